"""The consumer's fetcher: fetch requests to partition leaders, and what they bring back.

Owns: building one fetch request per leader and topic (``FetchTarget``) from where each wanted
partition's buffer ends; keeping one fetch per target in flight, so the next one is on the wire
while the caller decodes; buffering fetched batches per partition (a partition whose buffer
holds ``partition_max_bytes`` waits until it is drained); per-partition errors (a metadata
refresh for leadership errors, OFFSET_OUT_OF_RANGE handed to the consumer's callback);
``list_offsets`` with a retry when the leader moved; and turning buffered batches into Tables
with ``offset`` and ``partition`` columns, or into ConsumerRecords. ``fetch_request`` builds the
fetch a consumer or a range reader (``datasource/reader.py``) sends. Must not: hold positions,
the assignment or group state (``consumer.py`` does), or reach into broker internals.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from logstore.client.metadata import ClusterMetadata
from logstore.client.metrics import ConsumerMetrics
from logstore.errors import ApiError, OffsetOutOfRangeError
from logstore.messages.fetch import DEFAULT_FETCH_MAX_BYTES, FetchPartition, FetchRequest
from logstore.messages.log import (
    ListOffsetsPartition,
    ListOffsetsPartitionResult,
    ListOffsetsRequest,
)
from logstore.model import ConsumerRecord, TopicPartition
from logstore.rpc.client import FetchedBatch, FetchResponse

log = logging.getLogger(__name__)

MiB = 1024 * 1024
LEADER_ATTEMPTS = 5  # list_offsets tries, across leader moves


class FetchTarget(NamedTuple):
    """Where one fetch request goes: the leader of some of one topic's partitions."""

    leader: int
    topic: str


@dataclass(frozen=True, slots=True)
class FetchConfig:
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES  # fetch_max_bytes: per request
    partition_max_bytes: int = 8 * MiB  # max_partition_fetch_bytes: per partition
    min_bytes: int = 1
    max_wait_ms: int = 500


class Drained(NamedTuple):
    """Records taken from one partition's buffer: the topic's columns plus ``offset`` and
    ``partition``, and the offset after the last of them (the partition's new position)."""

    table: pa.Table
    next_offset: int


# The consumer's answer to OFFSET_OUT_OF_RANGE for a partition: reset its position, or raise.
OutOfRange = Callable[[TopicPartition, ApiError], None]
_Buffered = tuple[pa.RecordBatch, np.ndarray]  # a batch from the position on, and its offsets
_InFlight = tuple[dict[TopicPartition, int], Future[FetchResponse]]


def fetch_request(topic: str, offsets: Mapping[int, int], *, max_wait_ms: int,
                  max_bytes: int, partition_max_bytes: int | None = None, min_bytes: int = 1,
                  end_offset: int | None = None) -> FetchRequest:
    """A consumer's fetch of ``topic`` from the given offsets (partition -> offset).
    ``end_offset`` bounds a range reader's partition: no batch starting at or after it."""
    return FetchRequest(topic=topic, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                        max_bytes=max_bytes, partitions=[FetchPartition(
                            partition=p, offset=o, max_bytes=partition_max_bytes,
                            end_offset=end_offset) for p, o in offsets.items()])


