"""The producer's sender: ordered, pipelined, retried delivery of ProducerBatches.

Each batch travels already encoded (``produced.py``), as one row of STORED_MESSAGE_SCHEMA on a
stream that declares ``messages``, so the leader stores it as it came. Per partition, batches
leave in creation order and only the head of a partition's queue may
wait for a retry, so a retry never lets a later batch overtake an earlier one. Batches travel on
one DoPut stream per (broker, topic) with up to ``max_in_flight`` unacknowledged; a reader
thread per stream matches acknowledgements to batches in order, and a watchdog breaks a stream
whose oldest batch waited longer than ``request_timeout_ms``.

Idempotence: each batch carries (producer id, epoch, base sequence), kept across retries so the
broker drops a resent duplicate and rejects a gap. When a batch fails for good its partition's
sequence has a hole, so that partition moves to a fresh producer id once its in-flight batches
have come back, and its queued batches are numbered again in their original order (Kafka bumps
the epoch for the same reason). A transactional producer's batches all carry the id and epoch
its transaction manager set, are flagged transactional, and a batch that fails for good makes
the transaction abortable instead (the epoch bump comes with the abort). An abort
(``abort_pending``) fails every batch of the aborted transaction not yet acknowledged, queued
or in flight, and moves the sender to a new generation: a batch of an earlier generation is
refused at ``enqueue``, never sent or retried, and its failure does not touch the next
transaction. A batch carries the topic id it was encoded for, and so does its stream's
descriptor: a leader whose topic has another id (deleted and recreated) refuses it with
UNKNOWN_TOPIC_ID; after the refresh it goes on to the new topic only if that has the schema
it was encoded with, else it fails with INVALID_RECORD naming the topic. Must not: build batches (``producer.py`` does that).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from logstore.client.batches import ProducerBatch
from logstore.client.metadata import ClusterMetadata
from logstore.client.metrics import ProducerMetrics
from logstore.errors import (
    ApiError,
    FencedLeaderEpochError,
    InvalidRecordError,
    NetworkError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
    UnknownTopicIdError,
)
from logstore.messages.produce import (
    InitProducerIdRequest,
    ProduceBatchMetadata,
    ProduceRequest,
)
from logstore.model import TopicPartition
from logstore.records import STORED_MESSAGE_SCHEMA, message_batch
from logstore.rpc.client import ProduceStream

log = logging.getLogger(__name__)


class _Stream:
    def __init__(self, stream: ProduceStream, key: tuple[str, str], node: int = -1,
                 topic_id: str | None = None) -> None:
        self.stream = stream
        self.key = key
        self.topic_id = topic_id  # its ProduceRequest's: only batches encoded for it go here
        self.node = node  # the leader's broker id (the metrics' node)
        self.inflight: deque[ProducerBatch] = deque()
        self.lock = threading.Lock()
        self.broken = False


class _Sequences:
    """Producer ids and per-partition sequence numbers (guarded by the sender's lock; the
    network call for a new id is made outside it, by ``fetch_ids``)."""

    def __init__(self, metadata: ClusterMetadata) -> None:
        self._metadata = metadata
        self._ids: dict[TopicPartition, tuple[int, int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._default: tuple[int, int] | None = None
        self.confirmed: set[TopicPartition] = set()  # an ack came under the current id

    def fetch_ids(self) -> tuple[int, int]:
        response = self._metadata.call(InitProducerIdRequest())
        response.raise_error("init_producer_id")
        return response.producer_id, response.producer_epoch

    def has_default(self) -> bool:
        return self._default is not None

    def set_default(self, ids: tuple[int, int]) -> None:
        self._default = self._default or ids

    def assign(self, batch: ProducerBatch) -> None:
        """Number a batch that has no sequence yet (a retry keeps its own, so the broker can
        drop it if the first attempt was written)."""
        if batch.producer_id >= 0:
            return
        assert self._default is not None
        ids = self._ids.setdefault(batch.tp, self._default)
        seq = self._next.get(batch.tp, 0)
        batch.producer_id, batch.producer_epoch, batch.base_sequence = ids[0], ids[1], seq
        self._next[batch.tp] = (seq + batch.record_count) & 0x7FFFFFFF

    def current(self, tp: TopicPartition) -> int:
        return self._ids.get(tp, self._default or (-1, -1))[0]

    def reset_all(self, ids: tuple[int, int]) -> None:
        """A transactional producer's (new) id and epoch, for every partition from 0."""
        self._ids.clear()
        self._next.clear()
        self.confirmed.clear()
        self._default = ids

    def reset(self, tp: TopicPartition, ids: tuple[int, int]) -> None:
        """Give ``tp`` a fresh producer id: its old sequence has a hole."""
        self._ids[tp] = ids
        self._next[tp] = 0
        self.confirmed.discard(tp)


