"""Loading a partition directory at open: finishing or discarding interrupted compaction swaps,
reading the schema, checking or rebuilding indexes, and re-validating the unflushed tail.

Owns: the recovery rules. Segments wholly below the recovery point are trusted: only their
indexes are sanity-checked (and rebuilt from the batch headers when missing or wrong). After an
unclean shutdown, every batch from the segment holding the recovery point onwards is decoded and
CRC-checked; the first torn, short or failing batch and everything after it (the rest of its file
and every later segment file) is truncated with a WARNING. After a clean shutdown nothing is
re-validated; a torn tail found while reading the last segment's headers is still truncated.
An aborted-transaction index cannot be rebuilt from its segment alone (it needs the producer
state before it): the index of every re-validated segment, of a trusted segment whose index
fails its sanity check, and of every segment after one of those is emptied and marked
``stale``; the Log rebuilds them by replaying producer state (log.py).
Must not: touch producer state, checkpoints or other partitions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import CorruptRecordError, InvalidRecordError, KafkaStorageError
from logstore.records import BatchHeader, decode_message, schema_message
from logstore.segments.file_cache import OpenFileCache
from logstore.segments.format import (
    CLEANED_SUFFIX,
    CONTINUATION,
    INDEX_SUFFIX,
    PREFIX,
    PREFIX_SIZE,
    SEGMENT_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    TXN_INDEX_SUFFIX,
    fsync_dir,
    parse_file_name,
    unlink_quietly,
)
from logstore.segments.segment import NO_FILE_LIMIT, LogSegment

logger = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 8 * 1024 * 1024


def finish_interrupted_swaps(dir: Path, tp: str) -> None:
    """Complete committed compaction swaps; delete half-written compaction output and temp files.

    The cleaner renames ``X.arrow.cleaned`` to ``X.arrow.swap`` (its commit point), then replaces
    the indexes and renames the swap file over ``X.arrow``. A swap file found here is therefore
    committed data: its offset and time indexes may be stale, so they are deleted and rebuilt
    later; its transaction index cannot be rebuilt from the segment, so the cleaned one (written
    and fsynced before the commit point) is moved into place if it is still waiting."""
    for path in sorted(dir.iterdir()):
        if path.name.endswith(SEGMENT_SUFFIX + SWAP_SUFFIX):
            _complete_swap(dir, path, tp)
    for path in sorted(dir.iterdir()):
        if path.name.endswith((CLEANED_SUFFIX, TMP_SUFFIX)):
            logger.info("%s: deleting leftover %s", tp, path.name)
            unlink_quietly(path)


def _complete_swap(dir: Path, swap: Path, tp: str) -> None:
    final = swap.with_name(swap.name[: -len(SWAP_SUFFIX)])
    logger.warning("%s: completing interrupted compaction swap of %s", tp, final.name)
    stem = final.name[: -len(SEGMENT_SUFFIX)]
    unlink_quietly(dir / (stem + INDEX_SUFFIX))
    unlink_quietly(dir / (stem + TIME_INDEX_SUFFIX))
    cleaned_txn_index = dir / (stem + TXN_INDEX_SUFFIX + CLEANED_SUFFIX)
    if cleaned_txn_index.exists():
        os.replace(cleaned_txn_index, dir / (stem + TXN_INDEX_SUFFIX))
    os.replace(swap, final)
    fsync_dir(dir)


def count_segment_files(dir: Path) -> int:
    """How many segment files ``dir`` holds (0 when it is missing), without opening any."""
    try:
        with os.scandir(dir) as entries:
            return sum(1 for e in entries if e.name.endswith(SEGMENT_SUFFIX))
    except FileNotFoundError:
        return 0


def segment_files_usage(dir: Path) -> tuple[int, int]:
    """(bytes, count) of the segment files in ``dir`` (0, 0 when it is missing), from their
    directory entries: nothing is opened."""
    try:
        with os.scandir(dir) as entries:
            sizes = [e.stat().st_size for e in entries if e.name.endswith(SEGMENT_SUFFIX)]
    except FileNotFoundError:
        return 0, 0
    return sum(sizes), len(sizes)


def segment_base_offsets(dir: Path) -> list[int]:
    """Base offsets of the segment files in ``dir``, ascending; orphan index files are removed."""
    bases, sidecars = set(), []
    for path in dir.iterdir():
        parsed = parse_file_name(path.name)
        if parsed is None:
            continue
        if parsed[1] == SEGMENT_SUFFIX:
            bases.add(parsed[0])
        elif parsed[1] in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            sidecars.append((parsed[0], path))
    for base, path in sidecars:
        if base not in bases:
            unlink_quietly(path)
    return sorted(bases)


def read_schema(dir: Path, bases: list[int], tp: str) -> pa.Schema:
    """The schema in the first segment file whose schema message is intact."""
    for base in bases:
        path = dir / f"{base:020d}{SEGMENT_SUFFIX}"
        try:
            with pa.OSFile(str(path)) as f:
                message = ipc.read_message(f)
            return ipc.read_schema(message)
        except (pa.ArrowInvalid, OSError, EOFError, TypeError):
            logger.warning("%s: no intact schema message in %s", tp, path)
    raise KafkaStorageError(f"{tp}: cannot determine the schema: no segment file in {dir} has "
                            "an intact schema message; reopen with an explicit schema")


def resolve_schema(dir: Path, bases: list[int], schema: pa.Schema | None,
                    tp: str) -> pa.Schema:
    """The schema on disk, checked against ``schema`` when both exist."""
    if not bases:
        if schema is None:
            raise KafkaStorageError(f"{tp}: no segment files in {dir}; creating a log needs a "
                                    "schema")
        return schema
    try:
        found = read_schema(dir, bases, tp)
    except KafkaStorageError:
        if schema is None:
            raise
        return schema
    if schema is not None and not found.equals(schema):
        raise InvalidRecordError(f"{tp}: the log in {dir} has schema {found}, not {schema}")
    return found


def scan_messages(seg: LogSegment, start: int, end: int) -> Iterator[tuple[int, int, ipc.Message]]:
    """(position, length, message) of consecutive complete IPC messages from ``start``; stops
    quietly at the first position where no complete message can be read."""
    position, window = start, SCAN_CHUNK_BYTES
    while position < end:
        n = min(window, end - position)
        buffer = pa.py_buffer(seg.read_at(position, n))
        reader, consumed = pa.BufferReader(buffer), 0
        while consumed < buffer.size:
            try:
                message = ipc.read_message(reader)
            except (pa.ArrowInvalid, OSError, EOFError):
                break
            length = reader.tell() - consumed
            yield position + consumed, length, message
            consumed += length
        if consumed == 0:
            if n == end - position:
                return
            window *= 2
            continue
        position, window = position + consumed, SCAN_CHUNK_BYTES


def _check_batch(message: ipc.Message, length: int, expected: int) -> BatchHeader | str:
    """The header of a message that is a valid next batch of the segment, or why it is not."""
    try:
        header = decode_message(message, verify=True).header
    except CorruptRecordError as e:
        return e.message
    if header.base_offset < expected:
        return f"base offset {header.base_offset} is below the expected {expected}"
    if header.batch_size != length:
        return f"header batch_size {header.batch_size} != message length {length}"
    if header.record_count <= 0 or header.last_offset_delta < header.record_count - 1:
        return f"implausible counts in header {header}"
    return header


def _schema_problem(seg: LogSegment, schema: pa.Schema) -> str | None:
    """Set ``seg.data_start`` from the file's schema message; say why it is unusable, if so."""
    prefix = seg.read_at(0, PREFIX_SIZE)
    if len(prefix) < PREFIX_SIZE:
        return "torn schema message"
    continuation, metadata_len = PREFIX.unpack(prefix)
    if continuation != CONTINUATION or metadata_len <= 0:
        return "no schema message"
    try:
        message = ipc.read_message(pa.py_buffer(seg.read_at(0, PREFIX_SIZE + metadata_len)))
        found = ipc.read_schema(message)
    except (pa.ArrowInvalid, OSError, EOFError, TypeError) as e:
        return f"torn schema message ({e})"
    if not found.equals(schema):
        return f"schema message holds a different schema: {found}"
    seg.data_start = PREFIX_SIZE + metadata_len
    return None


