"""Retention and compaction with transactions: neither passes the last stable offset;
compaction removes aborted records, keeps markers until no reader can need them, keeps the
aborted-transaction index in step, and survives a crash in its swap. Real segment files in
tmp_path, FakeClock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from segment_helpers import abandon, make_batch, open_log, records, reopen, segment_files
from txn_helpers import ABORT, COMMIT, Producer, committed, file_committed, index_entries

from logstore.clock import FakeClock
from logstore.records import FLAG_TRANSACTIONAL
from logstore.segments import format as fmt
from logstore.segments.cleaner import clean_segment, latest_offsets
from logstore.segments.log import Log
from logstore.segments.txn_cleaning import CleanedTxnState

RETENTION_MS = 10_000


def test_retention_never_passes_the_lso(tmp_path: Path) -> None:
    """Goal: retention deletes only segments wholly below the LSO, however old, and moves on
    once the transaction pinning it ends. Method: an open transaction in the second of four
    old segments, HW at the end; retention; commit; retention again."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, retention_ms=1_000)
    p = Producer(log, 1)
    log.append_as_leader(make_batch([b"a"], clock=clock))
    log.roll()
    p.send(1)                                     # 1: the transaction opens
    log.roll()
    log.append_as_leader(make_batch([b"b"], clock=clock))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    clock.advance(60_000)
    assert log.last_stable_offset == 1
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 1 <= log.last_stable_offset
    p.end(COMMIT)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments() == 2
    assert log.log_start_offset == 3


def _compacted_txn_log(tmp_path: Path, clock: FakeClock) -> tuple[Log, Producer, Producer]:
    """Segment 0: a=a0 (plain), aborted txn {a=bad, b=bad}, committed txn {c=c1}, markers.
    Segment 1: c=c2 (plain, shadows c1). Active segment: d, then a committed transaction of
    each producer (their last batches, which compaction keeps whatever they hold, are here so
    that they do not cover the rules under test). HW at the end."""
    log = open_log(tmp_path, clock, cleanup_policy="compact",
                   delete_retention_ms=RETENTION_MS)
    aborter, committer = Producer(log, 1), Producer(log, 2)
    log.append_as_leader(make_batch([b"a"], [b"a0"], clock=clock))          # 0
    aborter.send([b"a", b"b"], values=[b"bad", b"bad"])                     # 1..2
    committer.send([b"c"], values=[b"c1"])                                  # 3
    aborter.end(ABORT)                                                      # 4
    committer.end(COMMIT)                                                   # 5
    log.roll()
    log.append_as_leader(make_batch([b"c"], [b"c2"], clock=clock))          # 6
    log.roll()
    log.append_as_leader(make_batch([b"d"], [b"d0"], clock=clock))          # 7
    aborter.send([b"e"], values=[b"e0"])                                    # 8
    aborter.end(COMMIT)                                                     # 9
    committer.send([b"f"], values=[b"f0"])                                  # 10
    committer.end(COMMIT)                                                   # 11
    log.update_high_watermark(log.log_end_offset)
    return log, aborter, committer


LAST_TXNS = [8, 9, 10, 11]                    # the producers' last transactions (offsets)
# The read_committed view once compaction has removed the aborted and shadowed records.
COMPACTED_VIEW = [(0, b"a"), (6, b"c"), (7, b"d"), (8, b"e"), (10, b"f")]


def _offsets(log: Log) -> list[int]:
    return [b.header.base_offset for b in log.read(0, 1 << 20).batches]


def test_compaction_removes_aborted_records_and_drops_markers_only_when_safe(
        tmp_path: Path) -> None:
    """Goal: Kafka's rules. Aborted records go in the first pass and never shadow the committed
    value of their key; the ABORT marker and its index entry stay while that pass saw its data,
    and go in a later pass once delete_retention_ms has passed; a COMMIT marker stays while its
    transaction has batches, and goes once they are compacted away and the time has passed.
    Method: three passes over the same log, reading batches, index and committed records."""
    clock = FakeClock()
    log, _, _ = _compacted_txn_log(tmp_path, clock)
    view = committed(log)
    first = log.compact(now_ms=clock.time_ms() + RETENTION_MS + 1)
    assert first.aborted_records_dropped == 2 and first.markers_dropped == 0
    assert _offsets(log) == [0, 4, 5, 6, 7, *LAST_TXNS]  # c1 (3) is shadowed by c2; markers stay
    assert index_entries(log) == [(1, 1, 4)]
    assert committed(log) == [r for r in view if r[0] != 3] == COMPACTED_VIEW
    assert records(log)[0] == (0, b"a", b"a0")  # the aborted a=bad never shadowed a0
    second = log.compact(now_ms=clock.time_ms() + 1)
    assert second.markers_dropped == 0           # both markers droppable, but too recent
    assert _offsets(log) == [0, 4, 5, 6, 7, *LAST_TXNS] and index_entries(log) == []
    third = log.compact(now_ms=clock.time_ms() + RETENTION_MS + 1)
    assert third.markers_dropped == 2
    assert _offsets(log) == [0, 6, 7, *LAST_TXNS]
    assert committed(log) == COMPACTED_VIEW


