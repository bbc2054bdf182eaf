"""Storage layer: appends, reads, rolls, retention, time lookups, truncation, follower
appends, group-commit flushing and idempotent producers, on real segment files in tmp_path with a
FakeClock."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from segment_helpers import (
    VALUE,
    abandon,
    keyed,
    make_batch,
    open_log,
    records,
    reopen,
    segment_files,
)

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE, topic_schema
from logstore.segments import format as fmt
from logstore.segments.flusher import flush_range
from logstore.segments.log import Log
from logstore.segments.segment import SegmentClosedError


def test_segment_closed_error_is_a_logstore_error_that_never_crosses_the_wire() -> None:
    """Goal: the storage layer's internal signal sits in the one hierarchy but is no ApiError
    (it never escapes Log.read, so it has no wire code). Method: the class bases."""
    assert issubclass(SegmentClosedError, errors.LogstoreError)
    assert not issubclass(SegmentClosedError, errors.ApiError)


# -- append and read ---------------------------------------------------------------------


def test_append_read_round_trip(tmp_path: Path) -> None:
    """Goal: what is appended is read back, with offsets assigned from the log end offset.
    Method: append three batches, read from 0, compare keys, values, offsets and headers."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    infos = [log.append_as_leader(keyed(i * 10, 10, clock)) for i in range(3)]
    assert [(i.first_offset, i.last_offset) for i in infos] == [(0, 9), (10, 19), (20, 29)]
    assert log.log_end_offset == 30
    fetch = log.read(0, 1 << 20)
    assert [b.header.base_offset for b in fetch.batches] == [0, 10, 20]
    assert fetch.size_bytes == sum(i.batch_size for i in infos)
    assert records(log) == [(i, b"k%d" % i, VALUE) for i in range(30)]
    assert fetch.batches[0].header.max_timestamp == clock.time_ms()


def test_read_from_middle_of_batch_returns_whole_batch(tmp_path: Path) -> None:
    """Goal: a fetch at an offset inside a batch returns that whole batch.
    Method: append batches of 10 and read at offset 15."""
    log = open_log(tmp_path, FakeClock(), index_interval_bytes=1)
    for i in range(4):
        log.append_as_leader(keyed(i * 10, 10))
    fetch = log.read(15, 1 << 20)
    assert [b.header.base_offset for b in fetch.batches] == [10, 20, 30]


def test_read_respects_max_bytes_but_returns_at_least_one_batch(tmp_path: Path) -> None:
    """Goal: max_bytes bounds a fetch, except that the first batch always comes with min_one.
    Method: append equal batches and fetch with budgets of 1 byte, 2.5 batches and 0 (no
    min_one)."""
    log = open_log(tmp_path, FakeClock())
    size = log.append_as_leader(keyed(0, 1)).batch_size
    for _ in range(4):
        log.append_as_leader(keyed(0, 1))
    assert len(log.read(0, 1).batches) == 1
    assert len(log.read(0, int(size * 2.5)).batches) == 2
    assert log.read(0, size - 1, min_one=False).batches == []
    assert log.read(0, 1 << 20).size_bytes == 5 * size


def test_read_stops_before_max_offset(tmp_path: Path) -> None:
    """Goal: no batch starting at or after max_offset (the high watermark) is returned.
    Method: append four batches, read with max_offset 20 and 25."""
    log = open_log(tmp_path, FakeClock())
    for i in range(4):
        log.append_as_leader(keyed(i * 10, 10))
    assert [b.header.base_offset for b in log.read(0, 1 << 20, max_offset=20).batches] == [0, 10]
    assert [b.header.base_offset for b in log.read(0, 1 << 20, 25).batches] == [0, 10, 20]
    assert log.read(20, 1 << 20, max_offset=20).batches == []