def validate_segment(seg: LogSegment, schema: pa.Schema, index_interval_bytes: int,
                     tp: str) -> bool:
    """Decode and CRC-check every batch, rebuilding the indexes; truncate the file at the first
    bad batch. Returns True when something was truncated."""
    seg.reset_tracking()
    problem = _schema_problem(seg, schema)
    if problem is not None:
        logger.warning("%s: segment file %s: %s; recreating it empty (offset %d onwards is "
                       "lost)", tp, seg.path, problem, seg.base_offset)
        seg.recreate_empty(schema_message(schema))
        _rewrite_indexes(seg)
        return True
    good_end, expected, problem = seg.data_start, seg.base_offset, "torn message"
    for position, length, message in scan_messages(seg, seg.data_start, seg.size):
        checked = _check_batch(message, length, expected)
        if isinstance(checked, str):
            problem = checked
            break
        seg.track_batch(position, checked, index_interval_bytes)
        good_end, expected = position + length, checked.next_offset
    truncated = good_end < seg.size
    if truncated:
        logger.warning("%s: truncating segment file %s at position %d (offset %d, %d bytes "
                       "dropped): %s", tp, seg.path, good_end, expected, seg.size - good_end,
                       problem)
        seg.truncate_file(good_end)
    _rewrite_indexes(seg)
    return truncated


def _rewrite_indexes(seg: LogSegment) -> None:
    seg.offset_index.rewrite()
    seg.time_index.rewrite()


