"""A broker's log directories are its own: a start with another broker_id, a reordered or
extended log_dirs, a second broker listing a running broker's directory, or a partition the
metadata does not know must never cost data (``logstore/broker/log_dirs.py``).

Each test runs real broker processes (tests/brokers.py) and checks, after the mistake, that
every record produced before it is still read back.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.controller.local import METADATA_FILE
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer, write_broker_toml
from tests.helpers import wait_for

RECORDS = 100
CONSUME_TIMEOUT_S = 30.0


def _fill(broker: BrokerProcess, topic: str, partitions: int) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions)])
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value=b"%d" % i) for i in range(RECORDS)]
        producer.flush(30)
        assert all(f.result(10) for f in futures)


def _values(broker: BrokerProcess, topic: str, partitions: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                values += table.column("value").to_pylist()
    return sorted(values)


EXPECTED = sorted(b"%d" % i for i in range(RECORDS))


def _rewrite(broker: BrokerProcess, **settings: Any) -> None:
    """Change the broker's TOML file (same port) for its next start."""
    write_broker_toml(broker.config_path, {"broker_id": broker.broker_id,
                                           "listener": f"127.0.0.1:{broker.port}",
                                           "log_dirs": [str(broker.log_dir)], **settings})


def _partition_dirs(*dirs: Path) -> list[str]:
    return sorted(p.name for d in dirs for p in d.iterdir() if p.name.startswith("keep-"))


def test_start_with_another_broker_id_is_refused_and_keeps_the_data(
        broker_factory: BrokerFactory) -> None:
    """Goal: a typo in broker_id cannot delete a log directory's partitions (Kafka refuses via
    meta.properties). Method: fill a topic as broker 0, stop, start the same directory as
    broker 1: it exits naming meta.properties and both ids; back as broker 0, every record
    is read."""
    broker = broker_factory(broker_id=0)
    _fill(broker, "keep", 2)
    assert broker.stop() == 0
    _rewrite(broker, broker_id=1)
    with pytest.raises(RuntimeError, match=r"meta.properties records broker.id=0 .*broker_id=1"):
        broker.start()
    assert _partition_dirs(broker.log_dir) == ["keep-0", "keep-1"]
    _rewrite(broker)
    broker.start()
    assert _values(broker, "keep", 2) == EXPECTED


def test_a_first_start_with_a_wrong_broker_id_is_refused_before_anything_moves(
        broker_factory: BrokerFactory) -> None:
    """Goal: on the first start after an upgrade (no meta.properties yet) a broker_id that
    the metadata assigns none of the directory's partitions to is refused naming the ids,
    and nothing is renamed or recorded: before, every partition went -stray and
    meta.properties recorded the wrong id, so setting it back was refused too. Method: fill
    as broker 0, stop, remove meta.properties, start as broker 1, then as broker 0."""
    broker = broker_factory(broker_id=0)
    _fill(broker, "keep", 2)
    assert broker.stop() == 0
    (broker.log_dir / "meta.properties").unlink()
    _rewrite(broker, broker_id=1)
    with pytest.raises(RuntimeError, match=r"broker_id=1, but the metadata assigns the "
                                           r"partitions .* to broker\(s\) \[0\]"):
        broker.start()
    assert _partition_dirs(broker.log_dir) == ["keep-0", "keep-1"]
    assert not (broker.log_dir / "meta.properties").exists()
    _rewrite(broker)
    broker.start()
    assert _values(broker, "keep", 2) == EXPECTED


