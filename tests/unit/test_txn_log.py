"""Transactions in the storage layer: markers, open transactions and the last stable offset,
read_committed reads, the aborted-transaction index, followers, restarts and truncation, on
real segment files in tmp_path with a FakeClock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from segment_helpers import abandon, keyed, open_log, reopen, segment_files
from txn_helpers import ABORT, COMMIT, Producer, committed, file_committed, index_entries

from logstore import errors
from logstore.clock import FakeClock
from logstore.records import FLAG_CONTROL, FLAG_TRANSACTIONAL
from logstore.segments import format as fmt
from logstore.txn_filter import IsolationLevel

# -- markers and the last stable offset ----------------------------------------------------


def test_open_transaction_pins_lso_until_its_marker_is_below_the_high_watermark(
        tmp_path: Path) -> None:
    """Goal: the LSO is the first offset of the earliest transaction that is open or whose
    marker is not yet replicated (below the HW), else the HW. Method: open a transaction,
    write around it, move the HW, write its COMMIT marker, move the HW past it."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 2))
    p = Producer(log, 7)
    p.send(3)                                    # offsets 2..4, transaction opens at 2
    log.append_as_leader(keyed(0, 2))            # 5..6
    log.update_high_watermark(log.log_end_offset)
    assert (log.high_watermark, log.last_stable_offset) == (7, 2)
    assert log.producer_state.open_transactions == {7: 2}
    p.send(1)                                    # 7, same transaction
    marker = p.end(COMMIT)                       # 8
    assert (marker.first_offset, marker.last_offset) == (8, 8)
    assert log.producer_state.open_transactions == {}
    log.update_high_watermark(8)                 # the marker is not replicated yet
    assert log.last_stable_offset == 2
    log.update_high_watermark(9)
    assert log.last_stable_offset == 9 == log.high_watermark
    assert "lso=9" in repr(log)


def test_lso_is_the_earliest_of_several_open_transactions(tmp_path: Path) -> None:
    """Goal: with several producers, the LSO follows the earliest open first offset as
    transactions end in any order. Method: three interleaved transactions ended 2, 1, 3."""
    log = open_log(tmp_path, FakeClock())
    a, b, c = Producer(log, 1), Producer(log, 2), Producer(log, 3)
    a.send(1), b.send(1), c.send(1), a.send(1)
    b.end(ABORT)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 0
    a.end(COMMIT)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 2
    c.end(COMMIT)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.log_end_offset


def test_marker_with_an_older_epoch_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """Goal: a zombie coordinator's marker for a fenced epoch is refused with an error naming
    the producer and the partition. Method: the producer writes at epoch 1; a marker at epoch 0
    raises InvalidProducerEpochError; the log end offset does not move."""
    log = open_log(tmp_path, FakeClock())
    p = Producer(log, 7, epoch=1)
    p.send(2)
    with pytest.raises(errors.InvalidProducerEpochError, match="topic-0.*producer 7.*epoch 0"):
        log.append_control_marker(7, 0, ABORT, coordinator_epoch=0)
    with pytest.raises(errors.InvalidRecordError, match="topic-0"):
        log.append_control_marker(-1, 0, ABORT, coordinator_epoch=0)
    assert log.log_end_offset == 2 and log.producer_state.open_transactions == {7: 0}


def test_marker_without_open_transaction_is_written_but_changes_nothing(tmp_path: Path) -> None:
    """Goal: as in Kafka, a marker for a producer with no open transaction (an abort after a
    timeout) is written, opens and closes nothing and indexes nothing, but its epoch fences the
    producer's older epoch. Method: an ABORT at epoch 1 for a producer that wrote
    non-transactionally at epoch 0; then a write at epoch 0 is refused."""
    log = open_log(tmp_path, FakeClock())
    p = Producer(log, 4)
    p.send(2, transactional=False)
    log.update_high_watermark(2)
    info = log.append_control_marker(4, 1, ABORT, coordinator_epoch=3)
    assert info.first_offset == 2 and log.log_end_offset == 3
    log.update_high_watermark(3)
    assert log.last_stable_offset == 3 and index_entries(log) == []
    assert log.producer_state.entry(4).coordinator_epoch == 3
    with pytest.raises(errors.InvalidProducerEpochError):
        p.send(1, transactional=False)
    assert log.read(2, 1 << 20).batches[0].header.is_control


