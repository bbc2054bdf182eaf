"""The group coordinator around its appends: a slow offsets partition stalls only its own writes,
and a failed append changes nothing.

Goal: (1) while one ``__consumer_offsets`` partition's append hangs, groups on other partitions
keep heartbeating, committing and joining, groups on the same partition keep heartbeating, reads
answer from the last acknowledged state, and the tick goes on; the frozen write completes once
released. (2) Memory is never ahead of the log: a commit whose append fails is not visible to
offset_fetch, and a join whose append fails leaves the group at the generation of its latest
group record, with no member told of the generation that was not written. Method: the
coordinator runs against ``MemoryOffsetsLog``, the ``CoordinatorLog`` fake whose appends can be
frozen on an Event or failed per partition; every call that must not wait runs on a worker
thread with a bounded wait, so a regression fails in seconds instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.clock import FakeClock
from logstore.errors import (
    ApiError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from logstore.groups.coordinator import GroupConfig
from logstore.groups.state import GroupState
from logstore.model import TopicPartition
from tests.unit.group_helpers import (
    WAIT_S,
    MemoryOffsetsLog,
    commit,
    committed,
    describe,
    form_group,
    group_on,
    heartbeat,
    join,
    leave,
    tick,
)

T = TypeVar("T")
TP0 = TopicPartition("t", 0)
PROMPT_S = 2.0  # "did not wait": far below the frozen append's hold, far above a normal call
FROZEN, OTHER = 0, 1


@pytest.fixture
def offsets_log() -> MemoryOffsetsLog:
    return MemoryOffsetsLog()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coord(clock: FakeClock, offsets_log: MemoryOffsetsLog) -> GroupCoordinatorService:
    config = GroupConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)
    return GroupCoordinatorService(offsets_log, config, clock)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def promptly(pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
    """``fn()``, which must finish within PROMPT_S."""
    return pool.submit(fn).result(PROMPT_S)


def test_frozen_offsets_partition_does_not_stall_other_groups(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog,
        pool: ThreadPoolExecutor) -> None:
    n = offsets_log.num_partitions()
    frozen, same, other = (group_on(FROZEN, n, "frozen-"), group_on(FROZEN, n, "same-"),
                           group_on(OTHER, n, "other-"))
    (f,), (s,), (o,) = (form_group(coord, 1, g) for g in (frozen, same, other))
    gen = describe(coord, other).generation_id
    commit(coord, f, gen, {TP0: 1}, frozen)
    gate = offsets_log.freeze(FROZEN)
    stuck = pool.submit(commit, coord, f, gen, {TP0: 2}, frozen)
    assert gate.entered.wait(WAIT_S)

    promptly(pool, lambda: heartbeat(coord, o, gen, other))
    assert promptly(pool, lambda: commit(coord, o, gen, {TP0: 5}, other)) == {TP0: None}
    newcomer = promptly(pool, lambda: join(coord, group=other))  # starts a rebalance
    rejoined = promptly(pool, lambda: join(coord, o, group=other).result(PROMPT_S))
    assert rejoined.generation_id == gen + 1 and newcomer.result(PROMPT_S).generation_id == \
        gen + 1
    promptly(pool, lambda: heartbeat(coord, s, gen, same))  # same partition, other group
    promptly(pool, lambda: heartbeat(coord, f, gen, frozen))  # a commit does not hold it up
    assert promptly(pool, lambda: committed(coord, frozen))[TP0].offset == 1  # not yet durable
    promptly(pool, lambda: tick(coord))
    same_commit = pool.submit(commit, coord, s, gen, {TP0: 9}, same)  # writes of the partition
    assert not stuck.done() and not same_commit.done()  # ... wait their turn

    gate.release.set()
    assert stuck.result(WAIT_S) == {TP0: None}
    assert same_commit.result(WAIT_S) == {TP0: None}
    assert committed(coord, frozen)[TP0].offset == 2 and committed(coord, same)[TP0].offset == 9


def test_membership_write_in_flight_holds_only_its_own_groups_updates(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog,
        pool: ThreadPoolExecutor) -> None:
    """A leave that empties its group appends a new generation: until it is durable, reads see
    the old generation, a heartbeat of that group waits (answered from the old state, its
    effect would be lost when the leave installs the new one), and other groups' do not."""
    n = offsets_log.num_partitions()
    frozen, same = group_on(FROZEN, n, "frozen-"), group_on(FROZEN, n, "same-")
    (f,), (s,) = form_group(coord, 1, frozen), form_group(coord, 1, same)
    gen = describe(coord, frozen).generation_id
    gate = offsets_log.freeze(FROZEN)
    leaving = pool.submit(leave, coord, f, None, frozen)
    assert gate.entered.wait(WAIT_S)
    described = promptly(pool, lambda: describe(coord, frozen))
    assert (described.state, described.generation_id) == (GroupState.STABLE, gen)
    promptly(pool, lambda: heartbeat(coord, s, gen, same))
    waiting = pool.submit(heartbeat, coord, f, gen, frozen)
    assert not waiting.done()
    gate.release.set()
    leaving.result(WAIT_S)
    with pytest.raises(UnknownMemberIdError):  # answered after the leave, as ordered
        waiting.result(WAIT_S)
    assert describe(coord, frozen).generation_id == gen + 1


