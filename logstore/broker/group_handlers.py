"""DoAction handlers of the group protocol, and the coordinator's access to the offsets log.

Owns: parsing and answering find_coordinator, join_group, sync_group, heartbeat, leave_group,
offset_commit, offset_fetch, list_groups, describe_groups and delete_groups (an error code per
entry: one bad partition or group never fails the others), creating ``__consumer_offsets`` on
first use (compacted; ``offsets_topic_num_partitions``; replication factor
``offsets_topic_replication_factor`` capped to the live brokers), and ``ReplicaOffsetsLog``,
which reads and appends its partitions through the replica manager. The join and sync "long
polls" wait here on the coordinator's futures. Must not: hold group state (the coordinator
does) or touch the transport.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pyarrow as pa

from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.controller.topics import TopicController
from logstore.errors import (
    ApiError,
    CoordinatorNotAvailableError,
    InvalidRequestError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    UnknownServerError,
)
from logstore.groups.coordinator import CommitEntry, GroupCoordinator
from logstore.groups.offsets import partition_for
from logstore.model import OFFSETS_TOPIC, NewTopic, TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.wire import error_fields, field

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_TIMEOUT_MS = 30_000
WAIT_SLACK_S = 5.0


class ReplicaOffsetsLog:
    """``OffsetsLog`` over the partitions of ``__consumer_offsets`` this broker hosts."""

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
    def __init__(self, coordinator: GroupCoordinator, store: MetadataStore,
                 controller: TopicController, num_partitions: int,
                 replication_factor: int, segment_bytes: int) -> None:
        self.coordinator = coordinator
        self._store = store
        self._controller = controller
        self._num_partitions = num_partitions
        self._replication_factor = replication_factor
        self._segment_bytes = segment_bytes

    def actions(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"find_coordinator": self.find_coordinator, "join_group": self.join_group,
                "sync_group": self.sync_group, "heartbeat": self.heartbeat,
                "leave_group": self.leave_group, "offset_commit": self.offset_commit,
                "offset_fetch": self.offset_fetch, "list_groups": self.list_groups,
                "describe_groups": self.describe_groups, "delete_groups": self.delete_groups}

    # -- coordinator lookup ------------------------------------------------------------------

    def find_coordinator(self, req: dict[str, Any]) -> dict[str, Any]:
        return _answer(lambda: self._find(field(req, "group_id", str, "find_coordinator")))

    def _find(self, group_id: str) -> dict[str, Any]:
        partition = partition_for(group_id, self._ensure_offsets_topic())
        state = self._store.partition_states(OFFSETS_TOPIC).get(partition)
        broker = self._store.brokers().get(state.leader) if state else None
        if broker is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition} (group {group_id!r}) has no leader")
        return {"node_id": broker.broker_id, "host": broker.host, "port": broker.port,
                "partition": partition}

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

    def join_group(self, req: dict[str, Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            w = "join_group"
            rebalance_ms = field(req, "rebalance_timeout_ms", int, w, default=300_000)
            protocols = [(field(p, "name", str, w), p.get("metadata"))
                         for p in _objects(req, "protocols", w)]
            future = self.coordinator.join_group(
                field(req, "group_id", str, w), field(req, "member_id", str, w, default=""),
                field(req, "group_instance_id", str, w, default=None),
                field(req, "client_id", str, w, default=""),
                field(req, "session_timeout_ms", int, w),
                rebalance_ms, field(req, "protocol_type", str, w, default="consumer"),
                protocols)
            return _wait(future, rebalance_ms).to_json()
        return _answer(run)

    def sync_group(self, req: dict[str, Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            w = "sync_group"
            future = self.coordinator.sync_group(
                field(req, "group_id", str, w), field(req, "member_id", str, w),
                field(req, "generation_id", int, w),
                field(req, "assignments", dict, w, default=None))
            return {"assignment": _wait(future, field(req, "timeout_ms", int, w,
                                                      default=300_000))}
        return _answer(run)

    def heartbeat(self, req: dict[str, Any]) -> dict[str, Any]:
        return _answer(lambda: self.coordinator.heartbeat(
            field(req, "group_id", str, "heartbeat"), field(req, "member_id", str, "heartbeat"),
            field(req, "generation_id", int, "heartbeat")) or {})

    def leave_group(self, req: dict[str, Any]) -> dict[str, Any]:
        return _answer(lambda: self.coordinator.leave_group(
            field(req, "group_id", str, "leave_group"),
            field(req, "member_id", str, "leave_group", default=""),
            field(req, "group_instance_id", str, "leave_group", default=None)) or {})

    # -- offsets -----------------------------------------------------------------------------

    def offset_commit(self, req: dict[str, Any]) -> dict[str, Any]:
        w = "offset_commit"
        try:
            entries = [CommitEntry(TopicPartition(field(e, "topic", str, w),
                                                  field(e, "partition", int, w)),
                                   field(e, "offset", int, w),
                                   field(e, "metadata", str, w, default=""))
                       for e in _objects(req, "offsets", w)]
            errors = self.coordinator.offset_commit(
                field(req, "group_id", str, w), field(req, "member_id", str, w, default=""),
                field(req, "generation_id", int, w, default=-1), entries)
        except ApiError as e:
            return error_fields(e)
        return {**error_fields(None), "offsets": [
            {"topic": tp.topic, "partition": tp.partition, **error_fields(err)}
            for tp, err in errors.items()]}

    def offset_fetch(self, req: dict[str, Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            w = "offset_fetch"
            wanted = req.get("partitions")
            tps = None if wanted is None else [
                TopicPartition(field(e, "topic", str, w), field(e, "partition", int, w))
                for e in _objects(req, "partitions", w)]
            found = self.coordinator.offset_fetch(field(req, "group_id", str, w), tps)
            return {"offsets": [{"topic": tp.topic, "partition": tp.partition,
                                 "offset": om.offset, "metadata": om.metadata,
                                 "commit_timestamp": om.commit_timestamp}
                                for tp, om in sorted(found.items())]}
        return _answer(run)

    # -- admin -------------------------------------------------------------------------------

    def list_groups(self, req: dict[str, Any]) -> dict[str, Any]:
        return {**error_fields(None), "groups": self.coordinator.list_groups()}

    def describe_groups(self, req: dict[str, Any]) -> dict[str, Any]:
        ids = field(req, "group_ids", list, "describe_groups")
        return {"groups": [{"group_id": g, **_answer(
            lambda g=g: self.coordinator.describe_group(g))} for g in ids]}

    def delete_groups(self, req: dict[str, Any]) -> dict[str, Any]:
        ids = field(req, "group_ids", list, "delete_groups")
        return {"groups": [{"group_id": g, **_answer(
            lambda g=g: self.coordinator.delete_group(g) or {})} for g in ids]}


def _objects(req: dict[str, Any], name: str, what: str) -> list[dict[str, Any]]:
    items = field(req, name, list, what)
    if not all(isinstance(e, dict) for e in items):
        raise InvalidRequestError(f"{what}: every entry of {name!r} must be an object")
    return items


def _wait(future: Any, timeout_ms: int) -> Any:
    try:
        return future.result(timeout=timeout_ms / 1000.0 + WAIT_SLACK_S)
    except FutureTimeout:
        raise RebalanceInProgressError("the rebalance did not complete in time; rejoin") \
            from None


def _answer(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn``'s fields plus error fields; an ApiError becomes this entry's code."""
    try:
        return {**error_fields(None), **fn()}
    except ApiError as e:
        return error_fields(e)
    except Exception as e:  # boundary: report, never crash the broker
        log.exception("group request failed")
        return error_fields(UnknownServerError(f"{type(e).__name__}: {e}"))
