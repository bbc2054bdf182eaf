"""The admin client: the cluster's brokers and controller, topics, partitions, topic configs,
consumer groups, transactions (``admin_transactions.py``), ACLs and SCRAM users.

Each call raises the ApiError of the first entity that failed, with a message naming it, after
the request has been applied to every entity it could be applied to (as Kafka's admin does
per-topic). Must not: reach into broker internals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa

from logstore.client import admin_transactions as txn_admin
from logstore.client import lookups
from logstore.client.admin_transactions import (
    HangingTransaction,
    ProducerState,
    TransactionDescription,
    TransactionListing,
)
from logstore.client.group import GroupMember, GroupSettings
from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError, GroupIdNotFoundError, NonEmptyGroupError
from logstore.messages import ErrorFields
from logstore.messages.groups import (
    ConsumerProtocolAssignment,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from logstore.messages.metrics import (
    DescribeBrokerMetricsRequest,
    DescribeBrokerMetricsResponse,
    DescribeGroupLagRequest,
)
from logstore.messages.security import (
    AlterUserScramCredentialsRequest,
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
    DescribeUserScramCredentialsRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    binding_of,
    entry_of,
    filter_entry_of,
)
from logstore.messages.tiering import DescribeLogTiersRequest
from logstore.messages.topics import (
    AlterConfigsRequest,
    CreatableTopic,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    MetadataRequest,
    PartitionCount,
    TopicConfigChange,
    TopicResult,
)
from logstore.model import NewTopic, OffsetAndMetadata, TopicPartition
from logstore.records import decode_schema, encode_schema
from logstore.security.acl import AclBinding, AclBindingFilter
from logstore.security.config import client_security
from logstore.security.scram import (
    DEFAULT_ITERATIONS,
    SCRAM_SHA_256,
    check_iterations,
    check_mechanism,
    new_salt,
    salted_password,
)


@dataclass(frozen=True)
class LogTierDescription:
    """One partition's log over both tiers, as its leader answered ``describe_log_tiers``:
    log start offsets (over both tiers, and local), high watermark, and for a tiered partition
    its remote segments and bytes and its copy lag (sealed local segments not yet copied)."""

    log_start_offset: int
    local_log_start_offset: int
    high_watermark: int
    log_end_offset: int
    last_stable_offset: int = -1
    remote_storage_enable: bool = False
    remote_segments: int = 0
    remote_bytes: int = 0
    copy_lag_segments: int = 0
    copy_lag_bytes: int = 0


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    log_tiers: LogTierDescription | None = None  # with describe_topics(include_log_tiers=True)


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionDescription]
    internal: bool = False
    value_schema: pa.Schema | None = None
    # Tells it from an earlier topic of the same name (Kafka's topicId); None from a broker
    # that sends none.
    topic_id: str | None = None


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str
    protocol_type: str


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    assignment: list[TopicPartition]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation_id: int
    members: list[MemberDescription]


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group's lag, as its coordinator computes it (and exports it):
    ``log_end_offset`` is the high watermark, ``lag_seconds`` the age of the first record not
    committed (0 with no lag, None when unknown); -1 offsets and ``error`` where the
    partition's leader could not be asked."""

    committed_offset: int
    log_end_offset: int
    lag: int
    lag_seconds: float | None
    error: ApiError | None = None


