"""Unit tests of the group coordinator's state machine, with a FakeClock and an in-memory log.

Goal: the join/sync/heartbeat/leave protocol forms generations as Kafka's does, sessions
expire only after the session timeout, static members rejoin without a rebalance, stale
generations, unknown members and bad commits get Kafka's codes, state survives a reload of
the partition, and offsets of an empty group expire after the retention. Method: the
coordinator runs against ``MemoryOffsetsLog`` (the ``OffsetsLog`` seam; the real one is
exercised by the integration tests), and time moves only when a test advances the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from logstore.clock import FakeClock
from logstore.errors import (
    CoordinatorLoadInProgressError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from logstore.groups.coordinator import CommitEntry, GroupConfig, GroupCoordinator
from logstore.groups.offsets import java_string_hash, partition_for
from logstore.groups.state import GroupState
from logstore.model import TopicPartition

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
PROTOCOLS: list[tuple[str, Any]] = [("range", {"topics": ["t"]})]


class MemoryOffsetsLog:
    def __init__(self, partitions: int = 4) -> None:
        self.batches: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(partitions)}
        self.epochs: dict[int, int | None] = dict.fromkeys(range(partitions), 0)

    def num_partitions(self) -> int:
        return len(self.batches)

    def leader_epoch(self, partition: int) -> int | None:
        return self.epochs[partition]

    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        self.batches[partition].append(batch)

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        return iter(list(self.batches[partition]))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def offsets_log() -> MemoryOffsetsLog:
    return MemoryOffsetsLog()


@pytest.fixture
def coord(clock: FakeClock, offsets_log: MemoryOffsetsLog) -> GroupCoordinator:
    config = GroupConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100,
                         offsets_retention_minutes=1)
    return GroupCoordinator(offsets_log, config, clock)


def join(coord: GroupCoordinator, member: str = "", instance: str | None = None,
         session_ms: int = 1000) -> Any:
    return coord.join_group("g", member, instance, "c", session_ms, 2000, "consumer", PROTOCOLS)


def form_group(coord: GroupCoordinator, n: int) -> list[str]:
    """n members joined and synced (each owning partition i); their member ids."""
    first = join(coord).result(0)
    futures = [join(coord) for _ in range(n - 1)]
    rejoin = join(coord, first.member_id)
    results = [rejoin.result(0)] + [f.result(0) for f in futures]
    leader = next(r for r in results if r.leader == r.member_id)
    assignments = {r.member_id: {"partitions": [["t", i]]} for i, r in enumerate(results)}
    syncs = [coord.sync_group("g", r.member_id, leader.generation_id,
                              assignments if r is leader else None) for r in results]
    assert all(s.result(0)["partitions"] for s in syncs)
    return [r.member_id for r in results]


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31  # Java's famous MIN_VALUE case
    assert 0 <= partition_for("anything", 50) < 50


def test_members_form_one_generation_with_one_leader(coord: GroupCoordinator) -> None:
    members = form_group(coord, 3)
    described = coord.describe_group("g")
    assert described["state"] == GroupState.STABLE
    assert {m["member_id"] for m in described["members"]} == set(members)
    assert described["leader"] in members


def test_session_expires_only_after_the_timeout(coord: GroupCoordinator,
                                                clock: FakeClock) -> None:
    a, b = form_group(coord, 2)
    generation = coord.describe_group("g")["generation_id"]
    clock.advance(900)
    coord.heartbeat("g", a, generation)
    coord.tick()
    assert len(coord.describe_group("g")["members"]) == 2
    clock.advance(200)  # b has been silent for 1100 ms > 1000 ms
    coord.tick()
    with pytest.raises(RebalanceInProgressError):
        coord.heartbeat("g", a, generation)
    result = join(coord, a).result(0)
    assert result.generation_id == generation + 1
    with pytest.raises(UnknownMemberIdError):
        coord.heartbeat("g", b, generation)


def test_stale_generation_and_unknown_member_get_kafka_codes(coord: GroupCoordinator) -> None:
    (a,) = form_group(coord, 1)
    generation = coord.describe_group("g")["generation_id"]
    with pytest.raises(IllegalGenerationError):
        coord.heartbeat("g", a, generation - 1)
    with pytest.raises(UnknownMemberIdError):
        coord.heartbeat("g", "nobody", generation)
    with pytest.raises(IllegalGenerationError):
        coord.offset_commit("g", a, generation - 1, [CommitEntry(TP0, 5)])
    with pytest.raises(GroupIdNotFoundError):
        coord.describe_group("no-such-group")
    with pytest.raises(InvalidSessionTimeoutError):
        join(coord, session_ms=10)


def test_commit_checks_offsets_and_ownership(coord: GroupCoordinator) -> None:
    (a,) = form_group(coord, 1)  # owns t-0 only
    generation = coord.describe_group("g")["generation_id"]
    errors = coord.offset_commit("g", a, generation, [CommitEntry(TP1, 3),
                                                      CommitEntry(TP0, -1)])
    assert isinstance(errors[TP1], IllegalGenerationError)
    assert isinstance(errors[TP0], OffsetOutOfRangeError)
    assert coord.offset_fetch("g", None) == {}
    errors = coord.offset_commit("g", a, generation, [CommitEntry(TP0, 10, "note")])
    assert errors[TP0] is None
    assert coord.offset_fetch("g", [TP0])[TP0].metadata == "note"
    with pytest.raises(NonEmptyGroupError):
        coord.offset_commit("g", "", -1, [CommitEntry(TP0, 0)])
    with pytest.raises(NonEmptyGroupError):
        coord.delete_group("g")


def test_static_member_rejoins_without_rebalance(coord: GroupCoordinator) -> None:
    first = join(coord, instance="i-1").result(0)
    coord.sync_group("g", first.member_id, first.generation_id,
                     {first.member_id: {"partitions": [["t", 0]]}}).result(0)
    again = join(coord, instance="i-1").result(0)  # a restart: no member id, same instance
    assert again.generation_id == first.generation_id
    assert coord.sync_group("g", again.member_id, again.generation_id, None).result(0) == {
        "partitions": [["t", 0]]}
    with pytest.raises(FencedInstanceIdError):
        coord.join_group("g", first.member_id, "i-1", "c", 1000, 2000, "consumer", PROTOCOLS)


def test_state_survives_a_reload_and_leadership_loss(coord: GroupCoordinator,
                                                     offsets_log: MemoryOffsetsLog,
                                                     clock: FakeClock) -> None:
    (a,) = form_group(coord, 1)
    generation = coord.describe_group("g")["generation_id"]
    coord.offset_commit("g", a, generation, [CommitEntry(TP0, 42)])
    partition = partition_for("g", offsets_log.num_partitions())
    offsets_log.epochs[partition] = None
    with pytest.raises(NotCoordinatorError):
        coord.offset_fetch("g", None)
    offsets_log.epochs[partition] = 1  # this broker leads again: replay
    assert coord.offset_fetch("g", None)[TP0].offset == 42
    assert coord.describe_group("g")["generation_id"] == generation


def test_empty_group_offsets_expire_and_delete_writes_tombstones(
        coord: GroupCoordinator, clock: FakeClock, offsets_log: MemoryOffsetsLog) -> None:
    coord.offset_commit("g", "", -1, [CommitEntry(TP0, 7)])
    coord.offset_commit("h", "", -1, [CommitEntry(TP0, 9)])
    clock.advance(30_000)
    coord.tick()
    assert coord.offset_fetch("g", None)[TP0].offset == 7
    clock.advance(31_000)  # one minute since both commits
    coord.tick()
    assert coord.offset_fetch("g", None) == {}
    with pytest.raises(GroupIdNotFoundError):
        coord.delete_group("g")
    coord2 = GroupCoordinator(offsets_log, coord.config, clock)  # a fresh replay agrees
    assert coord2.offset_fetch("h", None) == {}


def test_leave_of_the_last_member_empties_the_group(coord: GroupCoordinator) -> None:
    (a,) = form_group(coord, 1)
    coord.leave_group("g", a, None)
    assert coord.describe_group("g")["state"] == GroupState.EMPTY
    coord.offset_commit("g", "", -1, [CommitEntry(TP0, 1)])
    coord.delete_group("g")
    with pytest.raises(GroupIdNotFoundError):
        coord.describe_group("g")


class BlockingOffsetsLog(MemoryOffsetsLog):
    """Reads wait for ``release``: a replay that takes as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.release = threading.Event()

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        self.reading.set()
        assert self.release.wait(10)
        return super().read(partition)


def test_requests_during_a_replay_get_load_in_progress(clock: FakeClock) -> None:
    offsets_log = BlockingOffsetsLog()
    coord = GroupCoordinator(offsets_log, GroupConfig(), clock)
    results: list[object] = []
    loader = threading.Thread(target=lambda: results.append(coord.offset_fetch("g", None)))
    loader.start()
    assert offsets_log.reading.wait(10)
    with pytest.raises(CoordinatorLoadInProgressError):
        coord.offset_fetch("g", None)
    assert coord.list_groups() == []  # other work goes on meanwhile
    offsets_log.release.set()
    loader.join(10)
    assert results == [{}]


def test_losing_leadership_fails_waiting_joins_with_not_coordinator(
        coord: GroupCoordinator, offsets_log: MemoryOffsetsLog) -> None:
    form_group(coord, 1)
    waiting = join(coord)  # a second member: its join waits for the first to rejoin
    assert not waiting.done()
    offsets_log.epochs[partition_for("g", offsets_log.num_partitions())] = None
    coord.tick()
    assert isinstance(waiting.exception(0), NotCoordinatorError)
