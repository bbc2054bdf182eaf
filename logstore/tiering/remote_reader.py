"""Reads of the remote tier for fetches below the local log start offset.

Owns: serving one fetch (partition, offset, max_bytes) from the remote segment that holds the
offset: the byte position from the segment's offset index (``RemoteIndexCache``), the bytes
through the ``ChunkCache``, each batch decoded and CRC-checked into the same ``StoredBatch``
the local read path returns; and the bounded thread pool (``remote_log_reader_threads``) those
reads run on, so a slow object store never blocks fetches of local data, and one fetch can read
several partitions' remote segments at once; after each read (with ``read_ahead``, as the
broker runs it), a read-ahead of the next
``max_bytes`` of the segment into the chunk cache on the same pool, so that the next fetch of
a consumer reading forward finds its bytes there. Must not: import fsspec, decide which
segments are readable (the ``RemoteSegmentLookup``, i.e. the RemoteLogManager, does), or skip
anything.

``scan_segment`` walks one remote segment's whole batches the same way, CRC-checked, for a
reader that has no broker behind it (a Spark executor): sequential range reads of
``scan_chunk_bytes`` through a private two-chunk cache.

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
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import ApiError, CorruptRecordError, OffsetOutOfRangeError
from logstore.model import TopicPartition
from logstore.records import BatchHeader, StoredBatch, decode_message
from logstore.segments.format import (
    INDEX_SUFFIX,
    PREFIX_SIZE,
    SEGMENT_SUFFIX,
    TXN_INDEX_SUFFIX,
    peek_header,
)
from logstore.segments.txn_index import TxnIndexEntry, collect_entries, parse_entries
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import segment_key
from logstore.tiering.remote_cache import (
    ChunkCache,
    RemoteIndexCache,
    locate,
    parse_offset_index,
)
from logstore.tiering.store import ObjectStore, RemoteObjectNotFoundError, RemoteStorageError

logger = logging.getLogger(__name__)

DEFAULT_SCAN_CHUNK_BYTES = 8 * 1024 * 1024
TXN_INDEXES_KEPT = 256  # parsed remote .txnindex objects kept in memory (they are small)
# A read also peeks at the header of the batch after its last one: read that far ahead too.
READ_AHEAD_SLACK_BYTES = 64 * 1024


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
                 index_cache: RemoteIndexCache, chunk_cache: ChunkCache, threads: int,
                 read_ahead: bool = False) -> None:
        self._store = store
        self._lookup = lookup
        self._indexes = index_cache
        self._chunks = chunk_cache
        self._read_ahead_on = read_ahead
        self._txn_lock = threading.Lock()
        self._txn_cache: OrderedDict[str, list[TxnIndexEntry]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="remote-reader")

    def collect_aborted(self, tp: TopicPartition, start: int, end: int
                        ) -> tuple[list[TxnIndexEntry], bool]:
        """The aborted transactions overlapping ``[start, end)`` that the remote tier knows:
        the uploaded ``.txnindex`` entries of the readable segment holding ``start`` and of
        the segments after it, until an entry proves no later segment can add one (Kafka's
        ``collectAbortedTransactions`` over remote segments); (entries, complete). When not
        complete the caller goes on with the local log's segments (all of them, for the same range).
        A segment copied without a ``.txnindex`` had no aborted transaction; one whose
        metadata says it had one, now missing, is CORRUPT_MESSAGE. This is the seam
        for read_committed fetches of the remote tier."""
        found: list[TxnIndexEntry] = []
        if start >= end:
            return found, True
        offset = start
        # Bounded: every step moves to a later segment. A transaction aborted in the range may
        # have its marker, and so its entry, in any later segment (Kafka goes on until an entry
        # proves completeness), so the search is not bounded by ``end``.
        while (segment := self._lookup.find_remote_segment(tp, offset)) is not None:
            more, complete = collect_entries(self._txn_entries(segment), start, end)
            found += more
            if complete:
                return found, True
            offset = segment.next_offset
        return found, False

    def _txn_entries(self, segment: RemoteLogSegmentMetadata) -> list[TxnIndexEntry]:
        with self._txn_lock:
            cached = self._txn_cache.get(segment.segment_id)
        if cached is not None:
            return cached
        key = segment_key(segment, TXN_INDEX_SUFFIX)
        try:
            entries = parse_entries(self._store.read_object(key))
        except RemoteObjectNotFoundError as e:
            if segment.has_txn_index:
                raise CorruptRecordError(
                    f"{segment.describe()}: its remote transaction index {key} is missing, so "
                    "which of its records were aborted is not known") from e
            entries = []
        except ValueError as e:
            raise CorruptRecordError(f"{segment.describe()}: remote transaction index {key}: "
                                     f"{e}") from e
        with self._txn_lock:
            self._txn_cache[segment.segment_id] = entries
            if len(self._txn_cache) > TXN_INDEXES_KEPT:
                self._txn_cache.popitem(last=False)
        return entries

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
            batches, position = self._read_segment(request, segment)
            self._read_ahead(segment, position, request.max_bytes)
            return RemoteFetchResult(tp, batches, segment)
        except RemoteObjectNotFoundError as e:
            self._chunks.forget(segment_key(segment, SEGMENT_SUFFIX))
            if self._lookup.find_remote_segment(tp, offset) != segment:
                raise OffsetOutOfRangeError(f"{tp}: offset {offset}: {segment.describe()} was "
                                            "deleted by retention while being read") from e
            raise CorruptRecordError(f"{tp}: offset {offset}: an object of {segment.describe()}"
                                     f" is missing from the remote tier ({e})") from e
        except RemoteStorageError as e:
            raise RemoteStorageError(f"{tp}: offset {offset}: {e.message}") from e

    def _read_segment(self, request: RemoteFetchRequest, segment: RemoteLogSegmentMetadata
                      ) -> tuple[list[StoredBatch], int]:
        """The batches, and the position after the last one. As a local read: a corrupt
        batch after good ones ends the read early, and the next read, which starts at it,
        raises."""
        reading = _SegmentRead(self._store, self._chunks, request, segment)
        position, expected = self._indexes.locate(segment, request.offset) or (
            reading.data_start(), segment.base_offset)
        batches: list[StoredBatch] = []
        try:
            position = self._collect(reading, request, segment, position, expected, batches)
        except CorruptRecordError:
            if not batches:
                raise
        return batches, position

    @staticmethod
    def _collect(reading: _SegmentRead, request: RemoteFetchRequest,
                 segment: RemoteLogSegmentMetadata, position: int, expected: int,
                 batches: list[StoredBatch]) -> int:
        limit = segment.next_offset if request.max_offset is None else min(
            request.max_offset, segment.next_offset)
        budget, first = request.max_bytes, True
        while position < segment.size_bytes and budget > 0:
            header = reading.header_at(position, expected, exact=first)
            first, expected = False, header.next_offset
            if header.base_offset >= limit:
                break
            if header.next_offset > request.offset:
                if header.batch_size > budget and (batches or not request.min_one):
                    break
                batches.append(reading.batch_at(position, header))
                budget -= header.batch_size
            position += header.batch_size
        return position

    def _read_ahead(self, segment: RemoteLogSegmentMetadata, position: int,
                    max_bytes: int) -> None:
        """Fetch what a consumer's next read will want (the next ``max_bytes`` from
        ``position`` and the header after them; when that runs past the segment's end, the
        next segment's index and first bytes) into the caches on the pool, so object-store
        reads overlap the time the broker spends sending this read. Errors are left to the
        read that needs the bytes."""
        if not self._read_ahead_on:
            return
        end = min(position + max_bytes + READ_AHEAD_SLACK_BYTES, segment.size_bytes)
        if end > position:
            self._pool.submit(self._prefetch, segment, position, end).add_done_callback(_quiet)
        if position + max_bytes <= segment.size_bytes:
            return
        tp = TopicPartition(segment.partition.topic, segment.partition.partition)
        try:
            following = self._lookup.find_remote_segment(tp, segment.next_offset)
        except ApiError:
            return
        if following is not None and following.base_offset > segment.base_offset:
            self._pool.submit(self._prefetch, following, 0, min(max_bytes, following.size_bytes),
                              True).add_done_callback(_quiet)

    def _prefetch(self, segment: RemoteLogSegmentMetadata, start: int, end: int,
                  index: bool = False) -> None:
        if index:
            self._indexes.locate(segment, segment.base_offset)
        self._chunks.read(self._store, segment_key(segment, SEGMENT_SUFFIX), segment.size_bytes,
                          start, end)


def scan_segment(store: ObjectStore, segment: RemoteLogSegmentMetadata, start_offset: int,
                 end_offset: int, scan_chunk_bytes: int = DEFAULT_SCAN_CHUNK_BYTES
                 ) -> Iterator[StoredBatch]:
    """The CRC-checked batches of ``segment`` holding offsets in ``[start_offset,
    end_offset)``, read straight from ``store`` in sequential ranges; CorruptRecordError
    naming topic, partition and offset for a corrupt batch or a missing object."""
    tp = TopicPartition(segment.partition.topic, segment.partition.partition)
    request = RemoteFetchRequest(tp, start_offset, max_bytes=0)
    reading = _SegmentRead(store, ChunkCache(2 * scan_chunk_bytes, scan_chunk_bytes), request,
                           segment)
    try:
        entries = parse_offset_index(segment, store.read_object(segment_key(segment,
                                                                            INDEX_SUFFIX)))
        position, expected = locate(entries, segment, start_offset) or (
            reading.data_start(), segment.base_offset)
        first = True
        while position < segment.size_bytes:
            header = reading.header_at(position, expected, exact=first)
            first, expected = False, header.next_offset
            if header.base_offset >= end_offset:
                return
            if header.next_offset > start_offset:
                yield reading.batch_at(position, header)
            position += header.batch_size
    except RemoteObjectNotFoundError as e:
        raise CorruptRecordError(f"{tp}: offset {start_offset}: an object of "
                                 f"{segment.describe()} is missing from the remote tier ({e})"
                                 ) from e


def _quiet(future: Future[None]) -> None:
    """A read-ahead's outcome is not needed; its failure shows in the read that needs it."""
    if not future.cancelled() and future.exception() is not None:
        logger.debug("read-ahead failed: %s", future.exception())


class _SegmentRead:
    """One request's reads of one remote segment object, with its error context."""

    def __init__(self, store: ObjectStore, chunks: ChunkCache, request: RemoteFetchRequest,
                 segment: RemoteLogSegmentMetadata) -> None:
        self._store = store
        self._chunks = chunks
        self._request = request
        self._segment = segment
        self._key = segment_key(segment, SEGMENT_SUFFIX)

    def _bytes(self, start: int, end: int) -> memoryview:
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
