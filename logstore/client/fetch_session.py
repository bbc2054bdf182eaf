"""The consumer's fetch sessions: one push session per (leader, topic), in place of a fetch
request per round trip (``messages/fetch_session.py`` describes the exchange).

Owns: opening a session per ``FetchTarget`` with the partitions wanted there and their fetch
positions; keeping each session's subscriptions in step with what the consumer wants (one
``FetchSessionUpdate`` adds partitions, moves them after a seek or a reset, removes them);
fencing, so that nothing from a partition's old position is ever buffered: a partition's
frames count only once the broker applied the update that last positioned it; a thread per
session reading its frames into one inbox, which the consumer's thread drains; credit: the
window (``fetch_max_bytes``) is granted at open, and bytes are granted back as the consumer
drains or drops what was pushed (``Credit``), so the broker pushes no faster than the
consumer consumes. As with HTTP/2's window updates, a grant goes out once a quarter of the
window is owed, not after every drain: a grant is a write on the stream that holds the
polling thread for 0.3-1 ms (a columnar read of 2M records sent 160 of them, 55 ms of its
230 ms; now 17). A consumer about to wait grants all it owes while it holds
half of the window or more (below that the broker still has half a window to push), so a
broker out of credit never waits on a consumer that waits too, unless paused partitions'
buffers hold the whole window, which stalls the session's other partitions until they are
resumed, as before; and a session that ends (a broker gone or stopping, a SASL session the
broker forgot) is dropped, the metadata refreshed, and its partitions subscribed again after
``RETRY_BACKOFF_S``. Must not: buffer records or hold positions (``fetcher.py`` does), or
reach into broker internals.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError, NetworkError, UnknownServerError
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionRequest,
    FetchSessionUpdate,
    FetchSessionUpdated,
)
from logstore.model import TopicPartition
from logstore.rpc.session_client import FetchSessionStream, SessionFrame

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.1  # Kafka's retry.backoff.ms


class FetchTarget(NamedTuple):
    """Where one fetch request (or session) goes: the leader of some of one topic's
    partitions."""

    leader: int
    topic: str


@dataclass(frozen=True, slots=True)
class SessionSettings:
    window_bytes: int  # the credit granted at open: fetch_max_bytes
    max_bytes: int
    partition_max_bytes: int
    isolation_level: int


class ClientSession:
    """One open session: its stream, the fences of its partitions, the credit it is owed."""

    def __init__(self, target: FetchTarget, stream: FetchSessionStream,
                 partitions: list[int], inbox: queue.SimpleQueue[Event],
                 window_bytes: int) -> None:
        self.target = target
        self.stream = stream
        self.window_bytes = window_bytes
        self._held = 0  # bytes pushed to us and not granted back: buffered, or owed
        self.fence: dict[int, float] = dict.fromkeys(partitions, 0)  # the update seq
        self.applied = 0
        self._seq = 0
        self._owed = 0
        self._reader = threading.Thread(target=self._read, args=(inbox,), daemon=True,
                                        name=f"fetch-session-{target.leader}-{target.topic}")
        self._reader.start()

    def accepts(self, partition: int) -> bool:
        return self.fence.get(partition, math.inf) <= self.applied

    def update(self, add: dict[int, int], remove: list[int],
               topic_ids: Mapping[int, str | None] | None = None) -> None:
        """Subscribe ``add`` (partition -> offset, each of its topic id in ``topic_ids``) and
        unsubscribe ``remove``."""
        self._seq += 1
        self.fence.update(dict.fromkeys(add, self._seq))
        for p in remove:
            self.fence.pop(p, None)
        ids = topic_ids or {}
        self.stream.send(FetchSessionUpdate(seq=self._seq, remove=remove, add=[
            FetchPartition(partition=p, offset=o, topic_id=ids.get(p))
            for p, o in add.items()]))

    def applied_update(self, frame: FetchSessionUpdated) -> None:
        self.applied = max(self.applied, frame.seq)

    def received(self, nbytes: int) -> None:
        """A frame of ``nbytes`` arrived (the broker took them from our credit)."""
        self._held += nbytes

    def owe(self, nbytes: int) -> None:
        self._owed += nbytes

    def grant_owed(self, waiting: bool) -> None:
        """Grant what is owed once it is a quarter of the window, or, when the consumer is
        about to wait (``waiting``), while it holds half of the window or more."""
        if self._owed > 0 and (self._owed >= self.window_bytes // 4
                               or (waiting and self._held >= self.window_bytes // 2)):
            owed, self._owed = self._owed, 0
            self._held -= owed
            self.stream.send(FetchSessionCredit(credit_bytes=owed))

    def close(self) -> None:
        self.stream.close()

    def _read(self, inbox: queue.SimpleQueue[Event]) -> None:
        try:
            while (frame := self.stream.read()) is not None:
                inbox.put((self, frame))
            inbox.put((self, NetworkError(f"{self.stream.where}: ended by the broker")))
        except ApiError as e:
            inbox.put((self, e))
        except Exception as e:  # a frame this client cannot read: the session fails, loudly
            log.exception("%s: reading the session failed", self.stream.where)
            inbox.put((self, UnknownServerError(f"{self.stream.where}: a frame could not be "
                                                f"read: {type(e).__name__}: {e}")))


Event = tuple[ClientSession, SessionFrame | ApiError]


@dataclass(eq=False, slots=True)
class Credit:
    """The bytes of a session's window a buffered batch holds, given back once."""

    session: ClientSession | None
    nbytes: int

    def release(self) -> None:
        if self.session is not None:
            self.session.owe(self.nbytes)
            self.session = None


