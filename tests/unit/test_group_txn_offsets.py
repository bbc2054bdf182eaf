"""Offsets committed inside a transaction, in the group coordinator (KIP-98, KIP-447).

Goal: a transactional offset commit is appended as the producer's transactional batch and
stays pending (invisible to offset fetch; UNSTABLE_OFFSET_COMMIT with require_stable) until
the producer's marker reaches the partition: COMMIT makes the offsets the group's, ABORT drops
them; a replay of the log (markers included) rebuilds the same; a member of an older
generation is fenced (ILLEGAL_GENERATION); a committed transaction's offset replaces the
committed one only if its record is later in the log (a plain commit appended between the
TxnOffsetCommit and the marker wins), live and on replay. Method: the group coordinator on the
in-memory log; a test appends the marker itself (as a partition leader's write_txn_markers
does) and reports it to the coordinator.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.clock import FakeClock
from logstore.errors import IllegalGenerationError, UnstableOffsetCommitError
from logstore.groups.coordinator import GroupConfig
from logstore.messages.groups import GroupPartition, OffsetFetchRequest
from logstore.messages.transactions import TxnOffsetCommitEntry, TxnOffsetCommitRequest
from logstore.model import TopicPartition
from logstore.records import ControlType
from tests.unit.group_helpers import MemoryOffsetsLog, commit, committed, form_group

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
PID = 77


@pytest.fixture
def offsets_log() -> MemoryOffsetsLog:
    return MemoryOffsetsLog()


def coordinator(offsets_log: MemoryOffsetsLog) -> GroupCoordinatorService:
    return GroupCoordinatorService(offsets_log, GroupConfig(
        group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100), FakeClock())


def txn_commit(coord: GroupCoordinatorService, offset: int, member: str = "",
               generation: int = -1, group: str = "g",
               tps: tuple[TopicPartition, ...] = (TP,)) -> None:
    response = coord.txn_offset_commit(TxnOffsetCommitRequest(
        transactional_id="tx", group_id=group, producer_id=PID, producer_epoch=0,
        member_id=member, generation_id=generation,
        offsets=[TxnOffsetCommitEntry(topic=tp.topic, partition=tp.partition, offset=offset)
                 for tp in tps]))
    response.raise_error()
    for r in response.results:
        r.raise_error()


def marker(coord: GroupCoordinatorService, log: MemoryOffsetsLog, committed_: bool,
           group: str = "g") -> None:
    partition = coord.partition(group)
    offset = log.append_marker(partition, PID,
                               ControlType.COMMIT if committed_ else ControlType.ABORT)
    coord.complete_txn(partition, PID, committed_, offset)


def fetch_stable(coord: GroupCoordinatorService) -> None:
    coord.offset_fetch(OffsetFetchRequest(group_id="g", require_stable=True, partitions=[
        GroupPartition(topic=TP.topic, partition=TP.partition)])).raise_error()


def test_transactional_offsets_wait_for_the_marker(offsets_log: MemoryOffsetsLog) -> None:
    coord = coordinator(offsets_log)
    txn_commit(coord, 5)
    partition = coord.partition("g")
    assert offsets_log.logged[partition][-1].producer_id == PID
    assert committed(coord) == {}
    with pytest.raises(UnstableOffsetCommitError, match="group g.*t-0.*producer 77"):
        fetch_stable(coord)
    marker(coord, offsets_log, False)
    assert committed(coord) == {}
    fetch_stable(coord)
    txn_commit(coord, 9)
    marker(coord, offsets_log, True)
    assert committed(coord)[TP].offset == 9


def test_a_replay_applies_committed_and_drops_aborted_transactional_offsets(
        offsets_log: MemoryOffsetsLog) -> None:
    coord = coordinator(offsets_log)
    txn_commit(coord, 5)
    marker(coord, offsets_log, True)
    txn_commit(coord, 8)
    marker(coord, offsets_log, False)
    txn_commit(coord, 11)  # still pending when the coordinator moves
    replayed = coordinator(offsets_log)
    assert committed(replayed)[TP].offset == 5
    with pytest.raises(UnstableOffsetCommitError):
        fetch_stable(replayed)
    marker(replayed, offsets_log, True)
    assert committed(replayed)[TP].offset == 11


def test_a_member_of_an_older_generation_is_fenced(offsets_log: MemoryOffsetsLog) -> None:
    coord = coordinator(offsets_log)
    (member,) = form_group(coord, 1)
    generation = coord.describe_group("g").generation_id
    txn_commit(coord, 3, member, generation)
    with pytest.raises(IllegalGenerationError, match="stale"):
        txn_commit(coord, 4, member, generation - 1)


def test_a_late_commit_completion_leaves_the_next_transactions_offsets_pending(
        offsets_log: MemoryOffsetsLog) -> None:
    """The marker's completion runs on a thread of its own (retried while the partition
    loads), so it may run after the producer's next transaction staged offsets: it decides
    only what was staged before the marker, as a replay of the same log does."""
    coord = coordinator(offsets_log)
    partition = coord.partition("g")
    txn_commit(coord, 5)  # T1
    t1_marker = offsets_log.append_marker(partition, PID, ControlType.COMMIT)
    txn_commit(coord, 9)  # T2, staged before T1's completion ran
    assert coord.complete_txn(partition, PID, True, t1_marker) == 1
    assert committed(coord)[TP].offset == 5
    with pytest.raises(UnstableOffsetCommitError):
        fetch_stable(coord)  # T2's offset is still pending
    marker(coord, offsets_log, False)  # T2 is aborted
    assert committed(coord)[TP].offset == 5
    assert committed(coordinator(offsets_log))[TP].offset == 5  # the replay agrees


def test_a_late_abort_completion_keeps_the_next_transactions_offsets(
        offsets_log: MemoryOffsetsLog) -> None:
    coord = coordinator(offsets_log)
    partition = coord.partition("g")
    txn_commit(coord, 5)  # T1
    t1_marker = offsets_log.append_marker(partition, PID, ControlType.ABORT)
    txn_commit(coord, 9)  # T2
    assert coord.complete_txn(partition, PID, False, t1_marker) == 1
    marker(coord, offsets_log, True)  # T2 commits
    assert committed(coord)[TP].offset == 9
    assert committed(coordinator(offsets_log))[TP].offset == 9


def test_a_repeated_completion_decides_nothing_more(offsets_log: MemoryOffsetsLog) -> None:
    """A marker retried by its sender is written again; the first copy's completion, run
    after the producer's next transaction staged offsets, leaves them pending."""
    coord = coordinator(offsets_log)
    partition = coord.partition("g")
    txn_commit(coord, 5)
    first = offsets_log.append_marker(partition, PID, ControlType.COMMIT)
    assert coord.complete_txn(partition, PID, True, first) == 1
    txn_commit(coord, 9)
    assert coord.complete_txn(partition, PID, True, first) == 0
    assert committed(coord)[TP].offset == 5
    with pytest.raises(UnstableOffsetCommitError):
        fetch_stable(coord)