def test_reordered_or_extended_log_dirs_keep_every_partition(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """Goal: the embedded metadata file is found in whichever log dir holds it. Method: fill
    4 partitions over [a, b]; restart with [b, a], then with a new directory first [c, b, a]:
    the topic and every record are still there, and no partition directory moved."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    broker = broker_factory(log_dirs=[str(a), str(b)])
    _fill(broker, "keep", 4)
    assert broker.stop() == 0
    before = _partition_dirs(a, b)
    for dirs in ([b, a], [c, b, a]):
        _rewrite(broker, log_dirs=[str(d) for d in dirs])
        broker.start()
        assert _values(broker, "keep", 4) == EXPECTED
        assert broker.stop() == 0
        assert _partition_dirs(a, b) == before


def test_partitions_without_their_metadata_file_are_refused(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """Goal: a missing embedded metadata file never starts an empty store over existing
    partitions. Method: fill a topic, stop, move the metadata file away: the start fails
    naming the log dir; with the file back every record is read. Two metadata files in two
    log dirs are refused too, naming both."""
    broker = broker_factory(broker_id=0)
    _fill(broker, "keep", 2)
    assert broker.stop() == 0
    meta = broker.log_dir / METADATA_FILE
    meta.rename(tmp_path / "saved.json")
    held = rf"log_dirs {re.escape(str(broker.log_dir))} hold \d+ partition"
    with pytest.raises(RuntimeError, match=held):
        broker.start()
    (tmp_path / "saved.json").rename(meta)
    other = tmp_path / "other"
    other.mkdir()
    (other / METADATA_FILE).write_bytes(meta.read_bytes())
    _rewrite(broker, log_dirs=[str(broker.log_dir), str(other)])
    with pytest.raises(RuntimeError, match="several log_dirs hold an embedded metadata file"):
        broker.start()
    _rewrite(broker)
    broker.start()
    assert _values(broker, "keep", 2) == EXPECTED


def test_second_broker_listing_a_running_brokers_dir_is_refused(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """Goal: every log dir is locked, not just the first. Method: broker 0 runs on x; a
    second broker on [y, x] exits naming x as in use (the lock is checked before
    anything else); broker 0 still has every record
    and so does it after a restart."""
    x, y = tmp_path / "x", tmp_path / "y"
    first = broker_factory(broker_id=0, log_dirs=[str(x)])
    _fill(first, "keep", 2)
    in_use = rf"log_dirs entry '{re.escape(str(x))}' is in use by another"
    with pytest.raises(RuntimeError, match=in_use):
        broker_factory(broker_id=1, log_dirs=[str(y), str(x)])
    assert _partition_dirs(x) == ["keep-0", "keep-1"]
    assert _values(first, "keep", 2) == EXPECTED
    first.restart()
    assert _values(first, "keep", 2) == EXPECTED


def test_stray_partition_is_set_aside_and_a_deleted_topic_frees_its_disk(
        broker_factory: BrokerFactory) -> None:
    """Goal: a partition directory the metadata does not know is renamed aside at start, not
    deleted; deleting a topic still removes its directories. Method: stop a broker, rename
    keep-1 to ghost-0: after the start ghost-0 is ``ghost-0.<uuid>-stray`` with its files;
    then delete topic keep: its directories are gone."""
    broker = broker_factory(broker_id=0)
    _fill(broker, "keep", 2)
    assert broker.stop() == 0
    (broker.log_dir / "keep-1").rename(broker.log_dir / "ghost-0")
    broker.start()
    aside = [p for p in broker.log_dir.iterdir() if p.name.startswith("ghost-0.")]
    assert len(aside) == 1 and aside[0].name.endswith("-stray") and any(aside[0].iterdir())
    assert not (broker.log_dir / "ghost-0").exists()
    with Admin(broker.bootstrap) as admin:
        admin.delete_topics(["keep"])
    wait_for(lambda: not _partition_dirs(broker.log_dir), "keep's directories deleted",
             CONSUME_TIMEOUT_S)


def test_zookeeper_mode_locks_every_log_dir_and_sets_strays_aside(
        broker_factory: BrokerFactory, zk_connect: str, tmp_path: Path) -> None:
    """Goal: the log dir lock and the stray rule hold in cluster mode too (there the
    metadata lives in ZooKeeper). Method: broker 1 runs on [x]; broker 2 on [y, x] in the same
    cluster is refused naming x; broker 1 restarted with a partition directory of a topic
    ZooKeeper does not know finds it renamed aside, and still serves every record."""
    x, y = tmp_path / "x", tmp_path / "y"
    first = broker_factory(broker_id=1, zk_connect=zk_connect, log_dirs=[str(x)])
    _fill(first, "keep", 2)
    in_use = rf"log_dirs entry '{re.escape(str(x))}' is in use by another"
    with pytest.raises(RuntimeError, match=in_use):
        broker_factory(broker_id=2, zk_connect=zk_connect, log_dirs=[str(y), str(x)])
    assert first.stop() == 0
    (x / "ghost-0").mkdir()
    first.start()
    assert [p.name.endswith("-stray") for p in x.iterdir() if p.name.startswith("ghost-0")] \
        == [True]
    assert _values(first, "keep", 2) == EXPECTED


def test_undecodable_checkpoint_files_keep_partitions_online(
        broker_factory: BrokerFactory) -> None:
    """Goal: one non-UTF-8 byte in a partition's leader-epoch-checkpoint or in the
    .clean_shutdown marker costs neither the partition nor the broker (the epoch cache starts
    empty, the shutdown counts as unclean), and "new partition(s) online" counts only
    partitions that came online. Method: fill topic keep, stop, set a high bit in keep-0's
    checkpoint and write 0xff into the marker, make lost-0's checkpoint a directory (which no
    broker can read); restart: every record of keep is read, the warnings name both files,
    and the broker logs 1 partition online, not 2."""
    broker = broker_factory(broker_id=0)
    _fill(broker, "keep", 1)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("lost", 1)])
    assert broker.stop() == 0
    checkpoint = broker.log_dir / "keep-0" / "leader-epoch-checkpoint"
    data = bytearray(checkpoint.read_bytes())
    data[-2] |= 0x80
    checkpoint.write_bytes(bytes(data))
    marker = broker.log_dir / ".clean_shutdown"
    marker.write_bytes(b"keep-0\n\xff\n")
    unreadable = broker.log_dir / "lost-0" / "leader-epoch-checkpoint"
    unreadable.unlink(missing_ok=True)
    unreadable.mkdir()
    broker.start()
    assert _values(broker, "keep", 1) == EXPECTED
    log_text = broker.stderr_path.read_text().split("--- starting")[-1]
    assert f"{checkpoint} is unreadable" in log_text
    assert f"{marker} is unreadable" in log_text
    assert "lost-0: could not be brought online" in log_text
    assert "broker 0: 1 new partition(s) online" in log_text
