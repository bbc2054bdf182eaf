"""The broker's side of tiered storage, in-process over real parts: a ReplicaManager and a
RemoteTier on a real LogManager in tmp_path, the embedded metadata store and a file:// object
store, on a FakeClock (remote reads run on the reader's real threads). Retention over both
tiers, the fetch paths below the local log start (consumers, followers, read_committed,
several partitions at once within max_bytes), offsets over both tiers, and the follower's
restart at a leader's local log start."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from logstore.broker.remote_tier import RemoteTier
from logstore.broker.replica_manager import (
    READ_COMMITTED,
    FetchPartition,
    PartitionFetchResult,
    ReplicaManager,
)
from logstore.clock import FakeClock
from logstore.config import BrokerConfig, TopicConfig
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import PartitionState, TopicRecord
from logstore.errors import CorruptRecordError, OffsetMovedToTieredStorageError
from logstore.model import EARLIEST, TopicPartition
from logstore.records import DEFAULT_SCHEMA, FLAG_TRANSACTIONAL
from logstore.replication.partition import Partition
from logstore.segments.log_manager import LogManager
from logstore.tiering.fsspec_store import FsspecObjectStore
from logstore.tiering.log_view import LogTierView, local_log_config
from tests.unit.segment_helpers import keyed, open_log
from tests.unit.tiering_helpers import TOPIC_ID, TP, tiered

TOPIC = "orders"
RECORDS = 10  # per batch; one batch per segment


@dataclass
class Broker:
    """A broker's storage and tiering, without its network."""

    clock: FakeClock
    config: TopicConfig
    replicas: ReplicaManager
    tier: RemoteTier
    logs: LogManager
    remote: Path  # the file:// store's directory

    def partition(self, p: int = 0) -> Partition:
        return self.replicas.partition(TopicPartition(TOPIC, p))

    def produce_segments(self, count: int, p: int = 0) -> None:
        part = self.partition(p)
        for _ in range(count):
            self.replicas.append_records(TopicPartition(TOPIC, p), keyed(
                part.log.log_end_offset, RECORDS, self.clock), required_acks=1)
            part.log.roll()

    def tier_all(self, partitions: int = 1) -> None:
        self.clock.advance(1)  # past local_retention_ms 0
        for p in range(partitions):
            self.tier.manager.run_task(TopicPartition(TOPIC, p))


def _broker(tmp_path: Path, partitions: int = 1) -> Broker:
    clock = FakeClock(10**12)
    config = TopicConfig(remote_storage_enable=True, retention_ms=None, local_retention_ms=0)
    broker_config = BrokerConfig(log_dirs=(str(tmp_path / "data"),),
                                 remote_storage_uri=f"file://{tmp_path}/remote")
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 0)
    store.start()
    store.create_topic(TopicRecord(TOPIC, {p: (0,) for p in range(partitions)},
                                   topic_id=TOPIC_ID),
                       {p: PartitionState(0, 0, (0,)) for p in range(partitions)})
    tier = RemoteTier(broker_config, FsspecObjectStore(broker_config.remote_storage_uri or ""),
                      store, clock)
    logs = LogManager([tmp_path / "data"], clock, lambda t: local_log_config(config))
    replicas = ReplicaManager(0, logs, clock, tier=tier)
    for p in range(partitions):
        tp = TopicPartition(TOPIC, p)
        replicas.make_leader(tp, local_log_config(config), DEFAULT_SCHEMA, 0, (0,), (0,))
        tier.sync(replicas.partition(tp), config, TOPIC_ID, lambda: config)
    return Broker(clock, config, replicas, tier, logs, tmp_path / "remote")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = _broker(tmp_path, partitions=3)
    yield b
    b.tier.close()


