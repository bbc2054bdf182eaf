"""Followers pulling from leaders: one fetcher thread per (leader broker, topic).

Owns: the follower's fetch loop (long-poll fetches carrying ``replica_id`` and the leader epoch
the follower knows), appending what arrives with ``append_as_follower``, learning the high
watermark from each response, and truncating by leader epoch before the first fetch from a new
leader (``offsets_for_leader_epoch``), so a divergent tail never survives. Every wait is
bounded; errors back off and retry until the broker moves the partition elsewhere.
Must not: import the transport (connections come from the injected ``connect``), decide
leadership, or touch ZooKeeper.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow.ipc as ipc

from logstore.errors import ApiError, OffsetOutOfRangeError
from logstore.messages import Message, Request
from logstore.messages.cluster import EpochRequestPartition, OffsetsForLeaderEpochRequest
from logstore.messages.fetch import FetchPartition, FetchPartitionSummary, FetchRequest
from logstore.model import TopicPartition
from logstore.records import StoredBatch, decode_message, stored_message_bytes
from logstore.replication.epoch_cache import UNDEFINED_EPOCH
from logstore.replication.partition import Partition

log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 8 * 1024 * 1024
BACKOFF_S = 0.2
IDLE_WAIT_S = 1.0


R = TypeVar("R", bound=Message)


class FetchedPartitions(Protocol):
    """What a follower reads of a fetch response (``rpc.client.FetchResponse``)."""

    @property
    def batches(self) -> list[Any]: ...

    @property
    def partitions(self) -> dict[int, FetchPartitionSummary]: ...


class LeaderConnection(Protocol):
    """What a broker needs of a connection to another (``rpc.client.BrokerConnection``)."""

    def call(self, request: Request[R], timeout_s: float | None = None) -> R: ...

    def fetch(self, request: FetchRequest, timeout_s: float | None = None
              ) -> FetchedPartitions: ...


# broker id -> a connection to it, or None when the broker is not registered.
Connect = Callable[[int], LeaderConnection | None]


@dataclass
class _Fetching:
    partition: Partition
    leader_epoch: int
    truncated: bool = False


def to_stored(fetched: Any) -> StoredBatch:
    """A fetched batch as the log stores it: the leader's stored IPC message, byte for byte (a
    replica fetch ships the message bytes, see ``records.stored_message_batch``), so nothing
    is decoded or encoded again. The CRC is checked once, by the log's append_as_follower."""
    return decode_message(ipc.read_message(stored_message_bytes(fetched.batch)), verify=False)


