"""Unit tests of the group coordinator's state machine, with a FakeClock and an in-memory log.

Goal: the join/sync/heartbeat/leave protocol forms generations as Kafka's does, sessions
expire only after the session timeout, static members rejoin without a rebalance, stale
generations, unknown members and bad commits get Kafka's codes, state survives a reload of
the partition, and offsets of an empty group expire after the retention. Method: the
coordinator (``GroupCoordinatorService``: the pure handlers of ``groups/`` on the coordinator
runtime) takes typed requests and runs against ``MemoryOffsetsLog`` (the ``CoordinatorLog``
seam; the real one is exercised by the integration tests), and time moves only when a test
advances the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.clock import FakeClock
from logstore.coordinator import LoggedBatch
from logstore.errors import (
    CoordinatorLoadInProgressError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from logstore.groups.coordinator import GroupConfig
from logstore.groups.offsets import java_string_hash, partition_for
from logstore.groups.state import GroupState
from logstore.messages.groups import HeartbeatRequest, SyncGroupRequest
from logstore.model import SINK_PROGRESS_TOPIC, TopicPartition
from tests.unit.group_helpers import (
    MemoryOffsetsLog,
    commit,
    committed,
    describe,
    form_group,
    heartbeat,
    join,
    leave,
    sync,
    tick,
)

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def offsets_log() -> MemoryOffsetsLog:
    return MemoryOffsetsLog()


@pytest.fixture
def coord(clock: FakeClock, offsets_log: MemoryOffsetsLog) -> GroupCoordinatorService:
    config = GroupConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100,
                         offsets_retention_minutes=1)
    return GroupCoordinatorService(offsets_log, config, clock)


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31  # Java's famous MIN_VALUE case
    assert 0 <= partition_for("anything", 50) < 50


def test_members_form_one_generation_with_one_leader(coord: GroupCoordinatorService) -> None:
    members = form_group(coord, 3)
    described = describe(coord)
    assert described.state == GroupState.STABLE
    assert {m.member_id for m in described.members} == set(members)
    assert described.leader in members


def test_session_expires_only_after_the_timeout(coord: GroupCoordinatorService,
                                                clock: FakeClock) -> None:
    a, b = form_group(coord, 2)
    generation = describe(coord).generation_id
    clock.advance(900)
    heartbeat(coord, a, generation)
    tick(coord)
    assert len(describe(coord).members) == 2
    clock.advance(200)  # b has been silent for 1100 ms > 1000 ms
    tick(coord)
    with pytest.raises(RebalanceInProgressError):
        heartbeat(coord, a, generation)
    result = join(coord, a).result(0)
    assert result.generation_id == generation + 1
    with pytest.raises(UnknownMemberIdError):
        heartbeat(coord, b, generation)


def test_heartbeat_during_a_rebalance_keeps_the_session(coord: GroupCoordinatorService,
                                                        clock: FakeClock) -> None:
    """Goal: REBALANCE_IN_PROGRESS is an answer, not a refusal: the heartbeat still counts.
    Method: a newcomer starts a rebalance; a member that has not rejoined yet heartbeats at
    900 ms and is still a member at 1100 ms (its join deadline is later)."""
    a, b = form_group(coord, 2)
    generation = describe(coord).generation_id
    join(coord)  # a newcomer: the group prepares a rebalance and waits for a and b
    clock.advance(900)
    for member in (a, b):
        with pytest.raises(RebalanceInProgressError):
            heartbeat(coord, member, generation)
    clock.advance(200)
    tick(coord)
    assert {a, b} <= {m.member_id for m in describe(coord).members}


def test_stale_generation_and_unknown_member_get_kafka_codes(
        coord: GroupCoordinatorService) -> None:
    (a,) = form_group(coord, 1)
    generation = describe(coord).generation_id
    with pytest.raises(IllegalGenerationError):
        heartbeat(coord, a, generation - 1)
    with pytest.raises(UnknownMemberIdError):
        heartbeat(coord, "nobody", generation)
    with pytest.raises(IllegalGenerationError):
        commit(coord, a, generation - 1, {TP0: 5})
    with pytest.raises(GroupIdNotFoundError):
        describe(coord, "no-such-group")
    with pytest.raises(InvalidSessionTimeoutError):
        join(coord, session_ms=10)
    with pytest.raises(InvalidGroupIdError):
        join(coord, group="")


def test_commit_checks_offsets_and_ownership(coord: GroupCoordinatorService) -> None:
    (a,) = form_group(coord, 1)  # owns t-0 only
    generation = describe(coord).generation_id
    errors = commit(coord, a, generation, {TP1: 3, TP0: -1})
    assert isinstance(errors[TP1], IllegalGenerationError)
    assert isinstance(errors[TP0], OffsetOutOfRangeError)
    assert committed(coord) == {}
    errors = commit(coord, a, generation, {TP0: (10, "note")})
    assert errors[TP0] is None
    assert committed(coord, tps=[TP0])[TP0].metadata == "note"
    with pytest.raises(NonEmptyGroupError):
        commit(coord, "", -1, {TP0: 0})
    with pytest.raises(NonEmptyGroupError):
        coord.delete_group("g")


def test_static_member_rejoins_without_rebalance(coord: GroupCoordinatorService) -> None:
    first = join(coord, instance="i-1").result(0)
    sync(coord, first.member_id, first.generation_id,
         {first.member_id: {"partitions": [["t", 0]]}}).result(0)
    again = join(coord, instance="i-1").result(0)  # a restart: no member id, same instance
    assert again.generation_id == first.generation_id
    assert sync(coord, again.member_id, again.generation_id).result(0) == {
        "partitions": [["t", 0]]}
    with pytest.raises(FencedInstanceIdError):
        join(coord, first.member_id, instance="i-1")


def test_a_replaced_static_members_requests_are_fenced_and_an_empty_id_is_unknown(
        coord: GroupCoordinatorService) -> None:
    """Heartbeat, sync and commit from a static member another instance replaced answer
    FENCED_INSTANCE_ID (it must stop, not rejoin and displace the new one); a request with no
    member id at all is UNKNOWN_MEMBER_ID, never a fencing (a member's own request sent while
    it resets must not end it for good)."""
    first = join(coord, instance="i-1").result(0)
    sync(coord, first.member_id, first.generation_id,
         {first.member_id: {"partitions": [["t", 0]]}}).result(0)
    join(coord, instance="i-1").result(0)  # the replacement
    stale = dict(group_id="g", member_id=first.member_id, generation_id=first.generation_id,
                 group_instance_id="i-1")
    with pytest.raises(FencedInstanceIdError):
        coord.heartbeat(HeartbeatRequest(**stale)).raise_error()  # type: ignore[arg-type]
    with pytest.raises(FencedInstanceIdError):
        coord.sync_group(SyncGroupRequest(**stale)).result(0)  # type: ignore[arg-type]
    with pytest.raises(UnknownMemberIdError):
        coord.heartbeat(HeartbeatRequest(**{**stale, "member_id": ""})).raise_error()  # type: ignore[arg-type]


def test_state_survives_a_reload_and_leadership_loss(coord: GroupCoordinatorService,
                                                     offsets_log: MemoryOffsetsLog) -> None:
    (a,) = form_group(coord, 1)
    generation = describe(coord).generation_id
    commit(coord, a, generation, {TP0: 42})
    partition = partition_for("g", offsets_log.num_partitions())
    offsets_log.epochs[partition] = None
    with pytest.raises(NotCoordinatorError):
        committed(coord)
    offsets_log.epochs[partition] = 1  # this broker leads again: replay
    assert committed(coord)[TP0].offset == 42
    assert describe(coord).generation_id == generation


def test_empty_group_offsets_expire_and_delete_writes_tombstones(
        coord: GroupCoordinatorService, clock: FakeClock, offsets_log: MemoryOffsetsLog
        ) -> None:
    commit(coord, "", -1, {TP0: 7})
    commit(coord, "", -1, {TP0: 9}, group="h")
    clock.advance(30_000)
    tick(coord)
    assert committed(coord)[TP0].offset == 7
    clock.advance(31_000)  # one minute since both commits
    tick(coord)
    assert committed(coord) == {}
    with pytest.raises(GroupIdNotFoundError):
        coord.delete_group("g")
    coord2 = GroupCoordinatorService(offsets_log, coord.config, clock)  # a fresh replay agrees
    assert committed(coord2, "h") == {}


def test_a_sink_progress_record_outlives_the_offsets_retention(
        coord: GroupCoordinatorService, clock: FakeClock) -> None:
    """A Spark sink's progress record (its group's offset on the pseudo-partition
    ``__logstore_sink_progress-0``) is what keeps a batch replayed after a restart from
    being published twice: it is never expired, while the same group's other offsets are."""
    progress = TopicPartition(SINK_PROGRESS_TOPIC, 0)
    commit(coord, "", -1, {TP0: 7, progress: 41})
    clock.advance(61_000)
    tick(coord)
    assert {tp: om.offset for tp, om in committed(coord).items()} == {progress: 41}