def test_a_tiered_log_leaves_total_retention_to_the_tier_manager(tmp_path: Path) -> None:
    """Goal: the LogManager's retention never deletes a tiered partition's uncopied segments,
    while the tier manager applies total retention over both tiers. Method: the real Log
    with ``local_log_config`` and a FakeClock; retention_ms 1 h; past it, the Log's own
    retention deletes nothing; the tier manager copies, deletes locally (local retention 0),
    and once past the total retention deletes remotely and moves the log start offset."""
    config = TopicConfig(remote_storage_enable=True, retention_ms=3_600_000,
                         local_retention_ms=0)
    assert local_log_config(config).retention_ms is None
    assert local_log_config(TopicConfig()).retention_ms == TopicConfig().retention_ms
    t = tiered(tmp_path)
    t.log.update_config(local_log_config(config))
    t.produce_segments(3)
    t.clock.advance(2 * 3_600_000)
    assert t.log.delete_old_segments() == 0 and t.log.log_start_offset == 0
    view = LogTierView(t.log, lambda: t.epochs, config=lambda: config)
    t.rlm.on_become_leader(view, TOPIC_ID, 0)
    t.rlm.run_task(TP)
    assert t.rlm.log_start_offset(TP) == 30 == t.log.log_start_offset
    assert t.objects() == []


def test_a_consumer_fetch_below_the_local_log_start_reads_the_remote_tier(
        broker: Broker) -> None:
    """Goal: offsets whose local segments are gone are served from the remote tier with the
    log start offset over both tiers; EARLIEST is that log start. Method: three segments
    copied and deleted locally; fetch offset 5 and offset 15."""
    broker.produce_segments(3)
    broker.tier_all()
    tp = TopicPartition(TOPIC, 0)
    assert broker.partition().log.log_start_offset == 30
    (r,) = broker.replicas.fetch([FetchPartition(tp, 5, 1 << 20)], 0, 1, 1 << 20)
    assert r.error is None and r.batches[0].header.base_offset == 0
    assert (r.log_start_offset, r.local_log_start_offset) == (0, 30)
    assert broker.replicas.list_offset(tp, EARLIEST) == (0, -1)


def test_a_follower_fetch_below_the_local_log_start_is_offset_moved_to_tiered_storage(
        broker: Broker) -> None:
    """Goal: followers never replicate the remote tier: their fetch below the leader's local
    log start is OFFSET_MOVED_TO_TIERED_STORAGE carrying the local log start offset, and the
    leader's epochs are there to rebuild from. Method: tier, then fetch as replica 1."""
    broker.produce_segments(3)
    broker.tier_all()
    tp = TopicPartition(TOPIC, 0)
    (r,) = broker.replicas.fetch([FetchPartition(tp, 0, 1 << 20)], 0, 1, 1 << 20,
                                 replica_id=1)
    assert isinstance(r.error, OffsetMovedToTieredStorageError)
    assert "orders-0: offset 0 is below the leader's local log start offset 30" in str(r.error)
    assert r.local_log_start_offset == 30
    assert broker.replicas.leader_epochs(tp) == [(0, 0)]


def test_a_read_committed_fetch_of_the_remote_tier_carries_its_aborted_transactions(
        broker: Broker) -> None:
    """Goal: read_committed reaches the remote tier with the aborted transactions of its
    range, from the uploaded ``.txnindex`` objects, so the reader can drop them, and never
    reads past the last stable offset. Method: producer 7 writes a transactional batch and
    aborts it (its marker at offset 10), a plain segment follows, all tiered; a
    read_committed fetch from 0 gets the aborted batch, its marker and (7, 0, 10) in
    ``aborted``; an open transaction of producer 8 in the local log bounds the read."""
    tp = TopicPartition(TOPIC, 0)
    part = broker.partition()
    broker.replicas.append_records(tp, keyed(0, RECORDS, broker.clock), 1, producer_id=7,
                                   producer_epoch=0, base_sequence=0, flags=FLAG_TRANSACTIONAL)
    broker.replicas.write_txn_marker(tp, 7, 0, committed=False, coordinator_epoch=0)
    part.log.roll()
    broker.produce_segments(2)  # offsets 11..30
    broker.tier_all()
    assert part.log.log_start_offset == 31
    broker.replicas.append_records(tp, keyed(31, RECORDS, broker.clock), 1, producer_id=8,
                                   producer_epoch=0, base_sequence=0, flags=FLAG_TRANSACTIONAL)
    assert part.log.last_stable_offset == 31
    (r,) = broker.replicas.fetch([FetchPartition(tp, 0, 1 << 20)], 0, 1, 1 << 20,
                                 isolation_level=READ_COMMITTED)
    assert r.error is None and r.from_remote
    assert [(b.header.base_offset, b.header.is_control) for b in r.batches][:2] == [
        (0, False), (10, True)]
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in r.aborted] == [(7, 0, 10)]
    assert r.batches[-1].header.next_offset <= r.last_stable_offset == 31
    (local,) = broker.replicas.fetch([FetchPartition(tp, 31, 1 << 20)], 0, 1, 1 << 20,
                                     isolation_level=READ_COMMITTED)
    assert local.error is None and local.batches == []  # the open transaction is not stable


