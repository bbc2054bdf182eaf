"""The producer: per-record ``send()`` and columnar ``send_batch()``.

``send()`` appends a tuple to the topic's current ``RecordChunk`` and returns a tiny future; a
background sender turns whole chunks into Arrow batches (vectorised partitioning and
timestamps), splits them per partition and writes them, pipelined, on one long-lived DoPut
stream per (broker, topic). Idempotence (producer id, epoch, per-partition sequence) lets the
broker drop duplicates and reject gaps, so retried batches keep their partition's order. With a
``transactional_id`` (``client/transactions.py``) records are sent inside transactions: the
partitions a chunk or a ``send_batch`` reaches are added to the transaction before its
batches go, and commit, abort and prepare flush first. An abort fails whatever of its
transaction is still unacknowledged (records not yet sent, batches queued or in flight) with
TRANSACTION_ABORTABLE, so nothing of it can be sent later into the next transaction.
Must not: reach into broker internals.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.client.batches import (
    RECORD_OVERHEAD,
    FutureBatchMetadata,
    FutureRecordMetadata,
    ProducerBatch,
    RecordChunk,
)
from logstore.client.metadata import ClusterMetadata, TopicInfo
from logstore.client.metrics import ClientEndpoint, Layout, ProducerMetrics
from logstore.client.partitioner import StickyPartitioner, assign_partitions
from logstore.client.pieces import (
    PieceLimits,
    by_partition,
    check_record_sizes,
    cut,
    piece_limits,
    windows,
)
from logstore.client.record_arrays import chunk_arrays
from logstore.client.sender import Sender
from logstore.client.transactions import (
    ConsumerGroupMetadata,
    PreparedTxnState,
    TransactionManager,
    TxnState,
)
from logstore.errors import (
    ApiError,
    InvalidRecordError,
    InvalidTxnStateError,
    MessageTooLargeError,
    RequestTimedOutError,
    TransactionAbortableError,
)
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.records import TIMESTAMP_TYPE, conform_batch, value_columns
from logstore.security.config import client_security, settings_of
from logstore.transactions.state import validate_transactional_id

log = logging.getLogger(__name__)

MiB = 1024 * 1024
WINDOW_BYTES = 64 * MiB  # send_batch cuts a table this much at a time (memory stays bounded)
_ACKS = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}


class Producer:
    """Sends records to LogStore topics. Thread-safe; use as a context manager or ``close()``.
    ``**security`` takes kafka-python's connection settings (``security_protocol``,
    ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``,
    ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``).

    ``batch_size`` is in bytes (default 1 MiB, larger than Kafka's 16 KiB because a batch is one
    Arrow record batch and large batches are what make Arrow fast).

    ``metrics()`` returns kafka-python's figures; ``metrics_listener="host:port"`` also serves
    them to Prometheus from this process (port 0 picks one: ``metrics_port``)."""

    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9092", *,
                 acks: str | int = "all", linger_ms: int = 5, batch_size: int = 1 * MiB,
                 compression_type: str | None = None, max_request_size: int = 8 * MiB,
                 retries: int = 2**31 - 1, delivery_timeout_ms: int = 120_000,
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 max_in_flight_requests_per_connection: int = 5,
                 buffer_memory: int = 256 * MiB, enable_idempotence: bool | None = None,
                 metadata_max_age_ms: int = 300_000, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000,
                 transaction_two_phase_commit: bool = False,
                 max_block_ms: int = 60_000, client_id: str = "logstore-producer",
                 metrics_listener: str | None = None, **security: Any) -> None:
        _check_settings(acks, compression_type, {
            "linger_ms": linger_ms, "batch_size": batch_size,
            "max_request_size": max_request_size, "delivery_timeout_ms": delivery_timeout_ms,
            "request_timeout_ms": request_timeout_ms, "retry_backoff_ms": retry_backoff_ms,
            "max_in_flight_requests_per_connection": max_in_flight_requests_per_connection,
            "buffer_memory": buffer_memory, "max_block_ms": max_block_ms, "retries": retries})
        _check_transactional(transactional_id, acks, enable_idempotence)
        if enable_idempotence and _ACKS[acks] != -1:  # Kafka's ConfigException
            raise ValueError(f"enable_idempotence=True needs acks='all', got acks={acks!r}")
        self.acks = _ACKS[acks]
        self.linger_s = linger_ms / 1000.0
        self.batch_size = batch_size
        self.max_request_size = max_request_size
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        self.max_block_s = max_block_ms / 1000.0
        # Pieces are compressed when encoded (pieces.py), never again by Flight.
        self._codec = None if compression_type in (None, "none") else compression_type
        self._metadata = ClusterMetadata(bootstrap_servers, request_timeout_ms, None,
                                         metadata_max_age_ms,
                                         client_security(security, "Producer",
                                                         settings_of(Producer.__init__)))
        idempotent = self.acks != 0 if enable_idempotence is None else enable_idempotence
        in_flight = max_in_flight_requests_per_connection
        if not idempotent and retries > 0:
            in_flight = 1  # without sequence numbers only one batch in flight keeps order
        self._txn = None if transactional_id is None else TransactionManager(
            self._metadata, transactional_id, transaction_timeout_ms,
            transaction_two_phase_commit, max_block_ms / 1000.0)
        self._metrics = ProducerMetrics()
        self._sender = Sender(self._metadata, self.acks, request_timeout_ms, retries,
                              retry_backoff_ms / 1000.0, in_flight, buffer_memory, idempotent,
                              transactional_id, self._txn.fail if self._txn else None,
                              self._metrics)
        self._endpoint = ClientEndpoint(metrics_listener, "producer", client_id,
                                        self._metrics.layout) if metrics_listener else None
        self._sticky = StickyPartitioner()
        self._chunks: dict[str, RecordChunk] = {}
        self._lock = threading.Lock()
        self._order = 0
        self._ready_chunks: list[RecordChunk] = []
        self._draining_chunks: list[RecordChunk] = []  # taken by the drainer, being split
        self._closed = False
        self._wake = threading.Event()
        self._drainer = threading.Thread(target=self._drain_loop, name="logstore-producer-drain",
                                         daemon=True)
        self._drainer.start()

    # -- transactions ------------------------------------------------------------------------

    def init_transactions(self, keep_prepared_txn: bool = False) -> None:
        """Get this transactional id's producer id and a new epoch, fencing earlier instances
        (their open transaction is aborted, or with ``keep_prepared_txn`` a Prepared one is
        kept for ``complete_transaction``). Call once, before the first transaction."""
        txn = self._transactional("init_transactions")
        producer_id, epoch = txn.init(keep_prepared_txn)
        self._sender.set_producer(producer_id, epoch)

    def begin_transaction(self) -> None:
        self._transactional("begin_transaction").begin()

    def send_offsets_to_transaction(
            self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
            group_metadata: ConsumerGroupMetadata) -> None:
        """Commit ``offsets`` (each the next offset to read) for the consumer's group as part
        of the transaction: they count only if it commits. ``group_metadata`` is
        ``consumer.group_metadata()``: a consumer of an older generation is fenced (KIP-447)."""
        self._transactional("send_offsets_to_transaction").send_offsets(
            {TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata) else
             OffsetAndMetadata(om) for tp, om in offsets.items()}, group_metadata)

    def commit_transaction(self, with_prepared: list[PreparedTxnState] | None = None,
                           timeout: float | None = None) -> None:
        """Flush, then commit; with ``with_prepared``, the prepared transactions of other
        ids are committed with this one, in one decision (all must be coordinated by this
        id's ``__transaction_state`` partition and still Prepared as their states say, else
        nothing is decided). Returns once every one is complete."""
        txn = self._transactional("commit_transaction")
        txn.check(TxnState.IN_TRANSACTION, action="commit")
        self._flush_transaction(txn, timeout)
        txn.end(True, with_prepared or ())

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: its records never become visible to read_committed
        readers. Records of it not acknowledged within ``timeout`` (not yet sent, queued or
        in flight) fail with TRANSACTION_ABORTABLE and are never sent into a later
        transaction. After a failed write, or when the abort failed batches, the epoch is
        bumped too (their sequences left a hole, and a batch still on its way to a broker
        must not join the next transaction)."""
        txn = self._transactional("abort_transaction")
        txn.check(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.PREPARED,
                  action="abort")
        with contextlib.suppress(ApiError):  # the batches' own errors: the abort goes on
            self.flush(timeout)
        if self._fail_unacknowledged(TransactionAbortableError(
                f"transactional id {txn.transactional_id}: the transaction was aborted before "
                "this record was acknowledged; it is in no transaction (send it again in a "
                "new one)")):
            txn.needs_epoch_bump = True
        txn.end(False)
        if txn.needs_epoch_bump:
            self._sender.set_producer(*txn.bump_epoch())

    def _fail_unacknowledged(self, error: ApiError) -> int:
        """Fail every record of the transaction being aborted that is not acknowledged yet,
        and start new chunks for the next transaction; how many batches and chunks failed
        (the drainer fails a chunk it is splitting when it finds the sender moved on)."""
        failed = self._sender.abort_pending(error)
        generation = self._sender.generation
        with self._lock:
            stale = [c for c in self._chunks.values() if c.values]
            stale.extend(self._ready_chunks)
            self._sender.release(sum(c.nbytes for c in self._ready_chunks))
            self._ready_chunks = []
            for topic in self._chunks:
                self._chunks[topic] = self._new_chunk(topic, generation)
        for chunk in stale:
            chunk.fail(error)
        return failed + len(stale)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Two-phase participation: flush, and leave the transaction Prepared for another
        party to decide (``complete_transaction`` on a new instance, or a
        ``commit_transaction(with_prepared=[...])``). The returned state is picklable and names
        this transaction alone: preparing bumps the producer's epoch, so a state kept from an
        earlier transaction of this producer can never decide a later one (this producer goes
        on at the new epoch, e.g. for ``abort_transaction``)."""
        txn = self._transactional("prepare_transaction")
        txn.check(TxnState.IN_TRANSACTION, action="prepare")
        self._flush_transaction(txn, timeout)
        state = txn.prepare()
        # The epoch was bumped: every partition's sequence starts again at 0.
        self._sender.set_producer(state.producer_id, state.producer_epoch)
        return state

    def complete_transaction(self, state: PreparedTxnState) -> bool:
        """After ``init_transactions(keep_prepared_txn=True)``: commit the transaction the
        previous instance prepared if ``state`` is it, else abort it. True if committed
        (False also when nothing was left prepared)."""
        txn = self._transactional("complete_transaction")
        txn.check(TxnState.READY, action="complete a prepared transaction")
        kept = txn.prepared_in_coordinator
        if kept is None:
            return False
        matches = state.transactional_id == txn.transactional_id and \
            (state.producer_id, state.producer_epoch) == kept
        txn.end(matches, force=True)
        return matches

    def _transactional(self, call: str) -> TransactionManager:
        self._check_open()
        if self._txn is None:
            raise InvalidTxnStateError(
                f"{call}: this producer has no transactional_id; create it with "
                "Producer(transactional_id=...) to use transactions (nothing was sent)")
        return self._txn

    def _flush_transaction(self, txn: TransactionManager, timeout: float | None) -> None:
        """Every record of the transaction acknowledged; a failed one fails the
        transaction (abortable)."""
        self.flush(timeout)
        txn.check(TxnState.IN_TRANSACTION, action="end the transaction")

    def _check_sending(self) -> None:
        if self._txn is not None:
            self._txn.check(TxnState.IN_TRANSACTION, action="send outside a transaction")

    # -- public API --------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: bytes | None = None,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes | None]] | None = None) -> FutureRecordMetadata:
        """Queue one record; the future's ``result(timeout)`` is its RecordMetadata. Blocks
        while ``buffer_memory`` is full, up to ``max_block_ms``."""
        # The common record (bytes value, bytes or no key, nothing else) costs two list
        # appends under the lock; everything else takes _send_any. The lock is taken with
        # acquire/release, not ``with``: a tenth of a microsecond less, a tenth of this call.
        if type(value) is not bytes or key is not None and type(key) is not bytes or \
                partition is not None or timestamp_ms is not None or headers is not None or \
                self._txn is not None:
            return self._send_any(topic, value, key, partition, timestamp_ms, headers)
        lock = self._lock
        lock.acquire()
        try:
            chunk = self._chunks.get(topic)
            if chunk is not None:
                values = chunk.values
                values.append(value)
                chunk.keys.append(key)
                nbytes = chunk.nbytes + len(value) + RECORD_OVERHEAD
                if key is not None:
                    nbytes += len(key)
                chunk.nbytes = nbytes
                index = len(values) - 1
                if nbytes >= chunk.max_bytes:
                    self._swap_chunk(topic)
                elif index == 0:  # its linger starts now; the drainer times it
                    chunk.created = time.monotonic()
                    self._wake.set()
                return FutureRecordMetadata(chunk, index)
        finally:
            lock.release()
        return self._send_any(topic, value, key, partition, timestamp_ms, headers)

    def _send_any(self, topic: str, value: Any, key: Any, partition: int | None,
                  timestamp_ms: int | None, headers: list[tuple[str, bytes | None]] | None
                  ) -> FutureRecordMetadata:
        """send() for any record: checked, and its rarer fields kept in the side table."""
        if self._txn is not None:
            self._check_sending()
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key", topic)
        if value is not None and type(value) is not bytes and type(value) is not dict:
            value = _as_bytes(value, "value", topic)
        if isinstance(partition, np.integer):
            partition = int(partition)
        if partition is not None or type(value) is dict:
            self._check_record(topic, partition, value)
        if timestamp_ms is not None:
            timestamp_ms = _check_timestamp(timestamp_ms, topic)
        if headers is not None:
            headers = _check_headers(headers, topic)
        extra = None if partition is None and timestamp_ms is None and headers is None else \
            (partition, timestamp_ms, headers)
        while True:
            with self._lock:
                chunk = self._chunks.get(topic)
                if chunk is not None:
                    return self._append(topic, chunk, key, value, extra)
            self._start_topic(topic)

    def _append(self, topic: str, chunk: RecordChunk, key: bytes | None, value: Any,
                extra: tuple[int | None, int | None, Any] | None) -> FutureRecordMetadata:
        """Add one record to ``chunk`` (caller holds ``self._lock``)."""
        chunk.values.append(value)
        chunk.keys.append(key)
        chunk.nbytes += RECORD_OVERHEAD + _approx_size(key) + _approx_size(value) + (
            0 if extra is None or extra[2] is None else
            sum(len(k) + _approx_size(v) for k, v in extra[2]))
        index = len(chunk.values) - 1
        if extra is not None:
            chunk.extras[index] = extra
        if chunk.nbytes >= chunk.max_bytes:
            self._swap_chunk(topic)
        elif index == 0:
            chunk.created = time.monotonic()
            self._wake.set()
        return FutureRecordMetadata(chunk, index)

    def send_batch(self, topic: str, data: pa.Table | pa.RecordBatch,
                   partition: int | None = None) -> FutureBatchMetadata:
        """Send a whole Arrow table or batch with ``key``/``value`` columns (and optional
        ``timestamp``, ``headers``; a typed topic's value columns in place of ``value``),
        partitioned and split without any per-record Python work. A table of any size is
        streamed: cut into pieces the leader accepts (``pieces.py``), each queued as it is
        encoded, blocking while ``buffer_memory`` is full (up to ``max_block_ms``, then
        REQUEST_TIMED_OUT). A record larger than the limit is MESSAGE_TOO_LARGE, raised
        before anything is sent when its binary values alone pass the limit."""
        self._check_open()
        self._check_sending()
        info = self._topic_info(topic)
        if partition is not None and partition not in info.partitions:
            raise InvalidRecordError(f"topic {topic!r} has no partition {partition} "
                                     f"(it has {info.num_partitions})")
        if not isinstance(data, pa.Table | pa.RecordBatch):
            raise InvalidRecordError(f"send_batch to {topic!r}: expected a pyarrow Table or "
                                     f"RecordBatch, got {type(data).__name__}")
        limits = self._limits(info, self.max_request_size)
        check_record_sizes(f"send_batch to topic {topic!r}" + (
            "" if partition is None else f" partition {partition}"), data, limits)
        # A transaction's pieces belong to the sender's generation now: an abort meanwhile
        # fails the rest instead of sending them into the next transaction.
        generation = self._sender.generation if self._txn is not None else None
        window_bytes = max(4 * limits.target, WINDOW_BYTES)
        _check_windows(topic, info.schema, data, window_bytes)
        future = FutureBatchMetadata(topic)
        try:
            for window in windows(data, window_bytes):
                self._send_window(topic, info, self._prepare_columns(topic, info, window),
                                  partition, limits, future, generation)
        except ApiError as e:
            if self._txn is not None and future.pieces:  # part of it is in the transaction
                self._txn.fail(e)
            raise
        finally:
            future.seal()
        return future

    def _send_window(self, topic: str, info: TopicInfo, batch: pa.RecordBatch,
                     partition: int | None, limits: PieceLimits,
                     future: FutureBatchMetadata, generation: int | None) -> None:
        """Cut one window of a send_batch and queue each piece as soon as it is encoded."""
        n = batch.num_rows
        groups = [(partition, None)] if partition is not None else \
            by_partition(self._partitions(topic, info, batch, None))
        deadline = time.monotonic() + self.delivery_timeout_s
        for p, rows in groups:
            tp = TopicPartition(topic, p)
            sub = batch if rows is None or len(rows) == n else batch.take(pa.array(rows))
            for lo, hi, message in cut(tp, sub, limits):
                if isinstance(message, MessageTooLargeError):
                    raise message  # what went before is sent; checked first where it can be
                piece = self._new_batch(tp, info, message, hi - lo, deadline, None, None)
                piece.batch_future = future
                future.add_piece()
                if self._txn is not None:
                    self._txn.add_partitions([tp])
                self._sender.enqueue([piece], self.max_block_s, generation=generation)

    def flush(self, timeout: float | None = None) -> None:
        """Send every record sent before this call and wait until each is acknowledged (or
        failed). Records other threads send meanwhile are not waited for, so a busy producer
        cannot starve a flush."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for topic in list(self._chunks):
                if self._chunks[topic].values:
                    self._swap_chunk(topic)
            chunks = [*self._ready_chunks, *self._draining_chunks]
            marker = self._order  # every send_batch piece so far is numbered at or below it
        self._wake.set()
        for chunk in chunks:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not chunk.done.wait(remaining):
                raise RequestTimedOutError(f"flush did not finish within {timeout} s")
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
        self._sender.wait_for(marker, remaining)

    def partitions_for(self, topic: str) -> set[int]:
        return set(self._topic_info(topic).partitions)

    def metrics(self) -> Layout:
        """kafka-python's ``metrics()``: ``{group: {name: value}}``, e.g.
        ``metrics()["producer-metrics"]["record-send-rate"]`` (module client/metrics.py)."""
        return self._metrics.layout()

    @property
    def metrics_port(self) -> int | None:
        """The port of this producer's metrics endpoint (None without one)."""
        return self._endpoint.port if self._endpoint is not None else None

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                # Records another thread sent after the flush took its chunks: failed, not
                # left pending; a later send() finds no chunk and raises.
                late = [chunk for chunk in self._chunks.values() if chunk.values]
                self._chunks.clear()
            for chunk in late:
                chunk.fail(RequestTimedOutError("the producer was closed before the record "
                                                "was sent"))
            self._wake.set()
            # The sender first: a drainer blocked on a full buffer then fails its chunk at
            # once instead of holding close() up.
            self._sender.close(RequestTimedOutError("the producer was closed before the record "
                                                    "was acknowledged"))
            self._drainer.join(5)
            self._metadata.close()
            if self._endpoint is not None:
                self._endpoint.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per-record path ---------------------------------------------------------------------

    def _check_record(self, topic: str, partition: int | None, value: Any) -> None:
        """What send() can check cheaply, so one bad record fails alone and at once. A
        partition past the cached count is looked up again first (it may have been added
        since: Kafka's send() waits for metadata that has it)."""
        info = self._topic_info(topic)
        if partition is not None and type(partition) is int and \
                partition >= info.num_partitions:
            info = self._metadata.topic(topic, refresh=True)
        if partition is not None and (type(partition) is not int
                                      or not 0 <= partition < info.num_partitions):
            raise InvalidRecordError(f"topic {topic!r} has no partition {partition!r} "
                                     f"(it has {info.num_partitions})")
        if type(value) is dict and info.value_schema is None:
            raise InvalidRecordError(f"send to {topic!r}: a dict value needs a typed topic; "
                                     "this topic's values are bytes")

    def _start_topic(self, topic: str) -> None:
        """Give ``topic`` a chunk, once ``buffer_memory`` has room (the wait is send()'s
        block, as in Kafka: at most ``max_block_ms``)."""
        self._check_open()
        self._topic_info(topic)
        if not self._sender.wait_for_room(self.max_block_s):
            raise RequestTimedOutError(
                f"send to {topic!r}: buffer_memory {self._sender.buffer_memory} bytes stayed "
                f"full for max_block_ms {self.max_block_s * 1000:.0f} ms (records are sent "
                "faster than the brokers take them); the record was not sent")
        with self._lock:
            self._check_open()  # closed during the wait: no chunk nobody would drain
            if topic not in self._chunks:
                self._chunks[topic] = self._new_chunk(topic, self._sender.generation)

    def _swap_chunk(self, topic: str) -> None:
        """Hand the topic's full chunk to the drainer (caller holds ``self._lock``). While
        ``buffer_memory`` is full the topic gets no new chunk, so its next send() waits in
        ``_start_topic``: what send() holds stays bounded."""
        full = self._chunks.pop(topic)
        self._sender.reserve(full.nbytes)  # counted against buffer_memory from now on
        if self._sender.has_room():
            self._chunks[topic] = self._new_chunk(topic, full.generation)
        self._ready_chunks.append(full)
        self._wake.set()

    def _new_chunk(self, topic: str, generation: int) -> RecordChunk:
        return RecordChunk(topic, generation, self.batch_size)

    def _drain_loop(self) -> None:
        """Drain full chunks, and chunks whose linger is over, until closed. Between rounds
        it sleeps until the first linger ends, or, with no record waiting, until woken (by a
        chunk's first record, a full chunk, flush or close): an idle producer costs no CPU."""
        wait_s: float | None = None
        while True:
            self._wake.wait(wait_s)
            self._wake.clear()  # before reading the chunks: a record after it wakes us again
            with self._lock:
                now = time.monotonic()
                for topic, chunk in list(self._chunks.items()):
                    if chunk.values and now - chunk.created >= self.linger_s:
                        self._swap_chunk(topic)
                ready, self._ready_chunks = self._ready_chunks, []
                self._draining_chunks = ready
            for chunk in ready:
                self._drain_chunk(chunk)
            with self._lock:
                self._draining_chunks = []
                # Closed: what flush or close left is drained at once, then the loop ends.
                wait_s = 0.0 if self._closed else self._linger_left()
            if self._closed and not ready:
                return

    def _linger_left(self) -> float | None:
        """Seconds until the first chunk holding records is due (0: now); None when no chunk
        holds any (caller holds ``self._lock``)."""
        started = [chunk.created for chunk in self._chunks.values() if chunk.values]
        if not started:
            return None
        return max(min(started) + self.linger_s - time.monotonic(), 0.0)

    def _drain_chunk(self, chunk: RecordChunk) -> None:
        reserved = chunk.nbytes  # released here unless enqueue takes it over
        try:
            info = self._topic_info(chunk.topic)
            arrays = chunk_arrays(chunk, info, time.time_ns() // 1_000_000)
            batch = arrays.batch
            parts = self._partitions(chunk.topic, info, batch, arrays.partitions)
            pieces, too_large = self._chunk_pieces(chunk, info, batch, parts, arrays.rejected)
            generation = None
            if self._txn is not None:
                generation = chunk.generation
                if generation != self._sender.generation:  # its transaction was aborted
                    raise self._sender.aborted_error()
                self._txn.add_partitions(pb.tp for pb in pieces)
            chunk.expect(len(pieces) + len(too_large), parts, arrays.timestamps)
            for rows, error in too_large:  # a record over the limit, or a misfit, fails alone
                if self._txn is not None:  # ... and its transaction can only abort (Kafka):
                    self._txn.fail(error)  # before its future fails, which a commit waits on
                chunk.batch_done(rows, -1, error)
            self._sender.enqueue(pieces, self.max_block_s, generation=generation,
                                 reserved=reserved)
            reserved = 0
        except Exception as e:  # a bad chunk fails its own futures, never the producer
            err = e if isinstance(e, InvalidRecordError | MessageTooLargeError) else e if \
                isinstance(e, ApiError) and (self._txn is not None or
                                             isinstance(e, RequestTimedOutError)) else \
                InvalidRecordError(f"topic {chunk.topic!r}: {type(e).__name__}: {e}")
            if self._txn is not None and chunk.generation == self._sender.generation:
                self._txn.fail(err)  # records of the open transaction failed: it must abort
            chunk.fail(err)  # after: a commit waiting on these futures sees the failure
        finally:
            if reserved:
                self._sender.release(reserved)

    def _chunk_pieces(self, chunk: RecordChunk, info: TopicInfo, batch: pa.RecordBatch,
                      parts: np.ndarray, rejected: Mapping[int, InvalidRecordError]
                      ) -> tuple[list[ProducerBatch], list[tuple[np.ndarray, ApiError]]]:
        """The chunk's records cut into pieces of about batch_size, per partition, and the
        records that fail alone (rows in the chunk, error): those over the limit, and the
        ``rejected`` ones (values that do not fit the topic's value_schema), never sent."""
        limits = self._limits(info, self.batch_size)
        deadline = time.monotonic() + self.delivery_timeout_s
        pieces: list[ProducerBatch] = []
        too_large: list[tuple[np.ndarray, ApiError]] = [
            (np.array([row]), error) for row, error in rejected.items()]
        for p, rows in by_partition(parts):
            if rejected:
                rows = rows[~np.isin(rows, list(rejected))]
                if not len(rows):
                    continue
            tp = TopicPartition(chunk.topic, p)
            sub = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
            for lo, hi, message in cut(tp, sub, limits):
                if isinstance(message, MessageTooLargeError):
                    too_large.append((rows[lo:hi], message))
                else:
                    pieces.append(self._new_batch(tp, info, message, hi - lo, deadline,
                                                  chunk, rows[lo:hi]))
        return pieces, too_large

    # -- columnar path -----------------------------------------------------------------------

    def _limits(self, info: TopicInfo, target: int) -> PieceLimits:
        return piece_limits(target, self.max_request_size, info.max_message_bytes,
                            self._codec, info.compression_type)

    def _partitions(self, topic: str, info: TopicInfo, batch: pa.RecordBatch,
                    explicit: np.ndarray | None) -> np.ndarray:
        """The partition of every record: named, else by key, else sticky."""
        block = max(1, int(self.batch_size / max(batch.nbytes / max(batch.num_rows, 1), 1)))
        return assign_partitions(batch.column(0), explicit, topic, info.num_partitions,
                                 self._sticky, block)

    def _prepare_columns(self, topic: str, info: TopicInfo, data: pa.RecordBatch
                         ) -> pa.RecordBatch:
        """``data`` in the topic's schema, every timestamp set (so the leader stores the
        encoded piece as it comes)."""
        missing = [c for c in value_columns(info.schema) if c not in data.schema.names]
        if missing:
            raise InvalidRecordError(f"send_batch to {topic!r}: missing column(s) {missing}")
        now = time.time_ns() // 1_000_000
        if "timestamp" not in data.schema.names:
            stamps = np.full(data.num_rows, now, dtype=np.int64)  # over its buffer, no cast
            data = data.append_column("timestamp", pa.Array.from_buffers(
                TIMESTAMP_TYPE, data.num_rows, [None, pa.py_buffer(stamps)]))
        data = conform_batch(data, info.schema, f"send_batch to {topic!r}")
        i = data.schema.get_field_index("timestamp")
        if data.column(i).null_count:
            filled = pc.fill_null(data.column(i), pa.scalar(now, TIMESTAMP_TYPE))
            data = data.set_column(i, data.schema.field(i), filled)
        return data

    def _new_batch(self, tp: TopicPartition, info: TopicInfo, message: pa.Buffer,
                   records: int, deadline: float, chunk: RecordChunk | None,
                   rows: np.ndarray | None) -> ProducerBatch:
        """A batch encoded under ``info``'s schema, marked with its topic id (the leader
        refuses it if the topic was recreated since: sender.py)."""
        with self._lock:
            self._order += 1
            order = self._order
        return ProducerBatch(tp, message, records, order, deadline, chunk, rows,
                             topic_id=info.topic_id, schema=info.schema)

    # -- helpers -----------------------------------------------------------------------------

    def _topic_info(self, topic: str) -> TopicInfo:
        return self._metadata.topic(topic)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the producer is closed")


def _check_windows(topic: str, schema: pa.Schema, data: pa.Table | pa.RecordBatch,
                   window_bytes: int) -> None:
    """Every window of a send_batch fits the topic's schema, checked before the first is
    sent (each is conformed again just before it goes: memory stays one window's), so a value
    that cannot be cast fails the call with nothing sent, naming its column and row. Nothing
    to check when no column needs a cast: what else conform_batch refuses is the same for
    every window, and the first window's refusal comes before anything is sent."""
    if not any(data.schema.get_field_index(f.name) >= 0 and
               not data.schema.field(f.name).type.equals(f.type) for f in schema):
        return
    where = f"send_batch to {topic!r}"
    first_row = 0
    for window in windows(data, window_bytes):
        try:
            conform_batch(window, schema, where)
        except InvalidRecordError as e:
            conform_batch(window.slice(0, 0), schema, where)  # a column missing or extra
            row = first_row + _first_bad_row(window, schema, where)
            raise InvalidRecordError(f"{e.message}, at row {row}; nothing was sent") from None
        first_row += window.num_rows


def _first_bad_row(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> int:
    """The first row of ``batch`` that conform_batch refuses, found by halving."""
    lo, hi = 0, batch.num_rows  # batch[lo:hi] is refused
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            conform_batch(batch.slice(lo, mid - lo), schema, where)
            lo = mid
        except InvalidRecordError:
            hi = mid
    return lo


def _as_bytes(obj: Any, what: str, topic: str) -> bytes:
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    if isinstance(obj, str):
        return obj.encode()
    raise InvalidRecordError(f"send to {topic!r}: {what} must be bytes, str or None, got "
                             f"{type(obj).__name__}")


def _approx_size(obj: Any) -> int:
    """Bytes a key, value or header value counts for against batch_size and buffer_memory:
    its length, a typed value's (a dict) estimated as 8 bytes a field plus its strings."""
    if obj is None:
        return 0
    if type(obj) is not dict:
        return len(obj)
    return sum(len(v) if isinstance(v, str | bytes) else 8 for v in obj.values())


def _check_timestamp(timestamp_ms: Any, topic: str) -> int:
    """A record's own timestamp: an int of milliseconds since the epoch, 0 up to int64's
    largest (Kafka's ProducerRecord refuses a negative one)."""
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int | np.integer) or \
            not 0 <= timestamp_ms < 2**63:
        raise InvalidRecordError(f"send to {topic!r}: timestamp_ms must be an int of "
                                 f"milliseconds, 0 to 2**63-1, got {timestamp_ms!r}")
    return int(timestamp_ms)


def _check_headers(headers: Any, topic: str) -> list[tuple[str, bytes | None]]:
    """A record's headers: a list of (str, bytes or None) pairs, as kafka-python takes them."""
    if not isinstance(headers, list | tuple):
        raise InvalidRecordError(f"send to {topic!r}: headers must be a list of (str, bytes) "
                                 f"pairs, got {type(headers).__name__}")
    checked: list[tuple[str, bytes | None]] = []
    for header in headers:
        if not isinstance(header, tuple | list) or len(header) != 2 or \
                not isinstance(header[0], str) or \
                not (header[1] is None or isinstance(header[1], bytes | bytearray | memoryview)):
            raise InvalidRecordError(f"send to {topic!r}: a header must be a (str, bytes or "
                                     f"None) pair, got {header!r}")
        key, value = header
        checked.append((key, value if value is None or type(value) is bytes else bytes(value)))
    return checked


_MAY_BE_ZERO = ("linger_ms", "retry_backoff_ms", "max_block_ms", "retries")  # 0: none (Kafka)


def _check_settings(acks: str | int, compression_type: str | None,
                    sizes: dict[str, int]) -> None:
    if acks not in _ACKS:
        raise ValueError(f"acks must be 'all', 1 or 0, got {acks!r}")
    if compression_type not in (None, "none", "lz4", "zstd"):
        raise ValueError(f"compression_type must be None, 'lz4' or 'zstd', "
                         f"got {compression_type!r}")
    for name, value in sizes.items():
        least = 0 if name in _MAY_BE_ZERO else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            what = "a non-negative" if least == 0 else "a positive"
            raise ValueError(f"{name} must be {what} integer, got {value!r}")


def _check_transactional(transactional_id: str | None, acks: str | int,
                         enable_idempotence: bool | None) -> None:
    """A transactional producer is idempotent with acks=all (Kafka's rule); its id is
    checked here, so a bad one fails before anything is sent."""
    if transactional_id is None:
        return
    validate_transactional_id(transactional_id)
    if _ACKS[acks] != -1 or enable_idempotence is False:
        raise ValueError(f"transactional id {transactional_id}: a transactional producer needs "
                         "acks='all' and idempotence")