def check_indexes(seg: LogSegment, end_offset: int | None, index_interval_bytes: int,
                  tp: str) -> None:
    """Load the indexes of a trusted segment; rebuild them from the headers when missing or
    inconsistent. Then set the segment's counters from the batches after the last entry."""
    problem = seg.offset_index.load() or seg.offset_index.sanity_check(
        seg.size, seg.data_start, end_offset)
    time_problem = seg.time_index.load() or seg.time_index.sanity_check(end_offset)
    if problem or time_problem:
        level = logging.INFO if problem == "missing" else logging.WARNING
        logger.log(level, "%s: rebuilding indexes of %s: offset index %s, time index %s",
                   tp, seg.path.name, problem or "ok", time_problem or "ok")
        seg.rebuild_indexes(index_interval_bytes)
    else:
        seg.resume_tracking(index_interval_bytes)


def _recovery_start(bases: list[int], recovery_point: int) -> int:
    """Index of the segment holding the recovery point (validation starts there)."""
    start = 0
    for i, base in enumerate(bases):
        if base <= recovery_point:
            start = i
    return start


def load_segments(dir: Path, tp: str, schema: pa.Schema, bases: list[int],
                  index_interval_bytes: int, max_index_bytes: int, recovery_point: int,
                  clean_shutdown: bool, files: OpenFileCache = NO_FILE_LIMIT
                  ) -> list[LogSegment]:
    """Open, check and (after an unclean shutdown) recover the segments named by ``bases``."""
    validate_from = len(bases) if clean_shutdown else _recovery_start(bases, recovery_point)
    segments: list[LogSegment] = []
    for i, base in enumerate(bases):
        seg = LogSegment.open(dir, base, max_index_bytes, files)
        segments.append(seg)
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        if i >= validate_from:
            cut = validate_segment(seg, schema, index_interval_bytes, tp)
        else:
            cut = _load_trusted(seg, next_base, schema, index_interval_bytes, tp)
        _load_txn_index(seg, i >= validate_from or cut, next_base, tp)
        if cut and next_base is not None and i >= validate_from:
            _drop_later_segments(dir, bases[i + 1:], max_index_bytes, tp)
            break
    _spread_staleness(segments)
    if not clean_shutdown:
        for seg in segments[validate_from:]:
            seg.fsync()
            seg.dirty = False
        fsync_dir(dir)
    for seg in segments[:-1]:
        seg.offset_index.close()
        seg.time_index.close()
        seg.sealed = True
    return segments


def _load_txn_index(seg: LogSegment, validated: bool, next_base: int | None, tp: str) -> None:
    """Load the aborted-transaction index of a trusted, unchanged segment; mark it stale when
    the segment was re-validated or the index fails its sanity check."""
    if validated:
        seg.txn_index.mark_stale()
        return
    end = seg.next_offset if next_base is None else next_base
    problem = seg.txn_index.load() or seg.txn_index.sanity_check(end)
    if problem:
        logger.warning("%s: aborted-transaction index of %s is unusable (%s); rebuilding it",
                       tp, seg.path.name, problem)
        seg.txn_index.mark_stale()


def _spread_staleness(segments: list[LogSegment]) -> None:
    """A rebuild replays from a segment onwards, so every index after a stale one is stale."""
    stale = False
    for seg in segments:
        stale = stale or seg.txn_index.stale
        if stale and not seg.txn_index.stale:
            seg.txn_index.mark_stale()


def _load_trusted(seg: LogSegment, next_base: int | None, schema: pa.Schema,
                  index_interval_bytes: int, tp: str) -> bool:
    """Index checks for a segment that is not re-validated. A torn schema message or a header
    that cannot be parsed in the last segment is a torn tail and is truncated (returns True); in
    an earlier segment a bad header is left for reads to report as corruption."""
    problem = _schema_problem(seg, schema)
    if problem is not None:
        expected_start = len(schema_message(schema))
        if seg.size <= expected_start:
            return validate_segment(seg, schema, index_interval_bytes, tp)
        logger.error("%s: segment file %s: %s; reading its batches anyway", tp, seg.path, problem)
        seg.data_start = expected_start
    try:
        check_indexes(seg, next_base, index_interval_bytes, tp)
        return False
    except CorruptRecordError as e:
        if next_base is not None:
            logger.error("%s: %s; reads of this range will fail", tp, e.message)
            seg.next_offset = next_base
            return False
        logger.warning("%s: %s; re-validating the last segment", tp, e.message)
        return validate_segment(seg, schema, index_interval_bytes, tp)


def _drop_later_segments(dir: Path, bases: list[int], max_index_bytes: int, tp: str) -> None:
    for base in bases:
        seg = LogSegment(dir, base, 0, max_index_bytes)
        logger.warning("%s: deleting segment file %s after a truncated segment", tp, seg.path)
        seg.delete()