def test_commit_marker_stays_while_its_transaction_has_data(tmp_path: Path) -> None:
    """Goal: a COMMIT marker is kept however old while any batch of its transaction is left
    (replaying the log without it would reopen the transaction and pin the LSO). Method: a
    committed transaction whose record is the latest of its key; compact long after; reopen
    and check no transaction is open."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=RETENTION_MS)
    p = Producer(log, 1)
    p.send([b"k"], values=[b"v"])
    p.end(COMMIT)
    log.roll()
    log.append_as_leader(make_batch([b"x"], clock=clock))
    log.update_high_watermark(log.log_end_offset)
    for _ in range(2):
        assert log.compact(now_ms=clock.time_ms() + 10 * RETENTION_MS).markers_dropped == 0
    assert _offsets(log) == [0, 1, 2]
    log.close()
    log = reopen(log, clock, clean=False)
    assert log.producer_state.open_transactions == {}


def test_compaction_never_touches_segments_at_or_after_the_lso(tmp_path: Path) -> None:
    """Goal: no segment at or after the LSO is compacted: an open transaction keeps even
    overwritten records of later segments. Method: an open transaction in the second segment;
    overwrite its keys in the third; compact; the second and third files are unchanged."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact")
    p = Producer(log, 1)
    log.append_as_leader(make_batch([b"a", b"a"], clock=clock))
    log.roll()
    p.send([b"b"])
    log.roll()
    log.append_as_leader(make_batch([b"b", b"b"], clock=clock))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    before = [f.read_bytes() for f in segment_files(log)]
    stats = log.compact()
    assert stats.segments_cleaned == 1 and log.last_stable_offset == 2
    after = [f.read_bytes() for f in segment_files(log)]
    assert after[0] != before[0] and after[1:] == before[1:]


@pytest.mark.parametrize("clean", [True, False])
def test_compacted_log_reads_the_same_committed_view_from_files_and_after_restart(
        tmp_path: Path, clean: bool) -> None:
    """Goal: after compaction with transactions, the file reader and a reopened log give the
    read_committed view of the live log. A clean restart keeps the index as it was; an unclean
    one rebuilds it by replay, which indexes only the aborts that still have data (here none:
    the marker is kept, its data is gone, so it closes nothing). Method: compact the mixed log,
    compare Log, files and the reopened log."""
    clock = FakeClock()
    log, _, _ = _compacted_txn_log(tmp_path, clock)
    log.compact(now_ms=clock.time_ms())
    view, entries = committed(log), index_entries(log)
    assert entries == [(1, 1, 4)]
    assert file_committed(log, 0, log.log_end_offset) == view
    log.close() if clean else abandon(log)
    log = reopen(log, clock, clean=clean)
    log.update_high_watermark(log.log_end_offset)
    assert committed(log) == view and log.producer_state.open_transactions == {}
    assert index_entries(log) == (entries if clean else [])


def test_interrupted_swap_installs_the_cleaned_txn_index(tmp_path: Path) -> None:
    """Goal: a crash after the cleaner's commit point (data file renamed to .swap) leaves the
    cleaned aborted-transaction index in place at restart, never the stale one. Method: clean
    the first segment of a log whose second pass drops an index entry, stop right after the
    commit rename, reopen."""
    clock = FakeClock()
    log, _, _ = _compacted_txn_log(tmp_path, clock)
    log.compact(now_ms=clock.time_ms())           # data removed, marker and entry kept
    seg = log._state.segments[0]
    aborted = log.collect_aborted_transactions(0, seg.next_offset)
    latest = latest_offsets(log, [seg], aborted)
    cleaned = clean_segment(log, seg, latest, clock.time_ms(), CleanedTxnState(aborted),
                            log.last_producer_batches()).segment
    assert len(cleaned.txn_index) == 0           # this pass drops the entry
    os.replace(cleaned.path, seg.path.with_name(seg.path.name + fmt.SWAP_SUFFIX))
    abandon(log)
    stale = log.dir / fmt.file_name(0, fmt.TXN_INDEX_SUFFIX)
    assert stale.exists()
    log = reopen(log, clock, clean=False, recovery_point=log.log_end_offset)
    assert index_entries(log) == []
    log.update_high_watermark(log.log_end_offset)
    assert committed(log) == COMPACTED_VIEW


