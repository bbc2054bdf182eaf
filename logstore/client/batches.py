"""The producer's units of work: records gathered by ``send()`` and batches on the wire.

A ``RecordChunk`` collects per-record sends for one topic as two growing lists, keys and values
(a list append is the cheapest thing Python can do per record; no per-record tuple); the rarer
fields (partition, timestamp, headers) go to a side table keyed by row, only for the records
that set them. The drainer turns a whole chunk into Arrow arrays at once (``record_arrays.py``)
and cuts it into ``ProducerBatch`` es, each one partition's records encoded as the message sent
(``pieces.py``). A future is a two-slot object pointing into its chunk. Must not: do I/O.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.errors import ApiError, RequestTimedOutError
from logstore.model import RecordMetadata, TopicPartition

# What a record costs in Arrow beyond its key, value and headers: the offsets of its key,
# value and headers, and its timestamp.
RECORD_OVERHEAD = 20


class RecordChunk:
    """Records sent one at a time to one topic, waiting to be turned into Arrow batches."""

    __slots__ = ("topic", "keys", "values", "nbytes", "max_bytes", "extras", "generation",
                 "created", "done", "partitions", "offsets", "timestamps", "_own_timestamps",
                 "error", "errors", "error_index", "_pending", "_lock")

    def __init__(self, topic: str, generation: int = 0, max_bytes: int = 1 << 20) -> None:
        self.topic = topic
        self.generation = generation  # the sender's generation when the chunk was started
        self.keys: list[bytes | None] = []
        self.values: list[Any] = []
        # The records' bytes in Arrow, about: keys, values, headers (a typed value's
        # estimated) and RECORD_OVERHEAD each. Counted against buffer_memory once handed to
        # the drainer; the chunk is full at max_bytes (the producer's batch_size).
        self.nbytes = 0
        self.max_bytes = max_bytes
        # row -> (partition, timestamp_ms, headers), for the records that set any of them
        self.extras: dict[int, tuple[int | None, int | None, Any]] = {}
        self.created = time.monotonic()  # then the first record's time: its linger starts
        self.done = threading.Event()
        self.partitions: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        self.timestamps: np.ndarray | None = None
        self._own_timestamps = False  # timestamps is shared with the chunk's Arrow batch
        self.error: ApiError | None = None  # the whole chunk failed before it was split
        self.errors: list[ApiError] = []  # failures of single pieces ...
        self.error_index: np.ndarray | None = None  # ... and which rows each one hit
        self._pending = 0
        self._lock = threading.Lock()

    def expect(self, batches: int, partitions: np.ndarray, timestamps: np.ndarray) -> None:
        self._pending = batches
        self.partitions = partitions
        self.timestamps = timestamps
        self.offsets = np.full(len(partitions), -1, dtype=np.int64)
        self.error_index = np.full(len(partitions), -1, dtype=np.int32)

    def batch_done(self, rows: np.ndarray, base_offset: int, error: ApiError | None,
                   log_append_time: int = -1) -> None:
        """One piece (one partition's rows) is acknowledged or failed; only its rows see it.
        A topic with LogAppendTime gives its records the broker's ``log_append_time``, and
        their metadata says so (as in Kafka)."""
        with self._lock:
            if error is not None and self.error_index is not None:
                self.error_index[rows] = len(self.errors)
                self.errors.append(error)
            elif base_offset >= 0 and self.offsets is not None:
                self.offsets[rows] = base_offset + np.arange(len(rows))
                if log_append_time >= 0 and self.timestamps is not None:
                    if not self._own_timestamps:  # the batch's column lies over it: copy
                        self.timestamps = self.timestamps.copy()
                        self._own_timestamps = True
                    self.timestamps[rows] = log_append_time
            self._pending -= 1
            if self._pending <= 0:
                self.done.set()

    def fail(self, error: ApiError) -> None:
        self.error = error
        self.done.set()


class FutureRecordMetadata:
    """The outcome of one ``send()``: ``result(timeout)`` returns RecordMetadata or raises."""

    __slots__ = ("_chunk", "_index")

    def __init__(self, chunk: RecordChunk, index: int) -> None:
        self._chunk = chunk
        self._index = index

    def done(self) -> bool:
        return self._chunk.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        chunk = self._chunk
        if not chunk.done.wait(timeout):
            raise RequestTimedOutError(f"record {self._index} to {chunk.topic!r} not "
                                       f"acknowledged within {timeout} s")
        if chunk.error is not None:
            raise chunk.error
        if chunk.error_index is not None and chunk.error_index[self._index] >= 0:
            raise chunk.errors[chunk.error_index[self._index]]
        assert chunk.partitions is not None and chunk.offsets is not None
        assert chunk.timestamps is not None
        i = self._index
        return RecordMetadata(chunk.topic, int(chunk.partitions[i]), int(chunk.offsets[i]),
                              int(chunk.timestamps[i]))

    def exception(self, timeout: float | None = None) -> ApiError | None:
        try:
            self.result(timeout)
        except ApiError as e:
            return e
        return None

    get = result


@dataclass(frozen=True, slots=True)
class BatchRecordMetadata:
    """Where one partition's share of a ``send_batch`` landed."""

    topic: str
    partition: int
    base_offset: int
    record_count: int


class FutureBatchMetadata:
    """The outcome of one ``send_batch()``: a list of BatchRecordMetadata, one per piece. Pieces
    are added while the batch is cut (``add_piece``); ``seal`` says there are no more."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.pieces = 0  # added so far (none: nothing of the batch was queued)
        self._pending = 0
        self._sealed = False
        self._results: list[BatchRecordMetadata] = []
        self._error: ApiError | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()

    def add_piece(self) -> None:
        with self._lock:
            self.pieces += 1
            self._pending += 1

    def seal(self) -> None:
        with self._lock:
            self._sealed = True
            if self._pending <= 0:
                self._done.set()

    def piece_done(self, partition: int, base_offset: int, count: int,
                   error: ApiError | None) -> None:
        with self._lock:
            if error is not None:
                self._error = self._error or error
            else:
                self._results.append(BatchRecordMetadata(self.topic, partition, base_offset,
                                                         count))
            self._pending -= 1
            if self._sealed and self._pending <= 0:
                self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[BatchRecordMetadata]:
        if not self._done.wait(timeout):
            raise RequestTimedOutError(f"batch to {self.topic!r} not acknowledged within "
                                       f"{timeout} s")
        if self._error is not None:
            raise self._error
        return sorted(self._results, key=lambda r: (r.partition, r.base_offset))


@dataclass(eq=False)
class ProducerBatch:
    """One partition's records on their way to the leader, as the encoded message sent
    (``produced.encode_produced``); retried whole, in order."""

    tp: TopicPartition
    message: pa.Buffer
    record_count: int
    order: int
    deadline: float
    chunk: RecordChunk | None = None
    rows: np.ndarray | None = None
    batch_future: FutureBatchMetadata | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attempts: int = 0
    epoch_refusals: int = 0  # attempts refused for a stale leader epoch (not counted as retries)
    last_error: ApiError | None = None  # why its last attempt failed (named if it expires)
    not_before: float = 0.0
    sent_at: float = 0.0
    nbytes: int = field(default=0)
    generation: int = 0  # the sender's generation it was queued in (an abort moves it on)
    # The topic it was encoded for (metadata's topic id) and the schema it was encoded with:
    # the sender checks them against the topic's current ones before each attempt.
    topic_id: str | None = None
    schema: pa.Schema | None = None

    def __post_init__(self) -> None:
        self.nbytes = int(self.message.size)

    def complete(self, base_offset: int, error: ApiError | None = None,
                 log_append_time: int = -1) -> None:
        if self.chunk is not None and self.rows is not None:
            self.chunk.batch_done(self.rows, base_offset, error, log_append_time)
        if self.batch_future is not None:
            self.batch_future.piece_done(self.tp.partition, base_offset, self.record_count,
                                         error)
