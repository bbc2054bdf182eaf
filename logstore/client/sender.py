"""The producer's sender: ordered, pipelined, retried delivery of ProducerBatches.

Per partition, batches leave in creation order and only the head of a partition's queue may
wait for a retry, so a retry never lets a later batch overtake an earlier one. Batches travel on
one DoPut stream per (broker, topic) with up to ``max_in_flight`` unacknowledged; a reader
thread per stream matches acknowledgements to batches in order. With idempotence each batch
carries (producer id, epoch, base sequence): the broker drops a resent duplicate and rejects a
gap, which the sender retries. Must not: build batches (``producer.py`` does that).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque

from logstore.client.batches import ProducerBatch
from logstore.client.metadata import ClusterMetadata
from logstore.errors import (
    ApiError,
    NetworkError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
)
from logstore.model import TopicPartition
from logstore.rpc.client import ProduceStream
from logstore.rpc.codec import error_from_fields

log = logging.getLogger(__name__)


class _Stream:
    def __init__(self, stream: ProduceStream, key: tuple[str, str]) -> None:
        self.stream = stream
        self.key = key
        self.inflight: deque[ProducerBatch] = deque()
        self.lock = threading.Lock()
        self.broken = False


class Sender:
    def __init__(self, metadata: ClusterMetadata, acks: int, request_timeout_ms: int,
                 retries: int, retry_backoff_s: float, max_in_flight: int, buffer_memory: int,
                 idempotent: bool) -> None:
        self._metadata = metadata
        self._acks = acks
        self._timeout_ms = request_timeout_ms
        self._retries = retries
        self._backoff_s = retry_backoff_s
        self._max_in_flight = max_in_flight
        self._buffer_memory = buffer_memory
        self._idempotent = idempotent
        self._cond = threading.Condition()
        self._ready: dict[TopicPartition, list[ProducerBatch]] = {}
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._queued_bytes = 0
        self._inflight = 0
        self._refresh: set[str] = set()
        self._producer_id = -1
        self._producer_epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="logstore-producer-sender",
                                        daemon=True)
        self._thread.start()

    # -- called by the producer --------------------------------------------------------------

    def enqueue(self, batches: list[ProducerBatch], max_block_s: float = 60.0) -> None:
        size = sum(b.nbytes for b in batches)
        deadline = time.monotonic() + max_block_s
        with self._cond:
            while self._queued_bytes > 0 and self._queued_bytes + size > self._buffer_memory:
                if not self._cond.wait(deadline - time.monotonic()):
                    raise RequestTimedOutError(
                        f"buffer_memory {self._buffer_memory} full for {max_block_s} s")
            for b in batches:
                self._insert(b)
            self._queued_bytes += size
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None, upstream_idle: object) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not (upstream_idle() and not self._ready and self._inflight == 0):  # type: ignore[operator]
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise RequestTimedOutError(f"flush did not finish within {timeout} s")
                self._cond.wait(0.01 if remaining is None else min(remaining, 0.01))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(10)
        for s in list(self._streams.values()):
            s.stream.close()

    # -- the sender thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed and not self._ready:
                    return
                batch = self._next_sendable()
                if batch is None:
                    self._cond.wait(self._backoff_s / 2)
                    continue
            self._maybe_refresh()
            self._send(batch)

    def _next_sendable(self) -> ProducerBatch | None:
        """The oldest head-of-partition batch that may go now (caller holds the lock)."""
        now = time.monotonic()
        best: ProducerBatch | None = None
        for tp, queue in list(self._ready.items()):
            head = queue[0]
            if now >= head.deadline:
                queue.pop(0)
                self._drop_empty(tp)
                self._finish(head, -1, RequestTimedOutError(
                    f"{tp}: batch of {head.record_count} record(s) expired after "
                    f"{head.attempts} attempt(s) (delivery_timeout_ms)"))
                continue
            if head.not_before <= now and (best is None or head.order < best.order):
                best = head
        if best is not None:
            if self._inflight >= self._max_in_flight * max(len(self._streams), 1):
                return None
            self._ready[best.tp].pop(0)
            self._drop_empty(best.tp)
            self._inflight += 1
        return best

    def _send(self, batch: ProducerBatch) -> None:
        try:
            stream = self._stream_for(batch)
            self._assign_sequence(batch)
        except ApiError as e:
            self._on_error(batch, e)
            return
        meta = {"seq": batch.order, "partition": batch.tp.partition,
                "producer_id": batch.producer_id, "producer_epoch": batch.producer_epoch,
                "base_sequence": batch.base_sequence}
        try:
            with stream.lock:
                if self._acks != 0:
                    stream.inflight.append(batch)
                stream.stream.send(batch.batch, meta)
        except ApiError as e:
            if self._acks != 0:
                self._break_stream(stream, e)  # the batch is in flight: it is retried there
            else:
                self._on_error(batch, e)
            return
        if self._acks == 0:
            self._complete(batch, -1, None)

    def _stream_for(self, batch: ProducerBatch) -> _Stream:
        conn = self._metadata.leader_connection(batch.tp)
        key = (conn.address, batch.tp.topic)
        stream = self._streams.get(key)
        if stream is None or stream.broken:
            produce = conn.open_produce(batch.tp.topic, batch.batch.schema, self._acks,
                                        self._timeout_ms)
            stream = _Stream(produce, key)
            self._streams[key] = stream
            if self._acks != 0:
                threading.Thread(target=self._read_acks, args=(stream,), daemon=True,
                                 name=f"logstore-acks-{key[0]}-{key[1]}").start()
        return stream

    def _assign_sequence(self, batch: ProducerBatch) -> None:
        if not self._idempotent:
            return
        if self._producer_id < 0:
            response = self._metadata.request("init_producer_id", {})
            self._producer_id = response["producer_id"]
            self._producer_epoch = response["producer_epoch"]
            self._next_sequence.clear()
        if batch.producer_id == self._producer_id:
            return  # a retry keeps its sequence, so the broker can spot a duplicate
        seq = self._next_sequence.get(batch.tp, 0)
        batch.producer_id, batch.producer_epoch = self._producer_id, self._producer_epoch
        batch.base_sequence = seq
        self._next_sequence[batch.tp] = (seq + batch.record_count) & 0x7FFFFFFF

    # -- acknowledgements --------------------------------------------------------------------

    def _read_acks(self, stream: _Stream) -> None:
        while True:
            try:
                ack = stream.stream.read_ack()
            except ApiError as e:
                self._break_stream(stream, e)
                return
            if ack is None:
                self._break_stream(stream, NetworkError(f"produce stream to {stream.key[0]} "
                                                        "closed"))
                return
            with stream.lock:
                batch = stream.inflight.popleft() if stream.inflight else None
            if batch is None or ack.get("seq") != batch.order:
                log.error("acknowledgement %s does not match in-flight batch", ack)
                continue
            error = error_from_fields(ack)
            if error is None:
                self._complete(batch, ack["base_offset"], None)
            else:
                self._on_error(batch, error)

    def _break_stream(self, stream: _Stream, error: ApiError) -> None:
        with stream.lock:
            stream.broken = True
            pending = list(stream.inflight)
            stream.inflight.clear()
        with self._cond:
            if self._streams.get(stream.key) is stream:
                del self._streams[stream.key]
        stream.stream.close()
        retry = error if error.retriable else NetworkError(str(error))
        for batch in pending:
            self._on_error(batch, retry)

    def _on_error(self, batch: ProducerBatch, error: ApiError) -> None:
        now = time.monotonic()
        if error.refresh_metadata or isinstance(error, NetworkError):
            with self._cond:
                self._refresh.add(batch.tp.topic)
        if error.retriable and batch.attempts < self._retries and now < batch.deadline:
            batch.attempts += 1
            gap = isinstance(error, OutOfOrderSequenceError)
            batch.not_before = now + (0 if gap else self._backoff_s)
            log.debug("%s: retrying batch after %s", batch.tp, error)
            with self._cond:
                self._inflight -= 1
                self._insert(batch)
                self._cond.notify_all()
            return
        log.warning("%s: batch of %d record(s) failed: %s", batch.tp, batch.record_count, error)
        if self._idempotent:
            self._producer_id = -1  # later batches start a fresh sequence under a new id
        self._complete(batch, -1, error)

    def _complete(self, batch: ProducerBatch, base_offset: int, error: ApiError | None) -> None:
        with self._cond:
            self._inflight -= 1
        self._finish(batch, base_offset, error)

    def _finish(self, batch: ProducerBatch, base_offset: int, error: ApiError | None) -> None:
        batch.complete(base_offset, error)
        with self._cond:
            self._queued_bytes -= batch.nbytes
            self._cond.notify_all()

    # -- helpers -----------------------------------------------------------------------------

    def _insert(self, batch: ProducerBatch) -> None:
        queue = self._ready.setdefault(batch.tp, [])
        bisect.insort(queue, batch, key=lambda b: b.order)

    def _drop_empty(self, tp: TopicPartition) -> None:
        if not self._ready.get(tp):
            self._ready.pop(tp, None)

    def _maybe_refresh(self) -> None:
        with self._cond:
            topics, self._refresh = self._refresh, set()
        if topics:
            try:
                self._metadata.refresh(sorted(topics))
            except ApiError as e:
                log.debug("metadata refresh failed: %s", e)