class Sender:
    def __init__(self, metadata: ClusterMetadata, acks: int, request_timeout_ms: int,
                 retries: int, retry_backoff_s: float, max_in_flight: int, buffer_memory: int,
                 idempotent: bool, transactional_id: str | None = None,
                 on_failure: Callable[[ApiError], object] | None = None,
                 metrics: ProducerMetrics | None = None) -> None:
        self._metadata = metadata
        self.metrics = metrics or ProducerMetrics()
        self.metrics.in_flight = self._in_flight_count
        self._acks = acks
        self._timeout_ms = request_timeout_ms
        self._retries = retries
        self._backoff_s = retry_backoff_s
        self._max_in_flight = max_in_flight
        self._buffer_memory = buffer_memory
        self._idempotent = idempotent
        # Transactional: one producer id and epoch for every partition, set by the
        # transaction manager; a batch that fails for good is reported to ``on_failure`` (it
        # makes the transaction abortable) instead of moving its partition to a fresh id.
        self._transactional_id = transactional_id
        self._on_failure = on_failure
        self._sequences = _Sequences(metadata)
        # One lock, two conditions: ``_cond`` for the callers waiting on the sender's state
        # (flush, buffer_memory), ``_work`` for the sender thread, woken only when a
        # batch may have become sendable (an acknowledgement with nothing queued used to wake
        # it for nothing: a context switch per batch).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._work = threading.Condition(lock)
        self._ready: dict[TopicPartition, list[ProducerBatch]] = {}
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._inflight: dict[TopicPartition, int] = {}
        self._resetting: set[TopicPartition] = set()  # need a fresh id once drained
        self._fresh_ids: dict[TopicPartition, tuple[int, int]] = {}  # fetched for them
        # A refusal no retry can change (an authorization error): batches fail with it.
        self._ids_refused: ApiError | None = None
        self._queued_bytes = 0
        self._reserved_bytes = 0  # records handed to the drainer, not yet queued (reserve)
        self._outstanding: set[int] = set()  # orders of batches not yet done
        self._generation = 0  # moved on by each abort_pending
        self._aborted: ApiError | None = None  # the error of the last abort
        self._refresh: set[str] = set()
        self._refresh_via: str | None = None  # a broker that just answered: ask it first
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="logstore-producer-sender",
                                        daemon=True)
        self._thread.start()

    # -- called by the producer --------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The current generation (a transaction's batches are queued in the generation
        that was current when its records were sent)."""
        with self._cond:
            return self._generation

    @property
    def buffer_memory(self) -> int:
        return self._buffer_memory

    def has_room(self) -> bool:
        """Whether queued batches and reserved records leave room in buffer_memory (read
        without the lock: a hint for the producer, which waits in ``wait_for_room``)."""
        return self._queued_bytes + self._reserved_bytes < self._buffer_memory

    def wait_for_room(self, max_block_s: float) -> bool:
        """Wait up to ``max_block_s`` until queued batches and reserved records leave room in
        buffer_memory."""
        deadline = time.monotonic() + max_block_s
        with self._cond:
            while self._queued_bytes + self._reserved_bytes >= self._buffer_memory and \
                    not self._closed:
                if not self._cond.wait(deadline - time.monotonic()):
                    return False
        return True

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` of records handed to the drainer against buffer_memory until they
        are queued as batches (``enqueue(reserved=...)``) or dropped (``release``): so
        send() blocks however far the drainer lags behind it."""
        with self._cond:
            self._reserved_bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Records reserved that will not be queued (their chunk failed)."""
        with self._cond:
            self._reserved_bytes -= nbytes
            self._cond.notify_all()

    def _in_flight_count(self) -> int:
        with self._cond:
            return sum(self._inflight.values())

    def enqueue(self, batches: list[ProducerBatch], max_block_s: float = 60.0,
                generation: int | None = None, reserved: int = 0) -> None:
        """Queue ``batches``, waiting (at most ``max_block_s``) while they would overflow
        buffer_memory; a batch larger than it all goes alone, once the queue is empty. With
        ``generation``, refused with the abort's error if an abort moved the sender past it
        (the records belong to an aborted transaction). ``reserved``: the bytes ``reserve``
        counted for these records, released once they are queued (the caller releases them
        if this raises). Other reservations are records the drainer has not reached, behind
        these: they do not hold these up."""
        size = sum(b.nbytes for b in batches)
        deadline = time.monotonic() + max_block_s
        with self._cond:
            while True:
                if self._closed:
                    raise RequestTimedOutError("the producer was closed before this record "
                                               "could be sent")
                if generation is not None and generation != self._generation:
                    raise self.aborted_error()
                if self._queued_bytes == 0 or \
                        self._queued_bytes + size <= self._buffer_memory:
                    break
                if not self._cond.wait(deadline - time.monotonic()):
                    raise RequestTimedOutError(
                        f"{batches[0].tp}: buffer_memory {self._buffer_memory} bytes stayed "
                        f"full for max_block_ms {max_block_s * 1000:.0f} ms (records come "
                        f"faster than the brokers take them); {len(batches)} batch(es) of "
                        f"{size} bytes were not sent")
            for b in batches:
                b.generation = self._generation
                self._insert(b)
                self._outstanding.add(b.order)
            self._queued_bytes += size
            self._reserved_bytes -= reserved
            self._changed()

    def set_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A transactional producer's id and epoch (after init_transactions or an epoch
        bump): every partition's sequence starts again at 0."""
        with self._cond:
            self._sequences.reset_all((producer_id, producer_epoch))
            self._changed()

    def wait_for(self, marker: int, timeout: float | None) -> None:
        """Wait until every batch numbered at or below ``marker`` is done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._outstanding and min(self._outstanding) <= marker:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise RequestTimedOutError(f"flush did not finish within {timeout} s")
                self._cond.wait(remaining)

    def abort_pending(self, error: ApiError) -> int:
        """A transaction is being aborted: move to a new generation and fail, with
        ``error``, every batch not yet acknowledged (queued ones and those in flight, whose
        streams are closed: the broker may still write them, but only into the aborted
        transaction). How many batches were failed."""
        with self._cond:
            self._generation += 1
            self._aborted = error
            queued = [b for queue in self._ready.values() for b in queue]
            self._ready.clear()
            streams = list(self._streams.values())
            self._changed()
        failed = len(queued)
        for stream in streams:
            with stream.lock:
                in_flight = len(stream.inflight)
            if in_flight:
                failed += in_flight
                self._break_stream(stream, error, retry=False)
        for batch in queued:
            self._finish(batch, -1, error)
        return failed

    def aborted_error(self) -> ApiError:
        """The error of records whose transaction was aborted (a fresh copy)."""
        with self._cond:
            error = self._aborted or RequestTimedOutError("the transaction was aborted")
            return type(error)(error.message)

    def close(self, error: ApiError) -> None:
        """Stop; batches not yet acknowledged fail with ``error``."""
        with self._cond:
            self._closed = True
            self._changed()
        self._thread.join(10)
        for stream in list(self._streams.values()):
            self._break_stream(stream, error, retry=False)
        with self._cond:
            leftovers = [b for queue in self._ready.values() for b in queue]
            self._ready.clear()
        for batch in leftovers:
            self._finish(batch, -1, error)

    # -- the sender thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                batch = self._next_sendable()
                if batch is None:
                    # Woken by news; at least every 50 ms for the watchdog and retries'
                    # backoff (never a busy loop: retry_backoff_ms may be 0).
                    self._work.wait(min(self._backoff_s / 2, 0.05) or 0.05)
            self._watchdog()
            self._fetch_ids()
            if batch is not None:
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
                self._expire(head)
                continue
            if tp in self._resetting and not self._reset_when_drained(tp):
                continue
            if self._inflight.get(tp, 0) >= self._partition_cap(tp, head):
                continue
            if head.not_before <= now and (best is None or head.order < best.order):
                best = head
        if best is None or sum(self._inflight.values()) >= \
                self._max_in_flight * max(len(self._streams), 1):
            return None
        self._ready[best.tp].pop(0)
        self._drop_empty(best.tp)
        self._inflight[best.tp] = self._inflight.get(best.tp, 0) + 1
        return best

    def _partition_cap(self, tp: TopicPartition, head: ProducerBatch) -> int:
        """How many batches of ``tp`` may be in flight. One without sequence numbers (so a
        retry cannot be overtaken); one until the first batch under the partition's current
        producer id is acknowledged (the broker accepts any first sequence, so a pipelined
        second batch could land before a retried first); one while a retry or a batch under a
        retired id is outstanding; else ``max_in_flight``."""
        if not self._idempotent or tp not in self._sequences.confirmed or head.attempts > 0:
            return 1
        if head.producer_id >= 0 and head.producer_id != self._sequences.current(tp):
            return 1
        return self._max_in_flight

    def _reset_when_drained(self, tp: TopicPartition) -> bool:
        """Once nothing of ``tp`` is in flight and a fresh id is at hand, move ``tp`` to it.
        Queued batches that already carry a sequence keep it (the first attempt may have been
        written; the broker drops a duplicate, or answers OUT_OF_ORDER, and then they are
        renumbered); the rest are numbered under the new id, in order."""
        ids = self._fresh_ids.pop(tp, None)
        if self._inflight.get(tp, 0) or ids is None:
            if ids is not None:
                self._fresh_ids[tp] = ids
            return False
        self._resetting.discard(tp)
        self._sequences.reset(tp, ids)
        return True

    def _fetch_ids(self) -> None:
        """Producer ids the sender needs, fetched without holding its lock."""
        with self._cond:
            wanted = [tp for tp in self._resetting if tp not in self._fresh_ids]
            need_default = self._idempotent and not self._sequences.has_default() and \
                self._transactional_id is None
        if not wanted and not need_default:
            return
        try:
            fetched = {tp: self._sequences.fetch_ids() for tp in wanted}
            default = self._sequences.fetch_ids() if need_default else None
        except ApiError as e:
            log.info("could not get a producer id yet: %s", e)
            self._ids_refused = None if e.retriable else e
            return
        self._ids_refused = None
        with self._cond:
            self._fresh_ids.update(fetched)
            if default is not None:
                self._sequences.set_default(default)
            self._changed()

    def _send(self, batch: ProducerBatch) -> None:
        stale = False
        try:
            if self._idempotent and not self._sequences.has_default():
                self._fetch_ids()
                if not self._sequences.has_default():
                    raise self._ids_refused or NetworkError("no producer id yet")
            self._check_topic_id(batch)
            stream, leader_epoch = self._stream_for(batch)
            with self._cond:
                stale = batch.generation != self._generation
                if self._idempotent and not stale:
                    self._sequences.assign(batch)
        except ApiError as e:
            self._on_error(batch, e)
            return
        if stale:  # its transaction was aborted while it waited: never sent
            self._complete(batch, -1, self.aborted_error())
            return
        meta = ProduceBatchMetadata(
            seq=batch.order, partition=batch.tp.partition, producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch, base_sequence=batch.base_sequence,
            leader_epoch=leader_epoch, transactional=self._transactional_id is not None)
        try:
            with stream.lock:
                if stream.broken:  # its reader gave up on it a moment ago
                    raise NetworkError(f"produce stream to {stream.key[0]} broke")
                # An abort moves the generation on before it closes the streams with batches
                # in flight: a batch is either in flight here (and failed by the abort) or
                # found stale now, never sent after its transaction ended.
                stale = batch.generation != self._generation
                if stale:
                    raise NetworkError(f"{batch.tp}: the batch's transaction was aborted")
                if self._acks != 0:
                    batch.sent_at = time.monotonic()
                    stream.inflight.append(batch)
                stream.stream.send(message_batch(batch.message), meta)
            self.metrics.batch_sent(batch.tp.topic, batch.record_count, batch.nbytes)
        except ApiError as e:
            if stale:
                self._complete(batch, -1, self.aborted_error())
            elif self._acks != 0 and batch in stream.inflight:
                self._break_stream(stream, e)  # the batch is in flight: it is retried there
            else:
                self._on_error(batch, e)
            return
        if self._acks == 0:
            self._complete(batch, -1, None)

    def _check_topic_id(self, batch: ProducerBatch) -> None:
        """Before each attempt: if the topic was recreated since ``batch`` was encoded (the
        metadata has another topic id, e.g. after the leader refused it with
        UNKNOWN_TOPIC_ID), it goes on to the new topic only if that has the schema it was
        encoded with (an untyped topic's, say); else it fails with INVALID_RECORD, never
        sent under another layout (an int64 read as a double)."""
        info = self._metadata.topic(batch.tp.topic)
        if batch.topic_id == info.topic_id:
            return
        if batch.schema is None or not batch.schema.equals(info.schema):
            raise InvalidRecordError(
                f"{batch.tp}: topic {batch.tp.topic!r} was recreated with another value "
                f"schema (topic id {batch.topic_id} -> {info.topic_id}) after this batch of "
                f"{batch.record_count} record(s) was encoded; it was not sent")
        batch.topic_id = info.topic_id

    def _stream_for(self, batch: ProducerBatch) -> tuple[_Stream, int]:
        """The stream to the partition's leader, and the leader epoch the metadata gave
        (the broker refuses the batch if its own epoch differs: FENCED_LEADER_EPOCH or
        UNKNOWN_LEADER_EPOCH, both retried after a metadata refresh)."""
        part = self._metadata.leader_partition(batch.tp)
        conn = self._metadata.broker_connection(part.leader)
        key = (conn.address, batch.tp.topic)
        stream = self._streams.get(key)
        if stream is not None and not stream.broken and stream.topic_id != batch.topic_id:
            # Opened for the topic before it was recreated: what is in flight there is refused
            # (UNKNOWN_TOPIC_ID) and comes back through _check_topic_id.
            self._break_stream(stream, NetworkError(
                f"produce stream to {stream.key[0]} for {stream.key[1]!r}: the topic was "
                "recreated"))
            stream = None
        if stream is None or stream.broken:
            # The broker gives up a little before our watchdog does, so its own timeout
            # error (not a broken stream) is what normally comes back.
            produce = conn.open_produce(ProduceRequest(
                topic=batch.tp.topic, acks=self._acks,
                timeout_ms=max(1, int(self._timeout_ms * 0.9)),
                transactional_id=self._transactional_id, messages=True,
                topic_id=batch.topic_id), STORED_MESSAGE_SCHEMA)
            stream = _Stream(produce, key, part.leader, batch.topic_id)
            with self._cond:
                self._streams[key] = stream
            if self._acks != 0:
                threading.Thread(target=self._read_acks, args=(stream,), daemon=True,
                                 name=f"logstore-acks-{key[0]}-{key[1]}").start()
        return stream, part.leader_epoch

    def _watchdog(self) -> None:
        """Break streams whose oldest batch has waited past the request timeout (a broker that
        hangs would otherwise hold its batches forever)."""
        limit = time.monotonic() - self._timeout_ms / 1000.0
        for stream in list(self._streams.values()):
            with stream.lock:
                stuck = bool(stream.inflight) and stream.inflight[0].sent_at < limit
            if stuck:
                self._break_stream(stream, RequestTimedOutError(
                    f"no acknowledgement from {stream.key[0]} for {stream.key[1]!r} within "
                    f"request_timeout_ms={self._timeout_ms}"))

    # -- acknowledgements --------------------------------------------------------------------

    def _read_acks(self, stream: _Stream) -> None:
        while True:
            try:
                ack = stream.stream.read_ack()
            except ApiError as e:
                self._break_stream(stream, e)
                return
            if ack is None:
                self._break_stream(stream, NetworkError(
                    f"produce stream to {stream.key[0]} closed"))
                return
            with stream.lock:
                if stream.broken:
                    return  # the watchdog gave this stream's batches to new attempts
                batch = stream.inflight.popleft() if stream.inflight else None
            if batch is None or ack.seq != batch.order:
                log.error("acknowledgement %s does not match the in-flight batch", ack)
                self._break_stream(stream, NetworkError("acknowledgements out of step"))
                if batch is not None:
                    self._on_error(batch, NetworkError("acknowledgements out of step"))
                return
            error = ack.error()
            self.metrics.acknowledged(str(stream.node),
                                      (time.monotonic() - batch.sent_at) * 1000.0)
            if error is None:
                with self._cond:
                    if batch.producer_id == self._sequences.current(batch.tp):
                        self._sequences.confirmed.add(batch.tp)
                self._complete(batch, ack.base_offset, None, ack.log_append_time)
            else:
                self._on_error(batch, error, answered_by=stream.key[0])

    def _break_stream(self, stream: _Stream, error: ApiError, retry: bool = True) -> None:
        with stream.lock:
            stream.broken = True
            pending = list(stream.inflight)
            stream.inflight.clear()
        with self._cond:
            if self._streams.get(stream.key) is stream:
                del self._streams[stream.key]
        # Closing waits for the server's final status, which a hung broker never sends: do it
        # off the sender thread.
        threading.Thread(target=stream.stream.close, name="logstore-stream-close",
                         daemon=True).start()
        for batch in pending:
            if retry:
                self._on_error(batch, error)
            else:
                self._complete(batch, -1, error)

    def _on_error(self, batch: ProducerBatch, error: ApiError, answered_by: str | None = None
                  ) -> None:
        now = time.monotonic()
        with self._cond:
            # A broken stream is a NetworkError, whose refresh_metadata flag is what sends the
            # next attempt to a freshly looked-up leader.
            if error.refresh_metadata:
                self._refresh.add(batch.tp.topic)
                if answered_by is not None:  # alive, unlike a bootstrap broker may be
                    self._refresh_via = answered_by
            if isinstance(error, OutOfOrderSequenceError) and \
                    batch.producer_id != self._sequences.current(batch.tp):
                # not written (the broker saw a gap) and numbered under a retired id
                batch.producer_id, batch.producer_epoch, batch.base_sequence = -1, -1, -1
            # A leader epoch refusal means only that our metadata is stale: the broker wrote
            # nothing, so it is retried after a refresh without spending one of ``retries``
            # (a controller's ISR change bumps the epoch without moving the leader, which
            # must not fail a retries=0 producer), still within delivery_timeout_ms. So is a
            # topic id refusal: after the refresh _check_topic_id sends it on or fails it.
            stale_epoch = isinstance(
                error, FencedLeaderEpochError | UnknownLeaderEpochError | UnknownTopicIdError)
            retries_left = stale_epoch or batch.attempts - batch.epoch_refusals < self._retries
            if batch.generation != self._generation:  # its transaction was aborted
                retries_left, error = False, self.aborted_error()
            if error.retriable and retries_left and now < batch.deadline and not self._closed:
                batch.attempts += 1
                batch.last_error = error
                batch.epoch_refusals += stale_epoch
                self.metrics.retried(batch.tp.topic, batch.record_count)
                batch.not_before = now + self._backoff_s
                self._inflight[batch.tp] -= 1
                self._insert(batch)
                self._changed()
                log.debug("%s: retrying batch after %s", batch.tp, error)
                return
        log.warning("%s: batch of %d record(s) failed: %s", batch.tp, batch.record_count, error)
        self._complete(batch, -1, error)

    def _expire(self, batch: ProducerBatch) -> None:
        """A queued batch ran out of delivery time (caller holds the lock)."""
        last = "" if batch.last_error is None else \
            f"; the last attempt failed with {batch.last_error}"
        error: ApiError = RequestTimedOutError(
            f"{batch.tp}: batch of {batch.record_count} record(s) expired after "
            f"{batch.attempts} attempt(s) (delivery_timeout_ms){last}")
        if batch.producer_id >= 0:
            error = self._failed_for_good(batch, error)
        self._queued_bytes -= batch.nbytes
        self._outstanding.discard(batch.order)
        self.metrics.failed(batch.tp.topic, batch.record_count)
        batch.complete(-1, error)
        self._changed()

    def _failed_for_good(self, batch: ProducerBatch, error: ApiError) -> ApiError:
        """Its partition's sequence has a hole; the error its futures get (a transactional
        producer's transaction manager may restate it; a batch of an aborted transaction
        fails alone: the abort already ended its transaction)."""
        with self._cond:
            if batch.generation != self._generation:
                return error
        if self._on_failure is not None:
            restated = self._on_failure(error)
            return restated if isinstance(restated, ApiError) else error
        if self._idempotent:
            with self._cond:
                self._resetting.add(batch.tp)
        return error

    def _complete(self, batch: ProducerBatch, base_offset: int, error: ApiError | None,
                  log_append_time: int = -1) -> None:
        """An in-flight batch is done. Its futures resolve before it stops counting as in
        flight, so flush() never sees the sender idle while a future is still pending.
        ``log_append_time`` is the broker's (-1 unless the topic uses LogAppendTime)."""
        if error is not None:
            self.metrics.failed(batch.tp.topic, batch.record_count)
            if batch.producer_id >= 0:
                error = self._failed_for_good(batch, error)
        batch.complete(base_offset, error, log_append_time)
        with self._cond:
            self._inflight[batch.tp] = self._inflight.get(batch.tp, 1) - 1
            self._queued_bytes -= batch.nbytes
            self._outstanding.discard(batch.order)
            self._changed(sendable=bool(self._ready))

    def _finish(self, batch: ProducerBatch, base_offset: int, error: ApiError | None) -> None:
        """A batch that never went out (still queued) is done."""
        batch.complete(base_offset, error)
        with self._cond:
            self._queued_bytes -= batch.nbytes
            self._outstanding.discard(batch.order)
            self._changed(sendable=bool(self._ready))

    # -- helpers -----------------------------------------------------------------------------

    def _changed(self, sendable: bool = True) -> None:
        """The sender's state changed (caller holds the lock): wake the callers waiting on it,
        and the sender thread unless no batch can have become sendable."""
        self._cond.notify_all()
        if sendable:
            self._work.notify()

    def _insert(self, batch: ProducerBatch) -> None:
        queue = self._ready.setdefault(batch.tp, [])
        bisect.insort(queue, batch, key=lambda b: b.order)

    def _drop_empty(self, tp: TopicPartition) -> None:
        if not self._ready.get(tp):
            self._ready.pop(tp, None)

    def _maybe_refresh(self) -> None:
        with self._cond:
            topics, self._refresh = self._refresh, set()
            via, self._refresh_via = self._refresh_via, None
        if topics:
            try:
                self._metadata.refresh(sorted(topics), prefer=via)
            except ApiError as e:
                log.debug("metadata refresh failed: %s", e)