def test_read_at_log_end_is_empty_and_out_of_range_errors_name_the_range(tmp_path: Path) -> None:
    """Goal: offset == LEO gives an empty fetch; below the start or past the end raises
    OffsetOutOfRangeError naming topic-partition, offset and valid range.
    Method: append, raise the log start offset, read at the edges."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 10))
    fetch = log.read(10, 100)
    assert fetch.batches == [] and fetch.log_end_offset == 10
    log.maybe_increment_log_start_offset(3)
    for bad in (2, 11):
        with pytest.raises(errors.OffsetOutOfRangeError) as e:
            log.read(bad, 100)
        assert "topic-0" in str(e.value) and str(bad) in str(e.value)
        assert "[3, 10]" in str(e.value)


def test_reads_span_segments(tmp_path: Path) -> None:
    """Goal: one fetch continues into the next segment while the budget lasts.
    Method: roll after every batch and read everything in one call."""
    log = open_log(tmp_path, FakeClock())
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10))
        log.roll()
    assert len(segment_files(log)) == 4
    assert [b.header.base_offset for b in log.read(5, 1 << 20).batches] == [0, 10, 20]


def test_schema_mismatch_empty_and_oversized_batches_are_rejected(tmp_path: Path) -> None:
    """Goal: bad batches raise errors naming the partition (and the column / size and limit).
    Method: append a batch with a wrong column type, an empty batch and a too-large batch."""
    log = open_log(tmp_path, FakeClock(), max_message_bytes=5_000)
    wrong = pa.record_batch([pa.array([1]), pa.array([b"x"]), pa.array([1]).cast(TIMESTAMP_TYPE),
                             pa.nulls(1, DEFAULT_SCHEMA.field("headers").type)],
                            names=DEFAULT_SCHEMA.names)
    with pytest.raises(errors.InvalidRecordError, match="topic-0.*column 0.*'key'"):
        log.append_as_leader(wrong)
    with pytest.raises(errors.InvalidRecordError, match="empty"):
        log.append_as_leader(keyed(0, 0))
    with pytest.raises(errors.MessageTooLargeError, match="topic-0.*bytes.*5000"):
        log.append_as_leader(keyed(0, 100))
    assert log.log_end_offset == 0


def test_null_timestamps_become_append_time_and_log_append_time_replaces_all(
        tmp_path: Path) -> None:
    """Goal: null timestamps are filled with the append time; under LogAppendTime every
    timestamp is the append time and the AppendInfo says so.
    Method: append a batch with a null timestamp to a CreateTime and a LogAppendTime log."""
    clock = FakeClock(start_ms=50_000)
    batch = make_batch([b"a", b"b"], timestamps=[10, None])
    log = open_log(tmp_path, clock)
    info = log.append_as_leader(batch)
    stamps = log.read(0, 1 << 20).batches[0].record_batch(log.schema).column("timestamp")
    assert stamps.cast(pa.int64()).to_pylist() == [10, 50_000]
    assert (info.max_timestamp, info.log_append_time) == (50_000, -1)
    other = Log.open(tmp_path / "lat-0", "lat", 0,
                     TopicConfig(message_timestamp_type="LogAppendTime"), DEFAULT_SCHEMA, clock)
    info = other.append_as_leader(batch)
    assert (info.max_timestamp, info.log_append_time) == (50_000, 50_000)
    stamps = other.read(0, 1 << 20).batches[0].record_batch(DEFAULT_SCHEMA).column("timestamp")
    assert stamps.cast(pa.int64()).to_pylist() == [50_000, 50_000]


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_topics_round_trip(tmp_path: Path, codec: str) -> None:
    """Goal: compression_type lz4/zstd writes compressed batches that read back equal.
    Method: append compressible values with and without compression, compare sizes and data."""
    plain = open_log(tmp_path / "plain", FakeClock())
    packed = open_log(tmp_path / codec, FakeClock(), compression_type=codec)
    batch = keyed(0, 200)
    assert packed.append_as_leader(batch).batch_size < plain.append_as_leader(batch).batch_size
    assert records(packed) == records(plain)


def test_typed_topic_round_trip(tmp_path: Path) -> None:
    """Goal: a topic with a typed value schema stores and returns typed columns.
    Method: append a batch with int and string value columns and read it back."""
    schema = topic_schema(pa.schema([("n", pa.int32()), ("s", pa.string())]))
    log = open_log(tmp_path, FakeClock(), schema=schema)
    batch = pa.record_batch([pa.array([b"a", b"b"]), pa.array([1, 2], pa.int32()),
                             pa.array(["x", None]), pa.array([5, 6]).cast(TIMESTAMP_TYPE),
                             pa.nulls(2, schema.field("headers").type)], schema=schema)
    log.append_as_leader(batch)
    assert log.read(0, 1 << 20).batches[0].record_batch(schema).equals(batch)


def test_records_never_looped_in_python_for_large_batches(tmp_path: Path) -> None:
    """Goal: a smoke check of throughput: 200 batches of 5k rows append and read back in well
    under the suite's budget. Method: time-independent: just append and read 1M records."""
    log = open_log(tmp_path, FakeClock(), segment_bytes=64 << 20)
    batch = make_batch([b"k"] * 5000, [VALUE] * 5000)
    for _ in range(200):
        log.append_as_leader(batch)
    total = 0
    offset = 0
    while offset < log.log_end_offset:
        fetch = log.read(offset, 8 << 20)
        total += sum(b.header.record_count for b in fetch.batches)
        offset = fetch.batches[-1].header.next_offset
    assert total == 1_000_000
    assert np.all(log.read(0, 1).batches[0].offsets() == np.arange(5000))


