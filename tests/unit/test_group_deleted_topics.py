"""Unit tests of a group's offsets against the topics of the metadata.

Goal: as Kafka's coordinator, a commit for a partition that does not exist is
UNKNOWN_TOPIC_OR_PARTITION (per partition, the others are committed), and the offsets of a
deleted partition are tombstoned (``onPartitionsDeleted``): a topic gone, fewer partitions,
or the same name recreated under a new topic id, so the new topic is read from its start; a
group with members outlives its last offsets, an empty one does not. Method: the coordinator
(``GroupCoordinatorService``) over ``MemoryOffsetsLog`` with its ``topics`` lookup set to a
dict the test edits, ticked by hand; a fresh replay checks the tombstones are in the log.
"""

from __future__ import annotations

import pytest

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.clock import FakeClock
from logstore.errors import GroupIdNotFoundError, UnknownTopicOrPartitionError
from logstore.groups.coordinator import GroupConfig
from logstore.model import OFFSETS_TOPIC, SINK_PROGRESS_TOPIC, TopicPartition
from tests.unit.group_helpers import (
    MemoryOffsetsLog,
    commit,
    committed,
    describe,
    form_group,
    tick,
)

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
U0 = TopicPartition("u", 0)


@pytest.fixture
def topics() -> dict[str, tuple[str, int]]:
    return {OFFSETS_TOPIC: ("offsets-id", 4), "t": ("t-id-1", 2), "u": ("u-id", 1)}


@pytest.fixture
def offsets_log() -> MemoryOffsetsLog:
    return MemoryOffsetsLog()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coord(clock: FakeClock, offsets_log: MemoryOffsetsLog,
          topics: dict[str, tuple[str, int]]) -> GroupCoordinatorService:
    config = GroupConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)
    service = GroupCoordinatorService(offsets_log, config, clock)
    service.topics = lambda: dict(topics)
    return service


def offsets(coord: GroupCoordinatorService, group: str = "g") -> dict[TopicPartition, int]:
    return {tp: om.offset for tp, om in committed(coord, group).items()}


def test_a_commit_for_an_unknown_topic_or_partition_is_refused_per_partition(
        coord: GroupCoordinatorService) -> None:
    errors = commit(coord, "", -1, {TP0: 3, TopicPartition("nope", 0): 5,
                                    TopicPartition("t", 9): 7, TopicPartition("t", -1): 1})
    assert errors[TP0] is None
    unknown = errors[TopicPartition("nope", 0)]
    assert isinstance(unknown, UnknownTopicOrPartitionError) and "'nope'" in str(unknown)
    beyond = errors[TopicPartition("t", 9)]
    assert isinstance(beyond, UnknownTopicOrPartitionError) and "2 partition(s)" in str(beyond)
    assert isinstance(errors[TopicPartition("t", -1)], UnknownTopicOrPartitionError)
    assert offsets(coord) == {TP0: 3}


def test_offsets_of_a_deleted_topic_are_tombstoned_and_an_empty_group_goes(
        coord: GroupCoordinatorService, clock: FakeClock, offsets_log: MemoryOffsetsLog,
        topics: dict[str, tuple[str, int]]) -> None:
    commit(coord, "", -1, {TP0: 5, TP1: 6, U0: 2}, group="g")
    commit(coord, "", -1, {TP0: 9}, group="h")
    tick(coord)
    assert offsets(coord) == {TP0: 5, TP1: 6, U0: 2}
    del topics["t"]
    tick(coord)
    assert offsets(coord) == {U0: 2}
    with pytest.raises(GroupIdNotFoundError):  # no offsets left, no members: gone
        describe(coord, "h")
    replayed = GroupCoordinatorService(offsets_log, coord.config, clock)
    assert offsets(replayed) == {U0: 2} and offsets(replayed, "h") == {}


def test_a_recreated_topic_is_read_from_its_start(
        coord: GroupCoordinatorService, topics: dict[str, tuple[str, int]]) -> None:
    """Deleted and created again between two ticks: only its id tells."""
    commit(coord, "", -1, {TP0: 5, U0: 2})
    tick(coord)
    topics["t"] = ("t-id-2", 1)
    tick(coord)
    assert offsets(coord) == {U0: 2}
    commit(coord, "", -1, {TP0: 1})  # the new topic's offsets stay
    tick(coord)
    assert offsets(coord) == {TP0: 1, U0: 2}


def test_fewer_partitions_drop_the_missing_ones_only(
        coord: GroupCoordinatorService, topics: dict[str, tuple[str, int]]) -> None:
    commit(coord, "", -1, {TP0: 5, TP1: 6})
    topics["t"] = ("t-id-1", 1)
    tick(coord)
    assert offsets(coord) == {TP0: 5}


def test_a_group_with_members_outlives_its_last_offsets(
        coord: GroupCoordinatorService, topics: dict[str, tuple[str, int]]) -> None:
    (a,) = form_group(coord, 1)
    commit(coord, a, describe(coord).generation_id, {TP0: 4})
    del topics["t"]
    tick(coord)
    assert offsets(coord) == {}
    assert len(describe(coord).members) == 1


def test_a_view_without_the_offsets_topic_or_no_view_deletes_nothing(
        coord: GroupCoordinatorService, topics: dict[str, tuple[str, int]]) -> None:
    progress = TopicPartition(SINK_PROGRESS_TOPIC, 0)
    commit(coord, "", -1, {TP0: 5, progress: 8})
    topics.clear()  # not the metadata's view (it always has __consumer_offsets)
    tick(coord)
    assert offsets(coord) == {TP0: 5, progress: 8}

    def unreachable() -> dict[str, tuple[str, int]]:
        raise ConnectionError("metadata store down")
    coord.topics = unreachable
    tick(coord)
    assert offsets(coord) == {TP0: 5, progress: 8}
    coord.topics = lambda: {OFFSETS_TOPIC: ("offsets-id", 4)}
    tick(coord)
    assert offsets(coord) == {progress: 8}  # a sink's progress is on no real topic
