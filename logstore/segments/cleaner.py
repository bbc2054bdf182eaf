"""Log compaction: keep only the latest record per key in the sealed segments of a log whose
cleanup policy contains "compact".

Owns: the key map (the last offset of every key across the cleanable segments, from one
vectorised group-by), the per-batch filtering, tombstone expiry, writing cleaned segments (and
their aborted-transaction indexes) and swapping them in. Must not: loop over records in Python,
touch the active segment or anything at or after the last stable offset (Log.cleanable_segments
stops before), or know about other partitions.

Rules:
- a record is kept when it is the latest of its key among the cleaned segments, or its key is
  null (such records predate the compact policy and are left alone); records of aborted
  transactions never count as the latest of their key;
- a tombstone (``value`` null; for typed topics every value column null) is dropped once its
  segment was last written (its file's modification time, stamped on the log's clock when it
  rolled, kept by the cleaned copy) before ``now - delete_retention_ms``: records' own
  timestamps (a producer's CreateTime) say nothing of when a consumer could last miss it;
- transactions (txn_cleaning.py): batches of aborted transactions are removed whole (but for
  a producer's last batch, below); a marker
  is dropped once no batch of its transaction is left and its segment was last written
  before ``now - delete_retention_ms``; an aborted-transaction index entry stays exactly as long as
  data of its transaction may be in the log. Before a cleaned segment that drops markers is
  swapped in, the producer snapshots at or below the last dropped marker are deleted: such a
  snapshot may hold that marker's transaction open, and a reload from it would then find no
  marker to close it (a hanging transaction pinning the LSO forever);
- a producer's last data batch (or, when its epoch wrote only markers, its marker of that
  epoch) is never removed: kept whole when its records would all go, aborted ones included,
  so that a rebuild of the producer state from the log finds the producer's epoch and last
  sequence (Kafka keeps an empty batch; an Arrow batch here keeps its records), and while
  such a batch is kept whole though shadowed, the tombstones of its keys stay (else its old
  values would be the latest again once they went);
- records keep their offsets: a batch with gaps sets FLAG_HAS_OFFSET_DELTAS; its header keeps
  the producer fields, and its last offset (base_sequence is shifted with the base offset so
  that the producer's last sequence is unchanged); batches left empty are dropped; untouched
  batches and kept control batches are copied byte for byte.

Swap protocol (crash-safe, finished by recovery.finish_interrupted_swaps): write
``X.arrow.cleaned`` with ``X.index.cleaned``/``X.timeindex.cleaned``/``X.txnindex.cleaned`` (the
last even when empty) and fsync them; rename the data file to ``X.arrow.swap`` (commit point);
delete the old indexes and rename the new ones into place; rename ``X.arrow.swap`` over
``X.arrow``. Readers in flight hold the old file descriptor, which keeps reading the old,
unlinked file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError
from logstore.records import (
    FLAG_HAS_OFFSET_DELTAS,
    BatchHeader,
    StoredBatch,
    control_marker,
    encode_batch,
    value_columns,
)
from logstore.segments.batches import write_options
from logstore.segments.format import CLEANED_SUFFIX, SWAP_SUFFIX, fsync_dir
from logstore.segments.producer_state import SEQUENCE_MODULUS, ProducerLastBatch
from logstore.segments.segment import Bytes, LogSegment, SegmentClosedError
from logstore.segments.txn_cleaning import CleanedTxnState
from logstore.segments.txn_index import TxnIndexEntry
from logstore.txn_filter import ReadCommittedFilter, is_abort_marker

if TYPE_CHECKING:
    from logstore.segments.log import Log

logger = logging.getLogger(__name__)

_ALL_OFFSETS = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CompactionStats:
    segments_cleaned: int = 0
    batches_read: int = 0
    batches_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    aborted_records_dropped: int = 0
    markers_dropped: int = 0

    def __add__(self, other: CompactionStats) -> CompactionStats:
        return CompactionStats(*(getattr(self, f.name) + getattr(other, f.name)
                                 for f in fields(self)))


def compact_log(log: Log, now_ms: int) -> CompactionStats:
    """Compact ``log``'s cleanable sealed segments; returns what was done."""
    tp = f"{log.topic}-{log.partition}"
    if "key" not in log.schema.names:
        logger.warning("%s: cannot compact a topic without a 'key' column", tp)
        return CompactionStats()
    segments, generation = log.cleanable_segments(now_ms)
    stats = CompactionStats()
    try:
        if not segments:
            return stats
        stats = _compact_segments(log, segments, generation, now_ms)
    except SegmentClosedError as e:  # retention deleted one of them meanwhile
        logger.info("%s: log changed during compaction (%s); this pass stops", tp, e)
    finally:
        for seg in segments:
            seg.release()
    logger.info("%s: compaction kept %d of %d records in %d segment(s), %d -> %d bytes, "
                "%d tombstone(s), %d aborted record(s), %d marker(s) dropped", tp,
                stats.records_kept, stats.records_read, stats.segments_cleaned,
                stats.bytes_before, stats.bytes_after, stats.tombstones_dropped,
                stats.aborted_records_dropped, stats.markers_dropped)
    return stats


