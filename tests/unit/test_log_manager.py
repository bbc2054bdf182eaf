"""LogManager: startup/shutdown with checkpoints and the clean-shutdown marker, placement across
log directories, topic names with '-' and '.', retention and cleaner passes, and the background
flush of rolled segments with the recovery point it earns across a crash."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from segment_helpers import (
    VALUE,
    abandon,
    keyed,
    make_batch,
    records,
    segment_files,
)

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.model import TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments import format as fmt
from logstore.segments.log_manager import LogManager

# -- log manager -------------------------------------------------------------------------


def test_log_manager_startup_shutdown_and_checkpoints(tmp_path: Path) -> None:
    """Goal: the manager places partitions in the emptiest dir, checkpoints recovery points and
    log start offsets, marks a clean shutdown and reloads everything, including topic names
    with '-' and '.'. Method: two dirs, three partitions, shutdown, inspect files, restart."""
    clock, dirs = FakeClock(), [tmp_path / "a", tmp_path / "b"]
    manager = LogManager(dirs, clock, lambda topic: TopicConfig())
    manager.startup()
    tps = [TopicPartition("my-topic.v1", 0), TopicPartition("my-topic.v1", 1),
           TopicPartition("x-1", 12)]
    for tp in tps:
        log = manager.get_or_create_log(tp, TopicConfig(), DEFAULT_SCHEMA)
        log.append_as_leader(keyed(0, 10))
    assert manager.get_or_create_log(tps[0], TopicConfig(), DEFAULT_SCHEMA) is manager.get_log(
        tps[0])
    assert sorted(len([p for p in d.iterdir() if p.is_dir()]) for d in dirs) == [1, 2]
    assert all((d / fmt.INCARNATION_FILE).read_text() == manager.incarnation for d in dirs)
    manager.get_log(tps[2]).maybe_increment_log_start_offset(4)
    manager.shutdown()
    assert all((d / fmt.CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    points = {}
    for d in dirs:
        points |= fmt.read_checkpoint(d / fmt.RECOVERY_POINT_CHECKPOINT)
    assert points == {tp: 10 for tp in tps}

    again = LogManager(dirs, clock, lambda topic: TopicConfig())
    again.startup()
    assert not any((d / fmt.CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    assert set(again.all_logs()) == set(tps)
    assert again.get_log(tps[2]).log_start_offset == 4
    assert records(again.get_log(tps[0])) == [(i, b"k%d" % i, VALUE) for i in range(10)]
    again.delete_log(tps[1])
    assert again.get_log(tps[1]) is None
    again.shutdown()


def test_undecodable_clean_shutdown_marker_means_an_unclean_shutdown(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Goal: a .clean_shutdown marker holding a non-UTF-8 byte does not stop the manager from
    starting (it used to raise UnicodeDecodeError naming no file); the shutdown counts as
    unclean, so every log is recovered, and a warning names the marker. Method: shut down
    cleanly, overwrite the marker with a 0xff byte, start a new manager."""
    clock, tp = FakeClock(), TopicPartition("t", 0)
    manager = LogManager([tmp_path], clock, lambda topic: TopicConfig())
    manager.startup()
    manager.get_or_create_log(tp, TopicConfig(), DEFAULT_SCHEMA).append_as_leader(keyed(0, 5))
    manager.shutdown()
    marker = tmp_path / fmt.CLEAN_SHUTDOWN_FILE
    marker.write_bytes(b"t-0\n\xff\n")

    again = LogManager([tmp_path], clock, lambda topic: TopicConfig())
    again.startup()
    assert str(marker) in caplog.text and "unclean" in caplog.text
    assert again.get_log(tp).needs_recovery
    assert [r[0] for r in records(again.get_log(tp))] == list(range(5))
    again.shutdown()


def test_log_manager_runs_retention_and_cleaner(tmp_path: Path) -> None:
    """Goal: run_retention_once and run_cleaner_once apply each topic's policy.
    Method: one delete topic with old segments, one compact topic with overwrites."""
    clock = FakeClock()
    configs = {"old": TopicConfig(retention_ms=10),
               "kv": TopicConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.1)}
    manager = LogManager([tmp_path], clock, configs.__getitem__)
    manager.startup()
    for topic, config in configs.items():
        log = manager.get_or_create_log(TopicPartition(topic, 0), config, DEFAULT_SCHEMA)
        for _ in range(3):
            log.append_as_leader(make_batch([b"same"] * 3, clock=clock))
            log.roll()
        log.update_high_watermark(log.log_end_offset)
    clock.advance(100)
    assert manager.run_retention_once() == 3
    assert manager.run_cleaner_once() == 1
    assert len(records(manager.get_log(TopicPartition("kv", 0)))) == 1
    assert manager.run_cleaner_once() == 0
    manager.shutdown()


# -- background flush of rolled segments -------------------------------------------------

ROLLING = TopicConfig(segment_bytes=5_000)  # flush_ms unset: no forced fsync of the active one
NEVER_MS = 10**9  # background intervals for tests that drive the passes themselves


