"""Reads of the remote tier for fetches below the local log start offset.

Owns: serving one fetch (partition, offset, max_bytes) from the remote segment that holds the
offset: the byte position from the segment's offset index (``RemoteIndexCache``), the bytes
through the ``ChunkCache``, each batch decoded and CRC-checked into the same ``StoredBatch``
the local read path returns; and the bounded thread pool (``remote_log_reader_threads``) those
reads run on, so a slow object store never blocks fetches of local data, and one fetch can read
several partitions' remote segments at once. Must not: import fsspec, decide which segments are
readable (the ``RemoteSegmentLookup``, i.e. the RemoteLogManager, does), or skip anything.

Errors, each naming topic, partition and offset:
- no readable remote segment holds the offset: OffsetOutOfRangeError;
- a batch fails its CRC, cannot be decoded, or does not fit where it lies, an object is
  shorter than recorded, or an object of a FINISHED segment is missing: CorruptRecordError
  (data loss; nothing is skipped: as in a local read, the batches before a corrupt one are
  returned and the read that starts at it fails). A segment deleted by retention while being read is
  OffsetOutOfRangeError instead;
- the object store fails: RemoteStorageError (retriable).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import ApiError, CorruptRecordError, OffsetOutOfRangeError
from logstore.model import TopicPartition
from logstore.records import BatchHeader, StoredBatch, decode_message
from logstore.segments.format import PREFIX_SIZE, SEGMENT_SUFFIX, peek_header
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import segment_key
from logstore.tiering.remote_cache import ChunkCache, RemoteIndexCache
from logstore.tiering.store import ObjectStore, RemoteObjectNotFoundError, RemoteStorageError

logger = logging.getLogger(__name__)


class RemoteSegmentLookup(Protocol):
    """Which readable remote segment holds an offset (RemoteLogManager implements it)."""

    def find_remote_segment(self, tp: TopicPartition, offset: int
                            ) -> RemoteLogSegmentMetadata | None: ...


@dataclass(frozen=True, slots=True)
class RemoteFetchRequest:
    """Like ``Log.read``'s arguments: whole batches from the one holding ``offset``, at most
    ``max_bytes`` (the first regardless when ``min_one``), none at or after ``max_offset``."""

    tp: TopicPartition
    offset: int
    max_bytes: int
    min_one: bool = True
    max_offset: int | None = None


@dataclass(frozen=True, slots=True)
class RemoteFetchResult:
    """CRC-checked batches in offset order, all from ``segment``."""

    tp: TopicPartition
    batches: list[StoredBatch]
    segment: RemoteLogSegmentMetadata

    @property
    def size_bytes(self) -> int:
        return sum(b.header.batch_size for b in self.batches)


class RemoteLogReader:
    """Serves fetches from remote segments on ``threads`` threads."""

    def __init__(self, store: ObjectStore, lookup: RemoteSegmentLookup,
                 index_cache: RemoteIndexCache, chunk_cache: ChunkCache, threads: int) -> None:
        self._store = store
        self._lookup = lookup
        self._indexes = index_cache
        self._chunks = chunk_cache
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="remote-reader")

    def submit(self, request: RemoteFetchRequest) -> Future[RemoteFetchResult]:
        """Read on the pool; the future raises what ``read`` would."""
        return self._pool.submit(self.read, request)

    def read_many(self, requests: Sequence[RemoteFetchRequest]
                  ) -> list[Future[RemoteFetchResult]]:
        """One future per request, read concurrently (one fetch, several partitions)."""
        return [self.submit(r) for r in requests]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def read(self, request: RemoteFetchRequest) -> RemoteFetchResult:
        """Serve ``request`` on the calling thread (see the module docstring for errors)."""
        tp, offset = request.tp, request.offset
        segment = self._lookup.find_remote_segment(tp, offset)
        if segment is None:
            raise OffsetOutOfRangeError(f"{tp}: offset {offset} is in no remote segment")
        try:
            return RemoteFetchResult(tp, self._read_segment(request, segment), segment)
        except RemoteObjectNotFoundError as e:
            self._chunks.forget(segment_key(segment, SEGMENT_SUFFIX))
            if self._lookup.find_remote_segment(tp, offset) != segment:
                raise OffsetOutOfRangeError(f"{tp}: offset {offset}: {segment.describe()} was "
                                            "deleted by retention while being read") from e
            raise CorruptRecordError(f"{tp}: offset {offset}: an object of {segment.describe()}"
                                     f" is missing from the remote tier ({e})") from e
        except RemoteStorageError as e:
            raise RemoteStorageError(f"{tp}: offset {offset}: {e.message}") from e

    def _read_segment(self, request: RemoteFetchRequest,
                      segment: RemoteLogSegmentMetadata) -> list[StoredBatch]:
        """As a local read: a corrupt batch after good ones ends the read early, and the next
        read, which starts at it, raises."""
        reading = _SegmentRead(self._store, self._chunks, request, segment)
        position, expected = self._indexes.locate(segment, request.offset) or (
            reading.data_start(), segment.base_offset)
        batches: list[StoredBatch] = []
        try:
            self._collect(reading, request, segment, position, expected, batches)
        except CorruptRecordError:
            if not batches:
                raise
        return batches

    @staticmethod
    def _collect(reading: _SegmentRead, request: RemoteFetchRequest,
                 segment: RemoteLogSegmentMetadata, position: int, expected: int,
                 batches: list[StoredBatch]) -> None:
        limit = segment.next_offset if request.max_offset is None else min(
            request.max_offset, segment.next_offset)
        budget, first = request.max_bytes, True
        while position < segment.size_bytes and budget > 0:
            header = reading.header_at(position, expected, exact=first)
            first, expected = False, header.next_offset
            if header.base_offset >= limit:
                return
            if header.next_offset > request.offset:
                if header.batch_size > budget and (batches or not request.min_one):
                    return
                batches.append(reading.batch_at(position, header))
                budget -= header.batch_size
            position += header.batch_size


class _SegmentRead:
    """One request's reads of one remote segment object, with its error context."""

    def __init__(self, store: ObjectStore, chunks: ChunkCache, request: RemoteFetchRequest,
                 segment: RemoteLogSegmentMetadata) -> None:
        self._store = store
        self._chunks = chunks
        self._request = request
        self._segment = segment
        self._key = segment_key(segment, SEGMENT_SUFFIX)

    def _bytes(self, start: int, end: int) -> bytes:
        data = self._chunks.read(self._store, self._key, self._segment.size_bytes, start, end)
        if len(data) < min(end, self._segment.size_bytes) - start:
            self._chunks.forget(self._key)
            raise self._corrupt(start, f"the object is shorter than its recorded "
                                       f"{self._segment.size_bytes} bytes")
        return data

    def _corrupt(self, position: int, why: str) -> ApiError:
        return CorruptRecordError(
            f"{self._request.tp}: offset {self._request.offset}: {self._segment.describe()}, "
            f"object {self._key}, position {position}: {why}")

    def data_start(self) -> int:
        """Where the first batch starts: after the schema message (prefix and metadata)."""
        return PREFIX_SIZE + int.from_bytes(self._bytes(4, PREFIX_SIZE), "little", signed=True)

    def header_at(self, position: int, expected: int, exact: bool) -> BatchHeader:
        """The header of the batch at ``position``, whose base offset must be ``expected``
        (``exact``: the offset index says so) or above it (batches only move forward; the base
        offset is outside the CRC, so this is what catches a flip in it)."""
        want = PREFIX_SIZE
        for _ in range(2):
            data = self._bytes(position, position + want)
            try:
                found = peek_header(data, 0)
            except CorruptRecordError as e:
                raise self._corrupt(position, e.message) from e
            if isinstance(found, BatchHeader):
                self._check_place(position, found, expected, exact)
                return found
            want = found
        raise self._corrupt(position, "batch header cut short")

    def _check_place(self, position: int, header: BatchHeader, expected: int,
                     exact: bool) -> None:
        if position + header.batch_size > self._segment.size_bytes:
            raise self._corrupt(position, f"batch at offset {header.base_offset} runs past the "
                                          "segment's end")
        misplaced = header.base_offset != expected if exact else header.base_offset < expected
        if misplaced or header.last_offset > self._segment.end_offset:
            raise self._corrupt(position, f"batch claims offsets [{header.base_offset}, "
                                          f"{header.last_offset}] where offset {expected} "
                                          f"{'is' if exact else 'or later is'} expected")

    def batch_at(self, position: int, header: BatchHeader) -> StoredBatch:
        data = self._bytes(position, position + header.batch_size)
        try:
            message = ipc.read_message(pa.py_buffer(data))
            batch = decode_message(message, verify=True)
        except CorruptRecordError as e:
            raise self._corrupt(position, f"batch at offset {header.base_offset}: "
                                          f"{e.message}") from e
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            raise self._corrupt(position, f"batch at offset {header.base_offset} cannot be "
                                          f"decoded: {e}") from e
        if batch.header != header:
            raise self._corrupt(position, f"batch header changed under the read: {header} then "
                                          f"{batch.header}")
        return batch
