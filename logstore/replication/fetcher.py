"""Followers replicating from leaders: one push session per (leader broker, topic).

Owns: the follower's side of replication. Each ``ReplicaFetcher`` holds one fetch session
(``messages/fetch_session.py``) with its leader for one topic: the leader pushes batches as
its log grows; a reading thread appends them with ``append_as_follower`` (the leader's stored
bytes as they are: only their headers are read), learns the high watermark the leader sends
with them (and with a frame of its own when only the watermark moved), and acknowledges its
new log end offset on the session together with the credit it gives back, so the leader
advances the high watermark (and answers acks=all) without waiting for a fetch request. A
control thread positions partitions in the session: before the first push from a leader
epoch it truncates by leader epoch (``offsets_for_leader_epoch``), so a divergent tail never
survives; it adds partitions, moves them after an error, removes them, and, while nothing is
pushed, repeats the log end offsets every ``KEEPALIVE_S`` so the leader keeps an idle,
caught-up follower in the ISR. Frames of a partition from before its last positioning are
dropped (the update ``seq`` fences them). A partition the leader ends (NOT_LEADER_OR_FOLLOWER,
a fenced epoch, ...) is positioned again after ``BACKOFF_S`` until the controller moves it
elsewhere; a session that ends (the leader gone or stopping) is opened again after
``BACKOFF_S``. Every wait is bounded.

Tiered partitions: a follower never replicates the remote tier. When its position is below
the leader's local log start offset, the leader ends the partition with
OFFSET_MOVED_TO_TIERED_STORAGE; the follower then asks the leader for its leader-epoch cache
(``leader_epochs``) and restarts its log at the leader's local log start offset with the
leader's epochs up to it (Kafka builds the same state from the remote segment's epoch
checkpoint). Afterwards it keeps its local log start offset at its leader's, so that it
deletes what the leader deleted locally.

Topic incarnations: a replica whose topic this broker's metadata already gives another id
(deleted and created again; the metadata sync stops the replica and deletes its log soon) is
not positioned, its pushes are dropped and its log end offset is not acknowledged: the new
topic's records must not go into the old log, nor the old log's end count for the new topic's
leader (``topic_id_of``). And whatever this broker's metadata says, every request to the
leader carries the replica's topic id (``offsets_for_leader_epoch``, ``leader_epochs``, each
partition of the session): a leader whose replica is of another incarnation (it learns of the
recreated topic later than this broker, or earlier) answers INCONSISTENT_TOPIC_ID (or
UNKNOWN_TOPIC_ID), and the partition is positioned again after ``BACKOFF_S``, nothing
appended, until the two converge; both incarnations start at leader epoch 0, so truncation by
epoch alone would keep the old records as the new topic's.
Must not: import the transport (connections come from the injected ``connect``), decide
leadership, or touch ZooKeeper.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import (
    ApiError,
    NetworkError,
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    UnknownServerError,
)
from logstore.messages import Message, Request
from logstore.messages.cluster import (
    EpochRequestPartition,
    LeaderEpochsPartition,
    LeaderEpochsRequest,
    OffsetsForLeaderEpochRequest,
)
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionPartitionEnd,
    FetchSessionPartitionState,
    FetchSessionRequest,
    FetchSessionUpdate,
    FetchSessionUpdated,
    PartitionOffset,
)
from logstore.model import TopicPartition
from logstore.records import StoredBatch, decode_message
from logstore.replication.epoch_cache import UNDEFINED_EPOCH
from logstore.replication.partition import Partition

log = logging.getLogger(__name__)

FETCH_MAX_BYTES = 8 * 1024 * 1024  # per push
WINDOW_BYTES = 4 * FETCH_MAX_BYTES  # the credit in flight: pushes on the wire while we append
BACKOFF_S = 0.2
KEEPALIVE_S = 0.5  # well under any replica_lag_time_max_ms
IDLE_WAIT_S = 1.0


R = TypeVar("R", bound=Message)
# A topic's id in this broker's metadata now, None when it has none.
TopicIdOf = Callable[[str], str | None]


class PushedPartition(Protocol):
    """What a follower reads of a pushed partition (``rpc.session_client.PartitionNews``):
    the leader's stored messages, byte for byte."""

    @property
    def state(self) -> FetchSessionPartitionState: ...

    @property
    def messages(self) -> list[pa.Buffer]: ...

    @property
    def size_bytes(self) -> int: ...


class LeaderSession(Protocol):
    """What a follower needs of a session (``rpc.session_client.FetchSessionStream``)."""

    def send(self, frame: FetchSessionCredit | FetchSessionUpdate) -> None: ...

    def read(self) -> PushedPartition | FetchSessionUpdated | FetchSessionPartitionEnd | None:
        ...

    def close(self) -> None: ...


