"""One consumer group's membership state machine (Kafka's classic group protocol).

Owns: members, generations, the leader, the chosen protocol and the states Empty ->
PreparingRebalance -> CompletingRebalance -> Stable (and back), with the join and sync
"long polls" as futures that complete when the rebalance reaches them; session expiry and
``group_initial_rebalance_delay_ms`` run from ``tick(now_ms)``, so tests move time with a
FakeClock. Static members (``group_instance_id``) that rejoin while the group is stable keep
their assignment without a rebalance.

A ``Group`` changes in place, but never resolves a future itself: it queues the resolution in
``completions``, which its owner fires once the change is durable. So the coordinator can run a
request on a ``copy()``, append the generation it reached, and install the copy (and fire its
completions) only when the append is acknowledged; a discarded copy has woken no one. A method
that raises an ApiError has changed nothing. Must not: do I/O, read clocks or persist anything
(the coordinator does); errors are ApiErrors with Kafka's codes.
"""

from __future__ import annotations

import dataclasses
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec

from logstore.coordinator import Completions
from logstore.errors import (
    ApiError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    NonEmptyGroupError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from logstore.messages.groups import (
    ConsumerProtocolAssignment,
    JoinGroupMember,
    JoinGroupResponse,
)
from logstore.model import TopicPartition

EMPTY_ASSIGNMENT: dict[str, Any] = {"partitions": []}


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, Any]]
    last_heartbeat_ms: int
    join_future: Future[JoinGroupResponse] | None = None
    sync_future: Future[Any] | None = None
    assignment: Any = field(default_factory=lambda: dict(EMPTY_ASSIGNMENT))  # the leader's JSON
    # What the last assignment took from this member: in a cooperative rebalance it gives
    # them up (committing their positions) only after it learns the new assignment, and no
    # other member gets them before the next generation.
    revoking: set[TopicPartition] = field(default_factory=set)

    def owned(self) -> set[TopicPartition]:
        """The partitions of a consumer's assignment (none if it is not one: assignments are
        the leader's, and only a consumer group's are read)."""
        try:
            decoded = msgspec.convert(self.assignment, ConsumerProtocolAssignment)
        except msgspec.ValidationError:
            return set()
        return {TopicPartition(t, p) for t, p in decoded.partitions}