def _compact_segments(log: Log, segments: list[LogSegment], generation: int, now_ms: int
                      ) -> CompactionStats:
    """Clean ``segments`` one by one and swap each cleaned copy in; stops at the first swap
    the log refuses (it changed). Raises SegmentClosedError when retention deleted one."""
    tp = f"{log.topic}-{log.partition}"
    aborted = log.collect_aborted_transactions(segments[0].base_offset,
                                               segments[-1].next_offset)
    latest = latest_offsets(log, segments, aborted)
    stats, txns = CompactionStats(), CleanedTxnState(aborted)
    last_batches, held_keys = log.last_producer_batches(), set[bytes]()
    for seg in segments:
        cleaned, seg_stats, last_dropped_marker = clean_segment(log, seg, latest, now_ms, txns,
                                                                last_batches, held_keys)
        if last_dropped_marker is not None:
            log.producer_state.delete_snapshots_through(last_dropped_marker)
        if not log.swap_cleaned_segment(seg, cleaned, generation, commit_swap):
            logger.info("%s: log changed during compaction; discarding %s", tp, cleaned.path)
            cleaned.delete()
            break
        stats += seg_stats
        log.cleaned_until = max(log.cleaned_until, cleaned.next_offset)
    return stats


def segment_batches(seg: LogSegment) -> list[StoredBatch]:
    """Every batch of a sealed segment, CRC-checked. Raises CorruptRecordError when any batch
    is unreadable: compacting around corruption would silently drop the rest of the segment."""
    batches, at_end = seg.read(seg.base_offset, seg.size, _ALL_OFFSETS, True)
    if not at_end:
        raise CorruptRecordError(f"segment file {seg.path}: unreadable batch after offset "
                                 f"{batches[-1].header.last_offset if batches else '-'}; "
                                 "not compacting it")
    return batches


def latest_offsets(log: Log, segments: list[LogSegment],
                   aborted: list[TxnIndexEntry]) -> np.ndarray:
    """Sorted offsets of the latest record of every non-null key in ``segments``, leaving out
    control batches and the records of the ``aborted`` transactions."""
    key_type = log.schema.field("key").type
    keys: list[pa.Array] = []
    offsets: list[np.ndarray] = []
    committed = ReadCommittedFilter([entry.aborted_txn() for entry in aborted])
    for seg in segments:
        seg_keys, seg_offsets = [], []
        batches = segment_batches(seg)
        markers = [is_abort_marker(b.header, partial(b.record_batch, log.schema))
                   for b in batches]
        for batch, kept in zip(batches, committed.keep([b.header for b in batches], markers),
                               strict=True):
            if kept:
                seg_keys.append(batch.record_batch(log.schema).column("key"))
                seg_offsets.append(batch.offsets())
        if seg_keys:
            # concat copies the keys, so the segment's file buffer can be freed
            keys.append(pa.concat_arrays(seg_keys))
            offsets.append(np.concatenate(seg_offsets))
    if not keys:
        return np.empty(0, dtype=np.int64)
    table = pa.table({"key": pa.chunked_array(keys, type=key_type),
                      "offset": np.concatenate(offsets)})
    table = table.filter(pc.is_valid(table.column("key")))
    grouped = table.group_by("key").aggregate([("offset", "max")])
    latest: np.ndarray = np.sort(grouped.column("offset_max").to_numpy())
    return latest


