"""The ``CoordinatorLog`` contract, held by the fake the coordinator tests use and by the real
``ReplicaOffsetsLog``.

Goal: the fake behaves as the real seam does where the coordinator relies on it: the partition
count, a leader epoch only for led partitions, appends read back whole and in order, and
NOT_LEADER_OR_FOLLOWER for an append to a partition this broker does not lead. Method: the same
claims against ``MemoryOffsetsLog`` and a ``ReplicaOffsetsLog`` over a real replica manager and
segment files in ``tmp_path`` (partition 0 led, partition 1 followed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from logstore.broker.group_handlers import ReplicaOffsetsLog
from logstore.broker.replica_manager import ReplicaManager
from logstore.clock import SystemClock
from logstore.config import TopicConfig
from logstore.controller.local import LocalMetadataStore
from logstore.controller.store import TopicRecord
from logstore.coordinator import CoordinatorLog, TxnProducer
from logstore.errors import ErrorCode, NotLeaderOrFollowerError
from logstore.groups.offsets import encode_batch
from logstore.model import OFFSETS_TOPIC, TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments.log_manager import LogManager
from tests.unit.group_helpers import MemoryOffsetsLog


def memory_log(tmp_path: Path) -> Iterator[CoordinatorLog]:
    fake = MemoryOffsetsLog(partitions=2)
    fake.epochs[1] = None
    yield fake


def replica_log(tmp_path: Path) -> Iterator[CoordinatorLog]:
    clock = SystemClock()
    store = LocalMetadataStore(tmp_path / "metadata.json", 0)
    store.create_topic(TopicRecord(OFFSETS_TOPIC, {0: (0,), 1: (1, 0)}, internal=True), {})
    logs = LogManager([tmp_path / "logs"], clock, lambda topic: TopicConfig())
    logs.startup()
    replicas = ReplicaManager(0, logs, clock)
    replicas.make_leader(TopicPartition(OFFSETS_TOPIC, 0), TopicConfig(), DEFAULT_SCHEMA, 3,
                         (0,), (0,))
    replicas.make_follower(TopicPartition(OFFSETS_TOPIC, 1), TopicConfig(), DEFAULT_SCHEMA, 1,
                           3, (1, 0))
    try:
        yield ReplicaOffsetsLog(replicas, store)
    finally:
        logs.shutdown()


@pytest.fixture(params=[memory_log, replica_log], ids=["memory", "replica"])
def offsets_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CoordinatorLog]:
    yield from request.param(tmp_path)


def rows(*values: bytes | None) -> pa.RecordBatch:
    return encode_batch([(b"k%d" % i, v) for i, v in enumerate(values)], 1_700_000_000_000)


def test_appends_to_a_led_partition_read_back_whole_and_in_order(
        offsets_log: CoordinatorLog) -> None:
    assert offsets_log.num_partitions() == 2
    assert offsets_log.leader_epoch(0) is not None and offsets_log.leader_epoch(1) is None
    first, second = rows(b"a", None), rows(b"b")
    offsets_log.append(0, first)
    offsets_log.append(0, second)
    read = [b.records for b in offsets_log.read(0)]
    assert [b.column("value").to_pylist() for b in read] == [[b"a", None], [b"b"]]
    assert [b.column("key").to_pylist() for b in read] == [[b"k0", b"k1"], [b"k0"]]


def test_a_transactional_append_reads_back_as_its_producers(offsets_log: CoordinatorLog) -> None:
    """Goal: offsets committed inside a transaction replay as the producer's transactional
    batch, and a plain append as nobody's. Method: one of each, read back."""
    offsets_log.append(0, rows(b"plain"))
    offsets_log.append(0, rows(b"txn"), TxnProducer(42, 3))
    plain, txn = offsets_log.read(0)
    assert (plain.producer_id, plain.transactional, plain.marker) == (-1, False, None)
    assert (txn.producer_id, txn.transactional, txn.marker) == (42, True, None)
    assert txn.records.column("value").to_pylist() == [b"txn"]


def test_append_to_a_partition_not_led_is_not_leader_or_follower(
        offsets_log: CoordinatorLog) -> None:
    with pytest.raises(NotLeaderOrFollowerError) as caught:
        offsets_log.append(1, rows(b"x"))
    assert caught.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
