"""The consumer's side of the group protocol: finding the coordinator, joining, assigning (as
the leader), syncing, heartbeating, committing and fetching committed offsets.

Owns: the member id, generation and assignment of one consumer in one group, the heartbeat
thread (which also enforces ``max_poll_interval_ms`` by leaving the group), and retries on the
coordinator's retriable codes (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS). Requests and responses are the typed messages of
``messages/groups.py``; subscription metadata and assignments are
``ConsumerProtocolSubscription`` and ``ConsumerProtocolAssignment``. Must not: fetch records or
hold positions (``consumer.py`` does), or run user callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from logstore.client.metadata import ClusterMetadata
from logstore.errors import (
    ApiError,
    ErrorCode,
    FencedInstanceIdError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnstableOffsetCommitError,
)
from logstore.groups.assignors import COOPERATIVE, REBALANCE_PROTOCOL, assignor
from logstore.messages import ErrorFields, Message, Request
from logstore.messages.groups import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupPartition,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    OffsetCommitEntry,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.rpc.client import BrokerConnection

log = logging.getLogger(__name__)

COORDINATOR_ATTEMPTS = 20
STABLE_WAIT_S = 60.0  # Kafka's default.api.timeout.ms
RETRY_BACKOFF_S = 0.05
REJOIN_CODES = (IllegalGenerationError, UnknownMemberIdError, RebalanceInProgressError)

R = TypeVar("R", bound=Message)
P = TypeVar("P", bound=Message)


@dataclass(frozen=True, slots=True)
class GroupSettings:
    group_id: str
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300_000
    strategies: tuple[str, ...] = ("range",)
    group_instance_id: str | None = None
    client_id: str = "logstore-consumer"


@dataclass(frozen=True, slots=True)
class JoinOutcome:
    generation_id: int
    protocol: str
    assignment: list[TopicPartition]


class GroupMember:
    def __init__(self, metadata: ClusterMetadata, settings: GroupSettings) -> None:
        for name in settings.strategies:
            assignor(name)  # an unknown strategy fails at construction
        self._metadata = metadata
        self.settings = settings
        self._lock = threading.RLock()
        self._coordinator: BrokerConnection | None = None
        self.member_id = ""
        self.generation_id = -1
        self.need_rejoin = threading.Event()
        self.need_rejoin.set()
        self.fenced: FencedInstanceIdError | None = None  # set for good (``fence``)
        self._joining = False
        self.last_poll = time.monotonic()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None

    @property
    def cooperative(self) -> bool:
        return all(REBALANCE_PROTOCOL[s] == COOPERATIVE for s in self.settings.strategies)

    # -- requests to the coordinator ---------------------------------------------------------

    def _find_coordinator(self) -> BrokerConnection:
        response = _find_coordinator(self._metadata,
                                     FindCoordinatorRequest(group_id=self.settings.group_id))
        response.raise_error()
        return self._metadata.connection(f"{response.host}:{response.port}")

    def call(self, request: Request[R], timeout_s: float | None = None,
             entries: Callable[[R], Iterable[ErrorFields]] | None = None) -> R:
        """``request`` on the coordinator; its top-level error raised, after retrying the
        retriable ones (bounded). With ``entries``, a retriable error of one of the
        response's entries (a group's NOT_COORDINATOR while its offsets partition comes
        online) is retried the same way; the last answer is returned with it."""
        for attempt in range(COORDINATOR_ATTEMPTS):
            try:
                with self._lock:
                    if self._coordinator is None:
                        self._coordinator = self._find_coordinator()
                    conn = self._coordinator
                response = conn.call(request, timeout_s)
                if isinstance(response, ErrorFields):
                    response.raise_error()
                if entries is not None and attempt < COORDINATOR_ATTEMPTS - 1:
                    for entry in entries(response):
                        entry.raise_error()
                return response
            except ApiError as e:
                if not e.retriable or attempt == COORDINATOR_ATTEMPTS - 1:
                    raise
                if e.refresh_metadata:
                    with self._lock:
                        self._coordinator = None
                time.sleep(RETRY_BACKOFF_S * min(attempt + 1, 10))
        raise AssertionError("unreachable")

    # -- join and sync -----------------------------------------------------------------------

    def join(self, topics: list[str], owned: list[TopicPartition],
             partition_counts: Callable[[list[str]], dict[str, int]]) -> JoinOutcome:
        """One join + sync round; raises the coordinator's error (the caller retries, but not
        FENCED_INSTANCE_ID, which ends this member for good)."""
        self.check_fenced()
        self._joining = True
        try:
            subscription = ConsumerProtocolSubscription(
                topics=sorted(topics), owned=[(tp.topic, tp.partition) for tp in sorted(owned)])
            rebalance_s = self.settings.max_poll_interval_ms / 1000.0
            joined = self._join_request(subscription, rebalance_s)
            protocol = joined.protocol or ""
            assignments = None
            if joined.leader == joined.member_id:
                assignments = self._assign(joined, protocol, partition_counts)
            synced = self.call(SyncGroupRequest(
                group_id=self.settings.group_id, member_id=self.member_id,
                generation_id=joined.generation_id, assignments=assignments,
                timeout_ms=self.settings.max_poll_interval_ms,
                group_instance_id=self.settings.group_instance_id), rebalance_s + 10)
            with self._lock:
                self.generation_id = joined.generation_id
            self.need_rejoin.clear()
            assignment = _payload(synced.assignment or {}, ConsumerProtocolAssignment,
                                  "the assignment")
            return JoinOutcome(joined.generation_id, protocol,
                               [TopicPartition(t, p) for t, p in assignment.partitions])
        except FencedInstanceIdError as e:
            self.fence(e)
            raise
        finally:
            self._joining = False

    def _join_request(self, subscription: ConsumerProtocolSubscription, rebalance_s: float
                      ) -> JoinGroupResponse:
        s = self.settings
        try:
            joined = self.call(JoinGroupRequest(
                group_id=s.group_id, member_id=self.member_id,
                group_instance_id=s.group_instance_id, client_id=s.client_id,
                session_timeout_ms=s.session_timeout_ms,
                rebalance_timeout_ms=s.max_poll_interval_ms, protocol_type="consumer",
                protocols=[GroupProtocol(name=n, metadata=subscription) for n in s.strategies]),
                rebalance_s + 10)
        except UnknownMemberIdError:
            self.reset_member()
            raise
        self.member_id = joined.member_id
        return joined

    @staticmethod
    def _assign(joined: JoinGroupResponse, protocol: str,
                partition_counts: Callable[[list[str]], dict[str, int]]
                ) -> dict[str, ConsumerProtocolAssignment]:
        members = {m.member_id: _payload(m.metadata, ConsumerProtocolSubscription,
                                         f"member {m.member_id}'s subscription")
                   for m in joined.members}
        subscriptions = {m: sub.topics for m, sub in members.items()}
        owned = {m: [TopicPartition(t, p) for t, p in sub.owned] for m, sub in members.items()}
        topics = sorted({t for ts in subscriptions.values() for t in ts})
        result = assignor(protocol)(subscriptions, partition_counts(topics), owned)
        log.info("group leader %s: assigned %d partition(s) to %d member(s) with %s",
                 joined.member_id, sum(len(v) for v in result.values()), len(result), protocol)
        return {m: ConsumerProtocolAssignment(partitions=[(tp.topic, tp.partition) for tp in tps])
                for m, tps in result.items()}

    def fence(self, error: FencedInstanceIdError) -> None:
        """Another consumer took over this one's group_instance_id: this one is done (as in
        Kafka, FENCED_INSTANCE_ID is fatal: rejoining would displace the new one in turn)."""
        log.error("group %s: %s", self.settings.group_id, error.message)
        with self._lock:
            self.fenced = error
            self.member_id, self.generation_id = "", -1

    def check_fenced(self) -> None:
        if self.fenced is not None:
            raise FencedInstanceIdError(self.fenced.message)

    def reset_member(self) -> None:
        with self._lock:
            self.member_id, self.generation_id = "", -1
        self.need_rejoin.set()

    # -- heartbeats --------------------------------------------------------------------------

    def start_heartbeats(self) -> None:
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"heartbeat-{self.settings.group_id}")
            self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_interval_ms / 1000.0):
            try:
                self._heartbeat_once()
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("group %s: heartbeat failed", self.settings.group_id)

    def _heartbeat_once(self) -> None:
        if self._joining:
            return  # a join in progress is the poll thread's work, not idleness
        idle_ms = (time.monotonic() - self.last_poll) * 1000
        if self.generation_id >= 0 and idle_ms > self.settings.max_poll_interval_ms:
            log.warning("group %s: no poll for %.0f ms (max_poll_interval_ms %d); leaving the "
                        "group", self.settings.group_id, idle_ms,
                        self.settings.max_poll_interval_ms)
            self.leave()
            return
        with self._lock:  # one snapshot: a reset meanwhile must not send an empty member id
            member_id, generation_id = self.member_id, self.generation_id
        if generation_id < 0 or not member_id:
            return
        # Also while a rebalance is pending: until this member rejoins (at its next poll,
        # within max_poll_interval_ms), heartbeats keep its session; without them a member
        # busy for longer than session_timeout_ms was removed as soon as another joined.
        try:
            self.call(HeartbeatRequest(group_id=self.settings.group_id, member_id=member_id,
                                       generation_id=generation_id,
                                       group_instance_id=self.settings.group_instance_id))
        except FencedInstanceIdError as e:
            self.fence(e)
        except UnknownMemberIdError:
            self.reset_member()
        except REJOIN_CODES:
            self.need_rejoin.set()
        except ApiError as e:
            log.info("group %s: heartbeat failed: %s", self.settings.group_id, e)

    # -- offsets -----------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], as_member: bool,
               topic_ids: Mapping[TopicPartition, str | None] | None = None) -> None:
        """Commit ``offsets``, each with its topic's id: ``topic_ids``' (the id a position's fetch
        was taken under), else as this client's metadata knows it (the coordinator
        records it, so a deleted topic's offsets are told from those of one recreated under
        its name, and refuses an offset naming an id that is no longer its topic's; unknown
        here: the coordinator's)."""
        ids = topic_ids or {}
        request = OffsetCommitRequest(
            group_id=self.settings.group_id, member_id=self.member_id if as_member else "",
            generation_id=self.generation_id if as_member else -1,
            group_instance_id=self.settings.group_instance_id if as_member else None,
            offsets=[OffsetCommitEntry(topic=tp.topic, partition=tp.partition,
                                       offset=om.offset, metadata=om.metadata,
                                       topic_id=ids.get(tp) or
                                       self._metadata.known_topic_id(tp.topic))
                     for tp, om in offsets.items()])
        try:
            response = self.call(request)
        except FencedInstanceIdError as e:
            self.fence(e)
            raise
        except REJOIN_CODES:
            self.need_rejoin.set()
            raise
        stale = sorted({e.topic for e in response.offsets
                        if e.error_code == ErrorCode.UNKNOWN_TOPIC_ID})
        if stale:  # the topic was recreated: the next commit must name its new id
            try:
                self._metadata.refresh(stale)
            except (ApiError, OSError) as e:  # the commit's own error is the one to raise
                log.info("group %s: metadata refresh of %s failed: %s",
                         self.settings.group_id, stale, e)
        for entry in response.offsets:
            entry.raise_error(f"commit of {entry.topic}-{entry.partition}")

    def committed(self, tps: list[TopicPartition] | None, require_stable: bool = False,
                  timeout_s: float = STABLE_WAIT_S) -> dict[TopicPartition, OffsetAndMetadata]:
        """The committed offsets; with ``require_stable``, retried while a transaction's
        offsets for them are pending (UNSTABLE_OFFSET_COMMIT), up to ``timeout_s``."""
        request = OffsetFetchRequest(
            group_id=self.settings.group_id, require_stable=require_stable,
            partitions=None if tps is None else
            [GroupPartition(topic=tp.topic, partition=tp.partition) for tp in tps])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                response = self.call(request)
                break
            except UnstableOffsetCommitError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(RETRY_BACKOFF_S)
        return {TopicPartition(e.topic, e.partition):
                OffsetAndMetadata(e.offset, e.metadata, e.commit_timestamp)
                for e in response.offsets}

    # -- leaving -----------------------------------------------------------------------------

    def leave(self) -> None:
        if self.member_id and self.settings.group_instance_id is None:
            try:
                self.call(LeaveGroupRequest(group_id=self.settings.group_id,
                                            member_id=self.member_id))
            except ApiError as e:
                log.info("group %s: leave failed: %s", self.settings.group_id, e)
        self.reset_member()

    def close(self, leave: bool) -> None:
        self._stop.set()
        if leave:
            self.leave()
        if self._heartbeats is not None:
            self._heartbeats.join(self.settings.heartbeat_interval_ms / 1000.0 + 5)


def _find_coordinator(metadata: ClusterMetadata, request: FindCoordinatorRequest
                      ) -> FindCoordinatorResponse:
    """``request`` to any reachable broker."""
    return metadata.call(request)


def _payload(value: Any, cls: type[P], what: str) -> P:
    """A JSON value a peer sent as ``cls``; a mismatch is INCONSISTENT_GROUP_PROTOCOL."""
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError as e:
        raise InconsistentGroupProtocolError(f"{what} is not a {cls.__name__}: {e}") from None