class Group:
    def __init__(self, group_id: str, now_ms: int, generation_id: int = 0,
                 protocol_type: str | None = None) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation_id = generation_id
        self.protocol_type = protocol_type
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group_instance_id -> member_id
        self.empty_since_ms = now_ms
        self._delay_until_ms = 0
        self._join_deadline_ms = 0
        self.completions = Completions()  # futures to resolve once this state is installed

    def copy(self) -> Group:
        """A copy to change: members are copied (their futures shared, not resolved), and the
        copy's completions start empty."""
        other = Group(self.group_id, self.empty_since_ms, self.generation_id, self.protocol_type)
        other.state, other.protocol, other.leader_id = self.state, self.protocol, self.leader_id
        other.members = {k: dataclasses.replace(m) for k, m in self.members.items()}
        other.static_members = dict(self.static_members)
        other._delay_until_ms, other._join_deadline_ms = \
            self._delay_until_ms, self._join_deadline_ms
        return other

    # -- join --------------------------------------------------------------------------------

    def join(self, member_id: str, group_instance_id: str | None, client_id: str,
             session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
             protocols: list[tuple[str, Any]], now_ms: int, initial_delay_ms: int
             ) -> Future[JoinGroupResponse]:
        self._check_protocols(protocol_type, protocols)
        if not member_id and group_instance_id in self.static_members:
            return self._static_rejoin(group_instance_id, protocols, now_ms)
        if member_id and member_id not in self.members:
            self._unknown(member_id, group_instance_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            self.members[member_id] = Member(member_id, group_instance_id, client_id,
                                             session_timeout_ms, rebalance_timeout_ms,
                                             protocols, now_ms)
            if group_instance_id is not None:
                self.static_members[group_instance_id] = member_id
        member = self.members[member_id]
        member.protocols, member.last_heartbeat_ms = protocols, now_ms
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocol_type = protocol_type
        future: Future[JoinGroupResponse] = Future()
        if member.join_future is not None:
            self.completions.fail(member.join_future, UnknownMemberIdError(
                f"group {self.group_id}: member {member_id} joined again"))
        member.join_future = future
        if self.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms, initial_delay_ms if self.state == GroupState.EMPTY
                                    else 0)
        elif now_ms < self._delay_until_ms:  # a newcomer during the initial delay extends it
            self._delay_until_ms = min(now_ms + initial_delay_ms, self._join_deadline_ms)
        self.maybe_complete_join(now_ms)
        return future

    def _check_protocols(self, protocol_type: str, protocols: list[tuple[str, Any]]) -> None:
        if not protocols or not protocol_type:
            raise InconsistentGroupProtocolError(
                f"group {self.group_id}: a join needs a protocol type and protocols")
        if self.members and protocol_type != self.protocol_type:
            raise InconsistentGroupProtocolError(
                f"group {self.group_id}: protocol type {protocol_type!r} does not match the "
                f"group's {self.protocol_type!r}")
        names = {name for name, _ in protocols}
        for m in self.members.values():
            names &= {name for name, _ in m.protocols}
        if self.members and not names:
            raise InconsistentGroupProtocolError(
                f"group {self.group_id}: no assignor in {[n for n, _ in protocols]} is "
                "supported by every member")

    def _static_rejoin(self, instance_id: str, protocols: list[tuple[str, Any]], now_ms: int
                       ) -> Future[JoinGroupResponse]:
        """A known group_instance_id with no member id: the new member replaces the old one;
        in a stable group with unchanged protocols it keeps the assignment, no rebalance."""
        old = self.members.pop(self.static_members[instance_id])
        fenced = FencedInstanceIdError(
            f"group {self.group_id}: instance {instance_id} rejoined as another member")
        for f in (old.join_future, old.sync_future):
            if f is not None and not f.done():
                self.completions.fail(f, fenced)
        new_id = f"{old.client_id or 'member'}-{uuid.uuid4()}"
        member = Member(new_id, instance_id, old.client_id, old.session_timeout_ms,
                        old.rebalance_timeout_ms, protocols, now_ms, assignment=old.assignment)
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old.member_id:
            self.leader_id = new_id
        future: Future[JoinGroupResponse] = Future()
        if self.state == GroupState.STABLE and protocols == old.protocols:
            self.completions.resolve(future, JoinGroupResponse(
                generation_id=self.generation_id, protocol=self.protocol,
                leader=self.leader_id or new_id, member_id=new_id))
            return future
        member.join_future = future
        if self.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms, 0)
        self.maybe_complete_join(now_ms)
        return future

    def _prepare_rebalance(self, now_ms: int, delay_ms: int) -> None:
        self.state = GroupState.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self._join_deadline_ms = now_ms + timeout
        self._delay_until_ms = now_ms + min(delay_ms, timeout)
        rebalancing = RebalanceInProgressError(f"group {self.group_id} is rebalancing")
        for m in self.members.values():
            if m.sync_future is not None:
                self.completions.fail(m.sync_future, rebalancing)
                m.sync_future = None

    def maybe_complete_join(self, now_ms: int) -> None:
        if self.state != GroupState.PREPARING_REBALANCE:
            return
        all_joined = all(m.join_future is not None for m in self.members.values())
        if not ((all_joined and now_ms >= self._delay_until_ms)
                or now_ms >= self._join_deadline_ms):
            return
        for m in [m for m in self.members.values() if m.join_future is None]:
            self._remove(m, UnknownMemberIdError(
                f"group {self.group_id}: member {m.member_id} did not rejoin in time"))
        self.generation_id += 1
        if not self.members:
            self._become_empty(now_ms)
            return
        self.protocol = self._select_protocol()
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.state = GroupState.COMPLETING_REBALANCE
        for m in self.members.values():
            assert m.join_future is not None
            self.completions.resolve(m.join_future, self._join_result(m))
            m.join_future, m.last_heartbeat_ms = None, now_ms

    def _join_result(self, member: Member) -> JoinGroupResponse:
        assert self.leader_id is not None and self.protocol is not None
        protocol = self.protocol
        members = [] if member.member_id != self.leader_id else [
            JoinGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                            metadata=dict(m.protocols)[protocol])
            for m in self.members.values()]
        return JoinGroupResponse(generation_id=self.generation_id, protocol=protocol,
                                 leader=self.leader_id, member_id=member.member_id,
                                 members=members)

    def _select_protocol(self) -> str:
        """The first assignor of the leader's (or any member's) preference list that every
        member supports."""
        common = set.intersection(*({n for n, _ in m.protocols} for m in self.members.values()))
        first = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
        return next(n for n, _ in first.protocols if n in common)

    def _become_empty(self, now_ms: int) -> None:
        self.state = GroupState.EMPTY
        self.protocol = self.leader_id = None
        self.empty_since_ms = now_ms

    # -- sync, heartbeat, leave --------------------------------------------------------------

    def sync(self, member_id: str, generation_id: int, assignments: dict[str, Any] | None,
             group_instance_id: str | None = None) -> Future[Any]:
        member = self.member(member_id, generation_id, group_instance_id)
        if self.state == GroupState.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id} is rebalancing; rejoin")
        future: Future[Any] = Future()
        if self.state == GroupState.STABLE:
            self.completions.resolve(future, member.assignment)
            return future
        member.sync_future = future
        if member_id == self.leader_id and assignments is not None:
            for m in self.members.values():
                before = m.owned()
                m.assignment = assignments.get(m.member_id, dict(EMPTY_ASSIGNMENT))
                m.revoking = before - m.owned()
            self.state = GroupState.STABLE
            for m in self.members.values():
                if m.sync_future is not None:
                    self.completions.resolve(m.sync_future, m.assignment)
                    m.sync_future = None
        return future

    def heartbeat(self, member_id: str, generation_id: int, now_ms: int,
                  group_instance_id: str | None = None) -> ApiError | None:
        """Keep the member's session; REBALANCE_IN_PROGRESS is returned, not raised, because
        the heartbeat counts even then (the member has until the join deadline to rejoin)."""
        member = self.member(member_id, generation_id, group_instance_id)
        member.last_heartbeat_ms = now_ms
        if self.state == GroupState.PREPARING_REBALANCE:
            return RebalanceInProgressError(f"group {self.group_id} is rebalancing; rejoin")
        return None

    def leave(self, member_id: str, group_instance_id: str | None, now_ms: int) -> None:
        if not member_id and group_instance_id in self.static_members:
            member_id = self.static_members[group_instance_id]
        if member_id not in self.members:
            self._unknown(member_id, group_instance_id)
        self._remove(self.members[member_id], UnknownMemberIdError(
            f"group {self.group_id}: member {member_id} left"))
        self._rebalance_after_removal(now_ms)

    def tick(self, now_ms: int) -> list[str]:
        """Expire members whose session ran out, complete a due join; the expired ids."""
        expired = self.expired(now_ms)
        for m in expired:
            self._remove(m, UnknownMemberIdError(
                f"group {self.group_id}: member {m.member_id} session expired"))
        if expired:
            self._rebalance_after_removal(now_ms)
        self.maybe_complete_join(now_ms)
        return [m.member_id for m in expired]

    def expired(self, now_ms: int) -> list[Member]:
        """Members whose session ran out (one waiting in a join or a sync is not idle)."""
        return [m for m in self.members.values()
                if m.join_future is None and m.sync_future is None
                and now_ms - m.last_heartbeat_ms > m.session_timeout_ms]

    def _rebalance_after_removal(self, now_ms: int) -> None:
        if self.state == GroupState.PREPARING_REBALANCE:
            self.maybe_complete_join(now_ms)
        elif not self.members:
            self.generation_id += 1
            self._become_empty(now_ms)
        else:
            self._prepare_rebalance(now_ms, 0)

    def _remove(self, member: Member, error: Exception) -> None:
        del self.members[member.member_id]
        if member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        for f in (member.join_future, member.sync_future):
            if f is not None and not f.done():
                self.completions.fail(f, error)

    def fail_pending(self, error: Exception) -> None:
        """Fail every waiting join and sync (the coordinator is giving the group up)."""
        for m in self.members.values():
            for f in (m.join_future, m.sync_future):
                if f is not None and not f.done():
                    self.completions.fail(f, error)
            m.join_future = m.sync_future = None

    # -- lookups -----------------------------------------------------------------------------

    def member(self, member_id: str, generation_id: int,
               group_instance_id: str | None = None) -> Member:
        """The member, checked against the generation (Kafka's codes otherwise: a static
        member another instance replaced gets FENCED_INSTANCE_ID, not UNKNOWN_MEMBER_ID, so
        it stops instead of rejoining and displacing the new one in turn)."""
        member = self.members.get(member_id)
        if member is None:  # (no member id at all is UNKNOWN_MEMBER_ID, never a fencing)
            self._unknown(member_id, group_instance_id if member_id else None)
        assert member is not None
        if generation_id != self.generation_id:
            raise IllegalGenerationError(
                f"group {self.group_id}: generation {generation_id} is stale (the group is at "
                f"{self.generation_id}); rejoin")
        return member

    def check_commit(self, member_id: str, generation_id: int,
                     group_instance_id: str | None = None) -> Member | None:
        """The committing member (None for an admin commit outside the protocol). Changes
        nothing: the commit's ``touch`` comes once its offsets are durable."""
        if generation_id < 0 and not member_id:
            if self.members:
                raise NonEmptyGroupError(
                    f"group {self.group_id} has {len(self.members)} active member(s); "
                    "offsets can only be changed from outside while it is empty")
            return None
        member = self.member(member_id, generation_id, group_instance_id)
        if self.state == GroupState.COMPLETING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id} is rebalancing; rejoin")
        return member

    def touch(self, member_id: str, now_ms: int) -> None:
        """A commit counts as a heartbeat (if the member is still there)."""
        member = self.members.get(member_id)
        if member is not None:
            member.last_heartbeat_ms = max(member.last_heartbeat_ms, now_ms)

    def _unknown(self, member_id: str, group_instance_id: str | None) -> None:
        if group_instance_id is not None and group_instance_id in self.static_members:
            raise FencedInstanceIdError(
                f"group {self.group_id}: instance {group_instance_id} is now member "
                f"{self.static_members[group_instance_id]}, not {member_id}")
        raise UnknownMemberIdError(f"group {self.group_id}: unknown member id {member_id!r}")
