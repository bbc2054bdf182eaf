"""Request handlers: a typed request in, a typed response out.

Owns: the broker's answers to the topic, log and producer-id actions and to produce and fetch
streams: the checks a request's types cannot express (a topic's name, partition count and
configs are the controller's; a value schema that does not decode; a produced batch
encoded for another topic id than its topic's, which was recreated since, is UNKNOWN_TOPIC_ID;
max_bytes <= 0 is INVALID_FETCH_SIZE; a transactional batch needs its stream's transactional id, and the first
of a transaction on a partition is verified with the coordinator, KIP-890 part 1, through the
injected ``TxnVerifier``), routing to the services, and a response with an error code per
partition (or per topic): one bad partition never fails the whole request. Decoding and type checks are
``logstore/messages``'s. Must not: contain storage or replication logic, or know about Arrow
Flight.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
import pyarrow as pa

from logstore.broker import acl_rules as rules
from logstore.broker.fetch_session import FetchSession, SessionRegistry
from logstore.broker.replica_manager import FetchPartition, PartitionFetchResult, ReplicaManager
from logstore.controller.store import MetadataStore, TopicRecord
from logstore.controller.topics import TopicController, repeated_topic_error
from logstore.errors import (
    ApiError,
    InvalidFetchSizeError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownServerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import ErrorFields, Route, error_kw
from logstore.messages.fetch import (
    AbortedTransaction,
    FetchPartitionSummary,
    FetchRequest,
    FetchSummary,
)
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.log import (
    AwaitHighWatermarksRequest,
    AwaitHighWatermarksResponse,
    BrokerStatsRequest,
    BrokerStatsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    ListOffsetsPartitionResult,
    ListOffsetsRequest,
    ListOffsetsResponse,
    LogDirPartition,
    PartitionHighWatermark,
)
from logstore.messages.produce import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceAck,
    ProduceBatchMetadata,
    ProduceRequest,
)
from logstore.messages.tiering import (
    DescribeLogTiersRequest,
    DescribeLogTiersResponse,
    ListRemoteSegmentsRequest,
    ListRemoteSegmentsResponse,
    LogTierPartition,
    RemoteSegmentEntry,
    RemoteSegmentsPartition,
)
from logstore.messages.topics import (
    AlterConfigsRequest,
    BrokerMetadata,
    CreatableTopic,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    MetadataRequest,
    MetadataResponse,
    PartitionMetadata,
    TopicConfigEntry,
    TopicMetadata,
    TopicResult,
    TopicResults,
)
from logstore.model import INTERNAL_TOPICS, NewTopic, TopicPartition
from logstore.produced import ProducerData, check_values, read_produced
from logstore.records import (
    DEFAULT_SCHEMA,
    FLAG_TRANSACTIONAL,
    STORED_MESSAGE_SCHEMA,
    StoredBatch,
    conform_batch,
    decode_schema,
    encode_schema,
    stored_message_bytes,
    topic_schema,
)
from logstore.replication.partition import PendingAppend
from logstore.security.access import Access, Permissions, authorize
from logstore.security.sasl import CredentialLookup
from logstore.segments.format import SEGMENT_SUFFIX
from logstore.segments.producer_state import VerificationGuard
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import segment_key

log = logging.getLogger(__name__)

MAX_WAIT_LIMIT_MS = 60_000
# How long a topic admin call waits for this broker's partitions to follow the change it made
# (creating the logs of 10,000 partitions takes seconds), well within clients' 30 s timeout.
METADATA_SYNC_WAIT_S = 20.0

Req = TypeVar("Req")
Resp = TypeVar("Resp")
# Legacy: an action whose body is a dict (the group actions, until they are typed).

@dataclass(frozen=True, slots=True)
class PendingProduce:
    """A produced batch that is appended (or failed); ``ack`` waits for its acknowledgement."""

    seq: int  # the batch's seq, echoed in its ack
    partition: int
    pending: PendingAppend | None
    error: ApiError | None

    def ack(self, timeout_ms: int) -> ProduceAck:
        error = self.error
        if error is None and self.pending is not None:
            try:
                info = self.pending.wait(timeout_ms)
                return ProduceAck(seq=self.seq, partition=self.partition,
                                  base_offset=info.first_offset,
                                  log_append_time=info.log_append_time,
                                  log_start_offset=info.log_start_offset)
            except ApiError as e:
                error = e
            except Exception as e:  # boundary: the ack path must answer, never die
                log.exception("partition %d: waiting for an acknowledgement failed",
                              self.partition)
                error = UnknownServerError(f"{type(e).__name__}: {e}")
        return ProduceAck(seq=self.seq, partition=self.partition, **error_kw(error))


class ProducerIdSource(Protocol):
    def next_producer_id(self) -> int: ...


class TxnVerifier(Protocol):
    """Asks a transactional id's coordinator whether a partition is in the producer's ongoing
    transaction (KIP-890 part 1); raises the ApiError that refuses the batch."""

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               tp: TopicPartition) -> None: ...


class RequestHandlers:
    """One instance per broker; thread-safe because every service it calls is."""

    def __init__(self, broker_id: int, store: MetadataStore, controller: TopicController,
                 replicas: ReplicaManager, producer_ids: ProducerIdSource) -> None:
        self.broker_id = broker_id
        self._store = store
        self._controller = controller
        self._replicas = replicas
        self._producer_ids = producer_ids
        # Set by the broker when it verifies transactional produces (None: no verification).
        self.txn_verifier: TxnVerifier | None = None
        self._action_counts: Counter[str] = Counter()
        self.sessions = SessionRegistry()
        # What a connection may do, and users' credentials: the broker's security manager sets
        # these (without it no authorizer runs and no user exists).
        self.permissions: Callable[[str, str], Permissions | None] = _no_authorizer
        self.credentials: CredentialLookup = _no_users
        # The broker sets this: wait (bounded) until its hosted partitions reflect the
        # metadata changes made so far; False if the time ran out.
        self.await_metadata_sync: Callable[[float], bool] = _no_sync
        # The Flight server dispatches on these, by action name.
        self.routes: dict[str, Route[Any, Any]] = {}
        self.add_routes([
            Route(MetadataRequest, self.metadata, rules.METADATA),
            Route(CreateTopicsRequest, self.create_topics, rules.CREATE_TOPICS),
            Route(DeleteTopicsRequest, self.delete_topics, rules.DELETE_TOPICS),
            Route(CreatePartitionsRequest, self.create_partitions, rules.CREATE_PARTITIONS),
            Route(DescribeConfigsRequest, self.describe_configs, rules.DESCRIBE_CONFIGS),
            Route(AlterConfigsRequest, self.alter_configs, rules.ALTER_CONFIGS),
            Route(ListOffsetsRequest, self.list_offsets, rules.LIST_OFFSETS),
            Route(InitProducerIdRequest, self.init_producer_id, rules.INIT_PRODUCER_ID),
            Route(DescribeLogDirsRequest, self.describe_log_dirs, rules.DESCRIBE_LOG_DIRS),
            Route(AwaitHighWatermarksRequest, self.await_high_watermarks,
                  rules.AWAIT_HIGH_WATERMARKS),
            Route(BrokerStatsRequest, self.broker_stats, rules.BROKER_STATS),
            Route(DescribeLogTiersRequest, self.describe_log_tiers, rules.DESCRIBE_LOG_TIERS),
            Route(ListRemoteSegmentsRequest, self.list_remote_segments,
                  rules.LIST_REMOTE_SEGMENTS),
        ])

    def add_routes(self, routes: list[Route[Any, Any]]) -> None:
        """Serve typed actions (the cluster's come from cluster.py), each counted."""
        for route in routes:
            self.routes[route.action] = Route(route.request_type, _counted(
                route.action, route.handle, self._action_counts), route.access)

    # -- topics ------------------------------------------------------------------------------

    def metadata(self, req: MetadataRequest) -> MetadataResponse:
        topics = self._store.topics()
        wanted = sorted(topics) if req.topics is None else req.topics
        return MetadataResponse(
            brokers=[BrokerMetadata(broker_id=b.broker_id, host=b.host, port=b.port,
                                    rack=b.rack) for b in self._store.brokers().values()],
            controller_id=self._store.controller_id(),
            topics=[self._topic_metadata(n, topics.get(n)) for n in wanted])

    def _topic_metadata(self, name: str, record: TopicRecord | None) -> TopicMetadata:
        if record is None:
            err = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            return TopicMetadata(name=name, **error_kw(err))
        states = self._store.partition_states(name)
        partitions = []
        for p, replicas in sorted(record.replicas.items()):
            st = states.get(p)
            partitions.append(PartitionMetadata(
                partition=p, replicas=list(replicas), leader=st.leader if st else -1,
                leader_epoch=st.leader_epoch if st else -1, isr=list(st.isr) if st else []))
        config = self._controller.topic_config(name)
        return TopicMetadata(name=name, internal=record.internal,
                             value_schema=encode_schema(record.value_schema),
                             partitions=partitions, max_message_bytes=config.max_message_bytes,
                             compression_type=config.compression_type,
                             topic_id=record.topic_id)

    def create_topics(self, req: CreateTopicsRequest) -> TopicResults:
        """All valid topics in one controller call (one store write, or a few ZooKeeper
        transactions); the answer comes once they are stored and this broker's metadata sync
        has created their logs here (in bulk, on its own threads), or after
        METADATA_SYNC_WAIT_S when that takes longer: the topics exist either way, and a
        produce or fetch to a partition not yet online gets a retriable error."""
        results: list[ApiError | None] = [None] * len(req.topics)
        valid: list[tuple[int, NewTopic]] = []
        counts = Counter(t.name for t in req.topics)
        for i, t in enumerate(req.topics):
            try:
                if counts[t.name] > 1:  # refused in every copy, valid or not
                    raise repeated_topic_error(t.name, counts[t.name])
                valid.append((i, _new_topic(t)))
            except ApiError as e:
                results[i] = e
        try:
            outcomes = self._controller.create_topics([topic for _, topic in valid])
        except Exception as e:  # boundary: report, never crash the broker
            log.exception("create_topics of %d topic(s) failed", len(valid))
            outcomes = [UnknownServerError(f"{type(e).__name__}: {e}")] * len(valid)
        for (i, _), error in zip(valid, outcomes, strict=True):
            results[i] = error
        if any(e is None for e in outcomes):
            self._await_sync("create_topics")
        return TopicResults(topics=[TopicResult(name=t.name, **error_kw(e))
                                    for t, e in zip(req.topics, results, strict=True)])

    def delete_topics(self, req: DeleteTopicsRequest) -> TopicResults:
        counts = Counter(req.topics)
        return self._synced("delete_topics", [
            _topic_result(name, self._once, counts[name], "deleted", self._delete_topic, name)
            for name in req.topics])

    def _delete_topic(self, name: str) -> None:
        _refuse_internal(name, "delete_topics")
        self._controller.delete_topic(name)

    def create_partitions(self, req: CreatePartitionsRequest) -> TopicResults:
        counts = Counter(t.name for t in req.topics)
        return self._synced("create_partitions", [_topic_result(
            t.name, self._once, counts[t.name], "grown", self._create_partitions, t.name,
            t.count) for t in req.topics])

    def _create_partitions(self, name: str, count: int) -> None:
        # The coordinators hash keys over the partition count: growing it would move groups
        # and transactional ids away from their stored state.
        _refuse_internal(name, "create_partitions")
        self._controller.create_partitions(name, count)

    @staticmethod
    def _once(count: int, done: str, fn: Callable[..., object], name: str, *args: Any) -> None:
        """``fn(name, *args)`` for a topic named once in its request; a name given twice is
        INVALID_REQUEST in every copy and acted on in none (Kafka's "Duplicate topic in
        request"): which copy would win is not the caller's to guess."""
        if count > 1:
            raise repeated_topic_error(name, count, done)
        fn(name, *args)

    def _synced(self, action: str, results: list[TopicResult]) -> TopicResults:
        """``results``, answered once the changes they made are hosted here (bounded)."""
        if any(r.error_code == 0 for r in results):
            self._await_sync(action)
        return TopicResults(topics=results)

    def _await_sync(self, action: str) -> None:
        if not self.await_metadata_sync(METADATA_SYNC_WAIT_S):
            log.warning("%s: answered before this broker's partitions caught up with it "
                        "(over %.0f s)", action, METADATA_SYNC_WAIT_S)

    def describe_configs(self, req: DescribeConfigsRequest) -> DescribeConfigsResponse:
        return DescribeConfigsResponse(topics=[self._topic_config(n) for n in req.topics])

    def _topic_config(self, name: str) -> TopicConfigEntry:
        try:
            config = self._controller.topic_config(name)
            overrides = self._store.topics()[name].config
        except ApiError as e:
            return TopicConfigEntry(name=name, **error_kw(e))
        return TopicConfigEntry(name=name, config=config.to_dict(), overrides=sorted(overrides))

    def alter_configs(self, req: AlterConfigsRequest) -> TopicResults:
        counts = Counter(t.name for t in req.topics)
        return self._synced("alter_configs", [_topic_result(
            t.name, self._once, counts[t.name], "altered", self._alter_config, t.name,
            dict(t.config), req.incremental) for t in req.topics])

    def _alter_config(self, name: str, config: dict[str, Any], incremental: bool) -> None:
        _refuse_internal(name, "alter_configs")
        self._controller.alter_config(name, config, incremental)

    # -- partitions' logs --------------------------------------------------------------------

    def list_offsets(self, req: ListOffsetsRequest) -> ListOffsetsResponse:
        out = []
        for p in req.partitions:
            try:
                offset, ts = self._replicas.list_offset(TopicPartition(req.topic, p.partition),
                                                        p.timestamp, req.isolation_level)
                out.append(ListOffsetsPartitionResult(partition=p.partition, offset=offset,
                                                      timestamp=ts))
            except ApiError as e:
                out.append(ListOffsetsPartitionResult(partition=p.partition, **error_kw(e)))
        return ListOffsetsResponse(topic=req.topic, partitions=out)

    def describe_log_dirs(self, req: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
        """Per partition: the directory of its files, the incarnation id that proves a reader
        sees this broker's disk, and its log start offset and high watermark (not told by a
        new leader that does not know it yet: OFFSET_NOT_AVAILABLE)."""
        out = []
        for p in req.partitions:
            try:
                d = self._replicas.describe_log_dir(TopicPartition(req.topic, p),
                                                    end_known=True)
                out.append(LogDirPartition(
                    partition=p, path=d.path, incarnation=d.incarnation,
                    log_start_offset=d.log_start_offset, high_watermark=d.high_watermark,
                    local_log_start_offset=d.local_log_start_offset,
                    last_stable_offset=d.last_stable_offset, topic_id=d.topic_id))
            except ApiError as e:
                out.append(LogDirPartition(partition=p, **error_kw(e)))
        return DescribeLogDirsResponse(topic=req.topic, partitions=out)

    def describe_log_tiers(self, req: DescribeLogTiersRequest) -> DescribeLogTiersResponse:
        """Per led partition: its offsets over both tiers and its remote tier's state."""
        out = []
        for p in req.partitions:
            try:
                out.append(self._log_tier(TopicPartition(req.topic, p)))
            except ApiError as e:
                out.append(LogTierPartition(partition=p, **error_kw(e)))
        return DescribeLogTiersResponse(topic=req.topic, partitions=out)

    def _log_tier(self, tp: TopicPartition) -> LogTierPartition:
        d = self._replicas.describe_log_dir(tp)
        tier = self._replicas.tier
        stats = tier.stats(tp) if tier is not None else None
        entry = LogTierPartition(
            partition=tp.partition, log_start_offset=d.log_start_offset,
            local_log_start_offset=d.local_log_start_offset, high_watermark=d.high_watermark,
            log_end_offset=self._replicas.partition(tp).log.log_end_offset,
            last_stable_offset=d.last_stable_offset)
        if stats is None:
            return entry
        return msgspec.structs.replace(
            entry, remote_storage_enable=True, remote_segments=stats.remote_segments,
            remote_bytes=stats.remote_bytes, copy_lag_segments=stats.copy_lag_segments,
            copy_lag_bytes=stats.copy_lag_bytes)

    def list_remote_segments(self, req: ListRemoteSegmentsRequest
                             ) -> ListRemoteSegmentsResponse:
        """The FINISHED remote segments of offset ranges (for Spark's driver), with the
        object store's URL and options (which never hold credentials)."""
        tier = self._replicas.tier
        out = []
        for r in req.partitions:
            tp = TopicPartition(req.topic, r.partition)
            try:
                d = self._replicas.describe_log_dir(tp)
                if tier is None or not tier.is_tiered(tp):
                    raise InvalidRequestError(
                        f"{tp} is not tiered on broker {self.broker_id} (the topic's "
                        "remote_storage_enable is false, or the broker has no "
                        "remote_storage_uri)")
                out.append(RemoteSegmentsPartition(
                    partition=r.partition, log_start_offset=d.log_start_offset,
                    local_log_start_offset=d.local_log_start_offset,
                    segments=[_segment_entry(m) for m in tier.segments(
                        tp, r.start_offset, r.end_offset)]))
            except ApiError as e:
                out.append(RemoteSegmentsPartition(partition=r.partition, **error_kw(e)))
        return ListRemoteSegmentsResponse(
            topic=req.topic, remote_storage_uri=None if tier is None else tier.store.url,
            remote_storage_options={} if tier is None else dict(
                tier.config.remote_storage_options), partitions=out)

    def await_high_watermarks(self, req: AwaitHighWatermarksRequest
                              ) -> AwaitHighWatermarksResponse:
        """A long poll: answers once a partition's high watermark passes the given offset, or
        after ``max_wait_ms``, with the high watermarks of the partitions this broker leads."""
        positions = {TopicPartition(req.topic, p.partition): p.offset for p in req.partitions}
        hws = self._replicas.await_high_watermarks(positions, _capped_wait(req.max_wait_ms))
        return AwaitHighWatermarksResponse(topic=req.topic, partitions=[
            PartitionHighWatermark(partition=tp.partition, high_watermark=hw)
            for tp, hw in sorted(hws.items())])

    def broker_stats(self, req: BrokerStatsRequest) -> BrokerStatsResponse:
        """Counters of this broker's fetches and fetch sessions since it started."""
        stats = self._replicas.stats
        sessions = self.sessions.stats()
        return BrokerStatsResponse(
            broker_id=self.broker_id, fetch_requests=stats.requests,
            fetch_batches=stats.batches, fetch_bytes=stats.bytes,
            actions=dict(self._action_counts), fetch_sessions=sessions.open,
            fetch_sessions_opened=sessions.opened,
            fetch_session_pushed_bytes=sessions.pushed_bytes,
            fetch_session_unacknowledged_bytes=sessions.unacknowledged_bytes)

    def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResponse:
        return InitProducerIdResponse(producer_id=self._producer_ids.next_producer_id(),
                                      producer_epoch=0)

    # -- produce -----------------------------------------------------------------------------

    def topic_schema(self, topic: str) -> pa.Schema:
        return topic_schema(self._topic_record(topic).value_schema)

    def _topic_record(self, topic: str) -> TopicRecord:
        record = self._store.topics().get(topic)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return record

    def _produce_schema(self, req: ProduceRequest, tp: TopicPartition) -> pa.Schema:
        """The schema a produced batch is decoded with: the topic's, if it is still the
        topic the producer encoded for (``req.topic_id``; one compare per batch). Another id
        is UNKNOWN_TOPIC_ID: a batch encoded under the old topic's value schema may have the
        same buffer layout as the new one's (int64 and double) and would be stored as
        garbage."""
        record = self._topic_record(req.topic)
        if req.topic_id is not None and req.topic_id != record.topic_id:
            raise UnknownTopicIdError(
                f"topic-partition {tp}: the batch was encoded for topic id {req.topic_id}, "
                f"but {req.topic!r} is now topic id {record.topic_id} (deleted and "
                "recreated); refresh the metadata")
        return topic_schema(record.value_schema)

    @staticmethod
    def authorize_stream(req: ProduceRequest | FetchRequest | FetchSessionRequest,
                         permissions: Permissions | None) -> None:
        """Refuse a produce, fetch or fetch session stream the connection may not open
        (acl_rules.PRODUCE, FETCH, FETCH_SESSION; with no authorizer, ``permissions`` None,
        every ACL allows), and any client produce to an internal topic."""
        if isinstance(req, ProduceRequest):
            # Whatever the ACLs: the coordinators append to their topics themselves (through
            # the replica manager), and a client's record there could forge any group's
            # offsets or any transaction's state (Kafka: INVALID_TOPIC_EXCEPTION).
            _refuse_internal(req.topic, "produce")
        if permissions is not None:
            access: Access[Any, Any] = rules.RULES[type(req)]
            authorize(access, req, permissions, _nothing)

    def produce(self, req: ProduceRequest, batch: pa.RecordBatch, meta: ProduceBatchMetadata,
                permissions: Permissions | None) -> PendingProduce:
        """Append one producer batch now, if the connection may still write (an ACL removed
        while the stream is open refuses the next batch); the result's ``ack(timeout_ms)``
        waits for the acknowledgement and gives the batch's ``ProduceAck``."""
        tp = TopicPartition(req.topic, meta.partition)
        try:
            self.authorize_stream(req, permissions)
            data = self._producer_data(req, batch, tp)
            flags, guard = self._transactional_flags(req, meta, tp)
            pending = self._replicas.append_records(
                tp, data, req.acks, producer_id=meta.producer_id,
                producer_epoch=meta.producer_epoch, base_sequence=meta.base_sequence,
                flags=flags, current_leader_epoch=meta.leader_epoch,
                verify=bool(flags) and self.txn_verifier is not None, guard=guard)
        except ApiError as e:
            return PendingProduce(meta.seq, meta.partition, None, e)
        return PendingProduce(meta.seq, meta.partition, pending, None)

    def _producer_data(self, req: ProduceRequest, batch: pa.RecordBatch, tp: TopicPartition
                       ) -> ProducerData:
        """What to append: the records in the topic's schema, or, on a stream of encoded
        batches (``req.messages``), the produced message the row holds (produced.py)."""
        where = f"topic-partition {tp}"
        schema = self._produce_schema(req, tp)
        if not req.messages:  # a plain client's records: checked as a message's are
            records = conform_batch(batch, schema, where)
            check_values(records, where)
            return records
        if not batch.schema.equals(STORED_MESSAGE_SCHEMA) or batch.num_rows != 1 or \
                batch.column(0).null_count:
            raise InvalidRequestError(
                f"{where}: a stream of encoded batches carries each one in one row of "
                f"{STORED_MESSAGE_SCHEMA.names}; got {batch.num_rows} row(s) of "
                f"{batch.schema.names}")
        return read_produced(stored_message_bytes(batch), where)

    def _transactional_flags(self, req: ProduceRequest, meta: ProduceBatchMetadata,
                             tp: TopicPartition) -> tuple[int, VerificationGuard | None]:
        """FLAG_TRANSACTIONAL for a transactional batch, and unless its producer's
        transaction is open on ``tp`` at its epoch, the guard of its verification with the
        coordinator (KIP-890 part 1). The append checks the guard under the log's lock: a
        marker written since the verification cleared it, and the batch is refused rather
        than opening a transaction nobody would end."""
        if not meta.transactional:
            return 0, None
        if not req.transactional_id or meta.producer_id < 0 or meta.base_sequence < 0:
            raise InvalidRequestError(
                f"{tp}: a transactional batch needs the stream's transactional_id and a "
                f"producer id, epoch and sequence (got transactional_id "
                f"{req.transactional_id!r}, producer {meta.producer_id})")
        guard = None
        if self.txn_verifier is not None:
            guard = self._replicas.verification_guard(tp, meta.producer_id,
                                                      meta.producer_epoch)
            if guard is not None and not guard.verified:
                self.txn_verifier.verify(req.transactional_id, meta.producer_id,
                                         meta.producer_epoch, tp)
                guard.verified = True
        return FLAG_TRANSACTIONAL, guard

    # -- fetch -------------------------------------------------------------------------------

    def fetch(self, req: FetchRequest, permissions: Permissions | None
              ) -> tuple[pa.Schema, list[PartitionFetchResult]]:
        self.authorize_stream(req, permissions)
        if req.max_bytes <= 0:
            raise InvalidFetchSizeError(f"fetch from {req.topic!r}: max_bytes must be positive")
        parts = [FetchPartition(
            TopicPartition(req.topic, p.partition), p.offset,
            req.max_bytes if p.max_bytes is None else p.max_bytes, p.current_leader_epoch,
            p.end_offset, p.topic_id) for p in req.partitions]
        try:
            schema = self.topic_schema(req.topic)
        except UnknownTopicOrPartitionError:
            schema = DEFAULT_SCHEMA
        results = self._replicas.fetch(parts, _capped_wait(req.max_wait_ms), req.min_bytes,
                                       req.max_bytes, req.isolation_level, req.replica_id)
        return schema, results

    def open_fetch_session(self, req: FetchSessionRequest, permissions: Permissions | None
                           ) -> tuple[pa.Schema, FetchSession]:
        """A push session the connection may open (FETCH_SESSION), registered until its
        stream ends (``end_fetch_session``), and the schema of the batches it pushes."""
        self.authorize_stream(req, permissions)
        if req.max_bytes <= 0 or req.partition_max_bytes <= 0:
            raise InvalidFetchSizeError(f"fetch session on {req.topic!r}: max_bytes and "
                                        "partition_max_bytes must be positive")
        schema = self.topic_schema(req.topic)
        # A consumer's session pushes only from replicas whose log has this schema, and ends
        # when the topic is deleted or recreated (fetch_session.py): the client opens a new
        # one, which decodes with the new topic's schema.
        session = FetchSession(self._replicas, req, None if req.replica_id >= 0 else schema)
        self.sessions.add(session)
        return schema, session

    def end_fetch_session(self, session: FetchSession) -> None:
        session.end()
        self.sessions.remove(session)

    @staticmethod
    def iter_fetch_batches(schema: pa.Schema, results: list[PartitionFetchResult]
                           ) -> Iterator[tuple[int, StoredBatch, pa.RecordBatch]]:
        for r in results:
            for stored in r.batches:
                yield r.tp.partition, stored, stored.record_batch(schema)

    @staticmethod
    def fetch_summary(results: list[PartitionFetchResult],
                      stream_error: ApiError | None = None) -> FetchSummary:
        return FetchSummary(partitions=[FetchPartitionSummary(
            partition=r.tp.partition, **error_kw(r.error), high_watermark=r.high_watermark,
            log_start_offset=r.log_start_offset, log_end_offset=r.log_end_offset,
            local_log_start_offset=r.local_log_start_offset,
            last_stable_offset=r.last_stable_offset, aborted_transactions=[
                AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset,
                                   last_offset=-1 if a.last_offset is None else a.last_offset)
                for a in r.aborted])
            for r in results], stream_error=None if stream_error is None else ErrorFields(
                **error_kw(stream_error)))


def _refuse_internal(topic: str, action: str) -> None:
    """Clients may read the internal topics but never write, create, delete, grow or
    reconfigure them: only their coordinators do (``InvalidTopicError``)."""
    if topic in INTERNAL_TOPICS:
        raise InvalidTopicError(
            f"{action}: topic {topic!r} is internal; only its coordinator writes or manages it")


def _topic_result(name: str, fn: Callable[..., object], *args: Any) -> TopicResult:
    """The outcome of ``fn(*args)`` for topic ``name``: each topic gets its own error code."""
    try:
        fn(*args)
    except ApiError as e:
        return TopicResult(name=name, **error_kw(e))
    except Exception as e:  # boundary: report, never crash the broker
        log.exception("request for topic %r failed", name)
        return TopicResult(name=name, **error_kw(UnknownServerError(f"{type(e).__name__}: {e}")))
    return TopicResult(name=name)


def _segment_entry(m: RemoteLogSegmentMetadata) -> RemoteSegmentEntry:
    return RemoteSegmentEntry(
        topic_id=m.partition.topic_id, segment_id=m.segment_id, base_offset=m.base_offset,
        end_offset=m.end_offset, max_timestamp=m.max_timestamp_ms, size_bytes=m.size_bytes,
        leader_epoch=m.leader_epoch, epochs=[list(e) for e in m.segment_leader_epochs],
        key=segment_key(m, SEGMENT_SUFFIX), txn_index=m.has_txn_index)


def _no_authorizer(principal: str, host: str) -> Permissions | None:
    return None


def _no_users(user: str) -> dict[str, Any]:
    return {}


def _no_sync(timeout_s: float) -> bool:
    return True


def _nothing(req: object) -> None:
    return None


def _capped_wait(max_wait_ms: int) -> int:
    return min(max(max_wait_ms, 0), MAX_WAIT_LIMIT_MS)


def _counted(name: str, fn: Callable[[Req], Resp], counts: Counter[str]
             ) -> Callable[[Req], Resp]:
    """``fn`` counting its calls in ``counts[name]`` (approximate under concurrency)."""
    def call(req: Req) -> Resp:
        counts[name] += 1
        return fn(req)

    call.__doc__ = fn.__doc__
    return call


def _new_topic(t: CreatableTopic) -> NewTopic:
    _refuse_internal(t.name, "create_topics")  # the coordinators create them
    return NewTopic(name=t.name, num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor, config=dict(t.config),
                    value_schema=_value_schema(t.value_schema, f"create_topics[{t.name!r}]"))


def _value_schema(text: str | None, what: str) -> pa.Schema | None:
    try:
        return decode_schema(text)
    except ApiError as e:
        raise InvalidRequestError(f"{what}: {e.message}") from None
