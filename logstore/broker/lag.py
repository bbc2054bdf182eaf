"""Consumer lag of the groups this broker coordinates, as kafka-lag-exporter computes it.

Owns: per (group, topic, partition) with a committed offset: the committed offset, the log end
offset (the partition's high watermark: what a consumer can read, as Kafka's tools report it),
the lag in offsets, and the lag in seconds: how old the first record not yet committed is, its
timestamp read at the committed offset through the offset index (``first_record_timestamp``).
A partition led here is read from its log; one led elsewhere is asked of its leader
(``offset_timestamps``, one request per leader and topic), and the answers are reused for
``LEADER_CACHE_MS`` and kept only for the partitions some group still commits, so the cache is
bounded by what this coordinator holds. Also the leader's side: ``OffsetTimestamps`` answers
``offset_timestamps`` with a bounded cache of (partition, offset) -> timestamp (records never
change their timestamp). The ``describe_group_lag`` Route answers from here, and the metrics
endpoint exports the same figures, so both always agree.

Where the timestamp cannot be known (the committed offset is below the local log start: deleted
by retention, or only in the remote tier), the oldest local record's is used: a lower bound.
Must not: hold group state (``groups/`` does) or touch the transport.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.broker import acl_rules as rules
from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.errors import (
    ApiError,
    BrokerNotAvailableError,
    GroupIdNotFoundError,
    LeaderNotAvailableError,
    UnknownServerError,
)
from logstore.groups.coordinator import GroupCoordinatorShard
from logstore.messages import Route, error_kw
from logstore.messages.metrics import (
    DescribeGroupLagRequest,
    DescribeGroupLagResponse,
    OffsetPosition,
    OffsetTimestampEntry,
    OffsetTimestampsRequest,
    OffsetTimestampsResponse,
    PartitionLagEntry,
)
from logstore.model import TopicPartition
from logstore.replication.fetcher import Connect
from logstore.segments.log import Log

log = logging.getLogger(__name__)

TIMESTAMP_CACHE_SIZE = 10_000
LEADER_CACHE_MS = 1_000
LEADER_TIMEOUT_S = 2.0
_CONTROL_SKIPS = 4  # transaction markers skipped looking for a record


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One committed partition of one group. -1: unknown (``error`` says why)."""

    group_id: str
    tp: TopicPartition
    committed_offset: int
    log_end_offset: int = -1
    timestamp_ms: int = -1  # of the first record at or after the committed offset
    error: ApiError | None = None

    @property
    def lag(self) -> int:
        return -1 if self.log_end_offset < 0 else max(self.log_end_offset - self.committed_offset,
                                                      0)

    def lag_seconds(self, now_ms: int) -> float | None:
        if self.lag == 0:
            return 0.0
        if self.lag < 0 or self.timestamp_ms < 0:
            return None
        return max(now_ms - self.timestamp_ms, 0) / 1000.0

    def entry(self, now_ms: int) -> PartitionLagEntry:
        return PartitionLagEntry(
            topic=self.tp.topic, partition=self.tp.partition,
            committed_offset=self.committed_offset, log_end_offset=self.log_end_offset,
            lag=self.lag, lag_seconds=self.lag_seconds(now_ms), **error_kw(self.error))


def first_record_timestamp(log_: Log, offset: int) -> int:
    """The timestamp of the first data record at or after ``offset`` below the high watermark
    (from the local log start on), -1 if there is none."""
    hw = log_.high_watermark
    start = max(offset, log_.log_start_offset)
    for _ in range(_CONTROL_SKIPS):
        if start >= hw:
            return -1
        data = log_.read(start, 1, max_offset=hw, min_one=True)
        if not data.batches:
            return -1
        stored = data.batches[0]
        if stored.header.is_control:
            start = stored.header.next_offset
            continue
        i = int(np.searchsorted(stored.offsets(), start))
        batch = stored.record_batch(log_.schema)
        if "timestamp" not in batch.schema.names or i >= batch.num_rows:
            return stored.header.max_timestamp
        value = batch.column("timestamp").slice(i, 1).cast(pa.int64())[0].as_py()
        return stored.header.max_timestamp if value is None else int(value)
    return -1


