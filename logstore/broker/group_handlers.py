"""Typed handlers of the group protocol, and the coordinator's access to the offsets log.

Owns: the Routes of find_coordinator, join_group, sync_group, heartbeat, leave_group,
offset_commit, offset_fetch, list_groups, describe_groups and delete_groups, each taking its
typed request (``messages/groups.py``) and answering its typed response, with an error code per
entry (one bad partition or group never fails the others); creating ``__consumer_offsets`` on
first use (compacted; ``offsets_topic_num_partitions``; replication factor
``offsets_topic_replication_factor`` capped to the live brokers); and ``ReplicaOffsetsLog``,
which reads and appends its partitions through the replica manager (the ``CoordinatorLog``
seam). The join and sync "long polls" wait here on the coordinator's futures. Must not: hold
group state (``group_coordinator.py`` and ``groups/`` do) or touch the transport.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import pyarrow as pa

from logstore.broker import acl_rules as rules
from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.controller.topics import TopicController
from logstore.errors import (
    ApiError,
    CoordinatorNotAvailableError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    UnknownServerError,
)
from logstore.groups.offsets import partition_for
from logstore.messages import ErrorFields, Route, error_kw
from logstore.messages.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupDescription,
    GroupResult,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from logstore.model import OFFSETS_TOPIC, NewTopic, TopicPartition
from logstore.records import DEFAULT_SCHEMA

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_TIMEOUT_MS = 30_000
WAIT_SLACK_S = 5.0

E = TypeVar("E", bound=ErrorFields)
T = TypeVar("T")


class ReplicaOffsetsLog:
    """``CoordinatorLog`` over the partitions of ``__consumer_offsets`` this broker hosts."""

    def __init__(self, replicas: ReplicaManager, store: MetadataStore) -> None:
        self._replicas = replicas
        self._store = store

    def num_partitions(self) -> int:
        record = self._store.topics().get(OFFSETS_TOPIC)
        if record is None:
            raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} does not exist yet")
        return record.num_partitions

    def leader_epoch(self, partition: int) -> int | None:
        p = self._replicas.hosted().get(TopicPartition(OFFSETS_TOPIC, partition))
        return p.leader_epoch if p is not None and p.is_leader else None

    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        self._replicas.append_records(tp, batch, -1).wait(APPEND_TIMEOUT_MS)

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """Up to the log end, not the high watermark: a newly elected leader's high
        watermark lags until its followers fetch again, and the commits between it and the
        log end (acknowledged by the old leader) would be lost to the replay. A leader never
        truncates its log, and the shard is dropped if leadership moves."""
        log_ = self._replicas.partition(TopicPartition(OFFSETS_TOPIC, partition)).log
        offset, end = log_.log_start_offset, log_.log_end_offset
        for _ in range(end - offset + 1):  # bounded: every read advances at least one offset
            if offset >= end:
                return
            data = log_.read(offset, READ_CHUNK_BYTES, max_offset=end)
            if not data.batches:
                return
            for stored in data.batches:
                if not stored.header.is_control:
                    yield stored.record_batch(DEFAULT_SCHEMA)
                offset = stored.header.next_offset


class GroupHandlers:
    def __init__(self, coordinator: GroupCoordinatorService, store: MetadataStore,
                 controller: TopicController, num_partitions: int,
                 replication_factor: int, segment_bytes: int) -> None:
        self.coordinator = coordinator
        self._store = store
        self._controller = controller
        self._num_partitions = num_partitions
        self._replication_factor = replication_factor
        self._segment_bytes = segment_bytes

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(FindCoordinatorRequest, self.find_coordinator, rules.FIND_COORDINATOR),
                Route(JoinGroupRequest, self.join_group, rules.GROUP_MEMBERSHIP),
                Route(SyncGroupRequest, self.sync_group, rules.GROUP_MEMBERSHIP),
                Route(HeartbeatRequest, self.heartbeat, rules.GROUP_MEMBERSHIP),
                Route(LeaveGroupRequest, self.leave_group, rules.GROUP_MEMBERSHIP),
                Route(OffsetCommitRequest, self.offset_commit, rules.OFFSET_COMMIT),
                Route(OffsetFetchRequest, self.offset_fetch, rules.OFFSET_FETCH),
                Route(ListGroupsRequest, self.list_groups, rules.LIST_GROUPS),
                Route(DescribeGroupsRequest, self.describe_groups, rules.DESCRIBE_GROUPS),
                Route(DeleteGroupsRequest, self.delete_groups, rules.DELETE_GROUPS)]

    # -- coordinator lookup ------------------------------------------------------------------

    def find_coordinator(self, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
        return _answer(FindCoordinatorResponse, lambda: self._find(req.group_id))

    def _find(self, group_id: str) -> FindCoordinatorResponse:
        partition = partition_for(group_id, self._ensure_offsets_topic())
        state = self._store.partition_states(OFFSETS_TOPIC).get(partition)
        broker = self._store.brokers().get(state.leader) if state else None
        if broker is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition} (group {group_id!r}) has no leader")
        return FindCoordinatorResponse(node_id=broker.broker_id, host=broker.host,
                                       port=broker.port, partition=partition)

    def _ensure_offsets_topic(self) -> int:
        record = self._store.topics().get(OFFSETS_TOPIC)
        if record is not None:
            return record.num_partitions
        live = len(self._store.brokers())
        with contextlib.suppress(TopicAlreadyExistsError):  # another broker was first
            self._controller.create_topic(NewTopic(
                OFFSETS_TOPIC, self._num_partitions,
                max(1, min(self._replication_factor, live)),
                config={"cleanup_policy": "compact", "segment_bytes": self._segment_bytes,
                        "retention_ms": None}))
        record = self._store.topics().get(OFFSETS_TOPIC)
        return record.num_partitions if record is not None else self._num_partitions

    # -- membership --------------------------------------------------------------------------

    def join_group(self, req: JoinGroupRequest) -> JoinGroupResponse:
        return _answer(JoinGroupResponse, lambda: _wait(self.coordinator.join_group(req),
                                                        req.rebalance_timeout_ms))

    def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        return _answer(SyncGroupResponse, lambda: SyncGroupResponse(
            assignment=_wait(self.coordinator.sync_group(req), req.timeout_ms)))

    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return _answer(HeartbeatResponse, lambda: self.coordinator.heartbeat(req))

    def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        return _answer(LeaveGroupResponse, lambda: self.coordinator.leave_group(req))

    # -- offsets -----------------------------------------------------------------------------

    def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return _answer(OffsetCommitResponse, lambda: self.coordinator.offset_commit(req))

    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return _answer(OffsetFetchResponse, lambda: self.coordinator.offset_fetch(req))

    # -- admin -------------------------------------------------------------------------------

    def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        return _answer(ListGroupsResponse, self.coordinator.list_groups)

    def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return DescribeGroupsResponse(groups=[self._describe(g) for g in req.group_ids])

    def _describe(self, group_id: str) -> GroupDescription:
        return _answer(GroupDescription, lambda: self.coordinator.describe_group(group_id),
                       group_id=group_id)

    def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        return DeleteGroupsResponse(groups=[self._delete(g) for g in req.group_ids])

    def _delete(self, group_id: str) -> GroupResult:
        def delete() -> GroupResult:
            self.coordinator.delete_group(group_id)
            return GroupResult(group_id=group_id)
        return _answer(GroupResult, delete, group_id=group_id)


def _wait(future: Future[T], timeout_ms: int) -> T:
    try:
        return future.result(timeout=max(timeout_ms / 1000.0 + WAIT_SLACK_S, 0.0))
    except FutureTimeout:
        raise RebalanceInProgressError("the rebalance did not complete in time; rejoin") \
            from None


def _answer(response_type: type[E], fn: Callable[[], E], **fields: Any) -> E:
    """``fn``'s response; an ApiError becomes this entry's code (``fields`` fill the entry's
    required fields)."""
    try:
        return fn()
    except ApiError as e:
        return response_type(**fields, **error_kw(e))
    except Exception as e:  # boundary: report, never crash the broker
        log.exception("group request failed")
        return response_type(**fields, **error_kw(UnknownServerError(f"{type(e).__name__}: {e}")))
