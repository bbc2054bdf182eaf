"""LogManager: startup/shutdown with checkpoints and the clean-shutdown marker, placement across
log directories, topic names with '-' and '.', retention and cleaner passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from segment_helpers import (
    VALUE,
    keyed,
    make_batch,
    records,
)

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
    assert sorted(len(list(d.iterdir())) for d in dirs) == [1, 2]
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
