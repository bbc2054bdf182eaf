"""Property test of the group state machine (logstore/groups/state.py).

Goal: whatever members do (join, rejoin, sync, heartbeat, leave, go silent) and however time
moves, the group stays coherent: the generation never goes back; a group is Empty exactly when
it has no members; outside Empty the leader is a member; every join that completes reports the
generation the group is in at that moment; no two members' assignments in one generation
overlap; and a change made on a ``copy()`` and discarded (the coordinator's failed append)
leaves the group as it was and resolves no future. Method: a hypothesis rule-based state machine
drives a ``Group`` with an integer clock, firing the completions each step queues (as the
coordinator does once a change is durable), and checks the invariants after every step;
hypothesis prints the failing steps (and its seed).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore.errors import ApiError
from logstore.groups.state import Group, GroupState
from logstore.messages.groups import JoinGroupResponse

PROTOCOLS: list[tuple[str, Any]] = [("range", {})]
PARTITIONS = [["t", p] for p in range(6)]


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.group = Group("g", self.now)
        self.joins: list[tuple[str, Future[JoinGroupResponse]]] = []
        self.last_generation = 0
        self.owners: dict[tuple[int, str], str] = {}

    @rule()
    def new_member_joins(self) -> None:
        self._join("")

    @precondition(lambda self: bool(self.group.members))
    @rule(data=st.data())
    def member_rejoins(self, data: st.DataObject) -> None:
        self._join(self._pick(data))

    def _pick(self, data: st.DataObject) -> str:
        """A member by join order (member ids are random uuids; their order is not)."""
        members = list(self.group.members)
        return members[data.draw(st.integers(0, len(members) - 1))]

    def _join(self, member_id: str) -> None:
        try:
            future = self.group.join(member_id, None, "c", 1000, 3000, "consumer", PROTOCOLS,
                                     self.now, 0)
        except ApiError:
            return
        finally:
            self._commit()
        self.joins.append((member_id, future))

    def _commit(self) -> None:
        """The change is durable: resolve the futures it queued, and go on with a copy (the
        coordinator always changes a copy and installs it)."""
        self.group.completions.take().fire()
        self.group = self.group.copy()

    @precondition(lambda self: bool(self.group.members))
    @rule(data=st.data())
    def member_syncs(self, data: st.DataObject) -> None:
        member = self._pick(data)
        members = list(self.group.members)
        plan = {m: {"partitions": PARTITIONS[i::len(members)]} for i, m in enumerate(members)}
        try:
            future = self.group.sync(member, self.group.generation_id, plan)
        except ApiError:
            return
        finally:
            self._commit()
        if future.done() and future.exception() is None:
            self._own(member, future.result())

    @precondition(lambda self: bool(self.group.members))
    @rule(data=st.data())
    def member_heartbeats(self, data: st.DataObject) -> None:
        member = self._pick(data)
        with contextlib.suppress(ApiError):
            self.group.heartbeat(member, self.group.generation_id, self.now)
        self._commit()

    @precondition(lambda self: bool(self.group.members))
    @rule(data=st.data())
    def member_leaves(self, data: st.DataObject) -> None:
        self.group.leave(self._pick(data), None, self.now)
        self._commit()

    @rule(ms=st.integers(0, 2500))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.group.tick(self.now)
        self._commit()

    @rule(data=st.data(), ms=st.integers(0, 2500))
    def change_on_a_copy_is_discarded(self, data: st.DataObject, ms: int) -> None:
        """Whatever happens to a copy, the group and every waiting future stay as they were."""
        before = _snapshot(self.group)
        waiting = [f for _, f in self.joins if not f.done()]
        copy = self.group.copy()
        members = list(copy.members)
        with contextlib.suppress(ApiError):
            action = data.draw(st.sampled_from(["join", "leave", "tick", "sync"]))
            if action == "join":
                copy.join(data.draw(st.sampled_from(["", *members])), None, "c", 1000, 3000,
                          "consumer", PROTOCOLS, self.now + ms, 0)
            elif action == "leave" and members:
                copy.leave(data.draw(st.sampled_from(members)), None, self.now + ms)
            elif action == "sync" and members:
                copy.sync(data.draw(st.sampled_from(members)), copy.generation_id,
                          {m: {"partitions": PARTITIONS[:1]} for m in members[:1]})
            else:
                copy.tick(self.now + ms)
        assert _snapshot(self.group) == before
        assert not any(f.done() for f in waiting)

    def _own(self, member: str, assignment: dict[str, Any]) -> None:
        for t, p in assignment["partitions"]:
            owner = self.owners.setdefault((self.group.generation_id, f"{t}-{p}"), member)
            assert owner == member, f"{t}-{p} owned twice in one generation"

    @invariant()
    def copy_is_equal(self) -> None:
        copy = self.group.copy()
        fields = {k: v for k, v in vars(self.group).items() if k != "completions"}
        assert {k: v for k, v in vars(copy).items() if k != "completions"} == fields
        assert all(copy.members[m] is not member for m, member in self.group.members.items())

    @invariant()
    def coherent(self) -> None:
        g = self.group
        assert g.generation_id >= self.last_generation
        self.last_generation = g.generation_id
        assert (g.state == GroupState.EMPTY) == (not g.members)
        if g.state != GroupState.EMPTY:
            assert g.state == GroupState.PREPARING_REBALANCE or g.leader_id in g.members
        if g.state == GroupState.STABLE:
            flat = [tuple(p) for m in g.members.values() for p in m.assignment["partitions"]]
            assert len(flat) == len(set(flat)), "overlapping assignments in a stable group"
        for member_id, future in [(m, f) for m, f in self.joins if f.done()]:
            self.joins.remove((member_id, future))
            if future.exception() is None:
                result = future.result()
                assert result.generation_id == g.generation_id or g.state in (
                    GroupState.PREPARING_REBALANCE, GroupState.EMPTY) or \
                    result.member_id not in g.members


def _snapshot(g: Group) -> tuple[Any, ...]:
    return (g.state, g.generation_id, g.leader_id, g.protocol, dict(g.static_members),
            {m.member_id: (m.last_heartbeat_ms, m.join_future, m.sync_future,
                           repr(m.assignment), repr(m.protocols))
             for m in g.members.values()})


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
TestGroupStateMachine = GroupMachine.TestCase