def test_producer_cannot_mix_transactional_and_plain_writes_or_write_markers(
        tmp_path: Path) -> None:
    """Goal: inside an open transaction a producer's non-transactional batch is refused
    (InvalidTxnStateError naming producer and partition); no producer writes a control batch;
    a transactional batch needs a producer id. Nothing is written by a refused append.
    Method: try each, check the log end offset."""
    log = open_log(tmp_path, FakeClock())
    p = Producer(log, 5)
    p.send(1)
    with pytest.raises(errors.InvalidTxnStateError, match="topic-0.*producer 5.*offset 0"):
        p.send(1, transactional=False)
    with pytest.raises(errors.InvalidRecordError, match="control"):
        log.append_as_leader(keyed(0, 1), flags=FLAG_CONTROL)
    with pytest.raises(errors.InvalidRecordError, match="producer id"):
        log.append_as_leader(keyed(0, 1), flags=FLAG_TRANSACTIONAL)
    assert log.log_end_offset == 1
    p.send(1)  # the refused batches took no sequence numbers
    p.end(COMMIT)
    p.send(1, transactional=False)  # allowed once the transaction is over
    assert log.log_end_offset == 4


# -- reads --------------------------------------------------------------------------------


def _mixed_log(tmp_path: Path) -> tuple:
    """offsets 0-1 plain; 2-3 A (aborted, marker 8); 4-5 B (committed, marker 9); 6-7 plain;
    10-11 C (open)."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, index_interval_bytes=1)
    a, b, c = Producer(log, 1), Producer(log, 2), Producer(log, 3)
    log.append_as_leader(keyed(0, 2))
    a.send([b"a1", b"a2"])
    b.send([b"b1", b"b2"])
    log.append_as_leader(keyed(10, 2))
    a.end(ABORT)
    b.end(COMMIT)
    c.send([b"c1", b"c2"])
    log.update_high_watermark(log.log_end_offset)
    return log, clock, (a, b, c)


def test_read_committed_stops_at_lso_and_lists_the_aborted_transactions(tmp_path: Path) -> None:
    """Goal: a read_committed read returns no batch at or after the LSO and carries every
    aborted transaction overlapping what it returns (Kafka's AbortedTransactions); filtered as
    a client does, only committed and plain records remain, each once; read_uncommitted is
    unchanged and its control batches are told apart by their header. Method: the mixed log,
    read both ways, with whole and tiny pages, with and without the markers' offsets."""
    log, _, _ = _mixed_log(tmp_path)
    assert log.last_stable_offset == 10
    fetch = log.read(0, 1 << 20, isolation=IsolationLevel.READ_COMMITTED)
    assert [b.header.base_offset for b in fetch.batches] == [0, 2, 4, 6, 8, 9]
    assert fetch.last_stable_offset == 10
    assert [(a.producer_id, a.first_offset, a.last_offset)
            for a in fetch.aborted_transactions] == [(1, 2, 8)]
    expected = [(0, b"k0"), (1, b"k1"), (4, b"b1"), (5, b"b2"), (6, b"k10"), (7, b"k11")]
    for page in (1, 1 << 20):
        assert committed(log, page=page) == expected
        assert committed(log, page=page, with_ends=False) == expected
    assert log.read(6, 1 << 20, isolation=IsolationLevel.READ_COMMITTED
                    ).aborted_transactions[0].first_offset == 2
    assert log.read(9, 1 << 20, isolation=IsolationLevel.READ_COMMITTED
                    ).aborted_transactions == []
    plain = log.read(0, 1 << 20)
    assert [b.header.base_offset for b in plain.batches] == [0, 2, 4, 6, 8, 9, 10]
    assert [b.header.is_control for b in plain.batches] == [False] * 4 + [True, True, False]
    assert plain.aborted_transactions == []


def test_file_reader_read_committed_matches_the_log(tmp_path: Path) -> None:
    """Goal: a Spark executor reading the files read_committed, given the LSO, gets what a
    read_committed consumer gets, for every range. Method: the mixed log rolled into several
    segments; every (start, end) pair compared."""
    log, _, (_, _, c) = _mixed_log(tmp_path)
    log.roll()
    c.end(ABORT)
    log.update_high_watermark(log.log_end_offset)
    leo = log.log_end_offset
    everything = committed(log)
    assert everything == [(0, b"k0"), (1, b"k1"), (4, b"b1"), (5, b"b2"), (6, b"k10"),
                          (7, b"k11")]
    for start in range(leo):
        for end in range(start + 1, leo + 1):
            assert file_committed(log, start, end) == [r for r in everything
                                                        if start <= r[0] < end]


# -- the aborted-transaction index ---------------------------------------------------------


def test_abort_entry_goes_to_the_segment_holding_the_marker(tmp_path: Path) -> None:
    """Goal: an ABORT marker's entry (producer, first offset, marker offset, LSO after it) is in
    the index of the marker's segment, on disk at once; a COMMIT adds nothing. Method: a
    transaction begun before a roll and aborted after it; read the .txnindex bytes."""
    log = open_log(tmp_path, FakeClock())
    a, b = Producer(log, 1), Producer(log, 2)
    a.send(2)
    b.send(1)
    log.roll()
    a.end(ABORT)
    b.end(COMMIT)
    assert index_entries(log) == [(1, 0, 3)]
    files = sorted(log.dir.glob("*" + fmt.TXN_INDEX_SUFFIX))
    assert [f.name for f in files] == [fmt.file_name(3, fmt.TXN_INDEX_SUFFIX)]
    assert files[0].read_bytes() == fmt.TXN_ENTRY.pack(1, 0, 3, 2)  # b's txn still open at 2


def test_follower_rebuilds_transactions_from_the_replicated_batches(tmp_path: Path) -> None:
    """Goal: a follower that appends the leader's batches (markers included, bytes untouched)
    ends with the same open transactions, index entries and LSO, so it can lead. Method:
    replicate the mixed log, compare state and files."""
    leader, clock, _ = _mixed_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", clock)
    follower.append_as_follower(leader.read(0, 1 << 20).batches)
    follower.update_high_watermark(leader.high_watermark)
    assert follower.producer_state.open_transactions == {3: 10}
    assert index_entries(follower) == index_entries(leader) == [(1, 2, 8)]
    assert follower.last_stable_offset == leader.last_stable_offset == 10
    assert committed(follower) == committed(leader)
    assert segment_files(follower)[0].read_bytes() == segment_files(leader)[0].read_bytes()


# -- restart, recovery and truncation ------------------------------------------------------


@pytest.mark.parametrize("clean", [True, False])
def test_open_transactions_and_aborts_survive_restart(tmp_path: Path, clean: bool) -> None:
    """Goal: open transactions (from the snapshot and the replayed tail) and the aborted index
    survive a clean or unclean restart; the reopened log goes on as before. Method: open one
    transaction before a roll (in the snapshot) and one after, abort another; restart; move the
    HW; commit and compare."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    a, b, c = Producer(log, 1), Producer(log, 2), Producer(log, 3)
    a.send(2)
    c.send(1)
    c.end(ABORT)
    log.roll()
    b.send(2)
    log.flush() if clean else None
    entries, opened = index_entries(log), log.producer_state.open_transactions
    assert opened == {1: 0, 2: 4}
    log.close() if clean else abandon(log)
    log = reopen(log, clock, clean=clean)
    assert log.producer_state.open_transactions == opened
    assert index_entries(log) == entries == [(3, 2, 3)]
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 0
    a.log = b.log = log
    a.end(COMMIT)
    b.end(ABORT)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.log_end_offset
    assert committed(log) == [(0, b"k0"), (1, b"k1")]


def test_a_log_flushed_since_its_last_write_closes_with_a_producer_snapshot(
        tmp_path: Path) -> None:
    """Goal: a clean close leaves a producer snapshot at the log end offset even when the log
    was flushed since its last write, so the reopened log loads its producer state instead of
    replaying the tail, as after a close with unflushed writes (which always wrote one): the
    snapshot, as in Kafka, carries no completed transaction, so one completed before the
    close is stable once the high watermark passes its data (found by the transaction state
    machine: replayed, the abort held the LSO at 0 with the HW at 1 until the HW passed its
    marker); and a log closed again with nothing new writes no second snapshot. Method: one transactional record and
    its ABORT marker, flush, close, reopen, move the HW to 1; close and reopen once more."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    p = Producer(log, 1)
    p.send(1)                                    # offset 0
    p.end(ABORT)                                 # marker at 1
    log.flush()
    log.close()
    log = reopen(log, clock, clean=True, recovery_point=2)
    assert log.producer_state.snapshot_offsets() == [2]
    log.update_high_watermark(1)
    assert (log.high_watermark, log.last_stable_offset) == (1, 1)
    snapshot = log.dir / fmt.file_name(2, fmt.SNAPSHOT_SUFFIX)
    written = snapshot.stat().st_mtime_ns
    log.close()
    assert snapshot.stat().st_mtime_ns == written


def test_unclean_restart_rebuilds_the_txn_index_of_the_unflushed_tail(tmp_path: Path) -> None:
    """Goal: after an unclean stop, the aborted index of every segment from the recovery point
    on is rebuilt from producer state, even if its file was lost or garbled; a garbled index
    of a trusted segment is rebuilt too. Method: aborts in two segments; flush the first;
    delete the tail's .txnindex and garble the first's; reopen unclean."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    a, b = Producer(log, 1), Producer(log, 2)
    a.send(2)
    b.send(1)
    a.end(ABORT)
    log.roll()
    log.flush_rolled_segments()
    point = log.recovery_point
    b.end(ABORT)
    a.send(1)
    a.end(ABORT)
    expected = index_entries(log)
    assert expected == [(1, 0, 3), (2, 2, 4), (1, 5, 6)]
    abandon(log)
    first, tail = sorted(log.dir.glob("*" + fmt.TXN_INDEX_SUFFIX))
    tail.unlink()
    first.write_bytes(fmt.TXN_ENTRY.pack(1, 9, 8, 7))  # marker offset outside the segment
    log = reopen(log, clock, clean=False, recovery_point=point)
    assert index_entries(log) == expected
    assert log.producer_state.open_transactions == {}


def test_torn_tail_loses_the_marker_and_reopens_the_transaction(tmp_path: Path) -> None:
    """Goal: recovery that truncates a torn ABORT marker leaves its transaction open again
    (LSO pinned at its start) and its index entry gone. Method: tear the marker's batch in
    half, reopen unclean."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    p = Producer(log, 1)
    p.send(2)
    size = p.end(ABORT).batch_size
    abandon(log)
    path = segment_files(log)[0]
    path.write_bytes(path.read_bytes()[: -size // 2])
    log = reopen(log, clock, clean=False)
    log.update_high_watermark(log.log_end_offset)
    assert log.log_end_offset == 2 and log.last_stable_offset == 0
    assert index_entries(log) == [] and log.producer_state.open_transactions == {1: 0}


def test_snapshot_version_1_is_still_read(tmp_path: Path) -> None:
    """Goal: a snapshot written before transactions (version 1) still restores duplicate
    detection, with no open transaction. Method: rewrite a clean close's snapshot in version 1
    form, reopen clean, retry the last batch."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    p = Producer(log, 4)
    last = p.send(3, transactional=False)
    log.close()
    (path,) = log.dir.glob("*" + fmt.SNAPSHOT_SUFFIX)
    body = json.loads(path.read_text())
    assert body["version"] == 2
    body["version"] = 1
    for producer in body["producers"]:
        del producer["coordinator_epoch"], producer["txn_first_offset"]
    path.write_text(json.dumps(body))
    log = reopen(log, clock, clean=True)
    p.log, p.sequence = log, 0
    assert p.send(3, transactional=False).duplicate and last.first_offset == 0
    assert log.producer_state.open_transactions == {}


def test_truncate_to_removes_index_entries_and_markers_above_the_point(tmp_path: Path) -> None:
    """Goal: truncating drops the aborted index entries whose markers go, and a transaction
    whose marker goes is open again; one whose data goes is gone. Method: two aborted
    transactions; truncate at the second marker, then inside the second transaction."""
    log = open_log(tmp_path, FakeClock())
    a, b = Producer(log, 1), Producer(log, 2)
    a.send(2)
    a.end(ABORT)       # 2
    b.send(2)          # 3..4
    b.end(ABORT)       # 5
    assert index_entries(log) == [(1, 0, 2), (2, 3, 5)]
    log.truncate_to(5)
    assert index_entries(log) == [(1, 0, 2)]
    assert log.producer_state.open_transactions == {2: 3}
    log.update_high_watermark(5)
    assert log.last_stable_offset == 3
    log.truncate_to(3)
    assert log.producer_state.open_transactions == {} and log.last_stable_offset == 3
    assert index_entries(log) == [(1, 0, 2)]
    (path,) = log.dir.glob("*" + fmt.TXN_INDEX_SUFFIX)
    assert path.read_bytes() == fmt.TXN_ENTRY.pack(1, 0, 2, 3)


def test_a_marker_from_an_older_coordinator_epoch_is_fenced(tmp_path: Path) -> None:
    """Goal: once a coordinator of epoch 5 wrote a producer's marker, a marker from an older
    coordinator (one that lost its ``__transaction_state`` partition) is
    TRANSACTION_COORDINATOR_FENCED naming partition and producer, and writes nothing; the same
    or a newer coordinator epoch is accepted. Method: markers at epochs 5, 4, 5, 6."""
    log = open_log(tmp_path, FakeClock())
    p = Producer(log, 9)
    p.send(1)
    p.end(COMMIT, coordinator_epoch=5)
    p.send(1)
    end = log.log_end_offset
    with pytest.raises(errors.TransactionCoordinatorFencedError,
                       match="topic-0.*producer 9.*coordinator epoch 4"):
        p.end(ABORT, coordinator_epoch=4)
    assert log.log_end_offset == end and log.producer_state.open_transactions == {9: 2}
    p.end(ABORT, coordinator_epoch=5)
    p.send(1)
    p.end(COMMIT, coordinator_epoch=6)
    assert log.producer_state.entry(9).coordinator_epoch == 6


def test_a_coordinator_writes_transactional_offsets_without_a_sequence(tmp_path: Path) -> None:
    """Goal: a transactional batch with sequence -1 (offsets a group coordinator commits in a
    producer's transaction) opens the producer's transaction and is checked by epoch only;
    a client batch without a sequence that is not transactional is still refused. Method:
    append both ways."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 1), producer_id=3, producer_epoch=1, base_sequence=-1,
                         flags=FLAG_TRANSACTIONAL)
    assert log.producer_state.open_transactions == {3: 0}
    with pytest.raises(errors.InvalidProducerEpochError):
        log.append_as_leader(keyed(0, 1), producer_id=3, producer_epoch=0, base_sequence=-1,
                             flags=FLAG_TRANSACTIONAL)
    with pytest.raises(errors.InvalidRecordError, match="base_sequence -1"):
        log.append_as_leader(keyed(0, 1), producer_id=4, producer_epoch=0, base_sequence=-1)
