"""Fetch sessions, the broker's side: pushing batches to a subscribed client as its partitions
grow (``messages/fetch_session.py`` describes the exchange).

Owns: one session's subscribed partitions and their positions; its credit (bytes the client
granted that the broker has not pushed yet: a push never starts without credit, and takes at
most the credit plus one batch, so a client that stops granting stops the pushes and the
broker holds nothing for it); reading each push through the replica manager, once, without
waiting (below the high watermark, the last stable offset for read_committed, the log end
offset for a follower), waking when a subscribed partition's log, watermarks or role move;
applying updates in order; a follower's acknowledgements (its log end offsets, which advance
the leader's high watermark as a fetch at that offset would, counted only for a partition it
holds subscribed and only at the leader epoch and topic id it subscribed with: a follower's
replica of another topic id than the leader's is INCONSISTENT_TOPIC_ID); ending a partition on
its error; ending a consumer's session whose topic was deleted or recreated (a subscribed
partition's hosted replica is no longer the one it subscribed to, or its log's schema is not
the one the session decodes with: UNKNOWN_TOPIC_OR_PARTITION or UNKNOWN_TOPIC_ID, so the client
refreshes and opens a new session, which decodes with the new topic's schema), and likewise
ending a follower's partition (UNKNOWN_TOPIC_ID) whose replica here was replaced since it
subscribed; and the registry of open sessions (ended when the broker stops, counted for
broker_stats). Must not: know about Arrow Flight (``rpc/session_stream.py`` writes what a push
holds), or loop over records.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa

from logstore.broker.replica_manager import FetchPartition, PartitionFetchResult, ReplicaManager
from logstore.errors import (
    ApiError,
    BrokerNotAvailableError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import error_kw
from logstore.messages.fetch import READ_COMMITTED, AbortedTransaction
from logstore.messages.fetch import FetchPartition as FetchPartitionMessage
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionPartitionEnd,
    FetchSessionPartitionState,
    FetchSessionRequest,
    FetchSessionUpdate,
)
from logstore.model import TopicPartition
from logstore.records import StoredBatch
from logstore.replication.partition import Partition

log = logging.getLogger(__name__)

_Watermarks = tuple[int, int, int, int]  # high watermark, LSO, log start, local log start


@dataclass(frozen=True, slots=True)
class PartitionPush:
    """One partition's news in a push: its state, then its batches in offset order."""

    state: FetchSessionPartitionState
    batches: list[StoredBatch]


@dataclass(frozen=True, slots=True)
class Push:
    """What one push sends, in this order: the updates applied (their seqs), the partitions
    that left the session on an error, then the partitions' news."""

    updated: list[int] = field(default_factory=list)
    ended: list[FetchSessionPartitionEnd] = field(default_factory=list)
    partitions: list[PartitionPush] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Acked:
    """What a follower's acknowledgements of a partition count for: the leader epoch it
    follows, its replica's topic id, and the replica here it subscribed to (None: none was
    hosted then)."""

    leader_epoch: int
    topic_id: str | None
    replica: Partition | None


@dataclass(slots=True)
class _Subscription:
    fetch: FetchPartition
    # The replica subscribed to (None: not hosted here then): a consumer's batches are pushed
    # only from it, as the session's schema is its log's.
    hosted: Partition | None
    sent: _Watermarks | None = None  # the watermarks last pushed