class OffsetTimestamps:
    """The leader's side: high watermarks and record timestamps of led partitions."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self._replicas = replicas
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[TopicPartition, int], int] = OrderedDict()

    def lookup(self, tp: TopicPartition, offset: int) -> tuple[int, int]:
        """(high watermark, timestamp at ``offset``) of a partition this broker leads."""
        log_ = self._replicas.leader_log(tp)
        hw = log_.high_watermark
        if offset >= hw:
            return hw, -1
        key = (tp, max(offset, log_.log_start_offset))
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return hw, found
        timestamp = first_record_timestamp(log_, offset)
        with self._lock:
            self._cache[key] = timestamp
            while len(self._cache) > TIMESTAMP_CACHE_SIZE:
                self._cache.popitem(last=False)
        return hw, timestamp

    def offset_timestamps(self, req: OffsetTimestampsRequest) -> OffsetTimestampsResponse:
        out = []
        for p in req.partitions:
            try:
                hw, ts = self.lookup(TopicPartition(req.topic, p.partition), p.offset)
                out.append(OffsetTimestampEntry(partition=p.partition, high_watermark=hw,
                                                timestamp=ts))
            except ApiError as e:
                out.append(OffsetTimestampEntry(partition=p.partition, **error_kw(e)))
        return OffsetTimestampsResponse(topic=req.topic, partitions=out)


Committed = tuple[str, TopicPartition, int]  # (group, partition, committed offset)
_Answer = tuple[int, int, ApiError | None, float]  # (hw, timestamp, error, when), by leader


class GroupLag:
    """The coordinator's side: lag of every committed partition of the groups it holds."""

    def __init__(self, broker_id: int, coordinator: GroupCoordinatorService,
                 timestamps: OffsetTimestamps, store: MetadataStore,
                 peers: Connect | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._broker_id = broker_id
        self._coordinator = coordinator
        self._timestamps = timestamps
        self._store = store
        self._peers = peers
        self._clock = clock
        self._lock = threading.Lock()  # one computation at a time; the others reuse it
        self._answers: dict[tuple[TopicPartition, int], _Answer] = {}

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(DescribeGroupLagRequest, self.describe_group_lag, rules.DESCRIBE_GROUP_LAG),
                Route(OffsetTimestampsRequest, self._timestamps.offset_timestamps,
                      rules.BROKERS_ONLY)]

    # -- what is committed here --------------------------------------------------------------

    def committed(self) -> list[Committed]:
        """Every committed offset of every group this broker coordinates (loading the
        offsets partitions it leads that no request has loaded since it became leader)."""
        runtime = self._coordinator.runtime
        try:
            partitions = runtime.num_partitions()
        except ApiError:  # no offsets topic yet
            return []
        out: list[Committed] = []
        for partition in range(partitions):
            try:
                out += runtime.read(partition, _all_offsets)
            except ApiError:  # not led here, or still loading
                continue
        return out

    def group_committed(self, group_id: str) -> list[Committed]:
        partition = self._coordinator.partition(group_id)
        return self._coordinator.runtime.read(partition,
                                              lambda shard: _group_offsets(shard, group_id))

    # -- lag ---------------------------------------------------------------------------------

    def lag(self, committed: list[Committed]) -> list[PartitionLag]:
        """The lag of each committed partition (its error where its leader did not answer)."""
        with self._lock:
            wanted = {(tp, offset) for _, tp, offset in committed}
            self._refresh(wanted)
            self._answers = {k: v for k, v in self._answers.items() if k in wanted}
            answers = dict(self._answers)
        out = []
        for group, tp, offset in committed:
            hw, ts, error, _ = answers.get((tp, offset), (-1, -1, None, 0.0))
            out.append(PartitionLag(group, tp, offset, hw, ts if offset < hw else -1, error))
        return out

    def describe_group_lag(self, req: DescribeGroupLagRequest) -> DescribeGroupLagResponse:
        now_ms = int(time.time() * 1000)
        lags = self.lag(self.group_committed(req.group_id))
        return DescribeGroupLagResponse(group_id=req.group_id, partitions=[
            p.entry(now_ms) for p in sorted(lags, key=lambda p: p.tp)])

    def _refresh(self, wanted: set[tuple[TopicPartition, int]]) -> None:
        """Ask for what is not cached or too old, grouped by leader and topic."""
        now = self._clock()
        stale = [k for k in wanted if k not in self._answers
                 or now - self._answers[k][3] > LEADER_CACHE_MS / 1000.0]
        by_leader: dict[tuple[int, str], list[tuple[TopicPartition, int]]] = {}
        for tp, offset in stale:
            by_leader.setdefault((self._leader(tp), tp.topic), []).append((tp, offset))
        for (leader, topic), keys in by_leader.items():
            # Only other leaders' answers are reused: a local one costs a high watermark read
            # (the timestamps have their own cache) and is never stale.
            at = now if leader != self._broker_id else float("-inf")
            for key, answer in zip(keys, self._ask(leader, topic, keys), strict=True):
                self._answers[key] = (*answer, at)

    def _leader(self, tp: TopicPartition) -> int:
        state = self._store.partition_states(tp.topic).get(tp.partition)
        return -1 if state is None else state.leader

    def _ask(self, leader: int, topic: str, keys: list[tuple[TopicPartition, int]]
             ) -> list[tuple[int, int, ApiError | None]]:
        if leader == self._broker_id:
            return [self._local(tp, offset) for tp, offset in keys]
        try:
            conn = self._peers(leader) if self._peers is not None and leader >= 0 else None
            if conn is None:
                raise (LeaderNotAvailableError(f"{topic}: no leader") if leader < 0 else
                       BrokerNotAvailableError(f"broker {leader}, leader of {topic}, is not "
                                               "reachable from the group coordinator"))
            resp = conn.call(OffsetTimestampsRequest(topic=topic, partitions=[
                OffsetPosition(partition=tp.partition, offset=o) for tp, o in keys]),
                timeout_s=LEADER_TIMEOUT_S)
            return [(e.high_watermark, e.timestamp, e.error()) for e in resp.partitions]
        except ApiError as e:
            log.info("lag of %s from broker %d: %s", topic, leader, e)
            return [(-1, -1, e)] * len(keys)

    def _local(self, tp: TopicPartition, offset: int) -> tuple[int, int, ApiError | None]:
        try:
            return (*self._timestamps.lookup(tp, offset), None)
        except ApiError as e:
            return -1, -1, e
        except Exception as e:  # boundary: one partition's trouble stays its own
            log.exception("%s: lag lookup at offset %d failed", tp, offset)
            return -1, -1, UnknownServerError(f"{tp}: {type(e).__name__}: {e}")


def _all_offsets(shard: GroupCoordinatorShard) -> list[Committed]:
    return [c for group in list(shard.offsets) for c in _visible(shard, group)]


def _group_offsets(shard: GroupCoordinatorShard, group_id: str) -> list[Committed]:
    if group_id not in shard.groups and group_id not in shard.offsets:
        raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
    return _visible(shard, group_id)


def _visible(shard: GroupCoordinatorShard, group_id: str) -> list[Committed]:
    """The group's offsets an offset fetch answers (none of a deleted topic's)."""
    return [(group_id, tp, om.offset) for tp, om in shard.visible_offsets(group_id).items()
            if om.offset >= 0]
