"""Offsets committed inside a transaction carry the partition leader's verification guard to
``__consumer_offsets`` (KIP-890 part 1, as a producer's data batch does).

Goal: a transactional offset commit whose transaction ended (a marker reached the offsets
partition) between the leader's check with the transaction coordinator and the append of the
offsets batch is refused with TRANSACTION_ABORTABLE: nothing is written or staged, no
transaction is left open on the offsets partition, its last stable offset is not held and
require_stable offset fetches are not stalled. The same holds when the transaction was open
on the partition at the check and a marker ended it before the append. A commit with a valid
guard opens the transaction and later commits join it; without verification the stale commit
opens a transaction nobody would end (the race this closes). Method: the group coordinator
service over the real ``ReplicaOffsetsLog`` (a real replica manager and log in tmp_path); the
test plays the partition leader's handler (takes the guard, marks it verified as the
coordinator's yes does) and the marker writer (appends the marker, reports it to the group
coordinator), in the order of the race.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.group_handlers import ReplicaOffsetsLog
from logstore.broker.replica_manager import ReplicaManager
from logstore.clock import SystemClock
from logstore.config import TopicConfig
from logstore.controller.local import LocalMetadataStore
from logstore.controller.store import TopicRecord
from logstore.errors import ErrorCode, TransactionAbortableError, UnstableOffsetCommitError
from logstore.groups.coordinator import GroupConfig
from logstore.messages.groups import GroupPartition, OffsetFetchRequest
from logstore.messages.transactions import (
    TxnOffsetCommitEntry,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from logstore.model import OFFSETS_TOPIC, TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments.log import Log
from logstore.segments.log_manager import LogManager
from logstore.segments.producer_state import VerificationGuard
from tests.unit.group_helpers import committed

OFFSETS = TopicPartition(OFFSETS_TOPIC, 0)  # the only partition: every group's
TP = TopicPartition("t", 0)
PID = 77
APPEND_TIMEOUT_MS = 10_000


@dataclass
class Leader:
    """The offsets partition's leader: its replica manager and the group coordinator."""

    replicas: ReplicaManager
    coord: GroupCoordinatorService

    @property
    def log(self) -> Log:
        return self.replicas.partition(OFFSETS).log

    def verified(self, epoch: int = 0) -> VerificationGuard:
        """The guard of a check the transaction coordinator answered yes."""
        guard = self.replicas.verification_guard(OFFSETS, PID, epoch)
        assert guard is not None, "the transaction is open here: no check is made"
        guard.verified = True
        return guard

    def commit(self, offset: int, guard: VerificationGuard | None, verify: bool = True
               ) -> TxnOffsetCommitResponse:
        return self.coord.txn_offset_commit(TxnOffsetCommitRequest(
            transactional_id="tx", group_id="g", producer_id=PID, producer_epoch=0,
            offsets=[TxnOffsetCommitEntry(topic=TP.topic, partition=TP.partition,
                                          offset=offset)]), verify=verify, guard=guard)

    def marker(self, committed_: bool) -> None:
        """A marker of the producer, as write_txn_markers writes and reports it."""
        pending = self.replicas.write_txn_marker(OFFSETS, PID, 0, committed_, 0)
        offset = pending.wait(APPEND_TIMEOUT_MS).first_offset
        self.coord.complete_txn(OFFSETS.partition, PID, committed_, offset)

    def fetch_stable(self) -> None:
        self.coord.offset_fetch(OffsetFetchRequest(group_id="g", require_stable=True, partitions=[
            GroupPartition(topic=TP.topic, partition=TP.partition)])).raise_error()

    def assert_nothing_open(self) -> None:
        log = self.log
        assert log.producer_state.open_transactions == {}
        assert log.high_watermark == log.log_end_offset
        assert log.last_stable_offset == log.high_watermark
        self.fetch_stable()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    clock = SystemClock()
    store = LocalMetadataStore(tmp_path / "metadata.json", 0)
    store.create_topic(TopicRecord(OFFSETS_TOPIC, {0: (0,)}, internal=True), {})
    logs = LogManager([tmp_path / "logs"], clock, lambda topic: TopicConfig())
    logs.startup()
    replicas = ReplicaManager(0, logs, clock)
    replicas.make_leader(OFFSETS, TopicConfig(), DEFAULT_SCHEMA, 3, (0,), (0,))
    coord = GroupCoordinatorService(ReplicaOffsetsLog(replicas, store), GroupConfig(
        group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100), clock)
    try:
        yield Leader(replicas, coord)
    finally:
        logs.shutdown()


def test_an_abort_between_the_check_and_the_append_refuses_the_offsets(
        leader: Leader) -> None:
    guard = leader.verified()      # the coordinator said the partition is in the transaction
    leader.marker(False)           # ... the transaction is aborted, its marker written here
    end = leader.log.log_end_offset
    with pytest.raises(TransactionAbortableError, match=r"__consumer_offsets-0.*producer 77") \
            as refused:
        leader.commit(5, guard)    # ... and then the offsets batch arrives
    assert refused.value.code == ErrorCode.TRANSACTION_ABORTABLE
    assert leader.log.log_end_offset == end  # nothing written
    leader.assert_nothing_open()
    assert committed(leader.coord) == {}


def test_a_marker_after_the_open_check_refuses_the_next_offsets(leader: Leader) -> None:
    """The transaction was open on the partition at the check (no guard needed); its commit
    marker lands before the next offsets batch, which must not open a new transaction."""
    leader.commit(5, leader.verified()).raise_error()
    assert leader.replicas.verification_guard(OFFSETS, PID, 0) is None  # open here
    leader.marker(True)
    with pytest.raises(TransactionAbortableError):
        leader.commit(9, None)
    leader.assert_nothing_open()
    assert committed(leader.coord)[TP].offset == 5


def test_a_verified_commit_opens_the_transaction_and_later_ones_join_it(
        leader: Leader) -> None:
    guard = leader.verified()
    leader.commit(5, guard).raise_error()
    first = leader.log.producer_state.open_transactions[PID]
    leader.commit(7, None).raise_error()  # joins the open transaction: no new check
    assert leader.log.producer_state.open_transactions == {PID: first}
    leader.marker(True)
    with pytest.raises(TransactionAbortableError):
        leader.commit(8, guard)           # used: no verification of the next transaction
    leader.assert_nothing_open()
    assert committed(leader.coord)[TP].offset == 7


def test_without_the_check_a_stale_commit_opens_a_transaction_nobody_ends(
        leader: Leader) -> None:
    """The race the guard closes: unchecked, the same late batch opens a transaction after
    the abort marker, holds the partition's LSO and stalls require_stable fetches."""
    leader.verified()
    leader.marker(False)
    leader.commit(5, None, verify=False).raise_error()
    assert PID in leader.log.producer_state.open_transactions
    assert leader.log.last_stable_offset < leader.log.high_watermark
    with pytest.raises(UnstableOffsetCommitError, match="producer 77"):
        leader.fetch_stable()