# -- rolling and retention ---------------------------------------------------------------


def test_roll_by_segment_bytes(tmp_path: Path) -> None:
    """Goal: a batch that would push the active segment past segment_bytes goes to a new one.
    Method: segment_bytes of about three batches; append ten and check segment bases."""
    log = open_log(tmp_path, FakeClock())
    size = log.append_as_leader(keyed(0, 10)).batch_size
    log.update_config(TopicConfig(segment_bytes=3 * size + 1000))
    for i in range(1, 10):
        log.append_as_leader(keyed(i * 10, 10))
    assert [s["base_offset"] for s in log.segments_info()] == [0, 30, 60, 90]
    assert all(s["size_bytes"] <= 3 * size + 1000 for s in log.segments_info())
    assert [s["sealed"] for s in log.segments_info()] == [True, True, True, False]
    assert records(log) == [(i, b"k%d" % i, VALUE) for i in range(100)]


def test_roll_by_segment_ms(tmp_path: Path) -> None:
    """Goal: a segment whose first append is segment_ms old is rolled at the next append.
    Method: FakeClock; append, advance just under and then to segment_ms, append."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_ms=1000)
    log.append_as_leader(keyed(0, 5, clock))
    clock.advance(999)
    log.append_as_leader(keyed(5, 5, clock))
    assert len(log.segments_info()) == 1
    clock.advance(1)
    log.append_as_leader(keyed(10, 5, clock))
    assert [s["base_offset"] for s in log.segments_info()] == [0, 10]


def _three_old_segments(tmp_path: Path, clock: FakeClock, **config) -> Log:
    log = open_log(tmp_path, clock, **config)
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10, clock))
        log.roll()
        clock.advance(1000)
    log.append_as_leader(keyed(30, 10, clock))
    log.update_high_watermark(log.log_end_offset)
    return log


def test_retention_by_time_keeps_active_segment_and_advances_log_start(tmp_path: Path) -> None:
    """Goal: retention_ms deletes sealed segments whose max timestamp is too old, oldest first,
    never the active segment, and moves the log start offset.
    Method: segments stamped 1 s apart; retention 1.5 s; then a retention far in the past."""
    clock = FakeClock()
    log = _three_old_segments(tmp_path, clock, retention_ms=1500)
    assert log.delete_old_segments() == 2
    assert log.log_start_offset == 20
    assert records(log)[0][0] == 20
    clock.advance(1_000_000)
    assert log.delete_old_segments() == 1
    assert [s["base_offset"] for s in log.segments_info()] == [30]
    assert log.log_start_offset == 30 and len(records(log)) == 10
    with pytest.raises(errors.OffsetOutOfRangeError):
        log.read(5, 100)


def test_retention_by_bytes_keeps_active_segment(tmp_path: Path) -> None:
    """Goal: retention_bytes deletes the oldest sealed segments until the log fits, never the
    active one. Method: four segments of one batch, retention of about two and a half."""
    clock = FakeClock()
    log = _three_old_segments(tmp_path, clock, retention_ms=None)
    sizes = [s["size_bytes"] for s in log.segments_info()]
    log.update_config(TopicConfig(retention_ms=None, retention_bytes=sum(sizes[2:])))
    assert log.delete_old_segments() == 2
    assert log.log_start_offset == 20
    log.update_config(TopicConfig(retention_ms=None, retention_bytes=0))
    assert log.delete_old_segments() == 1
    assert [s["base_offset"] for s in log.segments_info()] == [30]


def test_retention_waits_for_high_watermark_and_ignores_compact_policy(tmp_path: Path) -> None:
    """Goal: segments above the high watermark are never deleted by retention; compact-only
    topics are not deleted by time, but segments below the log start offset always are.
    Method: old segments with HW 0, then a compact policy with a raised log start offset."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, retention_ms=1)
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10, clock))
        log.roll()
    clock.advance(10_000)
    assert log.delete_old_segments() == 0
    log.update_config(TopicConfig(retention_ms=1, cleanup_policy="compact"))
    log.update_high_watermark(30)
    assert log.delete_old_segments() == 0
    log.maybe_increment_log_start_offset(15)
    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 15 and records(log)[0][0] == 15


