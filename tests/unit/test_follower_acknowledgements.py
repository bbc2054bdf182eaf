"""What a follower gives back and where it truncates, without a network.

Goal: a push the follower drops (its partition moved to another epoch meanwhile) gives its
credit back, so the session's window does not shrink for good; truncation by an epoch older
than every one the follower knows stays within the log. Method: a real ReplicaFetcher,
Partition and Log with a stand-in stream or leader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from segment_helpers import DEFAULT_SCHEMA, keyed

from logstore.clock import SystemClock
from logstore.config import TopicConfig
from logstore.messages.cluster import EpochEndOffset, OffsetsForLeaderEpochResponse
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionPartitionState,
)
from logstore.model import TopicPartition
from logstore.replication import fetcher
from logstore.replication.partition import Partition
from logstore.rpc.session_client import PartitionNews
from logstore.segments.log import Log

TP = TopicPartition("t", 0)


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