def _tiered_aborted_transaction(broker: Broker, tiered: int) -> Path:
    """Partition 0: producer 7's aborted transaction (marker at offset 10), then two plain
    segments; partition 1: two plain segments; the first ``tiered`` partitions tiered. The
    path of the one remote ``.txnindex`` object."""
    tp0 = TopicPartition(TOPIC, 0)
    broker.replicas.append_records(tp0, keyed(0, RECORDS, broker.clock), 1, producer_id=7,
                                   producer_epoch=0, base_sequence=0, flags=FLAG_TRANSACTIONAL)
    broker.replicas.write_txn_marker(tp0, 7, 0, committed=False, coordinator_epoch=0)
    broker.partition().log.roll()
    broker.produce_segments(2)
    broker.produce_segments(2, p=1)
    broker.tier_all(tiered)
    (index,) = broker.remote.glob("**/*.txnindex")
    return index


def _read_committed_both(broker: Broker) -> list[PartitionFetchResult]:
    """One read_committed fetch of partitions 0 and 1 from offset 0."""
    return broker.replicas.fetch([FetchPartition(TopicPartition(TOPIC, p), 0, 1 << 20)
                                  for p in (0, 1)], 0, 1, 1 << 20,
                                 isolation_level=READ_COMMITTED)


def test_an_unreadable_remote_txn_index_fails_its_partition_only(broker: Broker) -> None:
    """Goal: a read_committed fetch whose remote ``.txnindex`` cannot be read (cut short here)
    answers CORRUPT_MESSAGE naming the partition for that partition alone; the fetch's other
    partitions are served (before, the error escaped the fetch and failed all of them).
    Method: partition 0's aborted transaction tiered with its index object truncated;
    partition 1 local; one read_committed fetch of both."""
    index = _tiered_aborted_transaction(broker, tiered=1)
    with open(index, "r+b") as f:
        f.truncate(31)
    r0, r1 = _read_committed_both(broker)
    assert isinstance(r0.error, CorruptRecordError) and "orders-0" in str(r0.error)
    assert r0.batches == []
    assert r1.error is None and len(r1.batches) == 2


def test_a_lost_remote_txn_index_is_an_error_not_an_empty_one(broker: Broker) -> None:
    """Goal: a segment's metadata says whether a ``.txnindex`` was copied with it, so a
    read_committed fetch of a segment whose index object is gone answers CORRUPT_MESSAGE
    naming the segment, not the aborted records as if they were committed (before, a lost
    object read as "no aborted transaction", as Kafka's remote index cache does); a segment
    copied without one (no aborted transaction) is read as before.
    Method: partition 0's aborted transaction tiered, then its index object deleted;
    partition 1 tiered with no transaction; one read_committed fetch of both."""
    _tiered_aborted_transaction(broker, tiered=2).unlink()
    r0, r1 = _read_committed_both(broker)
    assert isinstance(r0.error, CorruptRecordError)
    assert "transaction index" in str(r0.error) and "orders-0" in str(r0.error)
    assert r0.batches == []
    assert r1.error is None and r1.from_remote and len(r1.batches) == 1


