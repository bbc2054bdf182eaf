"""Helpers of the group coordinator's unit tests: an in-memory ``CoordinatorLog`` (the seam the
coordinator appends through; ``tests/unit/test_coordinator_log_contract.py`` holds it and the
real ``ReplicaOffsetsLog`` to the same contract) whose appends can be frozen or failed per
partition, and typed requests with the tests' defaults."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.coordinator import LoggedBatch, TxnProducer, encode_rows
from logstore.errors import ApiError, NotLeaderOrFollowerError
from logstore.groups.offsets import partition_for
from logstore.messages.groups import (
    GroupDescription,
    GroupPartition,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    OffsetCommitEntry,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.records import ControlType

PROTOCOLS = [GroupProtocol(name="range", metadata={"topics": ["t"]})]
WAIT_S = 10.0


@dataclass
class Gate:
    """Holds a partition's appends: ``entered`` is set when one arrives, ``release`` lets
    them through."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class MemoryOffsetsLog:
    def __init__(self, partitions: int = 4) -> None:
        self.batches: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(partitions)}
        self.logged: dict[int, list[LoggedBatch]] = {p: [] for p in range(partitions)}
        self.epochs: dict[int, int | None] = dict.fromkeys(range(partitions), 0)
        self.gates: dict[int, Gate] = {}
        self.failures: dict[int, ApiError] = {}
        self._lock = threading.Lock()

    def freeze(self, partition: int) -> Gate:
        gate = self.gates[partition] = Gate()
        return gate

    def num_partitions(self) -> int:
        return len(self.batches)

    def leader_epoch(self, partition: int) -> int | None:
        return self.epochs[partition]

    def append(self, partition: int, batch: pa.RecordBatch,
               producer: TxnProducer | None = None, verify: bool = False,
               guard: object = None) -> int:
        """(No producer state here: ``verify`` and ``guard`` are the real log's.)"""
        gate = self.gates.get(partition)
        if gate is not None:
            gate.entered.set()
            assert gate.release.wait(WAIT_S), "a frozen append was never released"
        if partition in self.failures:
            raise self.failures[partition]
        if self.epochs[partition] is None:
            raise NotLeaderOrFollowerError(f"not the leader of partition {partition}")
        with self._lock:
            self.batches[partition].append(batch)
            offset = len(self.logged[partition])  # one offset per batch is enough here
            self.logged[partition].append(LoggedBatch(
                batch, -1 if producer is None else producer.producer_id, producer is not None,
                offset=offset))
            return offset

    def append_marker(self, partition: int, producer_id: int, marker: ControlType) -> int:
        """A transaction marker, as a partition leader's write_txn_markers appends it; its
        offset."""
        with self._lock:
            offset = len(self.logged[partition])
            self.logged[partition].append(LoggedBatch(
                encode_rows([], 0), producer_id, True, marker, offset))
            return offset

    def read(self, partition: int) -> Iterator[LoggedBatch]:
        if self.epochs[partition] is None:
            raise NotLeaderOrFollowerError(f"not the leader of partition {partition}")
        with self._lock:
            return iter(list(self.logged[partition]))


def group_on(partition: int, partitions: int, prefix: str) -> str:
    """A group id whose offsets partition is ``partition``."""
    return next(f"{prefix}{i}" for i in range(10_000)
                if partition_for(f"{prefix}{i}", partitions) == partition)


def join(coord: GroupCoordinatorService, member: str = "", instance: str | None = None,
         session_ms: int = 1000, group: str = "g") -> Future[JoinGroupResponse]:
    return coord.join_group(JoinGroupRequest(
        group_id=group, member_id=member, group_instance_id=instance, client_id="c",
        session_timeout_ms=session_ms, rebalance_timeout_ms=2000, protocol_type="consumer",
        protocols=PROTOCOLS))


def sync(coord: GroupCoordinatorService, member: str, generation: int,
         assignments: dict[str, Any] | None = None, group: str = "g") -> Future[Any]:
    return coord.sync_group(SyncGroupRequest(group_id=group, member_id=member,
                                             generation_id=generation,
                                             assignments=assignments))


def heartbeat(coord: GroupCoordinatorService, member: str, generation: int,
              group: str = "g") -> None:
    """A heartbeat; its error raised."""
    coord.heartbeat(HeartbeatRequest(group_id=group, member_id=member,
                                     generation_id=generation)).raise_error()


def leave(coord: GroupCoordinatorService, member: str, instance: str | None = None,
          group: str = "g") -> None:
    coord.leave_group(LeaveGroupRequest(group_id=group, member_id=member,
                                        group_instance_id=instance)).raise_error()


def commit(coord: GroupCoordinatorService, member: str, generation: int,
           offsets: dict[TopicPartition, int | tuple[int, str]], group: str = "g"
           ) -> dict[TopicPartition, ApiError | None]:
    """Commit; the error of each partition."""
    response: OffsetCommitResponse = coord.offset_commit(OffsetCommitRequest(
        group_id=group, member_id=member, generation_id=generation,
        offsets=[OffsetCommitEntry(topic=tp.topic, partition=tp.partition,
                                   offset=o if isinstance(o, int) else o[0],
                                   metadata="" if isinstance(o, int) else o[1])
                 for tp, o in offsets.items()]))
    response.raise_error()
    return {TopicPartition(e.topic, e.partition): e.error() for e in response.offsets}


def committed(coord: GroupCoordinatorService, group: str = "g",
              tps: list[TopicPartition] | None = None) -> dict[TopicPartition,
                                                                OffsetAndMetadata]:
    response = coord.offset_fetch(OffsetFetchRequest(
        group_id=group, partitions=None if tps is None else
        [GroupPartition(topic=tp.topic, partition=tp.partition) for tp in tps]))
    response.raise_error()
    return {TopicPartition(e.topic, e.partition):
            OffsetAndMetadata(e.offset, e.metadata, e.commit_timestamp) for e in response.offsets}


def describe(coord: GroupCoordinatorService, group: str = "g") -> GroupDescription:
    return coord.describe_group(group)


def tick(coord: GroupCoordinatorService) -> None:
    """One tick, and the appends it started."""
    for appended in coord.tick():
        appended.result(WAIT_S)


def form_group(coord: GroupCoordinatorService, n: int, group: str = "g") -> list[str]:
    """n members joined and synced (each owning partition i); their member ids."""
    first = join(coord, group=group).result(0)
    futures = [join(coord, group=group) for _ in range(n - 1)]
    rejoin = join(coord, first.member_id, group=group)
    results = [rejoin.result(0)] + [f.result(0) for f in futures]
    leader = next(r for r in results if r.leader == r.member_id)
    assignments = {r.member_id: {"partitions": [["t", i]]} for i, r in enumerate(results)}
    syncs = [sync(coord, r.member_id, leader.generation_id,
                  assignments if r is leader else None, group=group) for r in results]
    assert all(s.result(0)["partitions"] for s in syncs)
    return [r.member_id for r in results]