def plain_commit(coord: GroupCoordinatorService, offsets: dict[TopicPartition, int]) -> None:
    """An admin's commit to the empty group (as ``alter_group_offsets`` sends it)."""
    errors = commit(coord, "", -1, dict(offsets))
    assert not any(errors.values()), errors


def committed_offsets(coord: GroupCoordinatorService) -> dict[TopicPartition, int]:
    return {tp: om.offset for tp, om in committed(coord).items()}


def test_a_plain_commit_after_the_transactions_offsets_outlives_its_commit(
        offsets_log: MemoryOffsetsLog) -> None:
    """Goal: Kafka's rule (GroupMetadata.completePendingTxnOffsetCommit): a commit appended
    after a transaction's offsets and before its COMMIT marker is newer, so the marker leaves
    it, for that partition only; a replay of the log agrees. Method: the transaction stages
    5 for t-0 and t-1, a plain commit sets t-0 to 7, then the marker commits: t-0 stays 7,
    t-1 is 5, live and replayed."""
    coord = coordinator(offsets_log)
    txn_commit(coord, 5, tps=(TP, TP1))
    plain_commit(coord, {TP: 7})
    marker(coord, offsets_log, True)
    assert committed_offsets(coord) == {TP: 7, TP1: 5}
    assert committed_offsets(coordinator(offsets_log)) == {TP: 7, TP1: 5}