def test_one_fetch_reads_several_partitions_remote_tiers_within_max_bytes(
        broker: Broker) -> None:
    """Goal: one fetch is served from several partitions' remote segments at once and with
    its local partitions, and the whole response respects max_bytes (its first batch
    whatever its size). Method: partitions 0 and 1 tiered, 2 local; fetch all three with a
    max_bytes of one and a half batches, then a large one."""
    for p in range(3):
        broker.produce_segments(2, p)
    broker.tier_all(2)
    size = broker.partition(2).log.read(0, 1 << 20).batches[0].header.batch_size
    requests = [FetchPartition(TopicPartition(TOPIC, p), 0, 1 << 20) for p in range(3)]
    small = broker.replicas.fetch(requests, 0, 1, size + size // 2)
    assert [len(r.batches) for r in small] == [1, 0, 0]
    assert all(r.error is None for r in small)
    large = broker.replicas.fetch(requests, 0, 1, 1 << 20)
    assert [len(r.batches) for r in large] == [1, 1, 2]  # a remote read stays in its segment
    assert [r.from_remote for r in large] == [True, True, False]


def test_a_follower_restarts_at_the_leader_local_log_start_with_its_epochs(
        tmp_path: Path) -> None:
    """Goal: Kafka's OFFSET_MOVED_TO_TIERED_STORAGE handling on the follower: the log
    restarts empty at the leader's local log start offset and the epoch cache holds the
    leader's entries up to it; afterwards it follows the leader's local log start up to its
    own high watermark. Method: a real Log and Partition following leader 1 at epoch 3."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, remote_storage_enable=True)
    part = Partition(TopicPartition("topic", 0), log, 2, clock, lambda tp: None)
    part.make_follower(1, 3, (1, 2))
    assert not part.restart_at_leader_local_start(50, [(0, 0)], leader_epoch=2)  # stale
    assert part.restart_at_leader_local_start(50, [(0, 0), (2, 40), (3, 60)], leader_epoch=3)
    assert (log.log_start_offset, log.log_end_offset) == (50, 50)
    assert [(e.epoch, e.start_offset) for e in part.epochs.entries] == [(0, 0), (2, 40)]
    assert part.end_offset_for_epoch(0) == (0, 40)
    part.follow_leader_local_log_start(55)  # nothing above its high watermark goes
    assert log.log_start_offset == 50


def test_the_remote_reader_collects_aborted_transactions_from_uploaded_txn_indexes(
        tmp_path: Path) -> None:
    """Goal: the seam for read_committed over remote ranges: the aborted transactions of a
    remote range come from the segments' uploaded ``.txnindex`` objects, as the local log
    would have answered before its segments were deleted. Method: a transaction aborted
    across a segment boundary and one committed, on the real Log; copy (below the last stable
    offset) and delete locally; collect from the remote tier."""
    from txn_helpers import ABORT, COMMIT, Producer

    from logstore.tiering.remote_cache import ChunkCache, RemoteIndexCache
    from logstore.tiering.remote_reader import RemoteLogReader

    t = tiered(tmp_path, local_retention_ms=0)
    aborted, committed = Producer(t.log, 7), Producer(t.log, 8)
    aborted.send(3)
    t.log.roll()
    committed.send(2)
    aborted.send(2)
    aborted.end(ABORT)
    committed.end(COMMIT)
    t.log.roll()
    t.produce_segments(1)
    expected = t.log.collect_aborted_transactions(0, t.log.log_end_offset)
    assert [(e.producer_id, e.first_offset) for e in expected] == [(7, 0)]
    t.clock.advance(1)
    t.lead()
    t.rlm.run_task(TP)
    assert t.log.log_start_offset == t.log.log_end_offset  # every segment only in the remote
    reader = RemoteLogReader(t.store, t.rlm, RemoteIndexCache(t.root / "ic", 1 << 20, t.store),
                             ChunkCache(1 << 20), 1)
    found, _ = reader.collect_aborted(TP, 0, t.log.log_end_offset)
    assert found == expected
    assert reader.collect_aborted(TP, 8, t.log.log_end_offset)[0] == []  # after the abort
    reader.close()
