"""Driver-side planning: which partitions, which offset ranges, split how.

Owns: resolving a subscription to partitions, asking leaders for each partition's log start
offset, high watermark and file location, turning starting/ending specs (offsets, timestamps)
into offsets, the data-loss checks, narrowing by pushed-down filters and splitting ranges into
Spark input partitions. Must not: import pyspark (source.py adapts this to Spark) or read
records.

Only committed data is planned: every range ends at or below the high watermark its leader
reported while planning, and with ``kafka.isolation.level=read_committed`` at or below its last
stable offset (``PartitionInfo.end_offset``), so a range holds no open transaction's records and
every abort inside it is already indexed.

Remote ranges (``readMode`` ``auto`` or ``remote``): the planner asks each leader for the
FINISHED remote segments of the planned ranges (``list_remote_segments``) and cuts every piece
at segment boundaries (``assign_sources``): a piece held by a remote segment is read by the
executor straight from object storage, never through a broker. ``auto`` does so only below the
leader's local log start offset (the rest is read from the local files or fetched); ``remote``
reads everything from object storage, and a range that no FINISHED segment holds is an error
naming the partition and the offsets. Where copies overlap (after a leader change) the newest
segment holding an offset serves it, as on the broker.
"""

from __future__ import annotations

import heapq
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from datasource.options import OffsetSpec, OptionError, ReadOptions, Subscription
from logstore.client import lookups
from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError, LogstoreError, UnknownTopicOrPartitionError
from logstore.messages.log import (
    AwaitHighWatermarksRequest,
    DescribeLogDirsRequest,
    ListOffsetsPartition,
    ListOffsetsPartitionResult,
    ListOffsetsRequest,
    LogDirPartition,
    PartitionPosition,
)
from logstore.messages.tiering import (
    ListRemoteSegmentsRequest,
    RemoteSegmentEntry,
    RemoteSegmentsRange,
)
from logstore.model import EARLIEST, LATEST, TopicPartition
from logstore.rpc.client import BrokerConnection
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)

log = logging.getLogger(__name__)

# A per-partition entry of a response the planner asks each leader for.
E = TypeVar("E", LogDirPartition, ListOffsetsPartitionResult)
# How long a request to leaders is asked again across a failover: Kafka's default.api.timeout.ms
# (a new leader may not know its end until a follower that stopped fetching leaves the ISR).
LEADER_WAIT_S = 60.0


class DataLossError(LogstoreError, RuntimeError):
    """Offsets a read needs are no longer in the log (and failOnDataLoss is true)."""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """What the leader said about one partition while planning."""

    tp: TopicPartition
    leader: str
    log_start_offset: int  # over both tiers
    high_watermark: int
    path: str | None = None
    incarnation: str | None = None
    local_log_start_offset: int = -1  # -1: not told (the log start offset, then)
    last_stable_offset: int = -1  # -1: not told (the high watermark, then)
    read_committed: bool = False  # the read's isolation level is read_committed
    topic_id: str | None = None  # of the leader's replica, these offsets' (None: not told)

    @property
    def end_offset(self) -> int:
        """Where reads of the partition end now: the last stable offset for read_committed
        (no open transaction's records, so every aborted one is known), else the high
        watermark."""
        if self.read_committed and self.last_stable_offset >= 0:
            return min(self.last_stable_offset, self.high_watermark)
        return self.high_watermark

    def end_name(self) -> str:
        return "last stable offset" if self.read_committed else "high watermark"

    @property
    def local_start(self) -> int:
        return self.log_start_offset if self.local_log_start_offset < 0 \
            else self.local_log_start_offset


@dataclass(frozen=True, slots=True)
class RemoteStore:
    """Where executors read remote segments: an fsspec URL and options (never credentials)."""

    uri: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RemoteSegments:
    """What the leaders said about the remote tier of the planned partitions."""

    store: RemoteStore | None
    segments: dict[TopicPartition, list[RemoteLogSegmentMetadata]]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Constraints:
    """What pushed-down filters allow: a set of partitions, an offset interval and a lowest
    timestamp (ms). Narrowing by them only ever drops records the filters would drop."""

    partitions: frozenset[int] | None = None
    offset_min: int = 0
    offset_end: int | None = None  # exclusive
    timestamp_min_ms: int | None = None

    @property
    def empty(self) -> bool:
        return (self.partitions is not None and not self.partitions) or (
            self.offset_end is not None and self.offset_end <= self.offset_min)