class FetchSession:
    """One client's session on one topic. ``next_push`` runs on the stream's writing thread;
    ``grant``, ``update`` and ``close`` on its reading thread, and ``close`` anywhere."""

    def __init__(self, replicas: ReplicaManager, request: FetchSessionRequest,
                 schema: pa.Schema | None = None) -> None:
        self.request = request
        # What a consumer's pushes are decoded with: the topic's value schema at the open
        # (None for a replica, which is sent the stored messages as they are).
        self.schema = schema
        self.topic = request.topic
        self.replica_id = request.replica_id
        self._replicas = replicas
        self._cond = threading.Condition()
        self._credit = request.credit_bytes
        self._updates: deque[FetchSessionUpdate] = deque()
        self._dirty: set[int] = set()  # partitions that may have news
        self._closed = False
        self.error: ApiError | None = None  # why the session ended, if not by the client
        self._subs: dict[int, _Subscription] = {}  # the writing thread's alone
        self._cursor = 0  # the partition a read starts at (or the next due one after it)
        self.pushed_bytes = 0
        self.granted_bytes = 0  # granted after the open
        self._pending_adds = request.partitions
        # A follower's subscribed partitions and what its acknowledgements of each count for
        # (written by the writing thread, read by the reading thread, under _cond).
        self._acked: dict[int, _Acked] = {}

    @property
    def is_replica(self) -> bool:
        return self.replica_id >= 0

    @property
    def unacknowledged_bytes(self) -> int:
        """Pushed bytes the client has not granted back yet (consumed, or buffered)."""
        return self.pushed_bytes - self.granted_bytes

    # -- the reading thread ----------------------------------------------------------------

    def grant(self, credit: FetchSessionCredit) -> None:
        """More credit; a follower's log end offsets are its acknowledgements."""
        if credit.log_end_offsets and not self.is_replica:
            raise InvalidRequestError(f"fetch session on {self.topic!r}: only a replica "
                                      "acknowledges log end offsets")
        with self._cond:
            acks = [(ack, self._acked.get(ack.partition)) for ack in credit.log_end_offsets]
        for ack, acked in acks:
            if acked is not None:  # not a partition the session ended or never had
                self._replicas.acknowledge_follower(
                    TopicPartition(self.topic, ack.partition), self.replica_id, ack.offset,
                    acked.leader_epoch, acked.topic_id, acked.replica)
        with self._cond:
            self._credit += credit.credit_bytes
            self.granted_bytes += credit.credit_bytes
            self._cond.notify()

    def update(self, update: FetchSessionUpdate) -> None:
        with self._cond:
            self._updates.append(update)
            self._cond.notify()

    def close(self, error: ApiError | None = None) -> None:
        """End the session (``error``: why, for the client; the first reason wins)."""
        with self._cond:
            if not self._closed:
                self._closed, self.error = True, error
            self._cond.notify()

    def _wake(self, tp: TopicPartition) -> None:
        with self._cond:
            self._dirty.add(tp.partition)
            self._cond.notify()

    # -- the writing thread ----------------------------------------------------------------

    def next_push(self) -> Push | None:
        """Wait until there is something to send (an update, or news while credit lasts) and
        return it; None once the session is closed."""
        if self._pending_adds:  # the open's partitions, as the session's first update
            self._add(self._pending_adds)
            self._pending_adds = []
        with self._cond:
            while not self._closed and not self._updates and not (
                    self._dirty and self._credit > 0):
                self._cond.wait()
            if self._closed:
                return None
            updates = list(self._updates)
            self._updates.clear()
            credit = self._credit
            dirty, self._dirty = (self._dirty, set()) if credit > 0 else (set(), self._dirty)
        push = Push(updated=[self._apply(u) for u in updates])
        if credit > 0:
            self._read(push, credit, dirty)
        return push

    def end(self) -> None:
        """The stream is over: stop watching the partitions."""
        self.close()
        for p in list(self._subs):
            self._drop(p)

    def _apply(self, update: FetchSessionUpdate) -> int:
        for p in update.remove:
            self._drop(p)
        self._add(update.add)
        return update.seq

    def _add(self, partitions: list[FetchPartitionMessage]) -> None:
        for fp in partitions:
            tp = TopicPartition(self.topic, fp.partition)
            hosted = self._replicas.get(tp)
            self._check_schema(tp, hosted)
            if fp.partition not in self._subs:
                self._replicas.watch(tp, self._wake)
            self._subs[fp.partition] = _Subscription(FetchPartition(
                tp, fp.offset, self.request.partition_max_bytes if fp.max_bytes is None
                else fp.max_bytes, fp.current_leader_epoch, fp.end_offset, fp.topic_id), hosted)
            acked = _Acked(fp.current_leader_epoch, fp.topic_id, hosted)
            if self.is_replica:  # a follower (re)starts at its log end offset
                self._replicas.acknowledge_follower(tp, self.replica_id, fp.offset,
                                                    acked.leader_epoch, fp.topic_id, hosted)
            with self._cond:
                self._dirty.add(fp.partition)
                if self.is_replica:
                    self._acked[fp.partition] = acked

    def _drop(self, partition: int) -> None:
        with self._cond:
            self._acked.pop(partition, None)
        if self._subs.pop(partition, None) is not None:
            self._replicas.unwatch(TopicPartition(self.topic, partition), self._wake)

    def _read(self, push: Push, credit: int, dirty: set[int]) -> None:
        """Read the partitions that may have news once, within the credit and ``max_bytes``,
        starting from the first due partition at or after a cursor that moves past it each
        time (so every due partition goes first in turn, and a busy one cannot starve the
        rest). Those that sent batches, and all of them when the budget ran out, may have
        more; so does one that sent nothing though it had records to send, behind a
        partition that did: only the first partition with batches may pass its limits
        (Kafka's rule), so its next batch was too big for what was left, and it goes first
        in a later read. (A partition whose remote-tier read outlasted
        ``remote_fetch_max_wait_ms`` is woken when that read ends: ``RemoteTier.read``.)"""
        order = sorted(p for p in dirty if p in self._subs)
        if not order:
            return
        start = bisect.bisect_left(order, self._cursor) % len(order)
        order = order[start:] + order[:start]
        self._cursor = order[0] + 1
        budget = min(credit, self.request.max_bytes)
        results = self._replicas.read([self._subs[p].fetch for p in order], budget,
                                      self.request.isolation_level, self.replica_id)
        # After the read: what it read came from these replicas.
        replaced = self._check_hosted(order)
        pushed, again, skipped = 0, set(), set()
        for result in results:
            if (error := replaced.get(result.tp.partition)) is not None:
                result.error, result.batches = error, []
            unread = self._unread(result)
            sent = self._take(push, result)
            pushed += sent
            if sent:
                again.add(result.tp.partition)
            elif unread:
                skipped.add(result.tp.partition)
        if pushed >= budget:
            again.update(p for p in order if p in self._subs)
        elif pushed:
            again |= skipped
        with self._cond:
            self._credit -= pushed
            self.pushed_bytes += pushed
            self._dirty |= again

    def _check_schema(self, tp: TopicPartition, hosted: Partition | None) -> None:
        """UNKNOWN_TOPIC_ID if a consumer's session would decode ``hosted``'s batches with
        a schema that is not its log's (the topic was recreated with another value schema
        after the session opened)."""
        if self.schema is not None and hosted is not None and \
                not hosted.log.schema.equals(self.schema):
            raise UnknownTopicIdError(
                f"fetch session on {self.topic!r}: {tp} was recreated with another value "
                "schema since the session opened; open a new session")

    def _check_hosted(self, partitions: list[int]) -> dict[int, ApiError]:
        """Whether each subscribed partition's replica is still the one it subscribed to;
        if not, the topic was deleted (UNKNOWN_TOPIC_OR_PARTITION) or recreated
        (UNKNOWN_TOPIC_ID) under it. A consumer's session ends (raise). A follower's
        partitions whose replica was replaced end (returned with their errors; their reads
        are dropped): a follower of the old topic must not fetch, nor acknowledge, the new
        one's log, even one that predates topic ids in requests; it adds the partition again
        once it has the new topic too. A replica is never hosted again once dropped, so one
        identity check per partition and push covers every such change."""
        replaced: dict[int, ApiError] = {}
        for p in partitions:
            sub = self._subs[p]
            now = self._replicas.get(sub.fetch.tp)
            if now is sub.hosted:
                continue
            if sub.hosted is None and now is not None:  # hosted here since it subscribed
                self._check_schema(sub.fetch.tp, now)
                self._adopt(sub, now)
                continue
            error = self._replaced(sub, now)
            if self.schema is not None:
                raise error
            if now is not None:  # a follower's read of no replica answered that already
                replaced[p] = error
        return replaced

    def _replaced(self, sub: _Subscription, now: Partition | None) -> ApiError:
        """Why ``sub``'s replica, now ``now``, is not the one it subscribed to."""
        tp, was = sub.fetch.tp, _id(sub.hosted)
        if now is None:
            return UnknownTopicOrPartitionError(
                f"fetch session on {self.topic!r}: {tp} was deleted, or left this broker, "
                "since the session subscribed to it")
        if self.is_replica and now.topic_id is not None and now.topic_id == was:
            return NotLeaderOrFollowerError(
                f"fetch session on {self.topic!r}: {tp} was stopped and hosted again on this "
                "broker since the follower subscribed to it; subscribe again")
        return UnknownTopicIdError(
            f"fetch session on {self.topic!r}: {tp} was deleted and recreated since the "
            f"session subscribed to it (topic id {was}, now {now.topic_id}); "
            + ("the follower subscribes again once it has the new topic" if self.is_replica
               else "open a new session"))

    def _adopt(self, sub: _Subscription, hosted: Partition) -> None:
        """``hosted`` is the replica a subscription made before this broker hosted its
        partition reads, and that a follower's acknowledgements count for."""
        sub.hosted = hosted
        with self._cond:
            acked = self._acked.get(sub.fetch.tp.partition)
            if acked is not None:
                self._acked[sub.fetch.tp.partition] = _Acked(
                    acked.leader_epoch, acked.topic_id, hosted)

    def _unread(self, r: PartitionFetchResult) -> bool:
        """Whether ``r`` (read, not yet taken) left records below what this session may read:
        a follower's log end offset, the last stable offset for read_committed, else the
        high watermark (and never past the subscription's end offset)."""
        if r.error is not None or r.batches:
            return False
        fetch = self._subs[r.tp.partition].fetch
        if self.is_replica:
            end = r.log_end_offset
        elif self.request.isolation_level == READ_COMMITTED:
            end = r.last_stable_offset
        else:
            end = r.high_watermark
        if fetch.end_offset is not None:
            end = min(end, fetch.end_offset)
        return fetch.offset < end

    def _take(self, push: Push, r: PartitionFetchResult) -> int:
        """Add one partition's read to ``push``; the bytes it pushes."""
        partition = r.tp.partition
        sub = self._subs[partition]
        if r.error is not None:
            push.ended.append(FetchSessionPartitionEnd(
                partition=partition, **error_kw(r.error), high_watermark=r.high_watermark,
                log_start_offset=r.log_start_offset, log_end_offset=r.log_end_offset,
                local_log_start_offset=r.local_log_start_offset))
            self._drop(partition)
            return 0
        marks = (r.high_watermark, r.last_stable_offset, r.log_start_offset,
                 r.local_log_start_offset)
        if not r.batches and marks == sub.sent:
            return 0
        sub.sent = marks
        if r.batches:
            f = sub.fetch
            sub.fetch = FetchPartition(f.tp, r.batches[-1].header.next_offset, f.max_bytes,
                                       f.current_leader_epoch, f.end_offset, f.topic_id)
        push.partitions.append(PartitionPush(_state(r), r.batches))
        return r.size_bytes