class ReplicaFetcher:
    """Fetches the partitions of one topic that this broker follows on one leader."""

    def __init__(self, broker_id: int, leader_id: int, topic: str, connect: Connect,
                 max_wait_ms: int = FETCH_MAX_WAIT_MS) -> None:
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.topic = topic
        self._connect = connect
        self._max_wait_ms = max_wait_ms
        self._lock = threading.Lock()
        self._parts: dict[int, _Fetching] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"fetcher-{leader_id}-{topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, partition: Partition) -> None:
        with self._lock:
            self._parts[partition.tp.partition] = _Fetching(partition, partition.leader_epoch)
        self._wake.set()

    def remove(self, partition: int) -> bool:
        """Stop fetching ``partition``; True if the fetcher has nothing left."""
        with self._lock:
            self._parts.pop(partition, None)
            return not self._parts

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                parts = dict(self._parts)
            if not parts:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            try:
                self._fetch_once(parts)
            except ApiError as e:
                log.info("fetcher %d<-%d %s: %s; retrying", self.broker_id, self.leader_id,
                         self.topic, e)
                self._stop.wait(BACKOFF_S)
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("fetcher %d<-%d %s failed", self.broker_id, self.leader_id,
                              self.topic)
                self._stop.wait(BACKOFF_S)

    def _fetch_once(self, parts: dict[int, _Fetching]) -> None:
        conn = self._connect(self.leader_id)
        if conn is None:
            self._stop.wait(BACKOFF_S)
            return
        for f in parts.values():
            if not f.truncated:
                self._truncate_by_epoch(conn, f)
        response = conn.fetch(FetchRequest(
            topic=self.topic, replica_id=self.broker_id, max_wait_ms=self._max_wait_ms,
            min_bytes=1, max_bytes=FETCH_MAX_BYTES, partitions=[FetchPartition(
                partition=p, offset=f.partition.log.log_end_offset,
                current_leader_epoch=f.leader_epoch) for p, f in parts.items()]))
        by_partition: dict[int, list[Any]] = {}
        for b in response.batches:
            by_partition.setdefault(b.partition, []).append(b)
        backoff = False
        for p, summary in response.partitions.items():
            if p in parts:
                backoff |= self._handle(parts[p], summary, by_partition.get(p, []))
        if backoff:
            self._stop.wait(BACKOFF_S)

    def _handle(self, f: _Fetching, summary: FetchPartitionSummary, batches: list[Any]
                ) -> bool:
        """Apply one partition's part of a response; True if the fetcher should back off."""
        error = summary.error()
        p = f.partition
        if error is None:
            stored = [to_stored(b) for b in batches]
            p.append_as_follower(stored, summary.high_watermark, f.leader_epoch)
            return False
        if isinstance(error, OffsetOutOfRangeError):
            self._out_of_range(f, summary)
            return False
        if error.refresh_metadata:
            # Leadership moved or is moving (or the leader lost the partition's disk, which
            # it logs itself): the controller tells this broker where to fetch from next, so
            # backing off and retrying is all there is to do here.
            log.debug("%s: fetch from leader %d refused: %s", p.tp, self.leader_id, error)
        else:
            log.warning("%s: fetch from leader %d failed: %s", p.tp, self.leader_id, error)
        return True

    def _out_of_range(self, f: _Fetching, summary: FetchPartitionSummary) -> None:
        p, leo = f.partition, f.partition.log.log_end_offset
        if leo < summary.log_start_offset:
            log.warning("%s: behind the leader's log start %d; restarting the log there",
                        p.tp, summary.log_start_offset)
            p.truncate_fully_and_start_at(summary.log_start_offset)
        else:
            f.truncated = False  # ahead of the leader: truncate by epoch again

    def _truncate_by_epoch(self, conn: LeaderConnection, f: _Fetching) -> None:
        """Kafka's follower truncation: ask the leader where our latest epoch ended there, and
        cut our log to that (or to where that epoch ends here, if the leader knows only an
        older one)."""
        p = f.partition
        epoch = p.epochs.latest_epoch
        resp = conn.call(OffsetsForLeaderEpochRequest(topic=self.topic, partitions=[
            EpochRequestPartition(partition=p.tp.partition, leader_epoch=epoch,
                                  current_leader_epoch=f.leader_epoch)]))
        (entry,) = resp.partitions
        entry.raise_error(f"{p.tp}: offsets_for_leader_epoch {epoch} on leader {self.leader_id}")
        if entry.leader_epoch == UNDEFINED_EPOCH:
            # No epoch of ours is known there: nothing we hold is the leader's (unless we know
            # no epochs either, as in an empty log).
            target = p.log.log_end_offset if epoch == UNDEFINED_EPOCH else 0
        else:
            own_end = p.end_offset_for_epoch(entry.leader_epoch)[1]
            target = min(entry.end_offset, own_end)
        if target < p.log.log_end_offset:
            log.warning("%s: truncating the divergent tail %d..%d (leader %d, epoch %d)",
                        p.tp, target, p.log.log_end_offset, self.leader_id, epoch)
            p.truncate_to(target)
        f.truncated = True


class FetcherManager:
    """The fetcher threads of one broker, keyed by (leader, topic)."""

    def __init__(self, broker_id: int, connect: Connect) -> None:
        self._broker_id = broker_id
        self._connect = connect
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, str], ReplicaFetcher] = {}
        self._where: dict[TopicPartition, tuple[int, str]] = {}

    def add(self, partition: Partition, leader_id: int) -> None:
        """Fetch ``partition`` from ``leader_id`` (truncating by epoch first)."""
        self.remove(partition.tp)
        key = (leader_id, partition.tp.topic)
        with self._lock:
            fetcher = self._fetchers.get(key)
            if fetcher is None:
                fetcher = ReplicaFetcher(self._broker_id, leader_id, partition.tp.topic,
                                         self._connect)
                self._fetchers[key] = fetcher
                fetcher.start()
            fetcher.add(partition)
            self._where[partition.tp] = key

    def remove(self, tp: TopicPartition) -> None:
        with self._lock:
            key = self._where.pop(tp, None)
            fetcher = self._fetchers.get(key) if key else None
            if fetcher is not None and fetcher.remove(tp.partition):
                del self._fetchers[key]  # type: ignore[arg-type]
                fetcher.stop(0)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._where.clear()
        for f in fetchers:
            f.stop(0)
        for f in fetchers:
            f.stop(timeout_s)