@dataclass
class Planner:
    """One planning session against a cluster; ``close()`` drops its connections."""

    options: ReadOptions
    metadata: ClusterMetadata = field(init=False)

    def __post_init__(self) -> None:
        self.metadata = ClusterMetadata(self.options.bootstrap_servers, request_timeout_ms=30_000,
                                        security=self.options.security)

    def close(self) -> None:
        self.metadata.close()

    # -- partitions and schema -----------------------------------------------------------------

    def partitions(self, missing_ok: bool = False) -> list[TopicPartition]:
        """The partitions the subscription names now (sorted). A named topic or partition that
        does not exist is an error, or left out when ``missing_ok`` (a running stream, whose
        reader then reports the partitions it lost)."""
        sub = self.options.subscription
        if sub.assigned:
            return sorted(tp for tp in sub.assigned if self._exists(tp, missing_ok))
        out: list[TopicPartition] = []
        for topic in self.topics(sub, missing_ok):
            info = self.metadata.topic(topic)
            out.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
        return out

    def topics(self, sub: Subscription | None = None, missing_ok: bool = False) -> list[str]:
        sub = sub or self.options.subscription
        if sub.assigned:
            return sorted({tp.topic for tp in sub.assigned})
        if sub.pattern is None:
            return [t for t in sub.topics if self._topic_exists(t, missing_ok)]
        self.metadata.refresh(None)
        regex = re.compile(sub.pattern)
        names = self.metadata.topic_names(include_internal=False)
        return sorted(t for t in names if regex.fullmatch(t))

    def value_schema(self, topics: list[str]) -> pa.Schema | None:
        """The value schema shared by ``topics`` (None: untyped); topics that differ are an
        error, since one DataFrame has one schema."""
        schemas = {t: self.metadata.topic(t).value_schema for t in topics}
        first = next(iter(schemas.values()), None)
        differ = [t for t, s in schemas.items() if not _same_schema(s, first)]
        if differ:
            raise OptionError(f"topics {sorted(schemas)} have different value schemas "
                              f"({differ[0]!r} differs from {topics[0]!r}); read them apart")
        return first

    def _topic_exists(self, topic: str, missing_ok: bool) -> bool:
        try:
            self.metadata.topic(topic, refresh=True)
        except UnknownTopicOrPartitionError:
            if not missing_ok:
                raise
            return False
        return True

    def _exists(self, tp: TopicPartition, missing_ok: bool) -> bool:
        if not self._topic_exists(tp.topic, missing_ok):
            return False
        info = self.metadata.topic(tp.topic)
        if tp.partition in info.partitions:
            return True
        if missing_ok:
            return False
        raise UnknownTopicOrPartitionError(
            f"topic {tp.topic!r} has no partition {tp.partition} (it has {info.num_partitions})")

    # -- offsets ---------------------------------------------------------------------------

    def describe(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionInfo]:
        """Log start offset, high watermark and file location of each partition."""
        def ask(conn: BrokerConnection, topic: str, parts: list[TopicPartition]
                ) -> list[LogDirPartition]:
            return conn.call(DescribeLogDirsRequest(
                topic=topic, partitions=[tp.partition for tp in parts])).partitions
        committed = self.options.read_committed
        return {tp: PartitionInfo(tp, address, e.log_start_offset, e.high_watermark, e.path,
                                  e.incarnation, e.local_log_start_offset,
                                  e.last_stable_offset, committed, e.topic_id)
                for address, tp, e in self._per_leader("describe_log_dirs", tps, ask)}

    def remote_segments(self, spans: Mapping[TopicPartition, tuple[int, int]],
                        strict: bool) -> RemoteSegments:
        """The FINISHED remote segments holding offsets of each ``[start, end)`` span, and the
        store to read them from (the options' ``remoteStorageUri``/``remoteStorageOptions``,
        else what the leader uses). A leader's error raises when ``strict``; otherwise its
        partition has no remote segments (and is fetched)."""
        found: dict[TopicPartition, list[RemoteLogSegmentMetadata]] = {}
        store: RemoteStore | None = None
        for (leader, topic), parts in self._by_leader(spans).items():
            conn = self.metadata.broker_connection(leader)
            response = conn.call(ListRemoteSegmentsRequest(topic=topic, partitions=[
                RemoteSegmentsRange(partition=tp.partition, start_offset=spans[tp][0],
                                    end_offset=spans[tp][1]) for tp in parts]))
            for e in response.partitions:
                if strict:
                    e.raise_error(f"list_remote_segments for {topic!r} on {conn.address}")
                elif e.error() is not None:
                    log.info("%s-%d: no remote segments listed (%s); fetching instead", topic,
                             e.partition, e.error())
                    continue
                found[TopicPartition(topic, e.partition)] = [
                    _segment_metadata(topic, e.partition, s) for s in e.segments]
            store = store or self._store(response.remote_storage_uri,
                                         response.remote_storage_options)
        return RemoteSegments(store, found)

    def _store(self, uri: str | None, options: dict[str, Any]) -> RemoteStore | None:
        uri = self.options.remote_storage_uri or uri
        if uri is None:
            return None
        chosen = self.options.remote_storage_options
        return RemoteStore(uri, dict(options if chosen is None else chosen))

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """First offset with a timestamp >= the given one, or -1 when there is none."""
        def ask(conn: BrokerConnection, topic: str, parts: list[TopicPartition]
                ) -> list[ListOffsetsPartitionResult]:
            return conn.call(ListOffsetsRequest(topic=topic, partitions=[
                ListOffsetsPartition(partition=tp.partition, timestamp=times[tp])
                for tp in parts])).partitions
        return {tp: e.offset for _, tp, e in self._per_leader("list_offsets", times, ask)}

    def await_data(self, positions: dict[TopicPartition, int], max_wait_ms: int) -> None:
        """Return once some partition has records at or past its position, or after about
        ``max_wait_ms`` (long polls on the leaders, one (leader, topic) after another within
        the one deadline). Errors end the wait early: the caller asks again anyway."""
        if not positions:  # nothing to long-poll on (a pattern that matches no topic yet)
            time.sleep(max_wait_ms / 1000.0)
            return
        try:
            groups = self._by_leader(positions)
            deadline = time.monotonic() + max_wait_ms / 1000.0
            for (leader, topic), parts in groups.items():
                wait_ms = int((deadline - time.monotonic()) * 1000) // max(len(groups), 1)
                response = self.metadata.broker_connection(leader).call(
                    AwaitHighWatermarksRequest(topic=topic, max_wait_ms=max(wait_ms, 0),
                                               partitions=[PartitionPosition(
                                                   partition=tp.partition, offset=positions[tp])
                                                   for tp in parts]))
                if any(e.high_watermark > positions[TopicPartition(topic, e.partition)]
                       for e in response.partitions):
                    return
        except ApiError as e:
            log.info("waiting for new data failed (%s); polling instead", e)

    def _by_leader(self, tps: Iterable[TopicPartition]
                   ) -> dict[tuple[int, str], list[TopicPartition]]:
        groups: dict[tuple[int, str], list[TopicPartition]] = defaultdict(list)
        for tp in tps:
            groups[(self.metadata.leader(tp), tp.topic)].append(tp)
        return groups

    def _per_leader(self, action: str, tps: Iterable[TopicPartition],
                    ask: Callable[[BrokerConnection, str, list[TopicPartition]], Sequence[E]]
                    ) -> list[tuple[str, TopicPartition, E]]:
        """(leader address, partition, response entry) for ``action``, asked by ``ask`` of
        each leader for its partitions of one topic. A retriable error (a leader that moved
        or cannot be reached, or a new one that does not know its high watermark yet) asks
        again, after a metadata refresh where the error calls for one, for up to
        LEADER_WAIT_S, as the consumer's lookups do (``lookups.try_again``); any other error
        raises."""
        tps = list(tps)
        deadline = time.monotonic() + LEADER_WAIT_S
        attempt = 0
        while True:
            try:
                return self._ask_leaders(action, tps, ask)
            except ApiError as e:
                if not lookups.try_again(e, attempt, deadline):
                    raise
                log.info("%s: %s; asking again", action, e)
                if e.refresh_metadata:
                    self.metadata.refresh(sorted({tp.topic for tp in tps}))
            attempt += 1
            time.sleep(lookups.backoff_s(attempt))

    def _ask_leaders(self, action: str, tps: list[TopicPartition],
                     ask: Callable[[BrokerConnection, str, list[TopicPartition]], Sequence[E]]
                     ) -> list[tuple[str, TopicPartition, E]]:
        out = []
        for (leader, topic), parts in self._by_leader(tps).items():
            conn = self.metadata.broker_connection(leader)
            entries = ask(conn, topic, parts)
            for e in entries:
                e.raise_error(f"{action} for {topic!r} on {conn.address}")
            out += [(conn.address, TopicPartition(topic, e.partition), e) for e in entries]
        return out

    def resolve(self, spec: OffsetSpec, infos: dict[TopicPartition, PartitionInfo],
                side: str) -> dict[TopicPartition, int]:
        """Offsets of ``spec`` for every partition in ``infos`` (``side``: starting/ending)."""
        explicit = _covering(spec.offsets, infos, f"{side}Offsets")
        _covering(spec.timestamps, infos, f"{side}OffsetsByTimestamp")
        out = {}
        for tp, info in infos.items():
            value = explicit.get(tp, spec.default)
            out[tp] = {EARLIEST: info.log_start_offset, LATEST: info.end_offset}.get(
                value, value)
        if spec.by_timestamp:
            times = {tp: spec.timestamps.get(tp, spec.timestamp_ms) for tp in infos}
            found = self.offsets_for_times({tp: t for tp, t in times.items() if t is not None})
            for tp, offset in found.items():
                out[tp] = self._no_record_that_late(tp, offset, infos[tp], side, times[tp])
        return out

    def _no_record_that_late(self, tp: TopicPartition, offset: int, info: PartitionInfo,
                             side: str, ts: int | None) -> int:
        if offset >= 0:
            return offset
        if side == "ending" or self.options.timestamp_strategy_latest:
            return info.end_offset
        raise OptionError(f"{side}OffsetsByTimestamp: {tp} has no record with a timestamp at or "
                          f"after {ts} (set startingOffsetsByTimestampStrategy=latest to start "
                          f"at the end instead)")