def test_leave_of_the_last_member_empties_the_group(coord: GroupCoordinatorService) -> None:
    (a,) = form_group(coord, 1)
    leave(coord, a)
    assert describe(coord).state == GroupState.EMPTY
    commit(coord, "", -1, {TP0: 1})
    coord.delete_group("g")
    with pytest.raises(GroupIdNotFoundError):
        describe(coord)


class BlockingOffsetsLog(MemoryOffsetsLog):
    """Reads wait for ``release``: a replay that takes as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.release = threading.Event()

    def read(self, partition: int) -> Iterator[LoggedBatch]:
        self.reading.set()
        assert self.release.wait(10)
        return super().read(partition)


def test_requests_during_a_replay_get_load_in_progress(clock: FakeClock) -> None:
    offsets_log = BlockingOffsetsLog()
    coord = GroupCoordinatorService(offsets_log, GroupConfig(), clock)
    results: list[object] = []
    loader = threading.Thread(target=lambda: results.append(committed(coord)))
    loader.start()
    assert offsets_log.reading.wait(10)
    with pytest.raises(CoordinatorLoadInProgressError):
        committed(coord)
    assert coord.list_groups().groups == []  # other work goes on meanwhile
    offsets_log.release.set()
    loader.join(10)
    assert results == [{}]


def test_losing_leadership_fails_waiting_joins_with_not_coordinator(
        coord: GroupCoordinatorService, offsets_log: MemoryOffsetsLog) -> None:
    form_group(coord, 1)
    waiting = join(coord)  # a second member: its join waits for the first to rejoin
    assert not waiting.done()
    offsets_log.epochs[partition_for("g", offsets_log.num_partitions())] = None
    tick(coord)
    assert isinstance(waiting.exception(0), NotCoordinatorError)


def test_malformed_assignment_owns_nothing(coord: GroupCoordinatorService) -> None:
    """Goal: assignments are the leader's JSON; one that is not a consumer assignment makes
    its member own nothing, not the broker fail. Method: sync a number as the assignment, then
    commit: ILLEGAL_GENERATION for the partition, not UNKNOWN_SERVER_ERROR."""
    first = join(coord).result(0)
    sync(coord, first.member_id, first.generation_id, {first.member_id: 5}).result(0)
    errors = commit(coord, first.member_id, first.generation_id, {TP0: 1})
    assert isinstance(errors[TP0], IllegalGenerationError)
