"""Storage layer compaction: latest record per key with original offsets, tombstone expiry,
offset deltas, producer fields and readers running during segment swaps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from segment_helpers import (
    make_batch,
    open_log,
    records,
    reopen,
    segment_files,
)

from logstore import errors
from logstore.clock import FakeClock
from logstore.records import FLAG_HAS_OFFSET_DELTAS
from logstore.segments.log import Log

# -- compaction --------------------------------------------------------------------------


def _compacted_log(tmp_path: Path, clock: FakeClock) -> Log:
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=10_000,
                   index_interval_bytes=1)
    log.append_as_leader(make_batch([b"a", b"b", b"c"], [b"a0", b"b0", b"c0"], clock=clock))
    log.append_as_leader(make_batch([b"a", b"d"], [b"a1", None], clock=clock))
    log.roll()
    log.append_as_leader(make_batch([b"b", b"c"], [b"b1", None], clock=clock))
    log.roll()
    log.append_as_leader(make_batch([b"a"], [b"active"], clock=clock))
    log.update_high_watermark(log.log_end_offset)  # compaction stops at the LSO (<= HW)
    return log


def test_compaction_keeps_latest_per_key_with_original_offsets(tmp_path: Path) -> None:
    """Goal: compaction keeps the latest record of each key in the sealed segments, with its
    original offset (gaps are visible), keeps recent tombstones and never touches the active
    segment. Method: three segments with overwrites; compact; read back offsets and values."""
    clock = FakeClock()
    log = _compacted_log(tmp_path, clock)
    before = segment_files(log)[-1].read_bytes()
    stats = log.compact()
    assert stats.segments_cleaned == 2 and stats.records_read == 7 and stats.records_kept == 4
    assert records(log) == [(3, b"a", b"a1"), (4, b"d", None), (5, b"b", b"b1"), (6, b"c", None),
                            (7, b"a", b"active")]
    first = log.read(0, 1 << 20).batches[0]
    assert first.header.base_offset == 3 and first.header.last_offset == 4
    assert segment_files(log)[-1].read_bytes() == before
    assert log.read(1, 1 << 20).batches[0].header.base_offset == 3
    assert reopen(log, clock, clean=False).log_end_offset == 8
    assert records(reopen(log, clock, clean=False)) == records(log)


def test_compaction_drops_tombstones_older_than_delete_retention(tmp_path: Path) -> None:
    """Goal: tombstones survive until their batch is delete_retention_ms old, then go.
    Method: compact at now and again after delete_retention_ms has passed."""
    clock = FakeClock()
    log = _compacted_log(tmp_path, clock)
    log.compact(now_ms=clock.time_ms() + 5_000)
    assert (4, b"d", None) in records(log)
    stats = log.compact(now_ms=clock.time_ms() + 10_001)
    assert stats.tombstones_dropped == 2
    assert records(log) == [(3, b"a", b"a1"), (5, b"b", b"b1"), (7, b"a", b"active")]
    batch = log.read(3, 1 << 20).batches[0]
    assert batch.offsets().tolist() == [3] and batch.header.last_offset == 4


def test_a_tombstone_with_an_old_timestamp_is_kept_for_delete_retention_after_its_write(
        tmp_path: Path) -> None:
    """Goal: delete_retention_ms counts from when the tombstone was written (its segment's
    last write, on the log's clock), not from its own timestamp: a tombstone produced now
    with a producer's two-day-old CreateTime was dropped at the next pass, so a consumer that
    had read the value and resumed never saw the delete. The window also survives a
    cleaning pass (the cleaned copy keeps its source's time) and a reopen.
    Method: key k's value, then its tombstone stamped two days back; roll; compact at once,
    after a reopen, and after delete_retention_ms."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", delete_retention_ms=10_000)
    old = clock.time_ms() - 2 * 86_400_000
    log.append_as_leader(make_batch([b"k"], [b"v"], clock=clock))
    log.append_as_leader(make_batch([b"k"], [None], timestamps=[old]))
    log.roll()
    log.append_as_leader(make_batch([b"x"], [b"active"], clock=clock))
    log.update_high_watermark(log.log_end_offset)
    assert log.compact().tombstones_dropped == 0
    assert records(log)[0] == (1, b"k", None)
    log.close()
    log = reopen(log, clock, clean=True)
    log.update_high_watermark(log.log_end_offset)
    clock.advance(9_000)
    assert log.compact().tombstones_dropped == 0
    clock.advance(1_001)
    assert log.compact().tombstones_dropped == 1
    assert records(log) == [(2, b"x", b"active")]


def test_retention_deleting_a_segment_under_the_cleaner_stops_the_pass_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: when retention deletes a segment the cleaner has chosen, the pass stops
    quietly (the log changed): no SegmentClosedError escapes (578 tracebacks in 15 s under
    load) and no half-written .cleaned file is left behind. Method: retention deletes the
    first segment as the cleaner starts reading it."""
    from logstore.segments import cleaner

    clock = FakeClock()
    log = _compacted_log(tmp_path, clock)
    first = log.segments_info()[0]["base_offset"]
    batches = cleaner.segment_batches

    def retention_first(seg):  # type: ignore[no-untyped-def]
        if seg.base_offset == first:
            log.maybe_increment_log_start_offset(log.segments_info()[1]["base_offset"])
            log.delete_old_segments()
        return batches(seg)

    monkeypatch.setattr(cleaner, "segment_batches", retention_first)
    stats = log.compact()
    assert stats.segments_cleaned == 0
    assert not list(tmp_path.rglob("*.cleaned"))
    monkeypatch.setattr(cleaner, "segment_batches", batches)
    assert log.compact().segments_cleaned == 1


def test_retention_deleting_a_segment_before_the_cleaner_stats_it_stops_the_pass_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: the cleaner reads when a segment was last written from its file; a file that
    retention unlinked meanwhile (after the cleaner chose and pinned the segment) stops the
    pass as a changed log does, not with FileNotFoundError. Method: retention deletes the
    first segment as the cleaner finishes collecting the latest offsets."""
    from logstore.segments import cleaner

    clock = FakeClock()
    log = _compacted_log(tmp_path, clock)
    latest = cleaner.latest_offsets

    def then_retention(*args):  # type: ignore[no-untyped-def]
        found = latest(*args)
        log.maybe_increment_log_start_offset(log.segments_info()[1]["base_offset"])
        log.delete_old_segments()
        return found

    monkeypatch.setattr(cleaner, "latest_offsets", then_retention)
    assert log.compact().segments_cleaned == 0
    assert not list(tmp_path.rglob("*.cleaned"))


def test_compaction_writes_offset_deltas_and_keeps_producer_fields(tmp_path: Path) -> None:
    """Goal: a batch with holes in the middle carries offset deltas; its producer fields and
    last offset are preserved. Method: one idempotent batch with a duplicate key, compact."""
    log = open_log(tmp_path, FakeClock(), cleanup_policy="compact")
    log.append_as_leader(make_batch([b"a", b"b", b"c", b"a", b"c", b"d"]), producer_id=3,
                         producer_epoch=1, base_sequence=0)
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    log.compact()
    batch = log.read(0, 1 << 20).batches[0]
    assert batch.header.flags & FLAG_HAS_OFFSET_DELTAS
    assert batch.offsets().tolist() == [1, 3, 4, 5]
    assert batch.record_batch(log.schema).column("key").to_pylist() == [b"b", b"a", b"c", b"d"]
    assert (batch.header.producer_id, batch.header.producer_epoch) == (3, 1)
    assert batch.header.last_offset == 5 and batch.header.base_sequence == 1


def test_compaction_does_not_disturb_concurrent_readers(tmp_path: Path) -> None:
    """Goal: reads running while segments are swapped never fail and always see whole data.
    Method: a thread reads the log in a loop while the main thread compacts repeatedly."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact")
    for i in range(20):
        log.append_as_leader(make_batch([b"k%d" % (j % 5) for j in range(50)], clock=clock))
        if i % 4 == 3:
            log.roll()
    log.update_high_watermark(log.log_end_offset)
    stop, failures = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            try:
                assert records(log)[-1][0] == log.log_end_offset - 1
            except Exception as e:  # noqa: BLE001
                failures.append(e)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(5):
        log.compact()
    stop.set()
    thread.join()
    assert failures == []


def test_compacted_topic_rejects_null_keys(tmp_path: Path) -> None:
    """Goal: as in Kafka, a compacted topic refuses records without a key.
    Method: append a batch with a null key."""
    log = open_log(tmp_path, FakeClock(), cleanup_policy="compact")
    with pytest.raises(errors.InvalidRecordError, match="topic-0.*key"):
        log.append_as_leader(make_batch([b"a", None]))


def test_compaction_refuses_a_segment_with_a_corrupt_batch(tmp_path: Path) -> None:
    """Goal: compaction never rewrites a segment it cannot fully read (that would silently drop
    the batches after the corruption). Method: flip a byte in the last batch of a sealed
    segment, compact, and check the file is untouched and the error names it."""
    clock = FakeClock()
    log = _compacted_log(tmp_path, clock)
    path = segment_files(log)[0]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptRecordError, match=str(path)):
        log.compact()
    assert path.read_bytes() == bytes(data)
    assert [b.header.base_offset for b in log.read(0, 1 << 20).batches] == [0]
