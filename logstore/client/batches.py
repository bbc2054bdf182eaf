"""The producer's units of work: records gathered by ``send()`` and batches on the wire.

A ``RecordChunk`` collects per-record sends for one topic as two growing lists, keys and values
(a list append is the cheapest thing Python can do per record; no per-record tuple); the rarer
fields (partition, timestamp, headers) go to a side table keyed by row, only for the records
that set them. The drainer turns a whole chunk into Arrow arrays at once (``record_arrays.py``)
and cuts it into ``ProducerBatch`` es, each one partition's records encoded as the message sent
(``pieces.py``). A future is a two-slot object pointing into its chunk.

A record's future completes when its piece does (the chunk's other partitions may still be on
their way). Delivery callbacks (``callbacks.py``) are kept on the chunk, in a dict made by the
first one registered (``send()`` pays nothing for them), and run on the thread completing the
piece, row by row: a partition's pieces complete in order, so its records' callbacks run in
send order. The chunk's ``done`` is set after the callbacks ran, so a flush returns only once
they have. Must not: do I/O.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from logstore.client.callbacks import CallbackFuture, DeliveryCallback, run_callbacks
from logstore.errors import ApiError, RequestTimedOutError
from logstore.model import RecordMetadata, TopicPartition

# What a record costs in Arrow beyond its key, value and headers: the offsets of its key,
# value and headers, and its timestamp.
RECORD_OVERHEAD = 20


class RecordChunk:
    """Records sent one at a time to one topic, waiting to be turned into Arrow batches."""

    __slots__ = ("topic", "keys", "values", "nbytes", "max_bytes", "extras", "generation",
                 "created", "done", "partitions", "offsets", "timestamps", "_own_timestamps",
                 "error", "errors", "error_index", "settled", "callbacks", "_pending",
                 "_lock")

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
        self.settled: np.ndarray | None = None  # rows whose piece is done (acked or failed)
        # row -> its future and the callbacks registered on it; None until the first one
        self.callbacks: dict[int, _Registered] | None = None
        self._pending = 0
        self._lock = threading.Lock()

    def expect(self, batches: int, partitions: np.ndarray, timestamps: np.ndarray) -> None:
        self._pending = batches
        self.partitions = partitions
        self.timestamps = timestamps
        self.offsets = np.full(len(partitions), -1, dtype=np.int64)
        self.error_index = np.full(len(partitions), -1, dtype=np.int32)
        self.settled = np.zeros(len(partitions), dtype=np.bool_)

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
            if self.settled is not None:
                self.settled[rows] = True
            self._pending -= 1
            finished = self._pending <= 0
            due = self._take_callbacks(rows) if self.callbacks else None
        if due:
            _run_registered(due)
        if finished:
            self.done.set()

    def fail(self, error: ApiError) -> None:
        """The whole chunk failed before it was sent: every record not failed alone yet."""
        with self._lock:
            self.error = error
            due = [self.callbacks[row] for row in sorted(self.callbacks)] \
                if self.callbacks else None
            self.callbacks = None
        if due:
            _run_registered(due)
        self.done.set()

    def register(self, index: int, future: FutureRecordMetadata,
                 callback: DeliveryCallback) -> bool:
        """Keep ``callback`` until row ``index`` completes; False if it has already."""
        with self._lock:
            if self.error is not None or self.done.is_set() or \
                    self.settled is not None and self.settled[index]:
                return False
            if self.callbacks is None:
                self.callbacks = {}
            entry = self.callbacks.get(index)
            if entry is None:
                self.callbacks[index] = (future, [callback])
            else:
                entry[1].append(callback)
            return True

    def _take_callbacks(self, rows: np.ndarray) -> list[_Registered]:
        """The callbacks of ``rows``, just settled, in row order (caller holds the lock):
        looked up from the smaller side, the rows or the rows with callbacks."""
        callbacks = self.callbacks
        assert callbacks is not None and self.settled is not None
        if len(callbacks) < len(rows):
            settled = self.settled  # rows of earlier pieces had theirs taken already
            hits = sorted(row for row in callbacks if settled[row])
        else:
            hits = [row for row in rows.tolist() if row in callbacks]
        return [callbacks.pop(row) for row in hits]


class FutureRecordMetadata(CallbackFuture[RecordMetadata]):
    """The outcome of one ``send()``: ``result(timeout)`` returns RecordMetadata or raises;
    delivery callbacks as in kafka-python (``callbacks.py``)."""

    __slots__ = ("_chunk", "_index")

    def __init__(self, chunk: RecordChunk, index: int) -> None:
        self._chunk = chunk
        self._index = index

    def done(self) -> bool:
        chunk = self._chunk
        if chunk.done.is_set() or chunk.error is not None:
            return True
        settled = chunk.settled
        return settled is not None and bool(settled[self._index])

    def result(self, timeout: float | None = None) -> RecordMetadata:
        chunk = self._chunk
        if not self.done() and not chunk.done.wait(timeout):
            raise RequestTimedOutError(f"record {self._index} to {chunk.topic!r} not "
                                       f"acknowledged within {timeout} s")
        metadata, error = self._outcome()
        if error is not None:
            raise error
        assert metadata is not None
        return metadata

    def _outcome(self) -> tuple[RecordMetadata | None, ApiError | None]:
        """A failure of the record alone first (say, too large), then the chunk's."""
        chunk, i = self._chunk, self._index
        if chunk.error_index is not None and chunk.error_index[i] >= 0:
            return None, chunk.errors[chunk.error_index[i]]
        if chunk.error is not None:
            return None, chunk.error
        assert chunk.partitions is not None and chunk.offsets is not None
        assert chunk.timestamps is not None
        return RecordMetadata(chunk.topic, int(chunk.partitions[i]), int(chunk.offsets[i]),
                              int(chunk.timestamps[i])), None

    def _register(self, callback: DeliveryCallback) -> bool:
        return self._chunk.register(self._index, self, callback)

    def _where(self) -> str:
        chunk = self._chunk
        if chunk.partitions is None:
            return f"topic {chunk.topic!r} (record {self._index}, before partitioning)"
        return f"{chunk.topic}-{int(chunk.partitions[self._index])}"

    def exception(self, timeout: float | None = None) -> ApiError | None:
        try:
            self.result(timeout)
        except ApiError as e:
            return e
        return None

    get = result


