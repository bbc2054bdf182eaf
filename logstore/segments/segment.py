"""One segment of a partition's log: a segment file plus its offset, time and aborted-transaction
indexes.

Owns: the segment's file descriptor (at most one per segment, opened by the first I/O and
closed by the log manager's ``OpenFileCache`` when it is among the least recently used; every
I/O pins it, so it is never closed under a ``pread``), appending an encoded batch and indexing
it, locating the batch that holds an offset, reading whole batches with CRC verification,
scanning batch headers, truncating, sealing, fsync, and the lifetime of the descriptor (readers
``acquire`` it so that deleting or swapping a segment never closes a descriptor under a read in
flight; a descriptor the cache closed is reopened by path, after checking that the path still
names this segment's file). Must not: decide when to roll, what to retain, or know about other
segments.

Writers call the mutating methods under the owning Log's lock. Readers call ``read``,
``find_batch`` and ``iter_headers`` without it, bounded by a ``size`` they captured: every byte
below a captured ``size`` was written before ``size`` was published.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import ApiError, CorruptRecordError, LogstoreError
from logstore.records import (
    BatchHeader,
    EncodedBatch,
    StoredBatch,
    decode_message,
    iter_messages,
)
from logstore.segments.file_cache import OpenFileCache
from logstore.segments.format import (
    INDEX_SUFFIX,
    PREFIX_SIZE,
    SEGMENT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    file_name,
    peek_header,
    unlink_quietly,
)
from logstore.segments.index import OffsetIndex, TimeIndex
from logstore.segments.txn_index import TxnIndex

logger = logging.getLogger(__name__)

HEADER_WINDOW_BYTES = 16 * 1024
NO_FILE_LIMIT = OpenFileCache(None)  # for segments opened outside a log manager (tools, tests)
Bytes: TypeAlias = "bytes | bytearray | memoryview | pa.Buffer"


class SegmentClosedError(LogstoreError):
    """The segment was deleted, truncated or swapped under a reader: re-read the log's state.
    Internal to the storage layer; never escapes Log.read."""


class LogSegment:
    """A segment file ``{base_offset:020d}.arrow`` and its sidecar indexes."""

    def __init__(self, dir: Path, base_offset: int, data_start: int, max_index_bytes: int,
                 suffix: str = "", files: OpenFileCache = NO_FILE_LIMIT) -> None:
        self.dir = dir
        self.base_offset = base_offset
        self.data_start = data_start
        self.suffix = suffix
        self.path = dir / (file_name(base_offset, SEGMENT_SUFFIX) + suffix)
        self.offset_index = OffsetIndex(dir / (file_name(base_offset, INDEX_SUFFIX) + suffix),
                                        base_offset, max_index_bytes // 8)
        self.time_index = TimeIndex(dir / (file_name(base_offset, TIME_INDEX_SUFFIX) + suffix),
                                    base_offset, max_index_bytes // 12)
        self.txn_index = TxnIndex(dir / (file_name(base_offset, TXN_INDEX_SUFFIX) + suffix),
                                  base_offset)
        self.size = data_start
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.rolling_base_ms: int | None = None
        self.dirty = False
        self.sealed = False
        self._bytes_since_index = 0
        self._index_sync_pending = False
        self._files = files
        self._fd: int | None = None
        self._file_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we own
        self._refs = 0
        self._closing = False
        self._state_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls, dir: Path, base_offset: int, schema_bytes: bytes, max_index_bytes: int,
               suffix: str = "", files: OpenFileCache = NO_FILE_LIMIT,
               empty_dir: bool = False) -> LogSegment:
        """A new, empty segment file holding only the schema message. Stale index files of
        the same base offset are removed first, unless ``dir`` was made just now."""
        seg = cls(dir, base_offset, len(schema_bytes), max_index_bytes, suffix, files)
        if not empty_dir:
            seg.offset_index.delete()
            seg.time_index.delete()
            seg.txn_index.delete()
        fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        stat = os.fstat(fd)
        seg._fd, seg._file_id = fd, (stat.st_dev, stat.st_ino)
        files.used(seg)
        seg._write_at(schema_bytes, 0)
        seg.dirty = True
        return seg

    @classmethod
    def open(cls, dir: Path, base_offset: int, max_index_bytes: int,
             files: OpenFileCache = NO_FILE_LIMIT) -> LogSegment:
        """An existing segment file; recovery sets ``data_start``, the indexes and counters.
        The descriptor is opened by the first I/O."""
        seg = cls(dir, base_offset, 0, max_index_bytes, files=files)
        stat = os.stat(seg.path)
        seg.size, seg._file_id = stat.st_size, (stat.st_dev, stat.st_ino)
        return seg

    def acquire(self) -> None:
        """Hold the descriptor open until ``release`` (reopening it if the file cache closed
        it); raises SegmentClosedError if the segment was closed, deleted or replaced."""
        self._pin()

    def release(self) -> None:
        self._unpin()

    def _pin(self) -> int:
        with self._state_lock:
            if self._closing:
                raise SegmentClosedError(str(self.path))
            fd = self._fd if self._fd is not None else self._reopen()
            self._refs += 1
        self._files.used(self)
        return fd

    def _unpin(self) -> None:
        with self._state_lock:
            self._refs -= 1
            idle = self._refs == 0
            if idle and self._closing:
                self._close_fd()
        if idle:
            self._files.released()

    def _reopen(self) -> int:
        """Under the state lock: open the file again, refusing one that is not ours any more
        (the cleaner renames a cleaned copy over the path before it closes this segment)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise SegmentClosedError(f"{self.path} is gone") from None
        stat = os.fstat(fd)
        if self._file_id is not None and self._file_id != (stat.st_dev, stat.st_ino):
            os.close(fd)
            raise SegmentClosedError(f"{self.path} was replaced")
        self._fd, self._file_id = fd, (stat.st_dev, stat.st_ino)
        return fd

    def evict_fd(self) -> bool:
        """For the file cache: close the descriptor (it reopens on the next use) unless an I/O
        holds it; then it stays counted as open, unless the segment is closing (the last
        release closes it)."""
        with self._state_lock:
            if self._refs > 0:
                if not self._closing:
                    self._files.keep(self)
                return False
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return True

    def close(self) -> None:
        """Close the descriptor now, or when the last reader releases it."""
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        with self._state_lock:
            self._closing = True
            if self._refs == 0:
                self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._files.forget(self)

    def delete(self) -> None:
        """Remove the files; readers holding the descriptor keep reading the unlinked file."""
        self.close()
        for path in (self.path, self.offset_index.path, self.time_index.path,
                     self.txn_index.path):
            unlink_quietly(path)

    @property
    def is_empty(self) -> bool:
        return self.size <= self.data_start

    @property
    def has_open_fd(self) -> bool:
        return self._fd is not None

    def __repr__(self) -> str:
        return f"LogSegment({self.path.name}, size={self.size}, next_offset={self.next_offset})"

    # -- raw I/O (each pins the descriptor for its duration) -------------------------------

    def _write_at(self, data: Bytes | EncodedBatch, position: int) -> None:
        """Write ``data`` at ``position``; an EncodedBatch's two parts with one pwritev."""
        parts = [memoryview(data.prefix), memoryview(data.body)] if isinstance(
            data, EncodedBatch) else [memoryview(data)]
        fd = self._pin()
        try:
            while parts:
                written = os.pwritev(fd, parts, position)
                position += written
                while parts and written >= len(parts[0]):
                    written -= len(parts[0])
                    parts.pop(0)
                if parts:
                    parts[0] = parts[0][written:]
        finally:
            self._unpin()

    def read_at(self, position: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``position`` (fewer only at the end of the file)."""
        fd = self._pin()
        try:
            data = os.pread(fd, length, position)
            while len(data) < length:
                more = os.pread(fd, length - len(data), position + len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            self._unpin()

    def fsync(self) -> None:
        """fsync the segment file, and the index files once after sealing (the caller holds a
        reference)."""
        try:
            fd = self._pin()
        except SegmentClosedError:
            return  # closed or deleted: nothing of it needs to be durable any more
        try:
            os.fsync(fd)
        finally:
            self._unpin()
        if self._index_sync_pending:
            self._index_sync_pending = False
            for path in (self.offset_index.path, self.time_index.path, self.txn_index.path):
                _fsync_path(path)

    def flush_indexes(self) -> None:
        self.offset_index.flush()
        self.time_index.flush()

    def recreate_empty(self, schema_bytes: bytes) -> None:
        """Replace the file's content with just a schema message (recovery of a torn one)."""
        self.txn_index.mark_stale()
        self.truncate_file(0)
        self._write_at(schema_bytes, 0)
        self.data_start = self.size = len(schema_bytes)

    def truncate_file(self, size: int) -> None:
        fd = self._pin()
        try:
            os.ftruncate(fd, size)
        finally:
            self._unpin()
        self.size = size
        self.dirty = True

    # -- appending and indexing ------------------------------------------------------------

    def append(self, data: Bytes | EncodedBatch, header: BatchHeader, index_interval_bytes: int,
               now_ms: int) -> None:
        """Write one encoded batch at the end of the file and index it."""
        position = self.size
        self._write_at(data, position)
        if self.rolling_base_ms is None:
            self.rolling_base_ms = now_ms
        self.track_batch(position, header, index_interval_bytes)
        self.dirty = True
        self.size = position + len(data)

    def track_batch(self, position: int, header: BatchHeader, index_interval_bytes: int) -> None:
        """Account for a batch at ``position`` (appended, or found by a scan) in the counters
        and the indexes: an index entry for the first batch and then every
        ``index_interval_bytes``; a time entry at those points when the max timestamp rose."""
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.base_offset
        if len(self.offset_index) == 0 or self._bytes_since_index >= index_interval_bytes:
            self.offset_index.append(header.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += header.batch_size
        self.next_offset = header.next_offset

    def seal(self) -> None:
        """The segment will take no more appends: index its max timestamp and write the indexes
        out; the next flush fsyncs them (no fsync here: the caller holds the log's lock)."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        self.sealed = True
        self.dirty = True
        self._index_sync_pending = True

    @property
    def written_ms(self) -> int:
        """When the segment was last written, as its file's modification time records it
        (``stamp_written`` sets it on the log's clock when the log rolls the segment);
        SegmentClosedError when retention deleted the file."""
        try:
            return os.stat(self.path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            raise SegmentClosedError(f"{self.path} is gone") from None

    def stamp_written(self, ms: int) -> None:
        """Record ``ms`` as the time the segment was last written (its file's modification
        time: it survives restarts and the cleaner's swaps)."""
        os.utime(self.path, ns=(ms * 1_000_000, ms * 1_000_000))

    def reset_tracking(self) -> None:
        """Forget the indexes and counters before a rescan."""
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self._bytes_since_index = 0

    def resume_tracking(self, index_interval_bytes: int) -> None:
        """Set the counters of a segment whose indexes were loaded and found sane, by scanning
        only the batches from its last offset-index entry on (the time index covers the rest)."""
        self.max_timestamp = self.time_index.max_timestamp
        last_time_offset = self.time_index.last_offset
        self.offset_of_max_timestamp = (
            self.base_offset if last_time_offset is None else last_time_offset)
        self.next_offset = self.base_offset
        start = self.offset_index.last_position
        if start is None:
            return
        for position, header in self.iter_headers(start, self.size):
            if position != start:
                self.track_batch(position, header, index_interval_bytes)
                continue
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.base_offset
            self._bytes_since_index = header.batch_size
            self.next_offset = header.next_offset

    def rebuild_indexes(self, index_interval_bytes: int) -> None:
        """Re-derive both indexes and the counters from the batch headers in the file."""
        self.reset_tracking()
        for position, header in self.iter_headers(self.data_start, self.size):
            self.track_batch(position, header, index_interval_bytes)
        self.offset_index.rewrite()
        self.time_index.rewrite()

    def truncate_to(self, offset: int, index_interval_bytes: int) -> int | None:
        """Drop every batch whose last offset is >= ``offset`` (and the aborted transactions whose
        markers go with them); returns the base offset of the first dropped batch, or None when
        nothing was dropped."""
        found = self.find_batch(offset, self.size)
        if found is None:
            return None
        position, header = found
        self.truncate_file(position)
        self.txn_index.truncate_to(header.base_offset)
        self.rebuild_indexes(index_interval_bytes)
        if self.is_empty:
            self.rolling_base_ms = None
        self.sealed = False
        return header.base_offset

    # -- scanning and reading --------------------------------------------------------------

    def iter_headers(self, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch between ``start`` and ``end`` (a batch boundary),
        reading windows of HEADER_WINDOW_BYTES. Raises CorruptRecordError naming the file and
        position at a header that cannot be parsed or a batch that runs past ``end``."""
        position, window, window_start = start, b"", start
        while position < end:
            at = position - window_start
            result = self._peek(window, at, position) if at < len(window) else PREFIX_SIZE
            if isinstance(result, int):
                want = min(max(result, HEADER_WINDOW_BYTES), end - position)
                window, window_start = self.read_at(position, want), position
                if len(window) < want:
                    raise SegmentClosedError(f"{self.path} shrank under a scan")
                result = self._peek(window, 0, position)
                if isinstance(result, int):
                    raise self._corrupt(position, f"batch header cut short at byte {end}")
            if position + result.batch_size > end:
                raise self._corrupt(position, f"batch of {result.batch_size} bytes at offset "
                                              f"{result.base_offset} runs past byte {end}")
            yield position, result
            position += result.batch_size

    def _peek(self, window: bytes, at: int, position: int) -> BatchHeader | int:
        try:
            return peek_header(window, at)
        except CorruptRecordError as e:
            raise self._corrupt(position, e.message) from e

    def _corrupt(self, position: int, why: str) -> ApiError:
        return CorruptRecordError(f"segment file {self.path}, position {position}: {why}")

    def find_batch(self, offset: int, end: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch below ``end`` whose last offset is >= offset."""
        start = self.offset_index.lookup(offset)
        for position, header in self.iter_headers(start or self.data_start, end):
            if header.next_offset > offset:
                return position, header
        return None

    def read(self, offset: int, max_bytes: int, limit_offset: int,
             min_one: bool) -> tuple[list[StoredBatch], bool]:
        """Whole batches from the one holding ``offset``: at most ``max_bytes`` (but the first
        batch regardless when ``min_one``), none whose base offset is >= ``limit_offset``.
        Returns the batches and whether the segment's end was reached."""
        end = self.size
        found = self.find_batch(offset, end)
        if found is None:
            return [], True
        position, first = found
        if first.base_offset >= limit_offset:
            return [], False
        want = min(max_bytes, end - position)
        if first.batch_size > want:
            if not min_one:
                return [], False
            want = first.batch_size
        data = self.read_at(position, want)
        if len(data) < want:
            raise SegmentClosedError(f"{self.path} shrank under a read")
        batches, consumed, stopped = self._decode_chunk(data, position, first, limit_offset)
        return batches, not stopped and position + consumed >= end

    def _decode_chunk(self, data: bytes, position: int, first: BatchHeader,
                      limit_offset: int) -> tuple[list[StoredBatch], int, bool]:
        """Decode and CRC-check the complete batches in ``data`` (read at ``position``). A
        corrupt batch after good ones ends the chunk early: the next read, which starts at it,
        raises."""
        buffer = pa.py_buffer(data)
        batches: list[StoredBatch] = []
        consumed, expected = 0, first.base_offset
        try:
            for at, message in iter_messages(buffer):
                batch = self._decode(message, position + at, expected)
                if batch.header.base_offset >= limit_offset:
                    return batches, consumed, True
                batches.append(batch)
                consumed = at + batch.header.batch_size
                expected = batch.header.next_offset
            if consumed < len(data):
                self._check_tail(data, consumed, position, expected)
        except CorruptRecordError:
            if not batches:
                raise
            return batches, consumed, True
        return batches, consumed, False

    def _decode(self, message: ipc.Message, position: int, expected: int) -> StoredBatch:
        try:
            batch = decode_message(message, verify=True)
        except CorruptRecordError as e:
            raise self._corrupt(position, f"batch at offset {expected}: {e.message}") from e
        if batch.header.base_offset < expected or (
                batch.header.batch_size != PREFIX_SIZE + message.metadata.size + message.body.size):
            raise self._corrupt(position, f"batch header {batch.header} does not fit its place "
                                          f"(expected offset >= {expected})")
        return batch

    def _check_tail(self, data: bytes, at: int, position: int, expected: int) -> None:
        """The bytes after the last decodable message of a chunk must be a message cut off by the
        chunk's end; a complete but undecodable message is corruption."""
        header = self._peek(data, at, position + at)
        if isinstance(header, BatchHeader) and at + header.batch_size <= len(data):
            raise self._corrupt(position + at, f"batch at offset {expected} cannot be decoded")

    def read_batch_at(self, position: int, header: BatchHeader) -> StoredBatch:
        """The whole, CRC-checked batch whose header was found at ``position``."""
        data = self.read_at(position, header.batch_size)
        if len(data) < header.batch_size:
            raise SegmentClosedError(f"{self.path} shrank under a read")
        try:
            message = ipc.read_message(pa.py_buffer(data))
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            raise self._corrupt(position, f"batch at offset {header.base_offset}: {e}") from e
        return self._decode(message, position, header.base_offset)


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
