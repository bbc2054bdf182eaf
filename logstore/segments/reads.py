"""The read paths over a captured list of segments: fetching whole batches (and, for
read_committed, the aborted transactions overlapping them), finding the first record at or after
a timestamp, and scanning batch headers and transaction markers (to rebuild producer state and
aborted-transaction indexes).

Owns: the published segment list a reader captures (``SegmentList``), walking segments for a
fetch (continuing into the next segment while the byte budget lasts) and the time lookup (segment max timestamps, then the time index, then batch headers,
then a vectorised search inside one batch). Must not: take the log's lock or change any state;
a segment closed under a read raises SegmentClosedError and the caller starts over.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError
from logstore.records import BatchHeader, EndTxnMarker, StoredBatch, control_marker
from logstore.segments.segment import LogSegment
from logstore.segments.txn_index import TxnIndexEntry, collect_aborted
from logstore.txn_filter import AbortedTxn

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SegmentList:
    """A log's published segment list (replaced, never mutated) and its log start offset."""

    bases: tuple[int, ...]
    segments: tuple[LogSegment, ...]
    log_start_offset: int

    @classmethod
    def of(cls, segments: Sequence[LogSegment], log_start_offset: int) -> SegmentList:
        return cls(tuple(s.base_offset for s in segments), tuple(segments), log_start_offset)

    def floor(self, offset: int) -> int:
        """Index of the segment that holds ``offset`` (0 when it is below every segment)."""
        return max(0, bisect_right(self.bases, offset) - 1)

    def from_offset(self, offset: int) -> tuple[LogSegment, ...]:
        """The segment holding ``offset`` and every later one."""
        return self.segments[self.floor(offset):]

    def aborted(self, start: int, end: int) -> list[TxnIndexEntry]:
        """The aborted transactions overlapping [start, end), in marker order."""
        return collect_aborted((s.txn_index.entries() for s in self.from_offset(start)),
                               start, end)

    def sealed_below(self, offset: int, max_timestamp: int) -> list[LogSegment]:
        """The oldest sealed segments lying wholly below ``offset`` whose records are all
        stamped at or before ``max_timestamp``."""
        chosen = []
        for seg, following in zip(self.segments, self.segments[1:], strict=False):
            if seg.max_timestamp > max_timestamp or following.base_offset > offset:
                break
            chosen.append(seg)
        return chosen

    def dirty_ratio(self, cleaned_until: int) -> float:
        """Share of the sealed bytes at or after ``cleaned_until``."""
        sealed = self.segments[:-1]
        total = sum(s.size - s.data_start for s in sealed)
        dirty = sum(s.size - s.data_start for s in sealed if s.base_offset >= cleaned_until)
        return dirty / total if total else 0.0

    def info(self, log_end_offset: int) -> list[dict[str, Any]]:
        """base_offset, next_offset, size_bytes, path, sealed and max_timestamp per segment."""
        infos = []
        for seg, following in zip(self.segments, self.segments[1:] + (None,), strict=True):
            next_offset = log_end_offset if following is None else following.base_offset
            infos.append({"base_offset": seg.base_offset, "next_offset": next_offset,
                          "size_bytes": seg.size, "path": seg.path, "sealed": following is not None,
                          "max_timestamp": seg.max_timestamp})
        return infos


def read_log(state: SegmentList, offset: int, max_bytes: int, limit: int, min_one: bool,
             committed: bool) -> tuple[list[StoredBatch], list[AbortedTxn]]:
    """``read_segments`` over ``state`` from ``offset``; when ``committed``, also the aborted
    transactions overlapping the batches read (from the same segments' indexes)."""
    batches = read_segments(state.from_offset(offset), offset, max_bytes, limit, min_one)
    if not committed or not batches:
        return batches, []
    aborted = state.aborted(offset, batches[-1].header.next_offset)
    return batches, [entry.aborted_txn() for entry in aborted]