@dataclass(frozen=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class ClusterDescription:
    """The live brokers (by id) and the controller's id (None while no broker is controller)."""

    brokers: list[BrokerDescription]
    controller_id: int | None


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set ``user``'s credential for ``mechanism``. The password stays here: the broker gets a
    fresh salt and the salted password (KIP-554)."""

    user: str
    password: str = field(repr=False)
    mechanism: str = SCRAM_SHA_256
    iterations: int = DEFAULT_ITERATIONS


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: str = SCRAM_SHA_256


class Admin:
    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9092", *,
                 request_timeout_ms: int = 30_000, **security: Any) -> None:
        """``**security``: kafka-python's connection settings, as ``Producer`` takes them."""
        if not isinstance(request_timeout_ms, int) or isinstance(request_timeout_ms, bool) \
                or request_timeout_ms <= 0:
            raise ValueError(f"Admin: request_timeout_ms must be a positive integer, got "
                             f"{request_timeout_ms!r}")
        self._metadata = ClusterMetadata(bootstrap_servers, request_timeout_ms,
                                         security=client_security(security, "Admin",
                                                                  ("request_timeout_ms",)))
        self._timeout_s = max(request_timeout_ms / 1000.0, 60.0)

    def describe_cluster(self) -> ClusterDescription:
        """The registered brokers, sorted by id, and the controller, as one broker sees them."""
        response = self._metadata.call(MetadataRequest(topics=[]))
        brokers = sorted((BrokerDescription(b.broker_id, b.host, b.port, b.rack)
                          for b in response.brokers), key=lambda b: b.broker_id)
        return ClusterDescription(brokers, response.controller_id)

    def create_topics(self, topics: list[NewTopic], *, raise_errors: bool = True
                      ) -> dict[str, ApiError | None]:
        """Create the topics in one request, answered once they exist and the broker asked
        has brought its partitions of them online (other brokers' follow within moments; a
        produce or fetch meanwhile is retried). Per topic: None if it was created, else its
        error; with ``raise_errors`` an error is raised instead, naming every topic that failed
        and those created all the same."""
        response = self._metadata.call(CreateTopicsRequest(topics=[CreatableTopic(
            name=t.name, num_partitions=t.num_partitions,
            replication_factor=t.replication_factor, config=t.config,
            value_schema=encode_schema(t.value_schema)) for t in topics]))
        return _topic_outcomes(response.topics, "created", raise_errors)

    def delete_topics(self, names: list[str], *, raise_errors: bool = True
                      ) -> dict[str, ApiError | None]:
        """Delete the topics, each on its own. Per topic: None if it was deleted, else its
        error; with ``raise_errors`` an error is raised instead, naming every topic that
        failed and those deleted all the same. A name given twice is asked for once (the
        second copy would fail as missing once the first had deleted it)."""
        response = self._metadata.call(DeleteTopicsRequest(topics=list(dict.fromkeys(names))))
        return _topic_outcomes(response.topics, "deleted", raise_errors)

    def list_topics(self, include_internal: bool = False) -> list[str]:
        response = self._metadata.call(MetadataRequest(topics=None))
        return sorted(t.name for t in response.topics if include_internal or not t.internal)

    def describe_topics(self, names: list[str] | None = None, *,
                        include_log_tiers: bool = False) -> list[TopicDescription]:
        """Topics with their partitions' leaders, replicas and ISR; ``include_log_tiers`` asks
        each leader for its partitions' log offsets and tiers too (``log_tiers``, None where
        the leader could not answer)."""
        response = self._metadata.call(MetadataRequest(topics=names))
        _raise_first(response.topics)
        tiers = self._log_tiers({t.name: [p.partition for p in t.partitions if p.leader >= 0]
                                 for t in response.topics}) if include_log_tiers else {}
        return [TopicDescription(
            t.name, [PartitionDescription(p.partition, p.leader, p.replicas, p.isr,
                                          tiers.get(TopicPartition(t.name, p.partition)))
                     for p in t.partitions],
            t.internal, decode_schema(t.value_schema), t.topic_id) for t in response.topics]

    def _log_tiers(self, partitions: dict[str, list[int]]
                   ) -> dict[TopicPartition, LogTierDescription]:
        """``describe_log_tiers`` of each leader for its partitions; partitions whose leader
        fails to answer are left out."""
        out: dict[TopicPartition, LogTierDescription] = {}
        groups: dict[tuple[int, str], list[int]] = {}
        for topic, parts in partitions.items():
            for p in parts:
                try:
                    leader = self._metadata.leader(TopicPartition(topic, p))
                except ApiError:
                    continue
                groups.setdefault((leader, topic), []).append(p)
        for (leader, topic), parts in groups.items():
            try:
                response = self._metadata.broker_connection(leader).call(
                    DescribeLogTiersRequest(topic=topic, partitions=parts))
            except ApiError:
                continue
            for e in response.partitions:
                if e.error() is None:
                    out[TopicPartition(topic, e.partition)] = LogTierDescription(
                        e.log_start_offset, e.local_log_start_offset, e.high_watermark,
                        e.log_end_offset, e.last_stable_offset, e.remote_storage_enable,
                        e.remote_segments, e.remote_bytes, e.copy_lag_segments,
                        e.copy_lag_bytes)
        return out

    def create_partitions(self, counts: dict[str, int], *, raise_errors: bool = True
                          ) -> dict[str, ApiError | None]:
        """Grow each topic to its new partition count, each on its own; the outcome per topic
        and ``raise_errors`` as ``delete_topics``."""
        response = self._metadata.call(CreatePartitionsRequest(topics=[
            PartitionCount(name=n, count=c) for n, c in counts.items()]))
        return _topic_outcomes(response.topics, "grown", raise_errors)

    def describe_configs(self, names: list[str]) -> dict[str, dict[str, Any]]:
        response = self._metadata.call(DescribeConfigsRequest(topics=list(names)))
        _raise_first(response.topics)
        return {t.name: t.config for t in response.topics}

    def alter_configs(self, configs: dict[str, dict[str, Any]], incremental: bool = True,
                      *, raise_errors: bool = True) -> dict[str, ApiError | None]:
        """Change each topic's config, each on its own; the outcome per topic and
        ``raise_errors`` as ``delete_topics``."""
        response = self._metadata.call(AlterConfigsRequest(incremental=incremental, topics=[
            TopicConfigChange(name=n, config=c) for n, c in configs.items()]))
        return _topic_outcomes(response.topics, "altered", raise_errors)

    def list_offsets(self, partitions: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Offsets for EARLIEST (-2), LATEST (-1) or a timestamp, per partition; a retriable
        error (a leader that moved, or one that does not know its end yet) is asked again for
        up to ``request_timeout_ms``, and at least 60 s, as Kafka's admin waits
        ``default.api.timeout.ms`` (``lookups.list_offset``)."""
        out = {}
        for tp, spec in partitions.items():
            tp = TopicPartition(*tp)
            entry = lookups.list_offset(self._metadata, tp, spec, self._timeout_s)
            entry.raise_error(f"list_offsets of {tp}")
            out[tp] = entry.offset
        return out

    # -- consumer groups ---------------------------------------------------------------------

    def list_groups(self) -> list[GroupListing]:
        """Every group of every broker's coordinator (brokers that fail to answer are left
        out, as Kafka's admin does only after retries)."""
        self._metadata.refresh([])
        found: dict[str, GroupListing] = {}
        for broker_id in sorted(self._metadata.brokers()):
            response = self._metadata.broker_connection(broker_id).call(ListGroupsRequest())
            for g in response.groups:
                found[g.group_id] = GroupListing(g.group_id, g.state, g.protocol_type)
        return sorted(found.values(), key=lambda g: g.group_id)

    def describe_groups(self, group_ids: list[str]) -> list[GroupDescription]:
        out = []
        for group_id in group_ids:
            (g,) = self._group(group_id).call(DescribeGroupsRequest(group_ids=[group_id]),
                                              entries=lambda r: r.groups).groups
            g.raise_error()
            out.append(GroupDescription(
                g.group_id, g.state, g.protocol_type, g.protocol, g.generation_id,
                [MemberDescription(m.member_id, m.group_instance_id, m.client_id,
                                   _assigned(m.assignment)) for m in g.members]))
        return out

    def list_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return self._group(group_id).committed(None)

    def list_consumer_group_lag(self, group_id: str) -> dict[TopicPartition, PartitionLag]:
        """The lag of every partition ``group_id`` has committed, from its coordinator: the
        figures its metrics endpoint exports (kafka_consumergroup_group_lag...)."""
        response = self._group(group_id).call(DescribeGroupLagRequest(group_id=group_id))
        return {TopicPartition(e.topic, e.partition): PartitionLag(
            e.committed_offset, e.log_end_offset, e.lag, e.lag_seconds, e.error())
            for e in response.partitions}

    def describe_broker_metrics(self, max_groups: int = 10
                                ) -> dict[int, DescribeBrokerMetricsResponse | ApiError]:
        """Each live broker's figures now (``describe_broker_metrics``), or the error that
        kept it from answering; counters are totals since the broker started."""
        self._metadata.refresh([])
        out: dict[int, DescribeBrokerMetricsResponse | ApiError] = {}
        for broker_id in sorted(self._metadata.brokers()):
            try:
                out[broker_id] = self._metadata.broker_connection(broker_id).call(
                    DescribeBrokerMetricsRequest(max_groups=max_groups))
            except ApiError as e:
                out[broker_id] = e
        return out

    def alter_group_offsets(self, group_id: str,
                            offsets: dict[TopicPartition, int | OffsetAndMetadata]) -> None:
        """Set committed offsets; only while the group has no members (NON_EMPTY_GROUP)."""
        group = self._group(group_id)
        try:
            (desc,) = self.describe_groups([group_id])
            if desc.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has {len(desc.members)} active member(s); stop its "
                    "consumers before changing its offsets")
        except GroupIdNotFoundError:
            pass  # no such group yet: committing creates it
        group.commit({TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata)
                      else OffsetAndMetadata(om) for tp, om in offsets.items()},
                     as_member=False)

    def delete_groups(self, group_ids: list[str]) -> None:
        """Delete empty groups and their offsets (tombstones in __consumer_offsets)."""
        entries = []
        for group_id in group_ids:
            entries += self._group(group_id).call(DeleteGroupsRequest(group_ids=[group_id]),
                                                  entries=lambda r: r.groups).groups
        for entry in entries:
            entry.raise_error()

    # -- ACLs and users ----------------------------------------------------------------------

    def create_acls(self, bindings: list[AclBinding]) -> None:
        response = self._metadata.call(CreateAclsRequest(creations=[entry_of(b) for b in bindings]))
        _raise_first(response.results)

    def delete_acls(self, filters: list[AclBindingFilter]) -> list[AclBinding]:
        """Remove the bindings matching any filter; the ones removed."""
        response = self._metadata.call(DeleteAclsRequest(
            filters=[filter_entry_of(f) for f in filters]))
        _raise_first(response.results)
        return [binding_of(e) for r in response.results for e in r.matching]

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        response = self._metadata.call(DescribeAclsRequest(
            filter=filter_entry_of(acl_filter or AclBindingFilter())))
        response.raise_error("describe_acls")
        return [binding_of(e) for e in response.acls]

    def alter_user_scram_credentials(
            self, upsertions: Iterable[UserScramCredentialUpsertion] = (),
            deletions: Iterable[UserScramCredentialDeletion] = ()) -> None:
        request = AlterUserScramCredentialsRequest(
            deletions=[ScramCredentialDeletion(name=d.user, mechanism=d.mechanism)
                       for d in deletions],
            upsertions=[_upsertion(u) for u in upsertions])
        _raise_first(self._metadata.call(request).results)

    def describe_user_scram_credentials(self, users: list[str] | None = None
                                        ) -> dict[str, dict[str, int]]:
        """{user: {mechanism: iterations}} (every user when ``users`` is None)."""
        response = self._metadata.call(DescribeUserScramCredentialsRequest(users=users))
        _raise_first(response.results)
        return {r.user: {c.mechanism: c.iterations for c in r.credentials}
                for r in response.results}

    # -- transactions ------------------------------------------------------------------------

    def list_transactions(self, state_filters: list[str] | None = None,
                          producer_id_filters: list[int] | None = None,
                          transactional_id_prefix: str = "") -> list[TransactionListing]:
        """Every transactional id the coordinators know, filtered by state, producer id and
        id prefix (empty filters match everything)."""
        return txn_admin.list_transactions(self._metadata, list(state_filters or []),
                                           list(producer_id_filters or []),
                                           transactional_id_prefix)

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> list[TransactionDescription]:
        return txn_admin.describe_transactions(self._metadata, list(transactional_ids),
                                               self._timeout_s)

    def describe_producers(self, partitions: list[TopicPartition]
                           ) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, as its leader knows them."""
        return txn_admin.describe_producers(self._metadata, list(partitions))

    def abort_transaction(self, topic: str, partition: int, producer_id: int,
                          producer_epoch: int, coordinator_epoch: int) -> None:
        """Abort a hanging transaction: an ABORT marker for the producer's open transaction,
        written to the partition by its leader (refused if a newer producer epoch or
        coordinator epoch already wrote there)."""
        txn_admin.abort_transaction(self._metadata, TopicPartition(topic, partition),
                                    producer_id, producer_epoch, coordinator_epoch)

    def find_hanging_transactions(self, partitions: list[TopicPartition],
                                  max_transaction_timeout_ms: int = 15 * 60 * 1000
                                  ) -> list[HangingTransaction]:
        return txn_admin.find_hanging(self._metadata, list(partitions),
                                      max_transaction_timeout_ms, self._timeout_s)

    def transaction_state_partitions(self) -> int:
        """How many partitions ``__transaction_state`` has (it is created if need be): with
        ``colocated_transactional_id``, ids that one coordinator partition decides together."""
        return txn_admin.transaction_state_partitions(self._metadata, self._timeout_s)

    def fence_producers(self, transactional_ids: list[str]) -> None:
        """Fence each transactional id's producer (KIP-618): its epoch is bumped and its open
        transaction, Prepared ones included, is aborted; returns once they are."""
        txn_admin.fence_producers(self._metadata, list(transactional_ids), self._timeout_s)

    def _group(self, group_id: str) -> GroupMember:
        return GroupMember(self._metadata, GroupSettings(group_id))

    def close(self) -> None:
        self._metadata.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _upsertion(u: UserScramCredentialUpsertion) -> ScramCredentialUpsertion:
    check_iterations(check_mechanism(u.mechanism), u.iterations)
    salt = new_salt()
    return ScramCredentialUpsertion(
        name=u.user, mechanism=u.mechanism, iterations=u.iterations, salt=salt,
        salted_password=salted_password(u.mechanism, u.password, salt, u.iterations))


def _assigned(assignment: Any) -> list[TopicPartition]:
    """A member's partitions (none if its group's protocol is not the consumer's)."""
    try:
        decoded = msgspec.convert(assignment or {}, ConsumerProtocolAssignment)
    except msgspec.ValidationError:
        return []
    return [TopicPartition(t, p) for t, p in decoded.partitions]


def _topic_outcomes(entries: Iterable[TopicResult], done: str, raise_errors: bool
                    ) -> dict[str, ApiError | None]:
    """Per topic, None or its error. With ``raise_errors``, the first error is raised, its
    message naming every other topic that failed and the topics ``done`` all the same (the
    broker applies each topic on its own: a caller must not take the call for undone)."""
    outcomes = {t.name: t.error() for t in entries}
    failed = [(name, e) for name, e in outcomes.items() if e is not None]
    if not raise_errors or not failed:
        return outcomes
    first = failed[0][1]
    if len(outcomes) == 1:
        raise first
    notes = [f"also failed: {e.message}" for _, e in failed[1:]]
    succeeded = [name for name, e in outcomes.items() if e is None]
    notes.append(f"{done} all the same: {', '.join(map(repr, succeeded))}" if succeeded
                 else f"no topic was {done}")
    raise type(first)(f"{first.message} ({'; '.join(notes)})")


def _raise_first(entries: Iterable[ErrorFields]) -> None:
    """Raise the error of the first entry that carries one (its message names the entity)."""
    for entry in entries:
        entry.raise_error()