def _covering(given: Mapping[TopicPartition, int], infos: dict[TopicPartition, PartitionInfo],
              name: str) -> dict[TopicPartition, int]:
    """Per-partition JSON values; as in Spark's Kafka source, they must name exactly the
    partitions read."""
    if not given:
        return {}
    unknown = sorted(str(tp) for tp in given if tp not in infos)
    if unknown:
        raise OptionError(f"{name} names partitions {unknown} that are not read (the "
                          f"subscription covers {sorted(str(tp) for tp in infos)})")
    missing = sorted(str(tp) for tp in infos if tp not in given)
    if missing:
        hint = "-2 earliest, -1 latest" if name.endswith("Offsets") else "ms since the epoch"
        raise OptionError(f"{name} does not name partitions {missing}; give every partition "
                          f"a value ({hint})")
    return dict(given)


def _same_schema(a: pa.Schema | None, b: pa.Schema | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.equals(b))


def check_range(tp: TopicPartition, start: int, end: int, info: PartitionInfo,
                fail_on_data_loss: bool) -> OffsetRange | None:
    """The range to read for ``tp``, after the data-loss and direction checks."""
    if end > info.end_offset:
        why = "read_committed reads only decided transactions" if info.read_committed else \
            "only committed records can be read"
        raise OptionError(f"{tp}: ending offset {end} is past the {info.end_name()} "
                          f"{info.end_offset}; {why}")
    if start > end:
        raise OptionError(f"{tp}: starting offset {start} is after the ending offset {end}")
    if start < info.log_start_offset and start < end:  # an empty range needs no record
        lost = f"{tp}: offsets [{start}, {min(end, info.log_start_offset)}) are no longer in " \
               f"the log (it holds [{info.log_start_offset}, {info.high_watermark}))"
        if fail_on_data_loss:
            raise DataLossError(f"{lost}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)
        start = min(info.log_start_offset, end)
    return OffsetRange(tp, start, end) if end > start else None


def narrow(ranges: list[OffsetRange], c: Constraints,
           timestamp_starts: dict[TopicPartition, int] | None = None) -> list[OffsetRange]:
    """``ranges`` cut down to what the constraints allow (``timestamp_starts``: the first
    offset at or after ``c.timestamp_min_ms`` per partition, -1 when none)."""
    out = []
    for r in ranges:
        if c.partitions is not None and r.tp.partition not in c.partitions:
            continue
        start = max(r.start, c.offset_min)
        end = r.end if c.offset_end is None else min(r.end, c.offset_end)
        if timestamp_starts is not None and r.tp in timestamp_starts:
            first = timestamp_starts[r.tp]
            start = end if first < 0 else max(start, first)
        if end > start:
            out.append(OffsetRange(r.tp, start, end))
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Cut ranges to at most ``max_records`` each, then halve the largest until there are
    ``min_partitions`` (ranges of one record are not cut). Order: by partition, then offset."""
    pieces: list[OffsetRange] = []
    for r in ranges:
        step = max_records or max(r.size, 1)
        pieces.extend(OffsetRange(r.tp, s, min(s + step, r.end))
                      for s in range(r.start, r.end, step))
    if min_partitions is not None and len(pieces) < min_partitions:
        heap = [(-p.size, i, p) for i, p in enumerate(pieces)]
        heapq.heapify(heap)
        counter = len(heap)
        while len(heap) < min_partitions and heap and -heap[0][0] > 1:
            _, _, big = heapq.heappop(heap)
            mid = big.start + big.size // 2
            for half in (OffsetRange(big.tp, big.start, mid), OffsetRange(big.tp, mid, big.end)):
                heapq.heappush(heap, (-half.size, counter, half))
                counter += 1
        pieces = [p for _, _, p in heap]
    return sorted(pieces, key=lambda p: (p.tp, p.start))


# -- remote ranges ---------------------------------------------------------------------------


class RemoteRangeError(LogstoreError, RuntimeError):
    """readMode=remote, but offsets of a range are in no FINISHED remote segment."""


def _segment_metadata(topic: str, partition: int, e: RemoteSegmentEntry
                      ) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        TopicIdPartition(topic, e.topic_id, partition), e.segment_id, e.base_offset,
        e.end_offset, e.max_timestamp, e.size_bytes, e.leader_epoch,
        tuple((int(x), int(y)) for x, y in e.epochs), RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        0, has_txn_index=e.txn_index)


def remote_spans(pieces: Sequence[OffsetRange], infos: Mapping[TopicPartition, PartitionInfo],
                 read_mode: str) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition, the span of offsets whose remote segments the plan needs: below the
    local log start offset with ``auto``, everything with ``remote``, nothing otherwise."""
    spans: dict[TopicPartition, tuple[int, int]] = {}
    for p in pieces:
        end = p.end if read_mode == "remote" else min(p.end, infos[p.tp].local_start)
        if read_mode not in ("auto", "remote") or end <= p.start:
            continue
        lo, hi = spans.get(p.tp, (p.start, end))
        spans[p.tp] = (min(lo, p.start), max(hi, end))
    return spans


def assign_sources(pieces: Sequence[OffsetRange], infos: Mapping[TopicPartition, PartitionInfo],
                   segments: Mapping[TopicPartition, Sequence[RemoteLogSegmentMetadata]],
                   read_mode: str
                   ) -> list[tuple[OffsetRange, RemoteLogSegmentMetadata | None]]:
    """Each piece cut where its source changes: (range, the remote segment serving it) or
    (range, None) for the local files or a fetch (see the module docstring)."""
    out: list[tuple[OffsetRange, RemoteLogSegmentMetadata | None]] = []
    for piece in pieces:
        held = segments.get(piece.tp, ())
        limit = piece.end if read_mode == "remote" else min(
            piece.end, max(infos[piece.tp].local_start, piece.start))
        pos = piece.start
        while pos < limit:  # bounded: every step moves pos forward
            segment = holding_segment(held, pos)
            if segment is not None:
                stop = min(segment.next_offset, limit)
            else:
                stop = min([m.base_offset for m in held if m.base_offset > pos] + [limit])
                if read_mode == "remote":
                    raise RemoteRangeError(
                        f"{piece.tp}: readMode=remote, but offsets [{pos}, {stop}) are in no "
                        "FINISHED remote segment (not copied yet, or deleted); read them with "
                        "readMode=auto")
            out.append((OffsetRange(piece.tp, pos, stop), segment))
            pos = stop
        if pos < piece.end:
            out.append((OffsetRange(piece.tp, pos, piece.end), None))
    return out


def holding_segment(segments: Sequence[RemoteLogSegmentMetadata], offset: int
             ) -> RemoteLogSegmentMetadata | None:
    """The newest segment holding ``offset`` (copies overlap after a leader change)."""
    found = [m for m in segments if m.base_offset <= offset <= m.end_offset]
    return max(found, key=lambda m: m.base_offset) if found else None
