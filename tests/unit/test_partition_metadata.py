"""The storage side of topic ids (KIP-516): ``partition.metadata`` in each partition directory,
the LogManager recording it for a new log, refusing a log of another topic id and letting one
that records none adopt the id it is asked for, and deleting a log by renaming its directory
aside first (a crash part way must not leave part of a deleted log under the partition's name,
where a topic created again under that name would take it for its own).

Method: a real LogManager on tmp_path directories; files read back as written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from segment_helpers import keyed, records

from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.errors import UnknownTopicIdError
from logstore.model import TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments import format as fmt
from logstore.segments import log_manager
from logstore.segments.log_manager import LogManager

TP = TopicPartition("orders", 0)
OLD, NEW = "a" * 32, "b" * 32


def manager(tmp_path: Path) -> LogManager:
    return LogManager([tmp_path], FakeClock(), lambda topic: TopicConfig())


def test_partition_metadata_round_trips_in_kafkas_format(tmp_path: Path) -> None:
    assert fmt.read_partition_metadata(tmp_path) is None
    fmt.write_partition_metadata(tmp_path, OLD)
    assert (tmp_path / fmt.PARTITION_METADATA_FILE).read_text() == f"version: 0\ntopic_id: {OLD}\n"
    assert fmt.read_partition_metadata(tmp_path) == OLD
    (tmp_path / fmt.PARTITION_METADATA_FILE).write_bytes(b"")  # a crash before its fsync
    assert fmt.read_partition_metadata(tmp_path) is None
    for bad in (b"version: 1\ntopic_id: x\n", b"version: 0\n", b"\xff\xfe"):
        (tmp_path / fmt.PARTITION_METADATA_FILE).write_bytes(bad)
        with pytest.raises(ValueError, match="partition.metadata"):
            fmt.read_partition_metadata(tmp_path)


def test_a_new_log_records_its_topic_id_and_refuses_another(tmp_path: Path) -> None:
    """Goal: a log is handed out only for the topic incarnation it belongs to. Method: create
    orders-0 under OLD: the file records it; asking under NEW is UNKNOWN_TOPIC_ID; after a
    restart given the ids read at start, the same holds; unchecked callers (no id) get it."""
    logs = manager(tmp_path)
    logs.startup()
    log = logs.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, OLD)
    log.append_as_leader(keyed(0, 3))
    assert log.topic_id == OLD and fmt.read_partition_metadata(log.dir) == OLD
    with pytest.raises(UnknownTopicIdError, match=f"belongs to topic id {OLD}, not to {NEW}"):
        logs.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, NEW)
    assert logs.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA) is log
    logs.shutdown()

    again = manager(tmp_path)
    again.startup({TP: OLD})
    assert again.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, OLD).topic_id == OLD
    with pytest.raises(UnknownTopicIdError):
        again.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, NEW)
    again.shutdown()


def test_new_logs_topic_ids_are_made_durable_by_the_next_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: creating thousands of logs waits on no fsync of partition.metadata, yet each is
    durable after the log manager's next checkpoint (every checkpoint_interval_ms, and at
    shutdown). Method: count the fsyncs of those files: none at creation, one each at the
    checkpoint (none for a log deleted meanwhile), none at the next."""
    synced: list[Path] = []

    def fsync_file(path: Path) -> None:
        fmt.fsync_file(path)
        synced.append(path)
    monkeypatch.setattr(log_manager, "fsync_file", fsync_file)
    logs = manager(tmp_path)
    logs.startup()
    other = TopicPartition("orders", 1)
    for tp in (TP, other):
        logs.get_or_create_log(tp, TopicConfig(), DEFAULT_SCHEMA, OLD)
    assert synced == []
    logs.delete_log(other)  # itself a checkpoint: the deleted log's file is gone
    assert synced == [tmp_path / "orders-0" / fmt.PARTITION_METADATA_FILE]
    logs.checkpoint()
    assert len(synced) == 1
    logs.shutdown()


def test_a_log_that_records_no_topic_id_adopts_the_one_asked_for(tmp_path: Path) -> None:
    logs = manager(tmp_path)
    logs.startup()
    logs.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA).append_as_leader(keyed(0, 3))
    logs.shutdown()
    assert fmt.read_partition_metadata(tmp_path / "orders-0") is None

    again = manager(tmp_path)
    again.startup()
    log = again.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, NEW)
    assert log.topic_id == NEW and fmt.read_partition_metadata(log.dir) == NEW
    assert len(records(log)) == 3
    again.shutdown()


def test_a_deleted_log_leaves_nothing_under_its_name_and_leftovers_go_at_startup(
        tmp_path: Path) -> None:
    """Goal: a deletion that a crash interrupts never leaves a partial log where a topic
    created again under the name would find it. Method: delete a log: its directory is gone
    and no file of it is left; a ``<dir>.<uuid>-delete`` directory (a crash during a deletion)
    is removed by the next startup, while a directory that only ends in -delete is not."""
    logs = manager(tmp_path)
    logs.startup()
    logs.get_or_create_log(TP, TopicConfig(), DEFAULT_SCHEMA, OLD).append_as_leader(keyed(0, 3))
    logs.delete_log(TP)
    assert not (tmp_path / "orders-0").exists()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]
    logs.shutdown()

    leftover = tmp_path / f"orders-0.{'c' * 32}{fmt.DELETE_SUFFIX}"
    leftover.mkdir()
    (leftover / "00000000000000000000.arrow").write_bytes(b"old")
    unrelated = tmp_path / "backup-delete"
    unrelated.mkdir()
    again = manager(tmp_path)
    again.startup()
    assert not leftover.exists() and unrelated.exists()
    assert again.all_logs() == {}
    again.shutdown()