def read_segments(segments: Sequence[LogSegment], offset: int, max_bytes: int, limit: int,
                  min_one: bool) -> list[StoredBatch]:
    """Whole batches from the one holding ``offset`` in ``segments`` (the first of which holds
    it), at most ``max_bytes`` in total except the first when ``min_one``, none at or after
    ``limit``."""
    batches: list[StoredBatch] = []
    remaining = max_bytes
    if offset >= limit:
        return batches
    for seg in segments:
        seg.acquire()
        try:
            got, at_end = seg.read(offset, remaining, limit, min_one and not batches)
        finally:
            seg.release()
        batches.extend(got)
        remaining -= sum(b.header.batch_size for b in got)
        if not at_end or remaining <= 0:
            break
    return batches


def search_time(segments: Sequence[LogSegment], timestamp_ms: int, lso: int, leo: int,
                schema: pa.Schema) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record in offset order, within [lso, leo), whose
    timestamp is >= ``timestamp_ms``."""
    for seg in segments:
        if seg.max_timestamp >= timestamp_ms:
            seg.acquire()
            try:
                found = _search_segment(seg, timestamp_ms, lso, leo, schema)
            finally:
                seg.release()
            if found is not None:
                return found
    return None


def _search_segment(seg: LogSegment, timestamp_ms: int, lso: int, leo: int,
                    schema: pa.Schema) -> tuple[int, int] | None:
    start = seg.offset_index.lookup(seg.time_index.lookup(timestamp_ms))
    for position, header in seg.iter_headers(start or seg.data_start, seg.size):
        if header.base_offset >= leo:
            return None
        if header.max_timestamp >= timestamp_ms and header.next_offset > lso:
            found = search_batch(seg.read_batch_at(position, header), timestamp_ms, lso, schema)
            if found is not None:
                return found
    return None


def search_batch(batch: StoredBatch, timestamp_ms: int, lso: int,
                 schema: pa.Schema) -> tuple[int, int] | None:
    """The first record of ``batch`` at or after ``lso`` with timestamp >= ``timestamp_ms``."""
    offsets = batch.offsets()
    if "timestamp" in schema.names:
        column = batch.record_batch(schema).column("timestamp")
        stamps = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
    else:
        stamps = np.full(len(offsets), batch.header.max_timestamp, dtype=np.int64)
    hits = np.flatnonzero((stamps >= timestamp_ms) & (offsets >= lso))
    if hits.size == 0:
        return None
    return int(offsets[hits[0]]), int(stamps[hits[0]])


def scan_headers(segments: Sequence[LogSegment], from_offset: int,
                 tp: str) -> Iterator[BatchHeader]:
    """Headers of every batch ending after ``from_offset``; a corrupt header ends the scan of
    its segment with an ERROR (reads of that range report the corruption)."""
    for seg in segments:
        start = seg.offset_index.lookup(from_offset) or seg.data_start
        try:
            for _, header in seg.iter_headers(start, seg.size):
                if header.next_offset > from_offset:
                    yield header
        except CorruptRecordError as e:
            logger.error("%s: header scan stopped in %s: %s", tp, seg.path, e.message)


def scan_batches(segments: Sequence[LogSegment], from_offset: int, schema: pa.Schema,
                 tp: str) -> Iterator[tuple[LogSegment, BatchHeader, EndTxnMarker | None]]:
    """(segment, header, marker) of every batch ending after ``from_offset``; the marker of a
    control batch is read from its record (other batches' bodies are not read). A corrupt
    header or marker ends the scan of its segment with an ERROR, as in ``scan_headers``."""
    for seg in segments:
        start = seg.offset_index.lookup(from_offset) or seg.data_start
        try:
            for position, header in seg.iter_headers(start, seg.size):
                if header.next_offset <= from_offset:
                    continue
                marker = None
                if header.is_control:
                    batch = seg.read_batch_at(position, header)
                    marker = control_marker(batch.record_batch(schema))
                yield seg, header, marker
        except CorruptRecordError as e:
            logger.error("%s: batch scan stopped in %s: %s", tp, seg.path, e.message)