@dataclass(frozen=True, slots=True)
class _CleanedBatch:
    """What cleaning one batch gives: the batch to write (None: dropped) and what it did."""

    header: BatchHeader | None = None
    data: Bytes | None = None
    tombstones_dropped: int = 0
    aborted_records_dropped: int = 0
    markers_dropped: int = 0
    txn_index_entry: TxnIndexEntry | None = None


class CleanedSegment(NamedTuple):
    segment: LogSegment  # the X.arrow.cleaned copy, sealed and fsynced
    stats: CompactionStats
    last_dropped_marker: int | None  # offset of the last transaction marker it dropped


def clean_segment(log: Log, seg: LogSegment, latest: np.ndarray, now_ms: int,
                  txns: CleanedTxnState,
                  last_batches: Mapping[int, ProducerLastBatch],
                  held_keys: set[bytes] | None = None) -> CleanedSegment:
    """Write the cleaned copy of ``seg`` as ``X.arrow.cleaned`` with its indexes (indexed,
    sealed, fsynced). ``txns`` carries the transaction state from the previous segments;
    ``last_batches`` names, per producer, the batch that holds its state (never removed);
    ``held_keys`` (of the pass, from the first segment on) gathers the keys of such batches
    kept whole though shadowed: their tombstones must stay, or the old values would be the
    latest again."""
    held_keys = set() if held_keys is None else held_keys
    config = log.config
    written = seg.written_ms
    # Tombstones and droppable markers go once their segment was last written more than
    # delete_retention_ms ago (Kafka's rule before KIP-534): a record's own timestamp (a
    # producer's CreateTime, maybe days old) says nothing of when a consumer could last
    # have missed it.
    expired = written < now_ms - config.delete_retention_ms
    out = LogSegment.create(seg.dir, seg.base_offset, seg.read_at(0, seg.data_start),
                            config.segment_index_bytes, suffix=CLEANED_SUFFIX, files=log.files)
    try:
        stats = CompactionStats(segments_cleaned=1, bytes_before=seg.size)
        last_dropped_marker = None
        for batch in segment_batches(seg):
            cleaned = _clean_any_batch(log, batch, latest, expired, txns, last_batches,
                                       held_keys)
            if cleaned.markers_dropped:
                last_dropped_marker = batch.header.base_offset
            kept = 0
            if cleaned.header is not None and cleaned.data is not None:
                out.append(cleaned.data, cleaned.header, config.index_interval_bytes, now_ms)
                kept = cleaned.header.record_count
            if cleaned.txn_index_entry is not None:
                out.txn_index.append(cleaned.txn_index_entry)
            stats += CompactionStats(0, 1, int(cleaned.header is not None),
                                     batch.header.record_count, kept,
                                     cleaned.tombstones_dropped,
                                     aborted_records_dropped=cleaned.aborted_records_dropped,
                                     markers_dropped=cleaned.markers_dropped)
        out.txn_index.rewrite()  # the swap protocol wants the file even when it is empty
        out.seal()
        out.fsync()
        out.stamp_written(written)  # the copy keeps its source's time through the swap
    except BaseException:
        out.delete()  # no half-written .cleaned file is left behind
        raise
    out.dirty = False
    return CleanedSegment(out, stats + CompactionStats(bytes_after=out.size),
                          last_dropped_marker)


def _clean_any_batch(log: Log, batch: StoredBatch, latest: np.ndarray, expired: bool,
                     txns: CleanedTxnState,
                     last_batches: Mapping[int, ProducerLastBatch],
                     held_keys: set[bytes]) -> _CleanedBatch:
    header = batch.header
    producer = last_batches.get(header.producer_id) if header.producer_id >= 0 else None
    # A producer's last batch stays whole rather than go: a rebuild of the producer state from
    # the log (an unclean restart, a new follower) would otherwise expect an older sequence or
    # epoch, and the producer's next batch would be refused (Kafka's RETAIN_EMPTY).
    holds_state = producer is not None and producer.is_last(header)
    if header.is_control:
        marker = control_marker(batch.record_batch(log.schema))
        droppable, entry = txns.on_marker(header, marker.type)
        if droppable and expired and not holds_state:
            return _CleanedBatch(markers_dropped=1)
        return _CleanedBatch(header, batch.message.serialize(), txn_index_entry=entry)
    if txns.on_data_batch(header):  # aborted: its data goes, unless it holds the state
        if holds_state:
            return _CleanedBatch(header, batch.message.serialize())
        return _CleanedBatch(aborted_records_dropped=header.record_count)
    kept_header, data, tombstones = clean_batch(log, batch, latest, expired, held_keys)
    if kept_header is None and holds_state:
        keys = batch.record_batch(log.schema).column("key").to_pylist()
        held_keys.update(k for k in keys if k is not None)
        return _CleanedBatch(header, batch.message.serialize())
    return _CleanedBatch(kept_header, data, tombstones)