def test_tick_skips_a_partition_whose_write_is_in_flight(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog, clock: FakeClock,
        pool: ThreadPoolExecutor) -> None:
    n = offsets_log.num_partitions()
    frozen, other = group_on(FROZEN, n, "frozen-"), group_on(OTHER, n, "other-")
    (f,), _ = form_group(coord, 1, frozen), form_group(coord, 1, other)
    gen = describe(coord, frozen).generation_id
    gate = offsets_log.freeze(FROZEN)
    stuck = pool.submit(commit, coord, f, gen, {TP0: 1}, frozen)
    assert gate.entered.wait(WAIT_S)
    clock.advance(1500)  # both sessions ran out
    promptly(pool, lambda: tick(coord))
    assert describe(coord, other).state == GroupState.EMPTY  # expired, generation appended
    assert describe(coord, frozen).state == GroupState.STABLE  # skipped this tick
    gate.release.set()
    stuck.result(WAIT_S)
    tick(coord)
    assert describe(coord, frozen).state == GroupState.EMPTY


@pytest.mark.parametrize(("failure", "answer"), [
    (NotLeaderOrFollowerError("moved"), NotCoordinatorError),
    (RequestTimedOutError("slow isr"), CoordinatorNotAvailableError)])
def test_failed_commit_is_not_visible_to_offset_fetch(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog,
        failure: ApiError, answer: type[ApiError]) -> None:
    (a,) = form_group(coord, 1)
    gen = describe(coord).generation_id
    commit(coord, a, gen, {TP0: 3})
    offsets_log.failures.update(dict.fromkeys(range(offsets_log.num_partitions()), failure))
    with pytest.raises(answer):
        commit(coord, a, gen, {TP0: 4})
    assert committed(coord)[TP0].offset == 3
    offsets_log.failures.clear()
    assert commit(coord, a, gen, {TP0: 4}) == {TP0: None}
    assert committed(coord)[TP0].offset == 4


def test_failed_join_leaves_the_generation_of_the_log(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog, clock: FakeClock
        ) -> None:
    """Invariant: a group's generation in memory is the one of its latest group record, and
    no member is told a generation that is not in the log."""
    (a,) = form_group(coord, 1)
    gen = describe(coord).generation_id
    newcomer = join(coord)  # no append: the group prepares a rebalance, waiting for a
    offsets_log.failures.update(dict.fromkeys(range(offsets_log.num_partitions()),
                                              NotLeaderOrFollowerError("moved")))
    with pytest.raises(NotCoordinatorError):
        join(coord, a)  # would complete the rebalance at gen + 1
    assert describe(coord).generation_id == gen and not newcomer.done()
    replayed = GroupCoordinatorService(offsets_log, coord.config, clock)
    assert describe(replayed).generation_id == gen
    offsets_log.failures.clear()
    assert join(coord, a).result(0).generation_id == gen + 1  # a retry completes it
    assert newcomer.result(0).generation_id == gen + 1
    assert describe(GroupCoordinatorService(offsets_log, coord.config, clock)
                    ).generation_id == gen + 1


def test_failed_first_join_creates_no_group(coord: GroupCoordinatorService,
                                            offsets_log: MemoryOffsetsLog) -> None:
    offsets_log.failures.update(dict.fromkeys(range(offsets_log.num_partitions()),
                                              RequestTimedOutError("slow isr")))
    with pytest.raises(CoordinatorNotAvailableError):
        join(coord)
    assert coord.list_groups().groups == []