def _fsynced_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the name of every file or directory fsynced from now on (Linux /proc)."""
    names: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        names.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return names


def _rolled_log(manager: LogManager, tp: TopicPartition, batches: int = 10):  # noqa: ANN202
    log = manager.get_or_create_log(tp, ROLLING, DEFAULT_SCHEMA)
    for i in range(batches):
        log.append_as_leader(keyed(i * 10, 10))
    return log


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fds")
def test_background_flush_syncs_rolled_segments_and_checkpoints_recovery_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: with flush_ms unset, one background flush pass fsyncs every rolled segment (file
    and indexes) but not the active one, and moves the recovery point, and then its checkpoint,
    to the active segment's base offset. Method: append across several rolls, record fsyncs
    during run_flush_once, then checkpoint and read the file."""
    manager = LogManager([tmp_path], FakeClock(), lambda topic: ROLLING)
    tp = TopicPartition("t", 0)
    log = _rolled_log(manager, tp)
    bases = [info["base_offset"] for info in log.segments_info()]
    assert len(bases) >= 4 and log.recovery_point == 0
    synced = _fsynced_names(monkeypatch)

    assert manager.run_flush_once() == 1
    assert log.recovery_point == bases[-1] < log.log_end_offset
    expected = {f"{base:020d}{suffix}" for base in bases[:-1]
                for suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX)}
    assert set(synced) == expected | {"t-0"}
    assert f"{bases[-1]:020d}{fmt.SEGMENT_SUFFIX}" not in synced
    synced.clear()
    assert manager.run_flush_once() == 0 and synced == []  # nothing rolled since
    manager.checkpoint()
    assert fmt.read_checkpoint(tmp_path / fmt.RECOVERY_POINT_CHECKPOINT) == {tp: bases[-1]}


def test_unclean_restart_trusts_segments_below_checkpointed_recovery_point(
        tmp_path: Path) -> None:
    """Goal: after a crash, only data from the checkpointed recovery point on is re-validated:
    a byte flipped in a sealed segment the background flush fsynced is not truncated at open,
    and reading it raises CorruptRecordError naming the file and offset, while the unflushed
    active segment is recovered intact. Method: roll, run_flush_once, checkpoint, append more,
    abandon the logs (as kill -9 does), flip a byte in the first segment, start a new manager."""
    clock, tp = FakeClock(), TopicPartition("t", 0)
    manager = LogManager([tmp_path], clock, lambda topic: ROLLING)
    log = _rolled_log(manager, tp)
    manager.run_flush_once()
    manager.checkpoint()
    log.append_as_leader(keyed(100, 10))
    first, leo = log.segments_info()[0], log.log_end_offset
    abandon(log)
    path = segment_files(log)[0]
    data = bytearray(path.read_bytes())
    data[len(data) - 10] ^= 0xFF  # inside the body of the segment's last batch
    path.write_bytes(bytes(data))

    again = LogManager([tmp_path], clock, lambda topic: ROLLING,
                       retention_check_interval_ms=NEVER_MS, cleaner_interval_ms=NEVER_MS,
                       flush_check_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
    again.startup()
    reopened = again.get_log(tp)
    assert reopened.log_end_offset == leo and path.stat().st_size == len(data)
    last_batch = first["next_offset"] - 10
    with pytest.raises(errors.CorruptRecordError) as e:
        reopened.read(last_batch, 1 << 20)
    assert str(path) in str(e.value) and f"offset {last_batch}" in str(e.value)
    assert [r[0] for r in records(reopened, 100)] == list(range(100, 110))
    again.shutdown()


def test_checkpoint_files_round_trip_and_partition_dir_names(tmp_path: Path) -> None:
    """Goal: checkpoint files use Kafka's text layout and partition dirs split on the last '-'.
    Method: write and read a checkpoint; parse directory names."""
    path = tmp_path / fmt.RECOVERY_POINT_CHECKPOINT
    offsets = {TopicPartition("a-b.c", 3): 17, TopicPartition("z", 0): 0}
    fmt.write_checkpoint(path, offsets)
    assert path.read_text().splitlines()[:3] == ["0", "2", "a-b.c 3 17"]
    assert fmt.read_checkpoint(path) == offsets
    assert fmt.parse_partition_dir("a-b.c-3") == ("a-b.c", 3)
    assert fmt.parse_partition_dir("nodash") is None
    path.write_text("0\n5\nbad\n")
    with pytest.raises(ValueError, match=str(path)):
        fmt.read_checkpoint(path)


def test_deletions_inside_checkpoint_once_rewrite_the_checkpoints_once_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: deleting many logs (a big topic deleted, or recreated) rewrites the checkpoints
    once, not once per log (50 ms each at 10k partitions: 10 s for 200), and still before the
    block ends, with none of the deleted logs in them; a deletion outside a block, or by
    another thread during one, checkpoints at once as before. Method: count checkpoint()
    calls around deletions in and out of the block."""
    manager = LogManager([tmp_path], FakeClock(), lambda topic: TopicConfig())
    manager.startup()
    tps = [TopicPartition("big", p) for p in range(6)]
    for tp in tps:
        manager.get_or_create_log(tp, TopicConfig(), DEFAULT_SCHEMA).append_as_leader(
            keyed(0, 3))
    manager.checkpoint()
    calls: list[int] = []
    real = manager.checkpoint
    monkeypatch.setattr(manager, "checkpoint", lambda: (calls.append(1), real())[1])
    with manager.checkpoint_once():
        for tp in tps[:4]:
            manager.delete_log(tp)
        assert calls == []
        with manager.checkpoint_once():  # nested: still one, at the outer end
            manager.delete_log(tps[4])
        assert calls == []
        other = threading.Thread(target=manager.delete_log, args=(tps[5],))
        other.start()
        other.join()
        assert calls == [1]  # another thread's deletion is not deferred
    assert calls == [1, 1]
    assert fmt.read_checkpoint(tmp_path / fmt.RECOVERY_POINT_CHECKPOINT) == {}
    with manager.checkpoint_once():
        pass
    assert calls == [1, 1]  # nothing deleted, nothing owed
    manager.shutdown()
