"""Kafka's authorization of each API, for every action LogStore serves: the ``Access`` each Route
is registered with (``security/access.py`` says what the three shapes mean).

Owns: which resource and operation every request needs, as Kafka's ``KafkaApis`` checks them,
and the response entries of refused entities. One table, so a reviewer reads every rule on one
page (``RULES`` lists them, and a unit test checks every request a broker serves has one):

| action(s)                                          | needs                                     |
|----------------------------------------------------|-------------------------------------------|
| metadata                                           | DESCRIBE per topic; unnamed: only those   |
| create_topics / delete_topics / create_partitions  | CREATE (on the topic or cluster) / DELETE |
|                                                    | / ALTER, per topic                        |
| describe_configs / alter_configs                   | DESCRIBE_CONFIGS / ALTER_CONFIGS per topic|
| list_offsets, await_high_watermarks                | DESCRIBE on the topic                     |
| describe_log_dirs                                  | READ on the topic (it hands out file paths|
|                                                    | a reader maps)                            |
| produce                                            | WRITE on the topic (and transactional id) |
| fetch, fetch_session (at open and at each frame)   | READ on the topic; a replica's: CLUSTER_ACTION|
| init_producer_id                                   | WRITE on the transactional id; without one|
|                                                    | IDEMPOTENT_WRITE on the cluster or WRITE  |
|                                                    | on any topic                              |
| leader_and_isr, alter_isr, controlled_shutdown,    | CLUSTER_ACTION on the cluster (brokers)   |
| offsets_for_leader_epoch, write_txn_markers        |                                           |
| find_coordinator                                   | DESCRIBE on the group                     |
| join/sync/heartbeat/leave_group                    | READ on the group                         |
| offset_commit                                      | READ on the group, READ per topic         |
| txn_offset_commit                                  | WRITE on the transactional id, READ on the|
|                                                    | group, READ per topic                     |
| offset_fetch                                       | DESCRIBE on the group; topics it may      |
|                                                    | DESCRIBE only                             |
| list_groups                                        | DESCRIBE on the cluster, else groups it   |
|                                                    | may DESCRIBE only                         |
| describe_groups / delete_groups                    | DESCRIBE / DELETE per group               |
| add_partitions_to_txn                              | WRITE on the transactional id, WRITE per  |
|                                                    | topic (verify_only, from leaders: CLUSTER_ACTION)|
| add_offsets_to_txn                                 | WRITE on the transactional id, READ group |
| end_txn, prepare_txn                               | WRITE on the transactional id             |
| describe_transactions / list_transactions          | DESCRIBE per transactional id / only those|
| describe_producers, broker_stats                   | READ on the topic / DESCRIBE on the cluster|
| describe_group_lag / describe_broker_metrics       | DESCRIBE on the group / on the cluster    |
| offset_timestamps                                  | CLUSTER_ACTION on the cluster (brokers)   |
| create_acls, delete_acls, alter_user_scram_creds.  | ALTER on the cluster                      |
| describe_acls, describe_user_scram_credentials     | DESCRIBE on the cluster                   |

Must not: handle requests, or know who is asking (``Permissions`` carries that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from logstore.errors import ApiError, ErrorCode
from logstore.messages import error_kw
from logstore.messages import groups as g
from logstore.messages import log as lg
from logstore.messages import metrics as mt
from logstore.messages import security as sec
from logstore.messages import tiering as ti
from logstore.messages import topics as tp
from logstore.messages import transactions as tx
from logstore.messages.cluster import (
    AlterIsrRequest,
    ControlledShutdownRequest,
    LeaderAndIsrRequest,
    LeaderEpochsRequest,
    OffsetsForLeaderEpochRequest,
)
from logstore.messages.fetch import FetchRequest
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.produce import InitProducerIdRequest, ProduceRequest
from logstore.security.access import (
    Access,
    Check,
    Entities,
    Permissions,
    on_any,
    on_cluster,
    on_group,
    on_topic,
    on_transactional_id,
)
from logstore.security.acl import Operation, ResourceType

_O = Operation
_REFUSED_CODES = {int(c) for c in (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                   ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                   ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}


def _cluster(operation: Operation, summary: str) -> Access[Any, Any]:
    return Access(summary, require=lambda req: [on_cluster(operation)])


def _on_topic(operation: Operation) -> Access[Any, Any]:
    return Access(f"{operation.value} on the topic",
                  require=lambda req: [on_topic(req.topic, operation)])


def _by_name(field: str, keep: Callable[[Any], Any] = str) -> Callable[[Any, set[Any]], Any]:
    """``narrow`` for a request whose entity list ``field`` is keyed by ``keep(entry)``."""
    def narrow(req: Any, allowed: set[Any]) -> Any:
        return msgspec.structs.replace(req, **{field: [
            e for e in getattr(req, field) if keep(e) in allowed]})
    return narrow


def _added(field: str, make: Callable[[Any, ApiError], Any]) -> Callable[[Any, dict[Any, ApiError]],
                                                                          Any]:
    """``refuse`` for a response whose entries are in ``field``: one made entry per refusal."""
    def refuse(resp: Any, refused: dict[Any, ApiError]) -> Any:
        if not refused:
            return resp
        return msgspec.structs.replace(resp, **{field: [
            *getattr(resp, field), *(make(k, e) for k, e in refused.items())]})
    return refuse


def _per_topic(operation: Operation, summary: str, names: Callable[[Any], Iterable[str]],
               field: str, keep: Callable[[Any], Any], entry: Callable[[str, ApiError], Any],
               *alternatives: Check) -> Access[Any, Any]:
    return Access(summary, entities=Entities(
        checks=lambda req: [(n, on_topic(n, operation, *alternatives)) for n in names(req)],
        narrow=_by_name(field, keep), refuse=_added(field, entry)))


def _topic_result(name: str, e: ApiError) -> tp.TopicResult:
    return tp.TopicResult(name=name, **error_kw(e))


def _visible_topics(resp: tp.MetadataResponse, perms: Permissions) -> tp.MetadataResponse:
    return msgspec.structs.replace(resp, topics=[
        t for t in resp.topics if t.error_code in _REFUSED_CODES
        or perms.allows(on_topic(t.name, _O.DESCRIBE))])


# -- topics and logs -------------------------------------------------------------------------

METADATA: Access[Any, Any] = Access(
    "DESCRIBE per named topic; without names, only the topics it may DESCRIBE",
    entities=Entities(
        checks=lambda req: [(t, on_topic(t, _O.DESCRIBE)) for t in req.topics or ()],
        narrow=_by_name("topics"),
        refuse=_added("topics", lambda n, e: tp.TopicMetadata(name=n, **error_kw(e)))),
    visible=_visible_topics)
CREATE_TOPICS = _per_topic(_O.CREATE, "CREATE on each topic (or on the cluster)",
                           lambda r: [t.name for t in r.topics], "topics", lambda t: t.name,
                           _topic_result, on_cluster(_O.CREATE))
DELETE_TOPICS = _per_topic(_O.DELETE, "DELETE on each topic", lambda r: r.topics, "topics",
                           str, _topic_result)
CREATE_PARTITIONS = _per_topic(_O.ALTER, "ALTER on each topic",
                               lambda r: [t.name for t in r.topics], "topics",
                               lambda t: t.name, _topic_result)
DESCRIBE_CONFIGS = _per_topic(_O.DESCRIBE_CONFIGS, "DESCRIBE_CONFIGS on each topic",
                              lambda r: r.topics, "topics", str,
                              lambda n, e: tp.TopicConfigEntry(name=n, **error_kw(e)))
ALTER_CONFIGS = _per_topic(_O.ALTER_CONFIGS, "ALTER_CONFIGS on each topic",
                           lambda r: [t.name for t in r.topics], "topics", lambda t: t.name,
                           _topic_result)
LIST_OFFSETS = _on_topic(_O.DESCRIBE)
AWAIT_HIGH_WATERMARKS = _on_topic(_O.DESCRIBE)
DESCRIBE_LOG_DIRS = _on_topic(_O.READ)
DESCRIBE_LOG_TIERS = _on_topic(_O.DESCRIBE)
LIST_REMOTE_SEGMENTS = _on_topic(_O.READ)  # where to read the topic's remote data from
BROKER_STATS = _cluster(_O.DESCRIBE, "DESCRIBE on the cluster")


def _produce_checks(req: ProduceRequest) -> list[Check]:
    checks = [on_topic(req.topic, _O.WRITE)]
    if req.transactional_id is not None:
        checks.append(on_transactional_id(req.transactional_id, _O.WRITE))
    return checks


def _fetch_checks(req: FetchRequest | FetchSessionRequest) -> list[Check]:
    if req.replica_id >= 0:
        return [on_cluster(_O.CLUSTER_ACTION)]
    return [on_topic(req.topic, _O.READ)]


def _init_producer_id_checks(req: InitProducerIdRequest) -> list[Check]:
    if req.transactional_id is not None:
        return [on_transactional_id(req.transactional_id, _O.WRITE)]
    return [on_cluster(_O.IDEMPOTENT_WRITE, on_any(ResourceType.TOPIC, _O.WRITE))]


PRODUCE: Access[Any, Any] = Access("WRITE on the topic (and on the transactional id, if any)",
                                   require=_produce_checks)
FETCH: Access[Any, Any] = Access("READ on the topic; a replica's fetch CLUSTER_ACTION",
                                 require=_fetch_checks)
FETCH_SESSION: Access[Any, Any] = Access(
    "READ on the topic; a replica's session CLUSTER_ACTION (checked again at each client frame)",
    require=_fetch_checks)
INIT_PRODUCER_ID: Access[Any, Any] = Access(
    "WRITE on the transactional id; without one IDEMPOTENT_WRITE on the cluster or WRITE on "
    "any topic", require=_init_producer_id_checks)

# -- between brokers ---------------------------------------------------------------------------

BROKERS_ONLY = _cluster(_O.CLUSTER_ACTION, "CLUSTER_ACTION on the cluster (brokers)")

# -- groups ------------------------------------------------------------------------------------


def _on_group(operation: Operation) -> Access[Any, Any]:
    return Access(f"{operation.value} on the group",
                  require=lambda req: [on_group(req.group_id, operation)])


def _commit_checks(req: Any) -> list[tuple[tuple[str, int], Check]]:
    return [((o.topic, o.partition), on_topic(o.topic, _O.READ)) for o in req.offsets]


def _visible_offsets(resp: g.OffsetFetchResponse, perms: Permissions) -> g.OffsetFetchResponse:
    return msgspec.structs.replace(resp, offsets=[
        o for o in resp.offsets if perms.allows(on_topic(o.topic, _O.DESCRIBE))])


def _visible_groups(resp: g.ListGroupsResponse, perms: Permissions) -> g.ListGroupsResponse:
    if perms.allows(on_cluster(_O.DESCRIBE)):
        return resp
    return msgspec.structs.replace(resp, groups=[
        x for x in resp.groups if perms.allows(on_group(x.group_id, _O.DESCRIBE))])


def _find_coordinator_checks(req: g.FindCoordinatorRequest) -> list[Check]:
    if req.key_type == g.KEY_TYPE_TRANSACTION:
        return [on_transactional_id(req.group_id, _O.DESCRIBE)]
    return [on_group(req.group_id, _O.DESCRIBE)]


FIND_COORDINATOR: Access[Any, Any] = Access(
    "DESCRIBE on the group, or on the transactional id (key_type TRANSACTION)",
    require=_find_coordinator_checks)
GROUP_MEMBERSHIP = _on_group(_O.READ)
OFFSET_COMMIT: Access[Any, Any] = Access(
    "READ on the group, READ on each topic",
    require=lambda req: [on_group(req.group_id, _O.READ)],
    entities=Entities(checks=_commit_checks,
                      narrow=_by_name("offsets", lambda o: (o.topic, o.partition)),
                      refuse=_added("offsets", lambda k, e: g.OffsetCommitResult(
                          topic=k[0], partition=k[1], **error_kw(e)))))
OFFSET_FETCH: Access[Any, Any] = Access(
    "DESCRIBE on the group; only the topics it may DESCRIBE",
    require=lambda req: [on_group(req.group_id, _O.DESCRIBE)], visible=_visible_offsets)
LIST_GROUPS: Access[Any, Any] = Access(
    "DESCRIBE on the cluster, else only the groups it may DESCRIBE", visible=_visible_groups)


def _per_group(operation: Operation, entry: Callable[[str, ApiError], Any]) -> Access[Any, Any]:
    return Access(f"{operation.value} on each group", entities=Entities(
        checks=lambda req: [(x, on_group(x, operation)) for x in req.group_ids],
        narrow=_by_name("group_ids"), refuse=_added("groups", entry)))


DESCRIBE_GROUPS = _per_group(_O.DESCRIBE, lambda n, e: g.GroupDescription(group_id=n,
                                                                          **error_kw(e)))
DESCRIBE_GROUP_LAG: Access[Any, Any] = Access(
    "DESCRIBE on the group; only the topics it may DESCRIBE",
    require=lambda req: [on_group(req.group_id, _O.DESCRIBE)],
    visible=lambda resp, perms: msgspec.structs.replace(resp, partitions=[
        x for x in resp.partitions if perms.allows(on_topic(x.topic, _O.DESCRIBE))]))
DELETE_GROUPS = _per_group(_O.DELETE, lambda n, e: g.GroupResult(group_id=n, **error_kw(e)))

# -- security administration -------------------------------------------------------------------

ALTER_SECURITY = _cluster(_O.ALTER, "ALTER on the cluster")
DESCRIBE_SECURITY = _cluster(_O.DESCRIBE, "DESCRIBE on the cluster")

# -- transactions (declared for the coordinator's Routes) --------------------------------------


def _on_txn_id(operation: Operation, *more: Callable[[Any], Check]) -> Access[Any, Any]:
    return Access(f"{operation.value} on the transactional id", require=lambda req: [
        on_transactional_id(req.transactional_id, operation), *(m(req) for m in more)])


def _txn_partitions(req: tx.AddPartitionsToTxnRequest
                    ) -> list[tuple[tuple[str, int], Check]]:
    if req.verify_only:
        return []
    return [((t.topic, p), on_topic(t.topic, _O.WRITE)) for t in req.topics
            for p in t.partitions]


def _narrow_txn_partitions(req: tx.AddPartitionsToTxnRequest, allowed: set[Any]
                           ) -> tx.AddPartitionsToTxnRequest:
    topics = [tx.TxnTopicPartitions(topic=t.topic, partitions=[
        p for p in t.partitions if (t.topic, p) in allowed]) for t in req.topics]
    return msgspec.structs.replace(req, topics=[t for t in topics if t.partitions])


def _txn_result(k: tuple[str, int], e: ApiError) -> tx.TxnPartitionResult:
    return tx.TxnPartitionResult(topic=k[0], partition=k[1], **error_kw(e))


ADD_PARTITIONS_TO_TXN: Access[Any, Any] = Access(
    "WRITE on the transactional id and on each topic (one refused: nothing is added); "
    "verify_only (from partition leaders) CLUSTER_ACTION",
    require=lambda req: [on_cluster(_O.CLUSTER_ACTION)] if req.verify_only else [
        on_transactional_id(req.transactional_id, _O.WRITE)],
    entities=Entities(checks=_txn_partitions, narrow=_narrow_txn_partitions,
                      refuse=_added("results", _txn_result),
                      all_or_nothing=tx.AddPartitionsToTxnResponse))
ADD_OFFSETS_TO_TXN = _on_txn_id(_O.WRITE, lambda req: on_group(req.group_id, _O.READ))
TXN_OFFSET_COMMIT: Access[Any, Any] = Access(  # Kafka's handleTxnOffsetCommitRequest
    "WRITE on the transactional id, READ on the group, READ on each topic",
    require=lambda req: [on_transactional_id(req.transactional_id, _O.WRITE),
                         on_group(req.group_id, _O.READ)],
    entities=Entities(checks=_commit_checks,
                      narrow=_by_name("offsets", lambda o: (o.topic, o.partition)),
                      refuse=_added("results", _txn_result)))
END_TXN = _on_txn_id(_O.WRITE)
PREPARE_TXN = _on_txn_id(_O.WRITE)
WRITE_TXN_MARKERS = BROKERS_ONLY
def _visible_txn_topics(resp: tx.DescribeTransactionsResponse, perms: Permissions
                        ) -> tx.DescribeTransactionsResponse:
    """Each transaction's partitions, only of the topics the caller may DESCRIBE (Kafka's)."""
    return msgspec.structs.replace(resp, transactions=[msgspec.structs.replace(t, topics=[
        x for x in t.topics if perms.allows(on_topic(x.topic, _O.DESCRIBE))])
        for t in resp.transactions])


DESCRIBE_TRANSACTIONS: Access[Any, Any] = Access(
    "DESCRIBE on each transactional id; only the topics it may DESCRIBE",
    visible=_visible_txn_topics, entities=Entities(
        checks=lambda req: [(t, on_transactional_id(t, _O.DESCRIBE))
                            for t in req.transactional_ids],
        narrow=_by_name("transactional_ids"),
        refuse=_added("transactions", lambda n, e: tx.TransactionDescription(
            transactional_id=n, **error_kw(e)))))
LIST_TRANSACTIONS: Access[Any, Any] = Access(
    "only the transactional ids it may DESCRIBE",
    visible=lambda resp, perms: msgspec.structs.replace(resp, transactions=[
        t for t in resp.transactions
        if perms.allows(on_transactional_id(t.transactional_id, _O.DESCRIBE))]))
DESCRIBE_PRODUCERS = _on_topic(_O.READ)

# Every request type's rule, by type: the Routes take theirs from here, and the produce,
# fetch and fetch session streams (not Routes) are authorized by theirs.
RULES: dict[type[Any], Access[Any, Any]] = {
    tp.MetadataRequest: METADATA, tp.CreateTopicsRequest: CREATE_TOPICS,
    tp.DeleteTopicsRequest: DELETE_TOPICS, tp.CreatePartitionsRequest: CREATE_PARTITIONS,
    tp.DescribeConfigsRequest: DESCRIBE_CONFIGS, tp.AlterConfigsRequest: ALTER_CONFIGS,
    lg.ListOffsetsRequest: LIST_OFFSETS, lg.DescribeLogDirsRequest: DESCRIBE_LOG_DIRS,
    lg.AwaitHighWatermarksRequest: AWAIT_HIGH_WATERMARKS, lg.BrokerStatsRequest: BROKER_STATS,
    ProduceRequest: PRODUCE, FetchRequest: FETCH, FetchSessionRequest: FETCH_SESSION,
    InitProducerIdRequest: INIT_PRODUCER_ID,
    LeaderAndIsrRequest: BROKERS_ONLY, AlterIsrRequest: BROKERS_ONLY,
    ControlledShutdownRequest: BROKERS_ONLY, OffsetsForLeaderEpochRequest: BROKERS_ONLY,
    LeaderEpochsRequest: BROKERS_ONLY,
    ti.DescribeLogTiersRequest: DESCRIBE_LOG_TIERS,
    ti.ListRemoteSegmentsRequest: LIST_REMOTE_SEGMENTS,
    g.FindCoordinatorRequest: FIND_COORDINATOR, g.JoinGroupRequest: GROUP_MEMBERSHIP,
    g.SyncGroupRequest: GROUP_MEMBERSHIP, g.HeartbeatRequest: GROUP_MEMBERSHIP,
    g.LeaveGroupRequest: GROUP_MEMBERSHIP, g.OffsetCommitRequest: OFFSET_COMMIT,
    g.OffsetFetchRequest: OFFSET_FETCH, g.ListGroupsRequest: LIST_GROUPS,
    g.DescribeGroupsRequest: DESCRIBE_GROUPS, g.DeleteGroupsRequest: DELETE_GROUPS,
    sec.CreateAclsRequest: ALTER_SECURITY, sec.DeleteAclsRequest: ALTER_SECURITY,
    sec.DescribeAclsRequest: DESCRIBE_SECURITY,
    sec.AlterUserScramCredentialsRequest: ALTER_SECURITY,
    sec.DescribeUserScramCredentialsRequest: DESCRIBE_SECURITY,
    tx.AddPartitionsToTxnRequest: ADD_PARTITIONS_TO_TXN,
    tx.AddOffsetsToTxnRequest: ADD_OFFSETS_TO_TXN, tx.TxnOffsetCommitRequest: TXN_OFFSET_COMMIT,
    tx.EndTxnRequest: END_TXN, tx.PrepareTxnRequest: PREPARE_TXN,
    tx.WriteTxnMarkersRequest: WRITE_TXN_MARKERS,
    tx.DescribeTransactionsRequest: DESCRIBE_TRANSACTIONS,
    tx.ListTransactionsRequest: LIST_TRANSACTIONS, tx.DescribeProducersRequest: DESCRIBE_PRODUCERS,
    mt.DescribeGroupLagRequest: DESCRIBE_GROUP_LAG, mt.OffsetTimestampsRequest: BROKERS_ONLY,
    mt.DescribeBrokerMetricsRequest: BROKER_STATS,
}