def clean_batch(log: Log, batch: StoredBatch, latest: np.ndarray, expired: bool,
                held_keys: set[bytes] | frozenset[bytes] = frozenset()
                ) -> tuple[BatchHeader | None, Bytes | None, int]:
    """(header, bytes, tombstones dropped) of the cleaned data batch; header and bytes are
    None when no record is left. ``expired``: its segment was last written longer than
    delete_retention_ms ago (its tombstones may go, but not those of ``held_keys``)."""
    offsets = batch.offsets()
    records = batch.record_batch(log.schema)
    keep = _is_latest(offsets, latest) | records.column("key").is_null().to_numpy(
        zero_copy_only=False)
    dropped = 0
    if expired:
        tombstones = _tombstones(records, log.schema) & keep
        if held_keys and tombstones.any():
            keys = records.column("key")
            held = pc.is_in(keys, value_set=pa.array(list(held_keys), keys.type))
            tombstones &= ~held.to_numpy(zero_copy_only=False)
        dropped = int(tombstones.sum())
        keep &= ~tombstones
    if keep.all():
        return batch.header, batch.message.serialize(), 0
    if not keep.any():
        return None, None, dropped
    header, data = _rewrite(log, batch, records.filter(pa.array(keep)), offsets[keep])
    return header, data, dropped


def _is_latest(offsets: np.ndarray, latest: np.ndarray) -> np.ndarray:
    if latest.size == 0:
        return np.zeros(len(offsets), dtype=bool)
    at = np.minimum(np.searchsorted(latest, offsets), latest.size - 1)
    found: np.ndarray = latest[at] == offsets
    return found


def _tombstones(records: pa.RecordBatch, schema: pa.Schema) -> np.ndarray:
    nulls = [records.column(name).is_null().to_numpy(zero_copy_only=False)
             for name in value_columns(schema)]
    return np.logical_and.reduce(nulls) if nulls else np.zeros(records.num_rows, dtype=bool)


def _rewrite(log: Log, batch: StoredBatch, records: pa.RecordBatch,
             offsets: np.ndarray) -> tuple[BatchHeader, Bytes]:
    """Encode the kept ``records`` with their original ``offsets``."""
    old = batch.header
    base = int(offsets[0])
    last_delta = old.last_offset - base
    deltas = (offsets - base).astype(np.int32)
    gaps = len(offsets) != last_delta + 1
    first_ts, max_ts = old.first_timestamp, old.max_timestamp
    if "timestamp" in log.schema.names:
        bounds = pc.min_max(records.column("timestamp"))
        first_ts, max_ts = bounds["min"].value, bounds["max"].value
    sequence = old.base_sequence
    if sequence >= 0:
        sequence = (sequence + base - old.base_offset) % SEQUENCE_MODULUS
    flags = old.flags | FLAG_HAS_OFFSET_DELTAS if gaps else old.flags & ~FLAG_HAS_OFFSET_DELTAS
    header = replace(old, base_offset=base, last_offset_delta=last_delta,
                     record_count=records.num_rows, first_timestamp=first_ts,
                     max_timestamp=max_ts, base_sequence=sequence, flags=flags, batch_size=0,
                     crc=0)
    data = encode_batch(records, header, offset_deltas=deltas if gaps else None,
                        options=write_options(log.config))
    return replace(header, batch_size=len(data)), data


def commit_swap(old: LogSegment, new: LogSegment) -> None:
    """Put the cleaned files of ``new`` in place of ``old``'s (see the module docstring)."""
    swap = old.path.with_name(old.path.name + SWAP_SUFFIX)
    os.replace(new.path, swap)
    fsync_dir(old.dir)
    old.offset_index.delete()
    old.time_index.delete()
    new.offset_index.rename_to(old.offset_index.path)
    new.time_index.rename_to(old.time_index.path)
    new.txn_index.rename_to(old.txn_index.path)
    os.replace(swap, old.path)
    fsync_dir(old.dir)
    new.path, new.suffix = old.path, ""