def test_dropping_a_marker_deletes_the_snapshots_that_hold_its_transaction_open(
        tmp_path: Path) -> None:
    """Goal: once compaction drops a COMMIT marker, no reload can start from a producer
    snapshot taken inside that transaction (it would find the transaction open and no marker
    to end it: a hanging transaction pinning the LSO). Method: a transaction across a roll
    (snapshot at 1 holds it open), its record shadowed; two compaction passes drop its data
    then its marker; reopen unclean from a recovery point that would load that snapshot."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=RETENTION_MS)
    p = Producer(log, 1)
    p.send([b"k"])                                           # 0: the transaction opens
    log.roll()                                               # snapshot at 1: open since 0
    p.end(COMMIT)                                            # 1
    log.append_as_leader(make_batch([b"k"], clock=clock))    # 2 shadows offset 0
    log.roll()                                               # snapshot at 3
    p.send([b"z"])                                           # 3: the producer's last batch,
    p.end(COMMIT)                                            # 4: kept anyway, out of the way
    log.update_high_watermark(log.log_end_offset)
    assert log.producer_state.snapshot_offsets() == [1, 3]
    assert log.compact().markers_dropped == 0               # the data goes, the marker stays
    later = clock.time_ms() + RETENTION_MS + 1
    assert log.compact(now_ms=later).markers_dropped == 1
    assert log.producer_state.snapshot_offsets() == [3]
    abandon(log)
    log = reopen(log, clock, clean=False, recovery_point=1)
    log.update_high_watermark(log.log_end_offset)
    assert log.producer_state.open_transactions == {}
    assert log.last_stable_offset == log.log_end_offset == 5


def test_compaction_keeps_the_batch_that_holds_a_producers_sequence(tmp_path: Path) -> None:
    """Goal: a rebuild of the producer state from a compacted log finds the producer's last
    sequence, so its next batch is accepted (found by the property test: the aborted batch
    went, the rebuild saw sequence 0 and refused sequence 5). Method: a plain record (sequence
    0), then an aborted transaction (1..4) ending the producer's writes, rolled and compacted
    long after; reopen unclean from offset 0 (a rebuild from the log); send sequence 5."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=RETENTION_MS)
    p = Producer(log, 3)
    p.send(1, transactional=False)                           # 0: k0, sequence 0
    p.send(4)                                                # 1-4: sequences 1..4
    p.end(ABORT)                                             # 5
    log.roll()
    log.append_as_leader(make_batch([b"x"], clock=clock))    # 6
    log.update_high_watermark(log.log_end_offset)
    stats = log.compact(now_ms=clock.time_ms() + RETENTION_MS + 1)
    assert stats.aborted_records_dropped == 0 and stats.markers_dropped == 0
    assert committed(log) == [(0, b"k0"), (6, b"x")]
    abandon(log)
    log = p.log = reopen(log, clock, clean=False)
    assert p.send(1).first_offset == 7                      # sequence 5 follows 4
    p.end(COMMIT)
    log.update_high_watermark(log.log_end_offset)
    assert committed(log) == [(0, b"k0"), (6, b"x"), (7, b"k0")]


def test_a_kept_shadowed_batch_keeps_the_tombstone_of_its_key(tmp_path: Path) -> None:
    """Goal: a producer's last batch kept whole though shadowed never brings a deleted key
    back: the tombstone that shadows it stays past delete_retention_ms while the batch does.
    Method: an idempotent producer's last batch k=v1, a plain tombstone of k, rolled; two
    expired compaction passes; the last record of k is still the tombstone."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=RETENTION_MS)
    Producer(log, 7).send([b"k"], transactional=False, values=[b"v1"])  # 0: kept whole
    log.append_as_leader(make_batch([b"k"], [None], clock=clock))       # 1: k deleted
    log.roll()
    log.append_as_leader(make_batch([b"z"], [b"z"], clock=clock))       # 2
    log.update_high_watermark(log.log_end_offset)
    for _ in range(2):
        log.compact(now_ms=clock.time_ms() + RETENTION_MS + 1)
    assert [r for r in records(log) if r[1] == b"k"] == [(0, b"k", b"v1"), (1, b"k", None)]


def test_only_the_last_marker_of_a_producer_without_sequences_is_kept(tmp_path: Path) -> None:
    """Goal: a transactional producer whose batches carry no sequence (the coordinator's
    offset commits to __consumer_offsets) keeps only its last data batch through compaction,
    not every marker of its epoch (they piled up forever). Method: five transactions of one
    sequence-less record each, shadowed by the next; three expired passes."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=RETENTION_MS)
    for i in range(5):                                                  # 0..9
        log.append_as_leader(make_batch([b"k"], [b"v%d" % i], clock=clock), producer_id=9,
                             producer_epoch=0, base_sequence=-1, flags=FLAG_TRANSACTIONAL)
        log.append_control_marker(9, 0, COMMIT, 0)
    log.roll()
    log.append_as_leader(make_batch([b"z"], [b"z"], clock=clock))       # 10
    log.update_high_watermark(log.log_end_offset)
    for _ in range(3):
        log.compact(now_ms=clock.time_ms() + RETENTION_MS + 1)
    assert _offsets(log) == [8, 9, 10]                # the last transaction, and z
    assert committed(log) == [(8, b"k"), (10, b"z")]
