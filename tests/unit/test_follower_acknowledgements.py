"""What a leader counts of a follower's fetch session, and what a follower gives back.

Goal: a follower's log end offset advances the leader's high watermark (and completes acks=all
appends, and readmits it to the ISR) only while the follower follows the leader's current
epoch and holds the partition subscribed: a follower on an older epoch may hold a divergent
tail it has not truncated yet, and counting it acknowledged records no ISR member but the
leader had. A push the follower drops gives its credit back. Method: the real ReplicaManager,
Partition, Log and broker-side FetchSession in one process with a FakeClock (no network); the
follower's side with a real ReplicaFetcher and a stand-in stream or leader. Also: truncation
by an epoch older than every one the follower knows stays within the log, and a new leader
answers OFFSET_NOT_AVAILABLE for its end until its followers tell it its high watermark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from segment_helpers import DEFAULT_SCHEMA, keyed

from logstore.broker.fetch_session import FetchSession
from logstore.broker.replica_manager import ReplicaManager
from logstore.clock import FakeClock, SystemClock
from logstore.config import TopicConfig
from logstore.errors import OffsetNotAvailableError
from logstore.messages.cluster import EpochEndOffset, OffsetsForLeaderEpochResponse
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionPartitionState,
    FetchSessionRequest,
    PartitionOffset,
)
from logstore.model import TopicPartition
from logstore.records import StoredBatch
from logstore.replication import fetcher
from logstore.replication.partition import Partition
from logstore.rpc.session_client import PartitionNews
from logstore.segments.log import Log
from logstore.segments.log_manager import LogManager

TP = TopicPartition("t", 0)
CONFIG = TopicConfig(min_insync_replicas=2)


@pytest.fixture
def replicas(tmp_path: Path) -> Any:
    manager = LogManager([tmp_path], FakeClock(), lambda topic: TopicConfig())
    manager.startup()
    try:
        yield ReplicaManager(1, manager, FakeClock())
    finally:
        manager.shutdown()


def _session(replicas: ReplicaManager, offset: int, epoch: int) -> FetchSession:
    """Follower 3's session on partition 0, opened at ``offset`` and ``epoch``, first push
    made (the open's partitions are added then)."""
    session = FetchSession(replicas, FetchSessionRequest(
        topic="t", replica_id=3, credit_bytes=1 << 20,
        partitions=[FetchPartition(partition=0, offset=offset, current_leader_epoch=epoch)]))
    session.next_push()
    return session


def test_a_follower_on_an_old_epoch_neither_acknowledges_nor_rejoins(
        replicas: ReplicaManager) -> None:
    """acks=all waits for every ISR member: follower 2 has the records, follower 3 opens its
    session at the same offset but on epoch 1 while the leader is at 3; the high watermark
    stays, the append is not acknowledged, and follower 3 (out of the ISR in the second
    partition) is not readmitted; at the leader's epoch, it is."""
    replicas.make_leader(TP, CONFIG, DEFAULT_SCHEMA, 3, (1, 2, 3), (1, 2, 3))
    p = replicas.partition(TP)
    pending = replicas.append_records(TP, keyed(0, 10), -1)
    replicas.acknowledge_follower(TP, 2, 10, 3)
    _session(replicas, 10, 1)
    assert p.log.high_watermark == 0
    _session(replicas, 10, 3)
    assert p.log.high_watermark == 10
    pending.wait(0)

    out = TopicPartition("t", 1)
    replicas.make_leader(out, CONFIG, DEFAULT_SCHEMA, 5, (1, 2, 3), (1, 2))
    replicas.append_records(out, keyed(0, 20), 1)
    replicas.acknowledge_follower(out, 2, 20, 5)
    stale = FetchSession(replicas, FetchSessionRequest(
        topic="t", replica_id=3, credit_bytes=1 << 20,
        partitions=[FetchPartition(partition=1, offset=20, current_leader_epoch=2)]))
    stale.next_push()
    assert sorted(replicas.partition(out).isr) == [1, 2]


def test_acknowledgements_count_only_for_partitions_the_session_holds(
        replicas: ReplicaManager) -> None:
    """A follower's credit carries log end offsets without an epoch: the session counts
    them at the epoch the partition was subscribed with, and not at all for a partition it
    ended (here FENCED_LEADER_EPOCH) or never had."""
    replicas.make_leader(TP, CONFIG, DEFAULT_SCHEMA, 3, (1, 2, 3), (1, 2, 3))
    p = replicas.partition(TP)
    replicas.append_records(TP, keyed(0, 10), 1)
    replicas.acknowledge_follower(TP, 2, 10, 3)
    fenced = _session(replicas, 0, 1)  # ended at its first push
    fenced.grant(FetchSessionCredit(credit_bytes=0, log_end_offsets=[
        PartitionOffset(partition=0, offset=10), PartitionOffset(partition=7, offset=10)]))
    assert p.log.high_watermark == 0
    current = _session(replicas, 0, 3)
    current.grant(FetchSessionCredit(credit_bytes=0, log_end_offsets=[
        PartitionOffset(partition=0, offset=10)]))
    assert p.log.high_watermark == 10


def test_a_push_the_follower_drops_gives_its_credit_back(tmp_path: Path) -> None:
    """The follower's partition moved to another epoch while a push for it was read: the
    push is not appended, and its bytes of credit go back to the leader (before, they were
    lost, and each such drop shrank the session's window for good)."""
    clock = SystemClock()
    source = Log.open(tmp_path / "leader" / "t-0", "t", 0, TopicConfig(), DEFAULT_SCHEMA,
                      clock)
    source.append_as_leader(keyed(0, 100), leader_epoch=1)
    messages = [b.message_bytes() for b in source.read(0, 1 << 30).batches]
    follower = Partition(TP, Log.open(tmp_path / "follower" / "t-0", "t", 0, TopicConfig(),
                                      DEFAULT_SCHEMA, clock), 3, clock, lambda tp: None)
    follower.make_follower(1, 1, (1, 3))

    class Sent:
        def __init__(self) -> None:
            self.frames: list[Any] = []

        def send(self, frame: Any) -> None:
            self.frames.append(frame)

    stream = Sent()
    replica = fetcher.ReplicaFetcher(3, 1, "t", lambda broker: None)
    replica._session = stream  # type: ignore[assignment]
    replica._parts[0] = fetcher._Fetching(follower, 1, truncated=True, seq=0)
    news = PartitionNews(state=FetchSessionPartitionState(
        partition=0, batches=len(messages), high_watermark=0, last_stable_offset=0,
        log_start_offset=0, local_log_start_offset=0, log_end_offset=100,
        aborted_transactions=[]), messages=messages)
    follower.make_follower(1, 2, (1, 3))  # the controller's epoch bump lands meanwhile
    replica._on_frame(stream, news)  # type: ignore[arg-type]
    assert follower.log.log_end_offset == 0
    assert sum(f.credit_bytes for f in stream.frames
               if isinstance(f, FetchSessionCredit)) == news.size_bytes


def test_truncation_by_an_epoch_older_than_every_known_one_stays_in_the_log(
        tmp_path: Path) -> None:
    """A follower whose cached epochs all start after the epoch the leader answers with
    (its cache lost older entries) keeps what the leader's end of that epoch bounds, and
    never truncates below its log start (before, it truncated to offset -1: the log
    restarted empty at -1). Method: a follower log of 10 records at epoch 5, a stand-in
    leader that answers epoch 3 ending at 7."""
    clock = SystemClock()
    log = Log.open(tmp_path / "follower" / "t-0", "t", 0, TopicConfig(), DEFAULT_SCHEMA, clock)
    for i in range(10):
        log.append_as_leader(keyed(i, 1), leader_epoch=5)
    follower = Partition(TP, log, 3, clock, lambda tp: None)
    follower.epochs.assign(5, 0)
    follower.make_follower(1, 6, (1, 3))

    class Leader:
        def call(self, request: Any, timeout_s: float | None = None) -> Any:
            return OffsetsForLeaderEpochResponse(topic="t", partitions=[
                EpochEndOffset(partition=0, leader_epoch=3, end_offset=7)])

    replica = fetcher.ReplicaFetcher(3, 1, "t", lambda broker: None)
    replica._truncate_by_epoch(Leader(), fetcher._Fetching(follower, 6))  # type: ignore[arg-type]
    assert (log.log_start_offset, log.log_end_offset) == (0, 7)


def test_a_new_leader_does_not_answer_for_its_end_before_it_learns_its_high_watermark(
        replicas: ReplicaManager, tmp_path: Path) -> None:
    """A follower that takes over holds records its old leader had acknowledged, but its
    high watermark lags (followers learn it with the next push). Until a follower's fetch
    moves it to the start of the new epoch, LATEST (and a timestamp lookup that finds
    nothing below it) is OFFSET_NOT_AVAILABLE, not an end below what consumers already saw;
    EARLIEST and lookups below the high watermark answer. Kafka's KAFKA-2334. Spark's
    planner's describe_log_dirs is refused likewise."""
    p = replicas.make_follower(TP, CONFIG, DEFAULT_SCHEMA, 2, 4, (1, 2, 3))
    p.append_as_follower(_batches(tmp_path / "old-leader", 10), 4, 4)
    assert (p.log.log_end_offset, p.log.high_watermark) == (10, 4)
    replicas.make_leader(TP, CONFIG, DEFAULT_SCHEMA, 5, (1, 2, 3), (1, 3))
    for isolation in (0, 1):
        with pytest.raises(OffsetNotAvailableError, match="t-0: leader 1 at epoch 5"):
            replicas.list_offset(TP, -1, isolation)
    with pytest.raises(OffsetNotAvailableError):
        replicas.list_offset(TP, 10**13)
    with pytest.raises(OffsetNotAvailableError):  # what Spark's planner asks
        replicas.describe_log_dir(TP, end_known=True)
    assert replicas.describe_log_dir(TP).high_watermark == 4  # tools that show it as it is
    assert replicas.list_offset(TP, -2) == (0, -1)
    assert replicas.list_offset(TP, 0)[0] == 0
    _session(replicas, 10, 5)  # follower 3 has all 10: the high watermark reaches them
    assert replicas.list_offset(TP, -1) == (10, -1)
    assert replicas.list_offset(TP, 10**13) == (-1, -1)
    assert replicas.describe_log_dir(TP, end_known=True).high_watermark == 10


def _batches(dir: Path, count: int) -> list[StoredBatch]:
    """``count`` records as a leader at epoch 4 stored them, one batch per record."""
    source = Log.open(dir / "t-0", "t", 0, TopicConfig(), DEFAULT_SCHEMA, SystemClock())
    for i in range(count):
        source.append_as_leader(keyed(i, 1), leader_epoch=4)
    return [fetcher.to_stored(b.message_bytes()) for b in source.read(0, 1 << 30).batches]