_Registered: TypeAlias = tuple[FutureRecordMetadata, list[DeliveryCallback]]


def _run_registered(due: list[_Registered]) -> None:
    for future, callbacks in due:
        metadata, error = future._outcome()
        run_callbacks(callbacks, future, metadata, error, future._where())


@dataclass(frozen=True, slots=True)
class BatchRecordMetadata:
    """Where one partition's share of a ``send_batch`` landed."""

    topic: str
    partition: int
    base_offset: int
    record_count: int


class FutureBatchMetadata(CallbackFuture[list[BatchRecordMetadata]]):
    """The outcome of one ``send_batch()``: a list of BatchRecordMetadata, one per piece. Pieces
    are added while the batch is cut (``add_piece``); ``seal`` says there are no more. Delivery
    callbacks run once every piece is done (the first failure is the batch's), on the thread
    completing the last one, before ``done`` is set."""

    __slots__ = ("topic", "pieces", "_pending", "_sealed", "_results", "_error", "_finished",
                 "_callbacks", "_done", "_lock")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.pieces = 0  # added so far (none: nothing of the batch was queued)
        self._pending = 0
        self._sealed = False
        self._results: list[BatchRecordMetadata] = []
        self._error: ApiError | None = None
        self._finished = False  # every piece done: the outcome is final
        self._callbacks: list[DeliveryCallback] | None = None
        self._done = threading.Event()  # set once the callbacks ran
        self._lock = threading.Lock()

    def add_piece(self) -> None:
        with self._lock:
            self.pieces += 1
            self._pending += 1

    def seal(self) -> None:
        with self._lock:
            self._sealed = True
            due = self._finish() if self._pending <= 0 else None
        if due is not None:
            self._complete(due)

    def piece_done(self, partition: int, base_offset: int, count: int,
                   error: ApiError | None) -> None:
        with self._lock:
            if error is not None:
                self._error = self._error or error
            else:
                self._results.append(BatchRecordMetadata(self.topic, partition, base_offset,
                                                         count))
            self._pending -= 1
            due = self._finish() if self._sealed and self._pending <= 0 else None
        if due is not None:
            self._complete(due)

    def _finish(self) -> list[DeliveryCallback]:
        """Mark the outcome final and take the callbacks (caller holds the lock)."""
        self._finished = True
        due, self._callbacks = self._callbacks or [], None
        return due

    def _complete(self, due: list[DeliveryCallback]) -> None:
        if due:
            value, error = self._outcome()
            run_callbacks(due, self, value, error, self._where())
        self._done.set()

    def done(self) -> bool:
        return self._finished

    def result(self, timeout: float | None = None) -> list[BatchRecordMetadata]:
        if not self._finished and not self._done.wait(timeout):
            raise RequestTimedOutError(f"batch to {self.topic!r} not acknowledged within "
                                       f"{timeout} s")
        value, error = self._outcome()
        if error is not None:
            raise error
        assert value is not None
        return value

    def _outcome(self) -> tuple[list[BatchRecordMetadata] | None, ApiError | None]:
        if self._error is not None:
            return None, self._error
        return sorted(self._results, key=lambda r: (r.partition, r.base_offset)), None

    def _register(self, callback: DeliveryCallback) -> bool:
        with self._lock:
            if self._finished:
                return False
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(callback)
            return True

    def _where(self) -> str:
        return f"send_batch to {self.topic!r}"


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
