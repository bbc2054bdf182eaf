"""Opening a partition's log directory and replaying its producer state (Kafka's LogLoader).

Owns: the order of the steps at open (finish interrupted compaction swaps, resolve the schema,
load and recover the segments, or create the first one) and the replay of producer state from a
snapshot through the batches after it, which also rebuilds the aborted-transaction indexes that
recovery marked stale. Must not: publish anything to readers or hold the log's lock (the Log
calls these under it), or decide the recovery rules (recovery.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from logstore.config import TopicConfig
from logstore.records import schema_message
from logstore.segments import recovery
from logstore.segments.file_cache import OpenFileCache
from logstore.segments.format import fsync_dir
from logstore.segments.producer_state import ProducerStateManager
from logstore.segments.reads import scan_batches
from logstore.segments.segment import NO_FILE_LIMIT, LogSegment


@dataclass(frozen=True, slots=True)
class LoadedSegments:
    """What is on disk after recovery: the schema and the segments, oldest first."""

    schema: pa.Schema
    segments: list[LogSegment]
    created: bool
    fresh: bool = False  # created in a directory made just now: no snapshots to replay

    @property
    def stale_txn_index_from(self) -> int | None:
        """Base offset of the first segment whose aborted-transaction index needs a rebuild."""
        stale = [s.base_offset for s in self.segments if s.txn_index.stale]
        return stale[0] if stale else None


def load_segments(dir: Path, tp: str, config: TopicConfig, schema: pa.Schema | None,
                  recovery_point: int, log_start_offset: int, clean_shutdown: bool,
                  files: OpenFileCache = NO_FILE_LIMIT,
                  empty_schema: pa.Schema | None = None) -> LoadedSegments:
    """Recover the segments in ``dir``, or create the first one (a new log needs ``schema``,
    or ``empty_schema``, which is used only when ``dir`` holds no segment file). A directory
    made here is known to be empty: it is not scanned. The first segment's name is made
    durable by the log's first flush (``created``: its directory is dirty), not here: a crash
    before then loses at most an empty log, which the metadata sync creates again."""
    fresh = True
    try:
        dir.mkdir(parents=True)
        bases: list[int] = []
    except FileExistsError:
        fresh = False
        recovery.finish_interrupted_swaps(dir, tp)
        bases = recovery.segment_base_offsets(dir)
    resolved = recovery.resolve_schema(
        dir, bases, schema if bases or schema is not None else empty_schema, tp)
    if bases:
        return LoadedSegments(resolved, recovery.load_segments(
            dir, tp, resolved, bases, config.index_interval_bytes, config.segment_index_bytes,
            recovery_point, clean_shutdown, files), False)
    first = LogSegment.create(dir, max(0, log_start_offset), schema_message(resolved),
                              config.segment_index_bytes, files=files, empty_dir=fresh)
    return LoadedSegments(resolved, [first], True, fresh)


def replay_producer_state(producers: ProducerStateManager, segments: Sequence[LogSegment],
                          log_start_offset: int, log_end_offset: int, schema: pa.Schema,
                          tp: str, rebuild_from: int | None = None) -> None:
    """Load the newest snapshot (at or below ``rebuild_from`` when given) and replay every
    batch after it. The aborts of markers at or after ``rebuild_from`` are indexed again in
    their segments, whose indexes are then made durable and no longer stale."""
    start = producers.load(log_end_offset, rebuild_from)
    from_offset = log_start_offset if start is None else start
    first = max(0, sum(1 for s in segments if s.base_offset <= from_offset) - 1)
    for seg, header, marker in scan_batches(segments[first:], from_offset, schema, tp):
        entry = producers.index_entry(producers.update(header, marker))
        if entry is not None and rebuild_from is not None and header.base_offset >= rebuild_from:
            seg.txn_index.append(entry)
    rebuilt = [seg for seg in segments if seg.txn_index.stale]
    for seg in rebuilt:
        seg.txn_index.stale = False
        seg.txn_index.fsync()
    if rebuilt:  # the rebuilt files are new names: a lost one would read as "no abort"
        fsync_dir(rebuilt[0].dir)
