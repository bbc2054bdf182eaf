"""Read-only access to one partition directory's segment files, from another process.

Owns: finding the segments that hold an offset range, memory-mapping them and yielding their
CRC-checked batches without copying a body. It is how a Spark executor on the broker's machine
reads committed data straight from disk (layouts in format.py). Must not: write, lock, recover or
take anything from a live Log; it trusts only what it can check in the files themselves.

Why this is safe while the broker appends, rolls, deletes and compacts:
- a caller reads only below a high watermark it learnt earlier, and every byte below the high
  watermark was written (to the page cache) before the high watermark moved past it;
- an opened file keeps its inode: a segment deleted by retention or replaced by compaction
  (an atomic rename) after it was mapped is still read whole and consistently;
- the offset index is only a hint: the batch found there is checked (header magic, offsets) and
  on any doubt the scan starts at the segment's first batch.
A segment that vanished before it was opened, or a range the files no longer hold, raises
``OffsetOutOfRangeError`` naming the partition and offsets; the caller decides what that means.

read_committed (``read_committed``): the caller gives the last stable offset it learnt from the
leader; the read stops there and drops control batches and the batches of aborted transactions
with txn_filter's filter, fed from the ``.txnindex`` files. Every abort below that LSO is in
those files (the broker writes an entry as soon as its marker is appended, before the LSO can
pass it). The index is read before the data: compaction only ever removes entries whose
transaction's data is already gone, and each entry carries its marker's offset, so a marker
removed in between cannot make the filter drop later committed data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import CorruptRecordError, OffsetOutOfRangeError
from logstore.records import StoredBatch, decode_message
from logstore.segments.format import (
    INDEX_SUFFIX,
    OFFSET_ENTRY,
    SEGMENT_SUFFIX,
    TXN_INDEX_SUFFIX,
    file_name,
    parse_file_name,
    peek_header,
)
from logstore.segments.txn_index import TxnIndexEntry, collect_aborted, parse_entries
from logstore.txn_filter import ReadCommittedFilter, is_abort_marker

logger = logging.getLogger(__name__)

FILTER_CHUNK_BATCHES = 64  # batches filtered together by read_committed


class PartitionFiles:
    """The segment files of one partition directory, read-only."""

    def __init__(self, path: str | os.PathLike[str], verify_crc: bool = True) -> None:
        self.path = Path(path)
        self.verify_crc = verify_crc

    def base_offsets(self) -> list[int]:
        """Base offsets of the segment files present now, ascending."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            raise OffsetOutOfRangeError(f"partition directory {self.path} is gone") from None
        found = (parse_file_name(n) for n in names)
        return sorted(f[0] for f in found if f is not None and f[1] == SEGMENT_SUFFIX)

    def read(self, start: int, end: int) -> Iterator[tuple[pa.Schema, StoredBatch]]:
        """(schema, batch) for every batch holding an offset in [start, end), in offset order.
        Raises OffsetOutOfRangeError when the files do not hold the whole range."""
        if start >= end:
            return
        bases = self.base_offsets()
        first = _segment_for(bases, start)
        if first is None:
            oldest = bases[0] if bases else "none"
            raise OffsetOutOfRangeError(
                f"{self.path}: offset {start} is below the oldest segment (base offset {oldest})")
        position = start
        for base in bases[first:]:
            if base >= end:
                break
            for schema, batch in self._read_segment(base, position, end):
                position = batch.header.next_offset
                yield schema, batch
            if position >= end:
                return
        if position < end and bases[-1] < end:  # a gap before a later segment is compaction's
            raise OffsetOutOfRangeError(
                f"{self.path}: the segment files end at offset {position}, before {end}")

    def read_committed(self, start: int, end: int, last_stable_offset: int
                       ) -> Iterator[tuple[pa.Schema, StoredBatch]]:
        """(schema, batch) for the batches a read_committed reader keeps in [start, end) below
        ``last_stable_offset``: no control batch, none of an aborted transaction. Raises as
        ``read`` does."""
        end = min(end, last_stable_offset)
        if start >= end:
            return
        committed = ReadCommittedFilter(
            [entry.aborted_txn() for entry in self.aborted_transactions(start, end)])
        chunk: list[tuple[pa.Schema, StoredBatch]] = []
        for item in self.read(start, end):
            chunk.append(item)
            if len(chunk) >= FILTER_CHUNK_BATCHES:
                yield from _kept(committed, chunk)
                chunk = []
        yield from _kept(committed, chunk)

    def aborted_transactions(self, start: int, end: int) -> list[TxnIndexEntry]:
        """The aborted transactions overlapping [start, end), from the ``.txnindex`` files."""
        bases = self.base_offsets()
        first = _segment_for(bases, start) or 0
        return collect_aborted((self._txn_entries(base) for base in bases[first:]), start, end)

    def _txn_entries(self, base: int) -> list[TxnIndexEntry]:
        try:
            data = (self.path / file_name(base, TXN_INDEX_SUFFIX)).read_bytes()
        except FileNotFoundError:
            return []  # no abort in that segment, or the segment is gone (read() says so)
        return parse_entries(data, tolerate_torn_tail=True)

    def _read_segment(self, base: int, start: int, end: int
                      ) -> Iterator[tuple[pa.Schema, StoredBatch]]:
        path = self.path / file_name(base, SEGMENT_SUFFIX)
        try:
            source = pa.memory_map(str(path), "r")
        except FileNotFoundError:
            raise OffsetOutOfRangeError(
                f"{path} was deleted (retention or compaction) before offset {start} was read"
            ) from None
        with source:
            buffer = source.read_buffer()
            reader = pa.BufferReader(buffer)
            schema = ipc.read_schema(ipc.read_message(reader))
            data_start = reader.tell()
            position = self._hint(base, start, buffer, data_start)
            yield from self._scan(path, buffer, position, start, end, schema)

    def _scan(self, path: Path, buffer: pa.Buffer, position: int, start: int, end: int,
              schema: pa.Schema) -> Iterator[tuple[pa.Schema, StoredBatch]]:
        reader = pa.BufferReader(buffer)
        reader.seek(position)
        while reader.tell() < buffer.size:
            at = reader.tell()
            try:
                message = ipc.read_message(reader)
                batch = decode_message(message, verify=self.verify_crc)
            except (pa.ArrowInvalid, OSError, EOFError) as e:
                # Every batch holding an offset below `end` was whole before the caller learnt
                # `end` (and a tail being written lies past it, never read: see below), so an
                # unreadable message here is damage, not the end of the segment.
                raise CorruptRecordError(f"segment file {path}, position {at}: unreadable "
                                         f"message before offset {end} ({e})") from None
            except CorruptRecordError as e:
                raise CorruptRecordError(f"segment file {path}, position {at}: {e.message}"
                                         ) from None
            if batch.header.base_offset >= end:
                return
            if batch.header.next_offset > start:
                yield schema, batch
            if batch.header.next_offset >= end:
                return  # offsets only grow: nothing after this batch is in the range

    def _hint(self, base: int, offset: int, buffer: pa.Buffer, data_start: int) -> int:
        """A byte position at or before the batch holding ``offset``, from the offset index
        when its entry checks out, else the first batch."""
        try:
            raw = (self.path / file_name(base, INDEX_SUFFIX)).read_bytes()
        except FileNotFoundError:
            return data_start
        usable = len(raw) - len(raw) % OFFSET_ENTRY.size
        entries = np.frombuffer(raw[:usable], dtype=[("k", "<i4"), ("v", "<i4")])
        i = int(np.searchsorted(entries["k"], offset - base, side="right")) - 1
        if i < 0:
            return data_start
        position = int(entries["v"][i])
        if not data_start <= position < buffer.size:
            return data_start  # a garbage entry; peek_header would wrap a negative position
        try:
            header = peek_header(memoryview(buffer), position)
        except CorruptRecordError:
            return data_start
        if isinstance(header, int) or header.base_offset != base + int(entries["k"][i]):
            return data_start
        return position


def _kept(committed: ReadCommittedFilter, chunk: list[tuple[pa.Schema, StoredBatch]]
          ) -> Iterator[tuple[pa.Schema, StoredBatch]]:
    markers = [is_abort_marker(b.header, partial(b.record_batch, schema)) for schema, b in chunk]
    mask = committed.keep([b.header for _, b in chunk], markers)
    for item, kept in zip(chunk, mask, strict=True):
        if kept:
            yield item


def _segment_for(bases: list[int], offset: int) -> int | None:
    """Index of the last segment whose base offset is <= ``offset``."""
    i = int(np.searchsorted(np.asarray(bases, dtype=np.int64), offset, side="right")) - 1
    return i if i >= 0 else None