def test_offsets_for_time(tmp_path: Path) -> None:
    """Goal: offsets_for_time finds the first record (in offset order) with a timestamp >= the
    target, across segments and inside batches whose timestamps are not sorted.
    Method: three segments with known timestamps; query below, between, inside and above."""
    log = open_log(tmp_path, FakeClock(), index_interval_bytes=1)
    log.append_as_leader(make_batch([b"a", b"b", b"c"], timestamps=[100, 300, 200]))
    log.roll()
    log.append_as_leader(make_batch([b"d", b"e"], timestamps=[400, 350]))
    log.append_as_leader(make_batch([b"f"], timestamps=[500]))
    log.roll()
    log.append_as_leader(make_batch([b"g"], timestamps=[250]))
    assert log.offsets_for_time(0) == (0, 100)
    assert log.offsets_for_time(150) == (1, 300)
    assert log.offsets_for_time(300) == (1, 300)
    assert log.offsets_for_time(301) == (3, 400)
    assert log.offsets_for_time(450) == (5, 500)
    assert log.offsets_for_time(501) is None
    log.maybe_increment_log_start_offset(2)
    assert log.offsets_for_time(150) == (2, 200)
    reopened = reopen(log, FakeClock(), clean=False)
    assert reopened.offsets_for_time(301) == (3, 400)


# -- truncation and follower appends -----------------------------------------------------


def test_truncate_to_drops_later_segments_and_fixes_offsets(tmp_path: Path) -> None:
    """Goal: truncate_to drops everything at or after the offset, across segments, and the
    log keeps working. Method: five segments, truncate inside the third, append, reopen."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, index_interval_bytes=1)
    for i in range(5):
        log.append_as_leader(keyed(i * 10, 10))
        log.roll()
    log.update_high_watermark(50)
    log.truncate_to(20)
    assert log.log_end_offset == 20 and log.high_watermark == 20
    assert [s["base_offset"] for s in log.segments_info()] == [0, 10, 20]
    log.truncate_to(15)  # inside a batch: the whole batch goes
    assert log.log_end_offset == 10
    log.append_as_leader(keyed(100, 5))
    assert [r[0] for r in records(log)] == list(range(15))
    log.close()
    assert [r[1] for r in records(reopen(log, clock, clean=True))][10:] == [
        b"k%d" % i for i in range(100, 105)]


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    """Goal: the log restarts empty at the given offset. Method: append, truncate, append."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 10))
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 500)
    assert log.append_as_leader(keyed(0, 3)).first_offset == 500
    assert [r[0] for r in records(log)] == [500, 501, 502]


def test_append_as_follower_copies_batches_verbatim(tmp_path: Path) -> None:
    """Goal: a follower appends the leader's batches byte for byte, offsets included, and
    rejects batches below its log end offset or with a bad CRC.
    Method: read batches from a leader log, append them to a follower, compare files."""
    leader = open_log(tmp_path / "leader", FakeClock())
    for i in range(3):
        leader.append_as_leader(keyed(i * 10, 10), producer_id=7, producer_epoch=0,
                                base_sequence=i * 10)
    follower = open_log(tmp_path / "follower", FakeClock())
    batches = leader.read(0, 1 << 20).batches
    info = follower.append_as_follower(batches[:2])
    assert (info.first_offset, info.last_offset) == (0, 19)
    assert follower.append_as_follower([]) is None
    with pytest.raises(errors.InvalidRecordError, match="below the log end offset"):
        follower.append_as_follower(batches[:1])
    follower.append_as_follower(batches[2:])
    assert segment_files(follower)[0].read_bytes() == segment_files(leader)[0].read_bytes()
    assert follower.producer_state.entry(7).last_seq == 29


# -- flushing ----------------------------------------------------------------------------