def test_a_late_marker_completion_leaves_a_commit_made_after_the_transactions_offsets(
        offsets_log: MemoryOffsetsLog) -> None:
    """Goal: the marker's completion runs on a thread of its own, possibly after later
    plain commits were applied; positions in the log decide, not the order completions run.
    Method: the transaction stages 5, its COMMIT marker is appended, a plain commit of 7
    follows and is applied, and only then does the completion run: 7 stays, and a replay
    agrees."""
    coord = coordinator(offsets_log)
    partition = coord.partition("g")
    txn_commit(coord, 5)
    at = offsets_log.append_marker(partition, PID, ControlType.COMMIT)
    plain_commit(coord, {TP: 7})
    assert coord.complete_txn(partition, PID, True, at) == 1
    assert committed_offsets(coord) == {TP: 7}
    assert committed_offsets(coordinator(offsets_log)) == {TP: 7}


def test_a_transactions_offsets_replace_a_plain_commit_made_before_them(
        offsets_log: MemoryOffsetsLog) -> None:
    """Goal: the other order: a commit appended before the transaction's offsets is older,
    so the COMMIT marker replaces it; a replay agrees; an ABORT leaves it. Method: a plain
    commit of 3, the transaction stages 5, its marker commits (5); again with 8 and an
    ABORT (5 stays)."""
    coord = coordinator(offsets_log)
    plain_commit(coord, {TP: 3})
    txn_commit(coord, 5)
    marker(coord, offsets_log, True)
    assert committed_offsets(coord) == {TP: 5}
    assert committed_offsets(coordinator(offsets_log)) == {TP: 5}
    txn_commit(coord, 8)
    marker(coord, offsets_log, False)
    assert committed_offsets(coord) == committed_offsets(coordinator(offsets_log)) == {TP: 5}


# One step of the property test: a plain commit, a TxnOffsetCommit, a marker (its completion
# deferred until a "complete" step or the end), or running the deferred completions.
STEPS = st.lists(st.sampled_from(["plain", "txn", "commit", "abort", "complete"]),
                 max_size=25)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_the_committed_offset_is_the_latest_record_that_counts_live_and_replayed(
        steps: list[str]) -> None:
    """Goal: whatever the interleaving, the committed offset is the one of the record latest
    in the log among the plain commits and the transactional records a completed COMMIT
    decided, in the running coordinator and in a replay of its log. Method: hypothesis over
    sequences of plain commits, TxnOffsetCommits, COMMIT/ABORT markers of one producer whose
    completions run late; each step commits its own index as the offset; the expected answer
    is computed from the log positions alone."""
    log = MemoryOffsetsLog()
    coord = coordinator(log)
    partition = coord.partition("g")
    plain: dict[int, int] = {}  # log position -> offset
    staged: dict[int, int] = {}  # pending TxnOffsetCommit records: position -> offset
    decided: dict[int, int] = {}  # committed TxnOffsetCommit records: position -> offset
    deferred: list[tuple[int, bool, dict[int, int]]] = []  # marker, commit?, what it decides
    for i, step in enumerate(steps):
        position = len(log.logged[partition])
        if step == "plain":
            plain_commit(coord, {TP: i})
            plain[position] = i
        elif step == "txn":
            txn_commit(coord, i)
            staged[position] = i
        elif step in ("commit", "abort"):
            at = log.append_marker(partition, PID, ControlType.COMMIT if step == "commit"
                                   else ControlType.ABORT)
            deferred.append((at, step == "commit", staged))
            staged = {}
        if step == "complete" or i == len(steps) - 1:
            for at, commit_, records in deferred:
                coord.complete_txn(partition, PID, commit_, at)
                decided.update(records if commit_ else {})
            deferred = []
    counted = {**plain, **decided}
    expected = {TP: counted[max(counted)]} if counted else {}
    assert committed_offsets(coord) == expected
    assert committed_offsets(coordinator(log)) == expected