class FetchSessions:
    """The sessions of one consumer (used from the thread that polls only)."""

    def __init__(self, metadata: ClusterMetadata, settings: SessionSettings,
                 topic_id_of: Callable[[TopicPartition], str | None] = lambda tp: None
                 ) -> None:
        self._metadata = metadata
        self._settings = settings
        # The topic id a partition's fetch offset belongs to (the fetcher's), sent with it.
        self._topic_id_of = topic_id_of
        self._inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._sessions: dict[FetchTarget, ClientSession] = {}
        self._where: dict[TopicPartition, FetchTarget] = {}  # subscribed partitions
        self._moved: set[TopicPartition] = set()  # to be positioned again
        self._retry_at: dict[FetchTarget, float] = {}

    def sync(self, targets: dict[FetchTarget, dict[TopicPartition, int]]) -> None:
        """Subscribe as ``targets`` says (each wanted partition at its fetch offset): remove
        what is no longer wanted where it is, then open sessions and add or move partitions."""
        for target, session in list(self._sessions.items()):
            wanted = targets.get(target, {})
            stale = [tp for tp, t in self._where.items() if t == target and tp not in wanted]
            if not wanted:
                self._drop(session)
            elif stale:
                self._send(session, {}, stale)
        for target in [t for t in self._retry_at if t not in targets]:
            del self._retry_at[target]  # no longer wanted (the leader moved): no retry
        now = time.monotonic()
        for target, offsets in targets.items():
            if self._retry_at.get(target, 0.0) > now:
                continue
            current = self._sessions.get(target)
            add = {tp: o for tp, o in offsets.items()
                   if self._where.get(tp) != target or tp in self._moved}
            if current is None:
                self._open(target, offsets)
            elif add:
                self._send(current, add, [])

    def retry_pending(self) -> bool:
        """Whether a wanted session waits to be opened again (``wait`` returns early for it)."""
        return bool(self._retry_at)

    def wait(self, timeout_s: float) -> list[Event]:
        """The frames that arrived, waiting up to ``timeout_s`` (less while a session waits to
        be opened again) for the first."""
        if self._retry_at:
            timeout_s = min(timeout_s, max(min(self._retry_at.values()) - time.monotonic(),
                                           0.0))
        try:
            events = [self._inbox.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                events.append(self._inbox.get_nowait())
            except queue.Empty:
                return events

    def accepts(self, session: ClientSession, tp: TopicPartition) -> bool:
        """Whether a frame of ``tp`` from ``session`` is from its current position."""
        return self._sessions.get(session.target) is session and \
            self._where.get(tp) == session.target and tp not in self._moved and \
            session.accepts(tp.partition)

    def left(self, tp: TopicPartition) -> None:
        """The broker ended ``tp`` in its session (an error frame)."""
        target = self._where.pop(tp, None)
        self._moved.discard(tp)
        session = self._sessions.get(target) if target is not None else None
        if session is not None:
            session.fence.pop(tp.partition, None)

    def forget(self, tp: TopicPartition) -> None:
        """``tp``'s position moved: its frames count again only once it is positioned anew."""
        if tp in self._where:
            self._moved.add(tp)

    def fail(self, session: ClientSession, error: ApiError) -> None:
        """A session ended: drop it and retry later (a retriable error), or raise."""
        if self._sessions.get(session.target) is not session:
            return
        self._drop(session)
        if not error.retriable:
            raise error
        log.info("fetch session with broker %d on %r ended (%s); refreshing metadata",
                 session.target.leader, session.target.topic, error)
        self._retry_later(session.target)

    def grant_owed(self, waiting: bool = False) -> None:
        """Grant back the credit that drained batches freed, as ``ClientSession.grant_owed``
        says (``waiting``: the consumer is about to wait for frames)."""
        for session in list(self._sessions.values()):
            try:
                session.grant_owed(waiting)
            except ApiError as e:
                self.fail(session, e)

    def close(self) -> None:
        for session in list(self._sessions.values()):
            self._drop(session)

    def _open(self, target: FetchTarget, offsets: dict[TopicPartition, int]) -> None:
        s = self._settings
        request = FetchSessionRequest(
            topic=target.topic, isolation_level=s.isolation_level, credit_bytes=s.window_bytes,
            max_bytes=s.max_bytes, partition_max_bytes=s.partition_max_bytes,
            state_with_first_batch=True, partitions=[
                FetchPartition(partition=tp.partition, offset=o, topic_id=self._topic_id_of(tp))
                for tp, o in offsets.items()])
        try:
            stream = self._metadata.broker_connection(target.leader).open_fetch_session(
                request)
        except ApiError as e:
            if not e.retriable:
                raise
            log.info("fetch session with broker %d on %r: %s; refreshing metadata",
                     target.leader, target.topic, e)
            self._retry_later(target)
            return
        self._retry_at.pop(target, None)
        self._sessions[target] = ClientSession(target, stream, [tp.partition for tp in offsets],
                                               self._inbox, s.window_bytes)
        for tp in offsets:
            self._where[tp] = target
            self._moved.discard(tp)

    def _retry_later(self, target: FetchTarget) -> None:
        """Open ``target``'s session again after the backoff, with fresh metadata if the
        cluster answers (a lone broker restarting does not: the metadata is kept)."""
        self._retry_at[target] = time.monotonic() + RETRY_BACKOFF_S
        try:
            self._metadata.refresh([target.topic])
        except ApiError as e:
            if not e.retriable:
                raise
            log.info("metadata refresh for %r failed (%s); retrying later", target.topic, e)

    def _send(self, session: ClientSession, add: dict[TopicPartition, int],
              remove: list[TopicPartition]) -> None:
        for tp in remove:
            del self._where[tp]
            self._moved.discard(tp)
        for tp in add:
            self._where[tp] = session.target
            self._moved.discard(tp)
        try:
            session.update({tp.partition: o for tp, o in add.items()},
                           [tp.partition for tp in remove],
                           {tp.partition: self._topic_id_of(tp) for tp in add})
        except ApiError as e:
            self.fail(session, e)

    def _drop(self, session: ClientSession) -> None:
        del self._sessions[session.target]
        for tp in [tp for tp, t in self._where.items() if t == session.target]:
            del self._where[tp]
            self._moved.discard(tp)
        session.close()