def test_group_commit_uses_fewer_fsyncs_than_appends(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: many threads appending and then waiting for durability all return, and one fsync
    covers many appends. Method: 8 threads x 25 append + flush_until; os.fsync wrapped to count
    calls and take 2 ms like a disk."""
    log = open_log(tmp_path, FakeClock(), flush_ms=0)
    calls, real_fsync, lock = [0], os.fsync, threading.Lock()

    def slow_fsync(fd: int) -> None:
        with lock:
            calls[0] += 1
        threading.Event().wait(0.002)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    batch, errors_seen = keyed(0, 10), []

    def producer() -> None:
        try:
            for _ in range(25):
                info = log.append_as_leader(batch)
                log.flush_until(info.last_offset + 1)
                assert log.recovery_point > info.last_offset
        except Exception as e:  # noqa: BLE001
            errors_seen.append(e)

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors_seen == []
    assert log.recovery_point == log.log_end_offset == 2000
    assert calls[0] < 200 / 2


def test_maybe_flush_follows_flush_ms(tmp_path: Path) -> None:
    """Goal: maybe_flush fsyncs only once flush_ms has passed since the last flush.
    Method: FakeClock; append, maybe_flush before and after flush_ms."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, flush_ms=100)
    log.append_as_leader(keyed(0, 5))
    log.maybe_flush()
    assert log.recovery_point == 0
    clock.advance(100)
    log.maybe_flush()
    assert log.recovery_point == 5


@pytest.mark.parametrize(("offset", "expected"), [
    (0, (0, 0)), (10, (1, 10)), (15, (2, 30)), (30, (2, 30)), (31, (3, 42)), (42, (3, 42))])
def test_flush_range_covers_whole_segments_below_the_offset(offset: int,
                                                            expected: tuple[int, int]) -> None:
    """Goal: a flush up to an offset fsyncs the segments holding offsets below it and earns the
    next segment boundary (the log end offset once the active segment is in). Method: segments
    based at 0, 10, 30 with the log end at 42."""
    assert flush_range((0, 10, 30), offset, 42) == expected

def test_flush_rolled_segments_syncs_a_segment_rolled_at_the_recovery_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: the first roll after a reopen happens at the recovery point, yet the sealed
    segment's rewritten indexes are still fsynced by the next flush_rolled_segments; after that
    there is nothing to do. Method: close, reopen cleanly, roll, count os.fsync calls."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    log.append_as_leader(keyed(0, 10))
    log.close()
    log = reopen(log, clock, clean=True)
    log.roll()
    assert log.recovery_point == 10 == log.segments_info()[-1]["base_offset"]
    calls, real_fsync = [0], os.fsync

    def counting_fsync(fd: int) -> None:
        calls[0] += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    assert log.flush_rolled_segments()
    assert calls[0] >= 3  # segment file, offset index, time index (and the directory)
    assert not log.flush_rolled_segments()
    log.append_as_leader(keyed(10, 10))
    assert not log.flush_rolled_segments() and log.recovery_point == 10  # active left alone

def test_reads_and_appends_do_not_wait_for_a_running_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: an fsync in progress blocks neither reads nor appends (only callers waiting for
    durability). Method: os.fsync blocks on an Event in a flusher thread; meanwhile the main
    thread appends and reads; then the fsync is released and the flusher returns."""
    log = open_log(tmp_path, FakeClock(), flush_ms=0)
    log.append_as_leader(keyed(0, 10))
    entered, release, real_fsync = threading.Event(), threading.Event(), os.fsync

    def blocking_fsync(fd: int) -> None:
        entered.set()
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", blocking_fsync)
    flusher = threading.Thread(target=log.flush)
    flusher.start()
    try:
        assert entered.wait(5)
        info = log.append_as_leader(keyed(10, 10))
        assert [r[0] for r in records(log)] == list(range(20))
        assert log.recovery_point == 0 and info.last_offset == 19
    finally:
        release.set()
        flusher.join(5)
    assert log.recovery_point >= 10


def test_reads_stay_consistent_while_appends_roll_and_retention_run(tmp_path: Path) -> None:
    """Goal: lock-free reads racing with appends, rolls and segment deletion never fail and
    never return a hole: every fetch is a contiguous run of offsets.
    Method: two reader threads scan the log in a loop while the main thread appends into tiny
    segments and applies retention_bytes; a reader that falls below the log start restarts."""
    log = open_log(tmp_path, FakeClock(), segment_bytes=6_000, retention_ms=None,
                   retention_bytes=20_000)
    stop, failures = threading.Event(), []

    def reader() -> None:
        offset = 0
        while not stop.is_set():
            try:
                fetch = log.read(offset, 7_000)
            except errors.OffsetOutOfRangeError:
                offset = log.log_start_offset
                continue
            except Exception as e:  # noqa: BLE001
                failures.append(e)
                return
            if not fetch.batches:
                stop.wait(0.001)  # at the end: let the writer have the GIL, as a long poll would
            for batch in fetch.batches:
                if not batch.header.base_offset <= offset < batch.header.next_offset:
                    failures.append(AssertionError(f"hole before {batch.header.base_offset}"))
                offset = batch.header.next_offset

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(300):
        log.append_as_leader(keyed(i, 5))
        log.update_high_watermark(log.log_end_offset)
        if i % 10 == 0:
            log.delete_old_segments()
    stop.set()
    for t in threads:
        t.join()
    assert failures == []
    assert log.log_start_offset > 0


# -- idempotent producers ----------------------------------------------------------------


def test_idempotent_retry_is_deduplicated(tmp_path: Path) -> None:
    """Goal: a retried batch equal to one of the producer's last five returns the original
    AppendInfo with duplicate=True and writes nothing. Method: append 6 batches, retry #2..#6
    and #1 (too old to be recognised, so it is out of order)."""
    log = open_log(tmp_path, FakeClock())
    infos = [log.append_as_leader(keyed(0, 10), producer_id=1, producer_epoch=0,
                                  base_sequence=i * 10) for i in range(6)]
    end = log.log_end_offset
    for i in range(1, 6):
        again = log.append_as_leader(keyed(0, 10), producer_id=1, producer_epoch=0,
                                     base_sequence=i * 10)
        assert again.duplicate and again.first_offset == infos[i].first_offset
        assert again.batch_size == infos[i].batch_size
    assert log.log_end_offset == end
    with pytest.raises(errors.OutOfOrderSequenceError):
        log.append_as_leader(keyed(0, 10), producer_id=1, producer_epoch=0, base_sequence=0)


def test_sequence_gaps_and_epochs_are_checked(tmp_path: Path) -> None:
    """Goal: Kafka's rules: a gap raises OutOfOrderSequenceError, an older epoch raises
    InvalidProducerEpochError, a new epoch must restart at sequence 0.
    Method: drive one producer id through each case."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 5), producer_id=9, producer_epoch=1, base_sequence=0)
    with pytest.raises(errors.OutOfOrderSequenceError, match="topic-0.*expected 5"):
        log.append_as_leader(keyed(0, 5), producer_id=9, producer_epoch=1, base_sequence=7)
    with pytest.raises(errors.InvalidProducerEpochError):
        log.append_as_leader(keyed(0, 5), producer_id=9, producer_epoch=0, base_sequence=5)
    with pytest.raises(errors.OutOfOrderSequenceError):
        log.append_as_leader(keyed(0, 5), producer_id=9, producer_epoch=2, base_sequence=5)
    assert not log.append_as_leader(keyed(0, 5), producer_id=9, producer_epoch=2,
                                    base_sequence=0).duplicate
    assert log.log_end_offset == 10


@pytest.mark.parametrize("clean", [True, False])
def test_producer_state_survives_restart(tmp_path: Path, clean: bool) -> None:
    """Goal: duplicates are still detected after a clean or unclean restart (snapshot at roll
    or close, plus a scan of the batch headers after it).
    Method: append, roll, append more, restart, retry the last batch and continue."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    for i in range(2):
        log.append_as_leader(keyed(0, 10), producer_id=4, producer_epoch=0, base_sequence=i * 10)
    log.roll()
    last = log.append_as_leader(keyed(0, 10), producer_id=4, producer_epoch=0, base_sequence=20)
    if clean:
        log.close()
    else:
        abandon(log)
    reopened = reopen(log, clock, clean=clean)
    again = reopened.append_as_leader(keyed(0, 10), producer_id=4, producer_epoch=0,
                                      base_sequence=20)
    assert again.duplicate and again.first_offset == last.first_offset
    with pytest.raises(errors.OutOfOrderSequenceError):
        reopened.append_as_leader(keyed(0, 10), producer_id=4, producer_epoch=0,
                                  base_sequence=40)
    assert list(log.dir.glob("*" + fmt.SNAPSHOT_SUFFIX))
