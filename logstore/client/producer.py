"""The producer: per-record ``send()`` and columnar ``send_batch()``.

``send()`` appends a tuple to the topic's current ``RecordChunk`` and returns a tiny future; a
background sender turns whole chunks into Arrow batches (vectorised partitioning and
timestamps), splits them per partition and writes them, pipelined, on one long-lived DoPut
stream per (broker, topic). Idempotence (producer id, epoch, per-partition sequence) lets the
broker drop duplicates and reject gaps, so retried batches keep their partition's order.
Must not: reach into broker internals.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.client.batches import (
    FutureBatchMetadata,
    FutureRecordMetadata,
    ProducerBatch,
    RecordChunk,
)
from logstore.client.metadata import ClusterMetadata, TopicInfo
from logstore.client.metrics import ClientEndpoint, Layout, ProducerMetrics
from logstore.client.partitioner import StickyPartitioner, assign_partitions
from logstore.client.sender import Sender
from logstore.errors import InvalidRecordError, MessageTooLargeError, RequestTimedOutError
from logstore.records import HEADERS_TYPE, TIMESTAMP_TYPE, conform_batch, value_columns
from logstore.security.config import client_security

log = logging.getLogger(__name__)

MiB = 1024 * 1024
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
                 metadata_max_age_ms: int = 300_000, client_id: str = "logstore-producer",
                 metrics_listener: str | None = None, **security: Any) -> None:
        if acks not in _ACKS:
            raise ValueError(f"acks must be 'all', 1 or 0, got {acks!r}")
        if compression_type not in (None, "none", "lz4", "zstd"):
            raise ValueError(f"compression_type must be None, 'lz4' or 'zstd', "
                             f"got {compression_type!r}")
        for name, value in (("linger_ms", linger_ms), ("batch_size", batch_size),
                            ("max_request_size", max_request_size),
                            ("delivery_timeout_ms", delivery_timeout_ms)):
            if not isinstance(value, int) or value < (0 if name == "linger_ms" else 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.acks = _ACKS[acks]
        self.linger_s = linger_ms / 1000.0
        self.batch_size = batch_size
        self.max_request_size = max_request_size
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        compression = None if compression_type in (None, "none") else compression_type
        self._metadata = ClusterMetadata(bootstrap_servers, request_timeout_ms, compression,
                                         metadata_max_age_ms,
                                         client_security(security, "Producer"))
        idempotent = self.acks != 0 if enable_idempotence is None else enable_idempotence
        in_flight = max_in_flight_requests_per_connection
        if not idempotent and retries > 0:
            in_flight = 1  # without sequence numbers only one batch in flight keeps order
        self._metrics = ProducerMetrics()
        self._sender = Sender(self._metadata, self.acks, request_timeout_ms, retries,
                              retry_backoff_ms / 1000.0, in_flight, buffer_memory, idempotent,
                              self._metrics)
        self._endpoint = ClientEndpoint(metrics_listener, "producer", client_id,
                                        self._metrics.layout) if metrics_listener else None
        self._sticky = StickyPartitioner()
        self._chunks: dict[str, RecordChunk] = {}
        self._lock = threading.Lock()
        self._order = 0
        self._ready_chunks: list[RecordChunk] = []
        self._draining_chunks: list[RecordChunk] = []  # taken by the drainer, being split
        self._rows_limit: dict[str, int] = {}  # rows per chunk that make about batch_size
        self._closed = False
        self._wake = threading.Event()
        self._drainer = threading.Thread(target=self._drain_loop, name="logstore-producer-drain",
                                         daemon=True)
        self._drainer.start()

    # -- public API --------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: bytes | None = None,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> FutureRecordMetadata:
        """Queue one record; the future's ``result(timeout)`` is its RecordMetadata."""
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key", topic)
        if value is not None and type(value) is not bytes and type(value) is not dict:
            value = _as_bytes(value, "value", topic)
        if partition is not None or type(value) is dict:
            self._check_record(topic, partition, value)
        with self._lock:
            chunk = self._chunks.get(topic)
            if chunk is not None:
                rows = chunk.rows
                rows.append((key, value, partition, timestamp_ms, headers))
                index = len(rows) - 1
                if index >= chunk.limit:
                    self._swap_chunk(topic)
                elif index == 0 and self.linger_s == 0:
                    self._wake.set()  # linger_ms=0: go now, with whatever gathers meanwhile
                return FutureRecordMetadata(chunk, index)
        self._start_topic(topic)
        return self.send(topic, value, key, partition, timestamp_ms, headers)

    def send_batch(self, topic: str, data: pa.Table | pa.RecordBatch,
                   partition: int | None = None) -> FutureBatchMetadata:
        """Send a whole Arrow table or batch with ``key``/``value`` columns (and optional
        ``timestamp``, ``headers``; a typed topic's value columns in place of ``value``),
        partitioned and split without any per-record Python work."""
        self._check_open()
        info = self._topic_info(topic)
        if partition is not None and partition not in info.partitions:
            raise InvalidRecordError(f"topic {topic!r} has no partition {partition} "
                                     f"(it has {info.num_partitions})")
        batch = self._prepare_columns(topic, info, data)
        pieces, _ = self._split(topic, info, batch, partition)
        future = FutureBatchMetadata(topic, len(pieces))
        for pb in pieces:
            pb.batch_future = future
        self._sender.enqueue(pieces)
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send every record sent before this call and wait until each is acknowledged (or
        failed). Records other threads send meanwhile are not waited for, so a busy producer
        cannot starve a flush."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for topic in list(self._chunks):
                if self._chunks[topic].rows:
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
                self._chunks.clear()  # a later send() finds no chunk and raises
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
        """What send() can check cheaply, so one bad record fails alone and at once."""
        info = self._topic_info(topic)
        if partition is not None and (type(partition) is not int
                                      or not 0 <= partition < info.num_partitions):
            raise InvalidRecordError(f"topic {topic!r} has no partition {partition!r} "
                                     f"(it has {info.num_partitions})")
        if type(value) is dict and info.value_schema is None:
            raise InvalidRecordError(f"send to {topic!r}: a dict value needs a typed topic; "
                                     "this topic's values are bytes")

    def _start_topic(self, topic: str) -> RecordChunk:
        self._check_open()
        self._topic_info(topic)
        with self._lock:
            if topic not in self._chunks:
                self._chunks[topic] = RecordChunk(topic, self._rows_limit.get(topic, 1000))
            return self._chunks[topic]

    def _swap_chunk(self, topic: str) -> None:
        """Hand the topic's full chunk to the drainer (caller holds ``self._lock``)."""
        full = self._chunks[topic]
        self._chunks[topic] = RecordChunk(topic, self._rows_limit.get(topic, 1000))
        self._ready_chunks.append(full)
        self._wake.set()

    def _drain_loop(self) -> None:
        while True:
            self._wake.wait(self.linger_s if self.linger_s > 0 else 0.001)
            self._wake.clear()
            with self._lock:
                now = time.monotonic()
                for topic, chunk in list(self._chunks.items()):
                    if chunk.rows and now - chunk.created >= self.linger_s:
                        self._swap_chunk(topic)
                ready, self._ready_chunks = self._ready_chunks, []
                self._draining_chunks = ready
            for chunk in ready:
                self._drain_chunk(chunk)
            with self._lock:
                self._draining_chunks = []
            if self._closed and not ready:
                return

    def _drain_chunk(self, chunk: RecordChunk) -> None:
        try:
            info = self._topic_info(chunk.topic)
            keys, values, parts, stamps, headers = zip(*chunk.rows, strict=False)
            batch, timestamps = self._rows_to_batch(info, keys, values, stamps, headers)
            self._rows_limit[chunk.topic] = max(
                1, min(1_000_000, int(self.batch_size * batch.num_rows / max(batch.nbytes, 1))))
            explicit = None
            if parts.count(None) != len(parts):
                explicit = pa.array(parts, pa.int32()).fill_null(-1).to_numpy()
                bad = explicit[(explicit >= info.num_partitions) | (explicit < -1)]
                if len(bad):
                    raise InvalidRecordError(f"topic {chunk.topic!r} has no partition "
                                             f"{int(bad[0])} (it has {info.num_partitions})")
            pieces, partitions = self._split(chunk.topic, info, batch, None, explicit, chunk)
            chunk.expect(len(pieces), partitions, timestamps)
            self._sender.enqueue(pieces)
        except Exception as e:  # a bad chunk fails its own futures, never the producer
            err = e if isinstance(e, InvalidRecordError | MessageTooLargeError) else \
                InvalidRecordError(f"topic {chunk.topic!r}: {type(e).__name__}: {e}")
            chunk.fail(err)

    def _rows_to_batch(self, info: TopicInfo, keys: tuple[Any, ...], values: tuple[Any, ...],
                       stamps: tuple[Any, ...], headers: tuple[Any, ...]) -> tuple[pa.RecordBatch, np.ndarray]:
        n = len(keys)
        now = time.time_ns() // 1_000_000
        ts = pa.array(stamps, pa.int64()).fill_null(now) if stamps.count(None) != n else \
            pa.array(np.full(n, now, dtype=np.int64))
        hdrs = pa.nulls(n, HEADERS_TYPE) if headers.count(None) == n else \
            pa.array(headers, HEADERS_TYPE)
        columns: dict[str, pa.Array] = {"key": pa.array(keys, pa.binary())}
        if info.value_schema is None:
            columns["value"] = pa.array(values, pa.binary())
        else:
            struct = pa.array(values, pa.struct(list(info.value_schema)))
            for name in info.value_schema.names:
                columns[name] = struct.field(name)
        columns["timestamp"] = ts.cast(TIMESTAMP_TYPE)
        columns["headers"] = hdrs
        batch = pa.RecordBatch.from_pydict(columns, schema=info.schema)
        return batch, ts.to_numpy(zero_copy_only=False)

    # -- columnar path -----------------------------------------------------------------------

    def _prepare_columns(self, topic: str, info: TopicInfo, data: pa.Table | pa.RecordBatch
                         ) -> pa.RecordBatch:
        if isinstance(data, pa.Table):
            data = data.combine_chunks().to_batches()[0] if data.num_rows else \
                pa.RecordBatch.from_pylist([], schema=data.schema)
        if not isinstance(data, pa.RecordBatch):
            raise InvalidRecordError(f"send_batch to {topic!r}: expected a pyarrow Table or "
                                     f"RecordBatch, got {type(data).__name__}")
        missing = [c for c in value_columns(info.schema) if c not in data.schema.names]
        if missing:
            raise InvalidRecordError(f"send_batch to {topic!r}: missing column(s) {missing}")
        if "timestamp" not in data.schema.names:
            now = np.full(data.num_rows, time.time_ns() // 1_000_000, dtype=np.int64)
            data = data.append_column("timestamp", pa.array(now).cast(TIMESTAMP_TYPE))
        return conform_batch(data, info.schema, f"send_batch to {topic!r}")

    def _split(self, topic: str, info: TopicInfo, batch: pa.RecordBatch,
               partition: int | None, explicit: np.ndarray | None = None,
               chunk: RecordChunk | None = None) -> tuple[list[ProducerBatch], np.ndarray]:
        """One ProducerBatch per partition (and per size limit), in record order, and the
        partition of every record."""
        n = batch.num_rows
        if partition is not None:
            parts = np.full(n, partition, dtype=np.int32)
        else:
            block = max(1, int(self.batch_size / max(batch.nbytes / max(n, 1), 1)))
            parts = assign_partitions(batch.column(0), explicit, topic, info.num_partitions,
                                      self._sticky, block)
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        pieces: list[ProducerBatch] = []
        deadline = time.monotonic() + self.delivery_timeout_s
        for rows in np.split(order, bounds) if n else []:
            p = int(parts[rows[0]])
            sub = batch.take(pa.array(rows)) if len(rows) != n else batch
            # A caller's own columnar batch goes whole up to max_request_size; records
            # gathered by send() are cut at batch_size.
            limit = self.batch_size if chunk is not None else self.max_request_size
            for lo, hi in self._size_slices(topic, sub, limit):
                pieces.append(self._new_batch(topic, p, sub.slice(lo, hi - lo), deadline,
                                              chunk, rows[lo:hi]))
        return pieces, parts

    def _size_slices(self, topic: str, batch: pa.RecordBatch, limit: int
                     ) -> list[tuple[int, int]]:
        """Row ranges of ``batch`` of at most ``limit`` bytes each (a single record larger
        than max_request_size is an error)."""
        # The encoded size, not nbytes: IPC padding and an all-null headers column make the
        # message about a tenth larger than the arrays in memory; keep 5% for the header.
        n, size = batch.num_rows, int(pa.ipc.get_record_batch_size(batch) * 1.05) + 1024
        if size <= limit or n <= 1:
            if size > self.max_request_size:
                raise MessageTooLargeError(f"a record to {topic!r} is {size} bytes, more than "
                                           f"max_request_size {self.max_request_size}")
            return [(0, n)]
        rows = max(1, int(n * limit / size))
        return [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]

    def _new_batch(self, topic: str, partition: int, batch: pa.RecordBatch, deadline: float,
                   chunk: RecordChunk | None, rows: np.ndarray) -> ProducerBatch:
        from logstore.model import TopicPartition

        with self._lock:
            self._order += 1
            order = self._order
        return ProducerBatch(TopicPartition(topic, partition), batch, order, deadline, chunk,
                             rows if chunk is not None else None)

    # -- helpers -----------------------------------------------------------------------------

    def _topic_info(self, topic: str) -> TopicInfo:
        return self._metadata.topic(topic)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the producer is closed")


def _as_bytes(obj: Any, what: str, topic: str) -> bytes:
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    if isinstance(obj, str):
        return obj.encode()
    raise InvalidRecordError(f"send to {topic!r}: {what} must be bytes, str or None, got "
                             f"{type(obj).__name__}")