class LeaderConnection(Protocol):
    """What a broker needs of a connection to another (``rpc.client.BrokerConnection``)."""

    def call(self, request: Request[R], timeout_s: float | None = None) -> R: ...

    def open_fetch_session(self, request: FetchSessionRequest) -> LeaderSession: ...


# broker id -> a connection to it, or None when the broker is not registered.
Connect = Callable[[int], LeaderConnection | None]


@dataclass
class _Fetching:
    partition: Partition
    leader_epoch: int
    truncated: bool = False
    restart_at: int | None = None  # the leader's local log start (OFFSET_MOVED_TO_TIERED...)
    seq: float = math.inf  # the session update that positioned it (inf: not positioned)
    retry_at: float = 0.0  # monotonic time before which it is not positioned again


def to_stored(message: pa.Buffer) -> StoredBatch:
    """A pushed message as the log stores it: the leader's stored IPC message, byte for byte
    (a replica's session ships the message bytes, see ``rpc.codec.stored_messages_batch``),
    of which only the header is read. The CRC is checked once, by the log's
    append_as_follower."""
    return decode_message(ipc.read_message(message), verify=False)


class ReplicaFetcher:
    """Replicates the partitions of one topic that this broker follows on one leader."""

    def __init__(self, broker_id: int, leader_id: int, topic: str, connect: Connect,
                 topic_id_of: TopicIdOf | None = None) -> None:
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.topic = topic
        self._connect = connect
        self._topic_id_of = topic_id_of
        self._lock = threading.Lock()
        self._parts: dict[int, _Fetching] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._session: LeaderSession | None = None
        self._session_retry_at = 0.0
        self._in_session: set[int] = set()  # what the leader holds subscribed
        self._seq = 0
        self._applied = 0
        self._last_ack = 0.0
        self._where = f"fetcher {broker_id}<-{leader_id} {topic}"
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
            empty = not self._parts
        self._wake.set()
        return empty

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        self._end_session()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    # -- the control thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except ApiError as e:
                log.info("%s: %s; retrying", self._where, e)
                self._end_session()
                self._stop.wait(BACKOFF_S)
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("%s failed", self._where)
                self._end_session()
                self._stop.wait(BACKOFF_S)
            self._wake.wait(KEEPALIVE_S if self._parts else IDLE_WAIT_S)
            self._wake.clear()

    def _step(self) -> None:
        """Open the session, position partitions in it, remove what left, keep alive."""
        with self._lock:
            parts = dict(self._parts)
        if not parts:
            self._end_session()
            return
        conn = self._connect(self.leader_id)
        now = time.monotonic()
        if conn is None or (self._session is None and now < self._session_retry_at):
            return
        ready = {p: f for p, f in parts.items() if f.seq == math.inf and f.retry_at <= now}
        adds = [self._prepare(conn, f) for f in ready.values()]
        positions = {f.partition.tp.partition: a for f, a in zip(
            ready.values(), adds, strict=True) if a is not None}
        if self._session is None:
            self._open(conn, ready, positions)
            return
        gone = sorted(self._in_session - set(parts))
        if positions or gone:
            self._update(ready, positions, gone)
        elif now - self._last_ack >= KEEPALIVE_S:
            self._acknowledge(0, [f for f in parts.values() if f.seq != math.inf])

    def _stale(self, f: _Fetching) -> bool:
        """Whether ``f``'s replica belongs to a topic id this broker's metadata has replaced
        (see the module docstring)."""
        if self._topic_id_of is None or f.partition.topic_id is None:
            return False
        current = self._topic_id_of(self.topic)
        return current is not None and current != f.partition.topic_id

    def _prepare(self, conn: LeaderConnection, f: _Fetching) -> FetchPartition | None:
        """Truncate (or restart) ``f`` as its leader epoch needs; where it starts in the
        session, or None to try again after a backoff."""
        if self._stale(f):
            log.debug("%s: topic id %s was replaced; not fetching it until the metadata sync "
                     "stops it", f.partition.tp, f.partition.topic_id)
            f.retry_at = time.monotonic() + BACKOFF_S
            return None
        try:
            if f.restart_at is not None:
                self._restart_at_leader_local_start(conn, f, f.restart_at)
            if not f.truncated:
                self._truncate_by_epoch(conn, f)
        except ApiError as e:
            log.info("%s: %s; positioning %s again in %.1f s", self._where, e,
                     f.partition.tp, BACKOFF_S)
            f.retry_at = time.monotonic() + BACKOFF_S
            return None
        return FetchPartition(partition=f.partition.tp.partition,
                              offset=f.partition.log.log_end_offset,
                              current_leader_epoch=f.leader_epoch,
                              topic_id=f.partition.topic_id)

    def _open(self, conn: LeaderConnection, ready: dict[int, _Fetching],
              positions: dict[int, FetchPartition]) -> None:
        session = conn.open_fetch_session(FetchSessionRequest(
            topic=self.topic, replica_id=self.broker_id, credit_bytes=WINDOW_BYTES,
            max_bytes=FETCH_MAX_BYTES, partition_max_bytes=FETCH_MAX_BYTES,
            state_with_first_batch=True,
            partitions=list(positions.values())))
        with self._lock:
            self._session, self._seq, self._applied = session, 0, 0
            self._in_session = set(positions)
            for p in positions:
                if self._parts.get(p) is ready[p]:
                    ready[p].seq = 0
        self._last_ack = time.monotonic()
        threading.Thread(target=self._read, args=(session,), daemon=True,
                         name=f"fetcher-{self.leader_id}-{self.topic}-session").start()

    def _update(self, ready: dict[int, _Fetching], positions: dict[int, FetchPartition],
                gone: list[int]) -> None:
        session = self._session
        assert session is not None
        with self._lock:
            self._seq += 1
            seq = self._seq
            for p in positions:
                if self._parts.get(p) is ready[p]:
                    ready[p].seq = seq
            self._in_session = (self._in_session - set(gone)) | set(positions)
        session.send(FetchSessionUpdate(seq=seq, add=list(positions.values()), remove=gone))

    def _acknowledge(self, credit: int, parts: list[_Fetching]) -> None:
        session = self._session
        if session is None:
            return
        self._last_ack = time.monotonic()
        session.send(FetchSessionCredit(credit_bytes=credit, log_end_offsets=[
            PartitionOffset(partition=f.partition.tp.partition,
                            offset=f.partition.log.log_end_offset)
            for f in parts if not self._stale(f)]))

    def _end_session(self) -> None:
        with self._lock:
            session, self._session = self._session, None
            for f in self._parts.values():
                f.seq = math.inf
            self._in_session = set()
        if session is not None:
            session.close()

    # -- the reading thread ----------------------------------------------------------------

    def _read(self, session: LeaderSession) -> None:
        error: ApiError
        try:
            while (frame := session.read()) is not None:
                self._on_frame(session, frame)
            error = NetworkError(f"{self._where}: the leader ended the session")
        except ApiError as e:
            error = e
        except Exception as e:  # boundary: the session ends, the control thread reopens it
            log.exception("%s: the session failed", self._where)
            error = UnknownServerError(f"{type(e).__name__}: {e}")
        with self._lock:
            current = self._session is session
        if current and not self._stop.is_set():
            log.info("%s: session ended (%s); opening it again in %.1f s", self._where,
                     error, BACKOFF_S)
            self._session_retry_at = time.monotonic() + BACKOFF_S
            self._end_session()
            self._wake.set()

    def _on_frame(self, session: LeaderSession,
                  frame: PushedPartition | FetchSessionUpdated | FetchSessionPartitionEnd
                  ) -> None:
        if isinstance(frame, FetchSessionUpdated):
            with self._lock:
                self._applied = max(self._applied, frame.seq)
            return
        state = frame if isinstance(frame, FetchSessionPartitionEnd) else frame.state
        with self._lock:
            f = self._parts.get(state.partition)
            current = f is not None and self._session is session and f.seq <= self._applied
        if f is None or not current:
            if not isinstance(frame, FetchSessionPartitionEnd) and frame.messages:
                session.send(FetchSessionCredit(credit_bytes=frame.size_bytes))
            return
        if isinstance(frame, FetchSessionPartitionEnd):
            self._ended(f, frame)
        else:
            self._append(session, f, frame)

    def _append(self, session: LeaderSession, f: _Fetching, pushed: PushedPartition) -> None:
        """Append a push and acknowledge it (the credit back, and the new log end offset)."""
        p, state = f.partition, pushed.state
        if self._stale(f):
            session.send(FetchSessionCredit(credit_bytes=pushed.size_bytes))
            self._reposition(f, truncate=False, backoff=True)
            return
        try:
            if not p.append_as_follower([to_stored(m) for m in pushed.messages],
                                        state.high_watermark, f.leader_epoch):
                # This replica moved on to another epoch (add() positions it again): the
                # push is dropped, and its credit goes back, or the session's window shrinks.
                session.send(FetchSessionCredit(credit_bytes=pushed.size_bytes))
                return
        except ApiError as e:
            log.warning("%s: append of the leader's batches failed: %s; truncating by "
                        "epoch again", p.tp, e)
            self._reposition(f, truncate=True, backoff=True)
            session.send(FetchSessionCredit(credit_bytes=pushed.size_bytes))
            return
        if p.log.config.remote_storage_enable and \
                state.local_log_start_offset > p.log.log_start_offset:
            p.follow_leader_local_log_start(state.local_log_start_offset)
        if pushed.messages:
            self._acknowledge(pushed.size_bytes, [f])

    def _ended(self, f: _Fetching, end: FetchSessionPartitionEnd) -> None:
        """The leader ended ``f`` in the session: recover, then position it again."""
        error = end.error()
        if isinstance(error, OffsetMovedToTieredStorageError):
            f.restart_at = end.local_log_start_offset
            self._reposition(f, truncate=False, backoff=False)
        elif isinstance(error, OffsetOutOfRangeError):
            self._out_of_range(f, end)
            self._reposition(f, truncate=False, backoff=False)
        else:
            # Leadership moved or is moving (or the leader lost the partition's disk, which
            # it logs itself): the controller tells this broker where to fetch from next;
            # until then, position it again after a backoff.
            level = logging.DEBUG if error is not None and error.refresh_metadata \
                else logging.WARNING
            log.log(level, "%s: leader %d ended it in the session: %s", f.partition.tp,
                    self.leader_id, error)
            self._reposition(f, truncate=False, backoff=True)

    def _reposition(self, f: _Fetching, truncate: bool, backoff: bool) -> None:
        with self._lock:
            f.seq = math.inf
            f.truncated = f.truncated and not truncate
            f.retry_at = time.monotonic() + (BACKOFF_S if backoff else 0.0)
        self._wake.set()

    def _out_of_range(self, f: _Fetching, summary: FetchSessionPartitionEnd) -> None:
        p, leo = f.partition, f.partition.log.log_end_offset
        if leo < summary.log_start_offset:
            log.warning("%s: behind the leader's log start %d; restarting the log there",
                        p.tp, summary.log_start_offset)
            p.truncate_fully_and_start_at(summary.log_start_offset)
        else:
            f.truncated = False  # ahead of the leader: truncate by epoch again

    def _restart_at_leader_local_start(self, conn: LeaderConnection, f: _Fetching,
                                       offset: int) -> None:
        """Restart the log at the leader's local log start ``offset``, with the leader's
        leader-epoch entries up to it (see the module docstring)."""
        p = f.partition
        resp = conn.call(LeaderEpochsRequest(topic=self.topic, partitions=[
            LeaderEpochsPartition(partition=p.tp.partition,
                                  current_leader_epoch=f.leader_epoch, topic_id=p.topic_id)]))
        (entry,) = resp.partitions
        entry.raise_error(f"{p.tp}: leader_epochs on leader {self.leader_id}")
        epochs = [(e.leader_epoch, e.start_offset) for e in entry.entries]
        if offset > p.log.log_end_offset:
            p.restart_at_leader_local_start(offset, epochs, f.leader_epoch)
        f.restart_at = None
        f.truncated = True

    def _truncate_by_epoch(self, conn: LeaderConnection, f: _Fetching) -> None:
        """Kafka's follower truncation: ask the leader where our latest epoch ended there, and
        cut our log to that (or to where that epoch ends here, if the leader knows only an
        older one)."""
        p = f.partition
        epoch = p.epochs.latest_epoch
        resp = conn.call(OffsetsForLeaderEpochRequest(topic=self.topic, partitions=[
            EpochRequestPartition(partition=p.tp.partition, leader_epoch=epoch,
                                  current_leader_epoch=f.leader_epoch, topic_id=p.topic_id)]))
        (entry,) = resp.partitions
        entry.raise_error(f"{p.tp}: offsets_for_leader_epoch {epoch} on leader {self.leader_id}")
        if entry.leader_epoch == UNDEFINED_EPOCH:
            # No epoch of ours is known there: nothing we hold is the leader's (unless we know
            # no epochs either, as in an empty log).
            target = p.log.log_end_offset if epoch == UNDEFINED_EPOCH else 0
        else:
            own_end = p.end_offset_for_epoch(entry.leader_epoch)[1]
            # An epoch older than every one we know (UNDEFINED_OFFSET): the leader's end of it
            # bounds what we may keep, as in Kafka; never below our log start.
            target = min(entry.end_offset, own_end if own_end >= 0 else p.log.log_end_offset)
        target = max(target, p.log.log_start_offset)
        if target < p.log.log_end_offset:
            log.warning("%s: truncating the divergent tail %d..%d (leader %d, epoch %d)",
                        p.tp, target, p.log.log_end_offset, self.leader_id, epoch)
            p.truncate_to(target)
        f.truncated = True


class FetcherManager:
    """The fetcher threads of one broker, keyed by (leader, topic)."""

    def __init__(self, broker_id: int, connect: Connect,
                 topic_id_of: TopicIdOf | None = None) -> None:
        self._broker_id = broker_id
        self._connect = connect
        self._topic_id_of = topic_id_of
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
                                         self._connect, self._topic_id_of)
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