class Fetcher:
    """Fetches for one consumer (used from the thread that polls; the pool only sends)."""

    def __init__(self, metadata: ClusterMetadata, config: FetchConfig,
                 on_out_of_range: OutOfRange, metrics: ConsumerMetrics | None = None) -> None:
        self._metadata = metadata
        self.metrics = metrics or ConsumerMetrics()
        self._config = config
        self._on_out_of_range = on_out_of_range
        self._buffer: dict[TopicPartition, deque[_Buffered]] = {}
        self._fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        self._inflight: dict[FetchTarget, _InFlight] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="logstore-fetch")

    # -- offsets lookups ---------------------------------------------------------------------

    def list_offsets(self, partitions: Iterable[TopicPartition], timestamp: int
                     ) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition for EARLIEST, LATEST or a timestamp."""
        out = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            entry = self._list_offset(tp, timestamp)
            entry.raise_error()
            out[tp] = (entry.offset, entry.timestamp)
        return out

    def _list_offset(self, tp: TopicPartition, timestamp: int) -> ListOffsetsPartitionResult:
        """Asked of ``tp``'s leader; when the leader moved, the metadata is refreshed and the
        new one asked."""
        request = ListOffsetsRequest(topic=tp.topic, partitions=[
            ListOffsetsPartition(partition=tp.partition, timestamp=timestamp)])
        for attempt in range(LEADER_ATTEMPTS):
            last = attempt == LEADER_ATTEMPTS - 1
            try:
                entry = self._metadata.leader_connection(tp).call(request).partitions[0]
                error = entry.error()
                if error is None or not error.refresh_metadata or last:
                    return entry
            except ApiError as e:
                if not e.retriable or last:
                    raise
            self._metadata.refresh([tp.topic])
            time.sleep(0.05 * (attempt + 1))  # backoff between leader lookups
        raise AssertionError("unreachable")

    # -- fetching ----------------------------------------------------------------------------

    def fetch(self, partitions: list[TopicPartition], position: Callable[[TopicPartition], int],
              timeout_s: float) -> bool:
        """Fetch ``partitions`` (each from where its buffer ends, else from ``position(tp)``):
        wait up to ``timeout_s`` for a fetch to land, buffer it, and send the next straight
        away. False when there was nothing to fetch (every buffer full, or none wanted)."""
        self._send(partitions, position, int(min(timeout_s * 1000, self._config.max_wait_ms)))
        if not self._inflight:
            return False
        done, _ = wait([f for _, f in self._inflight.values()], timeout=timeout_s,
                       return_when=FIRST_COMPLETED)
        for target, (sent, future) in list(self._inflight.items()):
            # pop, not del: handling one response may have forgotten another (a reset)
            if future in done and self._inflight.pop(target, None) is not None:
                self._handle(target, sent, future)
        self._send(partitions, position, self._config.max_wait_ms)
        return True

    def _targets(self, partitions: list[TopicPartition],
                 position: Callable[[TopicPartition], int]
                 ) -> dict[FetchTarget, dict[TopicPartition, int]]:
        """The partitions to fetch now and their offsets, by leader and topic."""
        targets: dict[FetchTarget, dict[TopicPartition, int]] = {}
        for tp in partitions:
            queue = self._buffer.get(tp)
            if queue and sum(b.nbytes for b, _ in queue) >= self._config.partition_max_bytes:
                continue
            try:
                offset = self._fetch_offsets.get(tp)
                if offset is None:
                    offset = self._fetch_offsets[tp] = position(tp)
                leader = self._metadata.leader(tp)
            except ApiError as e:
                if not e.retriable:
                    raise
                self._metadata.refresh([tp.topic])
                continue
            targets.setdefault(FetchTarget(leader, tp.topic), {})[tp] = offset
        return targets

    def _send(self, partitions: list[TopicPartition],
              position: Callable[[TopicPartition], int], max_wait_ms: int) -> None:
        for target, offsets in self._targets(partitions, position).items():
            if target not in self._inflight:
                self._inflight[target] = (offsets, self._pool.submit(
                    self._fetch, target, offsets, max_wait_ms))

    def _fetch(self, target: FetchTarget, offsets: dict[TopicPartition, int], max_wait_ms: int
               ) -> FetchResponse:
        request = fetch_request(
            target.topic, {tp.partition: o for tp, o in offsets.items()},
            max_wait_ms=max_wait_ms, max_bytes=self._config.max_bytes,
            partition_max_bytes=self._config.partition_max_bytes,
            min_bytes=self._config.min_bytes)
        started = time.monotonic()
        response = self._metadata.broker_connection(target.leader).fetch(request)
        self.metrics.fetched(target.topic, (time.monotonic() - started) * 1000.0,
                             sum(b.header.batch_size for b in response.batches),
                             sum(b.batch.num_rows for b in response.batches))
        return response

    def _handle(self, target: FetchTarget, sent: dict[TopicPartition, int],
                future: Future[FetchResponse]) -> None:
        try:
            response = future.result()
        except ApiError as e:
            if not e.retriable:
                raise
            log.info("fetch of %r from broker %d failed (%s); refreshing metadata",
                     target.topic, target.leader, e)
            self._metadata.refresh([target.topic])
            return
        for partition, summary in response.partitions.items():
            error = summary.error()
            if error is not None:
                self._on_partition_error(TopicPartition(target.topic, partition), error)
        for fetched in response.batches:
            self._buffer_batch(TopicPartition(target.topic, fetched.partition), sent, fetched)
        for partition, summary in response.partitions.items():
            position = self._fetch_offsets.get(TopicPartition(target.topic, partition))
            if summary.high_watermark >= 0 and position is not None:
                self.metrics.lag(target.topic, partition, max(summary.high_watermark - position,
                                                              0))

    def _buffer_batch(self, tp: TopicPartition, sent: dict[TopicPartition, int],
                      fetched: FetchedBatch) -> None:
        expected = self._fetch_offsets.get(tp)
        if tp not in sent or expected is None or sent[tp] > expected:
            return  # the position moved (seek, reset) while the fetch was in flight
        offsets = fetched.offsets()
        start = int(np.searchsorted(offsets, expected))
        if start < len(offsets):
            self._fetch_offsets[tp] = int(offsets[-1]) + 1
            if not fetched.header.is_control:
                self._buffer.setdefault(tp, deque()).append(
                    (fetched.batch.slice(start), offsets[start:]))
        else:
            self._fetch_offsets[tp] = max(expected, fetched.header.next_offset)

    def _on_partition_error(self, tp: TopicPartition, error: ApiError) -> None:
        if isinstance(error, OffsetOutOfRangeError):
            self._on_out_of_range(tp, error)
        elif error.refresh_metadata or error.retriable:
            self._metadata.refresh([tp.topic])
        else:
            raise error

    # -- the buffer --------------------------------------------------------------------------

    def drain(self, partitions: list[TopicPartition], limit: int
              ) -> dict[TopicPartition, Drained]:
        """Buffered records of ``partitions``, taken in that order, at most ``limit`` in all."""
        out: dict[TopicPartition, Drained] = {}
        for tp in partitions:
            queue = self._buffer.get(tp)
            if not queue or limit <= 0:
                continue
            batches, offsets = [], []
            while queue and limit > 0:
                batch, offs = queue.popleft()
                if batch.num_rows > limit:
                    queue.appendleft((batch.slice(limit), offs[limit:]))
                    batch, offs = batch.slice(0, limit), offs[:limit]
                batches.append(batch)
                offsets.append(offs)
                limit -= batch.num_rows
            all_offsets = np.concatenate(offsets)
            out[tp] = Drained(_with_offsets(pa.Table.from_batches(batches), all_offsets,
                                            tp.partition), int(all_offsets[-1]) + 1)
        return out

    def forget(self, tp: TopicPartition) -> None:
        """``tp``'s position moved: drop its buffer, where its fetching was, and fetches in
        flight for it."""
        self._fetch_offsets.pop(tp, None)
        self._buffer.pop(tp, None)
        self.metrics.forget(tp.topic, tp.partition)
        for target in [t for t, (sent, _) in self._inflight.items() if tp in sent]:
            del self._inflight[target]

    def retain(self, keep: set[TopicPartition]) -> None:
        """The assignment changed: keep the buffers of ``keep`` only, and send every fetch
        anew (their targets may have changed)."""
        for tp in set(self._fetch_offsets) - keep:
            self.metrics.forget(tp.topic, tp.partition)
        self._buffer = {tp: b for tp, b in self._buffer.items() if tp in keep}
        self._fetch_offsets = {tp: o for tp, o in self._fetch_offsets.items() if tp in keep}
        self._inflight.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _with_offsets(table: pa.Table, offsets: np.ndarray, partition: int) -> pa.Table:
    table = table.append_column("offset", pa.array(offsets, pa.int64()))
    return table.append_column("partition",
                               pa.array(np.full(len(offsets), partition, dtype=np.int32)))


def to_records(tp: TopicPartition, table: pa.Table) -> list[ConsumerRecord]:
    """A drained Table as ConsumerRecords (a typed topic's value is a dict of its columns)."""
    n = table.num_rows
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist() if "value" in table.column_names else \
        table.drop_columns(["key", "timestamp", "headers", "offset", "partition"]).to_pylist()
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    offsets = table.column("offset").to_pylist()
    hcol = table.column("headers")
    if hcol.null_count == n:
        headers: Iterable[Any] = repeat((), n)  # shared empty tuple: no per-record allocation
    else:
        headers = [[(h["key"], h["value"]) for h in hs] if hs else []
                   for hs in hcol.to_pylist()]
    # tuple.__new__ builds each record in C; calling the NamedTuple runs its Python __new__.
    return list(map(tuple.__new__, repeat(ConsumerRecord, n), zip(
        repeat(tp.topic, n), repeat(tp.partition, n), offsets, stamps, keys, values, headers,
        strict=False)))