def _id(replica: Partition | None) -> str | None:
    return None if replica is None else replica.topic_id


def _state(r: PartitionFetchResult) -> FetchSessionPartitionState:
    return FetchSessionPartitionState(
        partition=r.tp.partition, batches=len(r.batches), high_watermark=r.high_watermark,
        last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
        local_log_start_offset=r.local_log_start_offset, log_end_offset=r.log_end_offset,
        aborted_transactions=[AbortedTransaction(
            producer_id=a.producer_id, first_offset=a.first_offset,
            last_offset=-1 if a.last_offset is None else a.last_offset) for a in r.aborted])


class SessionRegistry:
    """The open sessions of one broker: counted for broker_stats, ended when it stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[FetchSession] = set()
        self._closed = False
        self._ended_pushed_bytes = 0
        self._opened = 0

    def add(self, session: FetchSession) -> None:
        with self._lock:
            if self._closed:
                raise BrokerNotAvailableError(
                    f"fetch session on {session.topic!r}: this broker is stopping")
            self._open.add(session)
            self._opened += 1

    def remove(self, session: FetchSession) -> None:
        with self._lock:
            if session in self._open:
                self._open.discard(session)
                self._ended_pushed_bytes += session.pushed_bytes

    def close_all(self, broker_id: int) -> None:
        """The broker stops: every session ends with BROKER_NOT_AVAILABLE (clients reconnect
        elsewhere), and no new one opens."""
        with self._lock:
            self._closed = True
            sessions = list(self._open)
        for s in sessions:
            s.close(BrokerNotAvailableError(f"fetch session on {s.topic!r}: broker "
                                            f"{broker_id} is stopping"))

    def stats(self) -> SessionStats:
        with self._lock:
            sessions = list(self._open)
            ended, opened = self._ended_pushed_bytes, self._opened
        return SessionStats(len(sessions), opened,
                            ended + sum(s.pushed_bytes for s in sessions),
                            sum(s.unacknowledged_bytes for s in sessions))


@dataclass(frozen=True, slots=True)
class SessionStats:
    """Counters of a broker's fetch sessions (approximate under concurrency)."""

    open: int
    opened: int  # since the broker started
    pushed_bytes: int  # by every session since the broker started
    unacknowledged_bytes: int  # pushed and not yet granted back, over the open sessions
