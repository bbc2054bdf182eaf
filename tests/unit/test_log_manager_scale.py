"""LogManager at scale: open segment files bounded by max_open_segment_files under random and
concurrent use, and logs left unopened by a restart until their first use, with the recovery an
unclean shutdown still owes them."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

from segment_helpers import abandon, keyed, records

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.model import TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments import format as fmt
from logstore.segments.log import Log
from logstore.segments.log_manager import LogManager
from tests.helpers import wait_for

CAP = 8
# Small segments and a sparse index: rolls are frequent, reads cross segments.
SMALL = TopicConfig(segment_bytes=4_000, index_interval_bytes=1_000)


def _manager(root: Path, clock: FakeClock, cap: int | None = CAP,
             config: TopicConfig = SMALL) -> LogManager:
    manager = LogManager([root], clock, lambda topic: config, max_open_segment_files=cap)
    manager.startup()
    return manager


def _open_segment_fds(manager: LogManager) -> int:
    """Segment files that hold a descriptor now, counted from the segments themselves."""
    return sum(seg.has_open_fd for log in manager.all_logs().values() if log.is_loaded
               for seg in log._state.segments)


def _process_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _keys(log: Log) -> list[bytes]:
    return [key for _, key, _ in records(log)]


def test_open_segment_files_stay_within_the_cap_under_random_appends_and_reads(
        tmp_path: Path, seed: int) -> None:
    """Goal: with more partitions (and segments) than max_open_segment_files, no more
    segment files than the cap stay open (beyond the moment a background fsync pins one), and
    every record reads back as written.
    Method: 30 partitions, cap 8; seeded random appends, reads from random offsets, rolls and
    retention (the records' old timestamps make it delete); after every step the cache, the
    segments and the process's descriptors are counted (waiting, bounded, for a pin to go); at
    the end every partition is read whole and compared with a model."""
    rng, clock = random.Random(seed), FakeClock()
    manager = _manager(tmp_path, clock)
    tps = [TopicPartition("wide", p) for p in range(30)]
    model: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}
    logs = {tp: manager.get_or_create_log(tp, SMALL, DEFAULT_SCHEMA) for tp in tps}
    baseline = _process_fds()
    for step in range(600):
        tp = rng.choice(tps)
        log, action = logs[tp], rng.random()
        if action < 0.5:
            start = len(model[tp])
            log.append_as_leader(keyed(start, rng.randint(1, 12)))
            model[tp] += [b"k%d" % i for i in range(start, log.log_end_offset)]
            log.update_high_watermark(log.log_end_offset)
        elif action < 0.9 and model[tp]:
            offset = max(rng.randrange(len(model[tp])), log.log_start_offset)
            got = records(log, offset)
            assert [k for _, k, _ in got] == model[tp][offset:], f"step {step}: {tp}"
        elif action < 0.95:
            log.roll()
        else:
            manager.run_retention_once()
        # The background flusher may pin a descriptor for a moment (a pinned one outlives
        # its eviction, file_cache.py): the bound holds once it lets go.
        wait_for(lambda: len(manager.files) <= CAP and _open_segment_fds(manager) <= CAP
                 and _process_fds() <= baseline + CAP, f"open files within the cap, step {step}")
    assert manager.files.evictions > 0
    for tp in tps:  # retention (7 days; the records are stamped 1970) moved the starts
        assert _keys(logs[tp]) == model[tp][logs[tp].log_start_offset:], tp
    manager.shutdown()


def test_reads_racing_appends_rolls_and_retention_read_only_what_was_written(
        tmp_path: Path, seed: int) -> None:
    """Goal: evicting descriptors under concurrent readers, appenders, rolls and retention
    never returns wrong bytes or an error other than OFFSET_OUT_OF_RANGE (retention moved the
    start), and the cap holds once the threads stop.
    Method: cap 2 over 6 partitions; two reader threads read random offsets and check each
    record's key against its offset, while the main thread appends (rolling often) and runs
    retention; bounded iteration counts, no timing."""
    clock = FakeClock()
    config = TopicConfig(segment_bytes=3_000, index_interval_bytes=500, retention_bytes=20_000)
    manager = _manager(tmp_path, clock, cap=2, config=config)
    tps = [TopicPartition("race", p) for p in range(6)]
    logs = [manager.get_or_create_log(tp, config, DEFAULT_SCHEMA) for tp in tps]
    failures: list[str] = []
    done = threading.Event()

    def reader(worker: int) -> None:
        rng = random.Random(seed + worker)
        while not done.is_set():
            log = rng.choice(logs)
            end = log.high_watermark
            if end == log.log_start_offset:
                continue
            try:
                fetch = log.read(rng.randrange(log.log_start_offset, end), 10_000, end)
            except errors.OffsetOutOfRangeError:
                continue
            except Exception as e:  # noqa: BLE001 (the test reports any other error)
                failures.append(f"{log}: {type(e).__name__}: {e}")
                return
            for batch in fetch.batches:
                keys = batch.record_batch(log.schema).column("key").to_pylist()
                if keys != [b"k%d" % o for o in batch.offsets().tolist()]:
                    failures.append(f"{log}: batch at {batch.header.base_offset}: {keys}")
                    return

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    rng = random.Random(seed)
    try:
        for step in range(400):
            log = rng.choice(logs)
            log.append_as_leader(keyed(log.log_end_offset, rng.randint(1, 8)))
            log.update_high_watermark(log.log_end_offset)
            if step % 25 == 0:
                manager.run_retention_once()
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    wait_for(lambda: len(manager.files) <= 2, "open files within the cap (the background "
             "flusher may hold one a moment longer)")
    assert any(log.log_start_offset > 0 for log in logs)  # retention did race the readers
    manager.shutdown()


def _fill(root: Path, clock: FakeClock, partitions: int
          ) -> tuple[LogManager, dict[TopicPartition, list[bytes]]]:
    """A manager with ``partitions`` logs holding a few batches each, left running."""
    manager = _manager(root, clock)
    written = {}
    for p in range(partitions):
        tp = TopicPartition("idle", p)
        log = manager.get_or_create_log(tp, SMALL, DEFAULT_SCHEMA)
        for i in range(3):
            log.append_as_leader(keyed(5 * i, 5))
        written[tp] = [b"k%d" % i for i in range(15)]
    return manager, written


def test_clean_restart_opens_no_log_until_it_is_used(tmp_path: Path) -> None:
    """Goal: after a clean shutdown, startup opens no log and no segment file; the log end
    offset and high watermark are known without opening a log; the first read opens only
    that log, and it reads what was written.
    Method: 40 logs, clean shutdown, restart; inspect the deferred logs, advance a high
    watermark, read one partition."""
    clock = FakeClock()
    manager, written = _fill(tmp_path, clock, 40)
    manager.shutdown()

    again = _manager(tmp_path, clock)
    logs = again.all_logs()
    assert set(logs) == set(written)
    assert not any(log.is_loaded for log in logs.values())
    assert len(again.files) == 0
    tp = TopicPartition("idle", 7)
    log = logs[tp]
    assert (log.log_start_offset, log.log_end_offset) == (0, 15)
    log.update_high_watermark(15)
    assert log.high_watermark == 15 and not log.is_loaded
    assert _keys(log) == written[tp]
    assert log.is_loaded and log.high_watermark == 15
    assert sum(other.is_loaded for other in logs.values()) == 1
    again.shutdown()


def _tear_tail(log_dir: Path) -> None:
    """Half a batch at the end of the active segment, as a crash during a write leaves."""
    active = sorted(log_dir.glob(f"*{fmt.SEGMENT_SUFFIX}"))[-1]
    torn = bytes(active.read_bytes()[-300:-100])
    with open(active, "ab") as f:
        f.write(torn)


def test_unclean_restart_truncates_the_torn_tail_of_an_untouched_log_before_it_is_read(
        tmp_path: Path) -> None:
    """Goal: after a crash, a log nobody used since startup is still recovered (its torn tail
    truncated) before its first read, and a clean shutdown before that use keeps it marked for
    recovery, so the start after that recovers it too.
    Method: 5 logs, crash (no close, no checkpoint), tear the tail of one; restart and shut
    down cleanly without touching it (the marker names it); restart, read it: the intact
    records only, and the file no longer holds the torn bytes."""
    clock = FakeClock()
    manager, written = _fill(tmp_path, clock, 5)
    for log in manager.all_logs().values():
        abandon(log)
    tp = TopicPartition("idle", 3)
    log_dir = tmp_path / fmt.partition_dir_name(tp.topic, tp.partition)
    _tear_tail(log_dir)
    size_torn = sum(p.stat().st_size for p in log_dir.glob(f"*{fmt.SEGMENT_SUFFIX}"))

    second = _manager(tmp_path, clock)
    assert all(log.needs_recovery for log in second.all_logs().values())
    second.shutdown()
    marker = (tmp_path / fmt.CLEAN_SHUTDOWN_FILE).read_text().split()
    assert fmt.partition_dir_name(tp.topic, tp.partition) in marker

    third = _manager(tmp_path, clock)
    log = third.get_log(tp)
    assert log is not None and not log.is_loaded and log.needs_recovery
    assert _keys(log) == written[tp]
    assert sum(p.stat().st_size for p in log_dir.glob(f"*{fmt.SEGMENT_SUFFIX}")) < size_torn
    third.shutdown()
    still = (tmp_path / fmt.CLEAN_SHUTDOWN_FILE).read_text().split()
    assert still == [fmt.partition_dir_name("idle", p) for p in (0, 1, 2, 4)]


def test_retention_opens_an_idle_log_only_when_it_has_a_sealed_segment(tmp_path: Path) -> None:
    """Goal: a retention pass over idle logs opens only those with something it could delete.
    Method: two logs, one rolled; restart cleanly; advance time past retention; run
    retention: the rolled one is opened and its old segment deleted, the other stays shut."""
    clock = FakeClock()
    config = TopicConfig(retention_ms=10)
    manager = _manager(tmp_path, clock, config=config)
    for p in range(2):
        log = manager.get_or_create_log(TopicPartition("ret", p), config, DEFAULT_SCHEMA)
        log.append_as_leader(keyed(0, 3, clock))
        log.update_high_watermark(log.log_end_offset)
        if p == 0:
            log.roll()
    manager.shutdown()
    clock.advance(1_000)
    again = _manager(tmp_path, clock, config=config)
    logs = again.all_logs()
    for log in logs.values():  # what a leader does; the logs stay shut
        log.update_high_watermark(log.log_end_offset)
    assert not any(log.is_loaded for log in logs.values())
    assert again.run_retention_once() == 1
    assert logs[TopicPartition("ret", 0)].is_loaded
    assert not logs[TopicPartition("ret", 1)].is_loaded
    again.shutdown()


def test_a_partition_directory_left_without_segment_files_starts_as_an_empty_log(
        tmp_path: Path) -> None:
    """Goal: a new log's directory is made durable by its first flush, not at creation, so a
    crash may leave a partition directory without its segment file; after the restart that
    partition is an empty log with the topic's schema, which takes appends.
    Method: make the directory by hand (nothing in it), start a manager, get the log as the
    broker does (with the schema), append and read back."""
    clock = FakeClock()
    tp = TopicPartition("cut", 0)
    (tmp_path / fmt.partition_dir_name(tp.topic, tp.partition)).mkdir()
    manager = _manager(tmp_path, clock)
    log = manager.get_or_create_log(tp, SMALL, DEFAULT_SCHEMA)
    assert not log.is_loaded
    log.append_as_leader(keyed(0, 3))
    log.update_high_watermark(log.log_end_offset)
    assert _keys(log) == [b"k0", b"k1", b"k2"]
    manager.shutdown()
