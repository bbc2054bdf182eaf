"""ISR, high-watermark and leader-epoch rules of one partition replica, on real logs in
tmp_path with a FakeClock, and the controller's election rules as pure functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logstore.clock import FakeClock
from logstore.controller.partition_election import check_isr_change, next_state
from logstore.controller.store import PartitionState
from logstore.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from logstore.messages.cluster import (
    EpochEndOffset,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
)
from logstore.messages.fetch import FetchRequest
from logstore.model import TopicPartition
from logstore.replication.epoch_cache import LeaderEpochCache
from logstore.replication.fetcher import ReplicaFetcher, _Fetching
from logstore.replication.partition import Partition
from tests.unit.segment_helpers import keyed, open_log, records

LAG_MS = 1000


def make_partition(path: Path, clock: FakeClock, broker_id: int = 1, **config: Any
                   ) -> Partition:
    log = open_log(path / f"b{broker_id}", clock, **config)
    return Partition(TopicPartition("topic", 0), log, broker_id, clock, lambda tp: None)


# -- high watermark and ISR --------------------------------------------------------------------


def test_high_watermark_is_the_smallest_log_end_offset_in_the_isr(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(0, (1, 2, 3), (1, 2, 3))
    p.append_records_to_leader(keyed(0, 10), 1)
    assert p.log.high_watermark == 0
    p.update_follower_fetch(2, 10)
    assert p.log.high_watermark == 0  # follower 3 has nothing yet
    p.update_follower_fetch(3, 4)
    assert p.log.high_watermark == 4
    p.update_follower_fetch(3, 10)
    assert p.log.high_watermark == 10


def test_lagging_follower_leaves_the_isr_after_the_lag_time_only(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(0, (1, 2, 3), (1, 2, 3))
    p.append_records_to_leader(keyed(0, 5), 1)
    p.update_follower_fetch(2, 5)
    clock.advance(LAG_MS)
    p.update_follower_fetch(2, 5)
    assert p.maybe_shrink_isr(LAG_MS) is None  # 3 is exactly at the lag time: still in
    clock.advance(1)
    assert p.maybe_shrink_isr(LAG_MS) == frozenset({1, 2})
    assert p.isr == frozenset({1, 2})  # embedded proposer: committed at once
    assert p.log.high_watermark == 5  # 3 no longer holds it back


def test_a_pipelining_follower_is_caught_up_as_of_the_leader_end_it_reached(
        tmp_path: Path) -> None:
    """Goal: a follower that always acknowledges a little behind the leader's log end offset
    (a push session under steady load) stays in the ISR while its lag in time is small, and
    leaves it once it stops progressing (Kafka's rule: caught up as of the time the leader's
    log end offset was what the follower has now). Method: appends and acknowledgements
    alternate, each acknowledgement reaching the leader's end of the step before."""
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(0, (1, 2), (1, 2))
    for step in range(5):
        p.append_records_to_leader(keyed(step * 10, 10), 1)  # the leader's end: 10 * (step + 1)
        clock.advance(LAG_MS // 2)
        p.update_follower_fetch(2, step * 10)  # behind the end of now, at the end of before
        assert p.maybe_shrink_isr(LAG_MS) is None, f"step {step}"
    clock.advance(LAG_MS + 1)  # no progress for longer than the lag time
    assert p.maybe_shrink_isr(LAG_MS) == frozenset({1})


def test_shrink_waits_for_the_controller_and_high_watermark_counts_the_larger_isr(
        tmp_path: Path) -> None:
    clock = FakeClock()
    proposals: list[tuple[int, frozenset[int]]] = []
    log = open_log(tmp_path, clock)
    p = Partition(TopicPartition("topic", 0), log, 1, clock, lambda tp: None,
                  lambda part, epoch, isr: proposals.append((epoch, isr)))
    p.make_leader(3, (1, 2), (1, 2))
    p.append_records_to_leader(keyed(0, 5), 1)
    clock.advance(LAG_MS + 1)
    p.maybe_shrink_isr(LAG_MS)
    assert proposals == [(3, frozenset({1}))]
    assert p.isr == frozenset({1, 2}) and p.log.high_watermark == 0  # not committed yet
    assert p.maybe_shrink_isr(LAG_MS) is None  # one proposal at a time
    p.apply_isr(2, frozenset({1}))  # an answer for an older epoch is ignored
    assert p.isr == frozenset({1, 2})
    p.apply_isr(3, frozenset({1}))
    assert p.isr == frozenset({1}) and p.log.high_watermark == 5


def test_follower_rejoins_the_isr_once_caught_up_to_the_high_watermark(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(0, (1, 2), (1,))
    p.append_records_to_leader(keyed(0, 5), 1)
    assert p.log.high_watermark == 5
    p.update_follower_fetch(2, 3)
    assert p.isr == frozenset({1})
    p.update_follower_fetch(2, 5)
    assert p.isr == frozenset({1, 2})


def test_acks_all_needs_min_insync_replicas(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock, min_insync_replicas=2)
    p.make_leader(0, (1, 2, 3), (1,))
    with pytest.raises(NotEnoughReplicasError):
        p.append_records_to_leader(keyed(0, 1), -1)
    p.append_records_to_leader(keyed(0, 1), 1)  # acks=1 still works


def test_acks_all_waits_for_every_isr_member(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(0, (1, 2), (1, 2))
    pending = p.append_records_to_leader(keyed(0, 3), -1)
    with pytest.raises(RequestTimedOutError):
        pending.wait(0)
    p.update_follower_fetch(2, 3)
    assert pending.wait(0).last_offset == 2


def test_follower_refuses_produce_and_stale_epochs(tmp_path: Path) -> None:
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_follower(2, 4, (1, 2))
    with pytest.raises(NotLeaderOrFollowerError):
        p.append_records_to_leader(keyed(0, 1), 1)
    p.make_leader(5, (1, 2), (1, 2))
    with pytest.raises(FencedLeaderEpochError):
        p.check_leader_epoch(4)


def test_produce_checks_the_leader_epoch_it_names(tmp_path: Path) -> None:
    """A produce naming an older epoch is fenced, a newer one is unknown, and neither is
    written; the current epoch or -1 (unchecked, older clients) is appended."""
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_leader(3, (1,), (1,))
    with pytest.raises(FencedLeaderEpochError):
        p.append_records_to_leader(keyed(0, 2), 1, 2)
    with pytest.raises(UnknownLeaderEpochError):
        p.append_records_to_leader(keyed(0, 2), 1, 4)
    assert p.log.log_end_offset == 0
    assert p.append_records_to_leader(keyed(0, 2), 1, 3).wait(0).last_offset == 1
    assert p.append_records_to_leader(keyed(2, 2), 1, -1).wait(0).last_offset == 3
    assert p.append_records_to_leader(keyed(4, 1), 1).wait(0).last_offset == 4


def test_stale_epoch_on_a_follower_is_fenced_before_not_leader(tmp_path: Path) -> None:
    """A producer behind a leader change hears its epoch is stale (refresh metadata)."""
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    p.make_follower(2, 4, (1, 2))
    with pytest.raises(FencedLeaderEpochError):
        p.append_records_to_leader(keyed(0, 1), 1, 3)
    with pytest.raises(NotLeaderOrFollowerError):
        p.append_records_to_leader(keyed(0, 1), 1, 4)


# -- leader epochs -----------------------------------------------------------------------------


def test_epoch_cache_answers_end_offsets_and_survives_a_restart(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    cache.assign(2, 10)
    cache.assign(1, 5)  # older than the latest: ignored
    cache.assign(5, 30)
    assert cache.end_offset_for(0, 40) == (0, 10)
    assert cache.end_offset_for(3, 40) == (2, 30)
    assert cache.end_offset_for(5, 40) == (5, 40)
    assert cache.end_offset_for(9, 40) == (5, 40)
    cache.truncate_from_end(30)
    assert LeaderEpochCache(tmp_path).entries == cache.entries
    assert cache.latest_epoch == 2


def test_epoch_checkpoint_with_a_non_utf8_byte_starts_an_empty_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Goal: a leader-epoch-checkpoint with one flipped high bit is bad content like any other:
    an empty cache and a warning naming the file, not a UnicodeDecodeError that keeps the
    partition offline. Method: write a checkpoint, set the high bit of a digit, reopen."""
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    path = tmp_path / "leader-epoch-checkpoint"
    data = bytearray(path.read_bytes())
    data[-2] |= 0x80
    path.write_bytes(bytes(data))
    assert LeaderEpochCache(tmp_path).entries == []
    assert str(path) in caplog.text and "unreadable" in caplog.text


def test_a_new_leaders_first_epoch_is_written_before_its_first_append(tmp_path: Path) -> None:
    """Goal: a new partition's first leader epoch costs no file (nor fsync) when it is brought
    online, and is in the checkpoint before any batch of that epoch is appended; a later epoch
    over existing entries is written at once.
    Method: a Partition on an empty log; make it leader: no checkpoint file; append: the file
    holds the epoch; a new epoch: written at once (read back by a fresh cache)."""
    clock = FakeClock()
    p = make_partition(tmp_path, clock)
    checkpoint = p.log.dir / "leader-epoch-checkpoint"
    p.make_leader(3, (1,), (1,))
    assert not checkpoint.exists()
    assert p.end_offset_for_epoch(3) == (3, 0)
    p.append_records_to_leader(keyed(0, 4), 1)
    assert [(e.epoch, e.start_offset) for e in LeaderEpochCache(p.log.dir).entries] == [(3, 0)]
    p.make_leader(4, (1,), (1,))
    assert [(e.epoch, e.start_offset) for e in LeaderEpochCache(p.log.dir).entries] == [
        (3, 0), (4, 4)]


class _LeaderConn:
    """Answers offsets_for_leader_epoch from a leader Partition in this process."""

    def __init__(self, leader: Partition) -> None:
        self.leader = leader

    def call(self, request: Any, timeout_s: float | None = None) -> Any:
        assert isinstance(request, OffsetsForLeaderEpochRequest)
        (p,) = request.partitions
        epoch, end = self.leader.end_offset_for_epoch(p.leader_epoch)
        return OffsetsForLeaderEpochResponse(topic=request.topic, partitions=[
            EpochEndOffset(partition=p.partition, leader_epoch=epoch, end_offset=end)])

    def fetch(self, request: FetchRequest, timeout_s: float | None = None) -> Any:
        raise AssertionError("not used")


def test_new_follower_truncates_its_divergent_tail_by_leader_epoch(tmp_path: Path) -> None:
    """Goal: a leader that appended records nobody replicated, then lost leadership, drops them
    when it follows the new leader. Method: both replicas hold 5 records of epoch 0; the old
    leader appends 3 more in epoch 0; the new leader starts epoch 1 at offset 5 and appends 2;
    the old leader, now a follower, truncates by epoch before fetching."""
    clock = FakeClock()
    old, new = make_partition(tmp_path, clock, 1), make_partition(tmp_path, clock, 2)
    old.make_leader(0, (1, 2), (1, 2))
    old.append_records_to_leader(keyed(0, 5), 1)
    new.make_follower(1, 0, (1, 2))
    new.append_as_follower(old.log.read(0, 1 << 20).batches, 5, leader_epoch=0)
    old.append_records_to_leader(keyed(100, 3), 1)  # the divergent tail
    new.make_leader(1, (1, 2), (2,))
    new.append_records_to_leader(keyed(200, 2), 1)
    old.make_follower(2, 1, (1, 2))
    fetcher = ReplicaFetcher(1, 2, "topic", lambda b: None)
    fetcher._truncate_by_epoch(_LeaderConn(new), _Fetching(old, 1))
    assert old.log.log_end_offset == 5
    assert records(old.log) == records(new.log)[:5]
    assert old.epochs.latest_epoch == 0


def test_follower_append_is_refused_after_the_leader_epoch_moved_on(tmp_path: Path) -> None:
    clock = FakeClock()
    leader, follower = make_partition(tmp_path, clock, 1), make_partition(tmp_path, clock, 2)
    leader.make_leader(0, (1, 2), (1, 2))
    leader.append_records_to_leader(keyed(0, 2), 1)
    follower.make_follower(1, 1, (1, 2))
    assert not follower.append_as_follower(leader.log.read(0, 1 << 20).batches, 2, 0)
    assert follower.log.log_end_offset == 0


# -- election rules ----------------------------------------------------------------------------


def test_election_picks_the_first_live_isr_member_and_bumps_the_epoch() -> None:
    st = PartitionState(1, 4, (1, 2, 3))
    assert next_state(st, (1, 2, 3), frozenset({2, 3}), 7) == PartitionState(2, 5, (2, 3), 7)
    assert next_state(st, (1, 2, 3), frozenset({1, 2, 3}), 7) is None


def test_no_unclean_election_unless_enabled() -> None:
    st = PartitionState(1, 4, (1,))
    offline = next_state(st, (1, 2), frozenset({2}), 7)
    assert offline == PartitionState(-1, 5, (1,), 7)
    assert next_state(offline, (1, 2), frozenset({2}), 7) is None
    assert next_state(st, (1, 2), frozenset({2}), 7, unclean=True) == PartitionState(
        2, 5, (2,), 7)
    assert next_state(offline, (1, 2), frozenset({1, 2}), 7) == PartitionState(1, 6, (1,), 7)


def test_preferred_replica_leads_again_once_in_the_isr() -> None:
    st = PartitionState(2, 5, (2, 3))
    assert next_state(st, (1, 2, 3), frozenset({1, 2, 3}), 7) is None
    st = PartitionState(2, 5, (1, 2, 3))
    assert next_state(st, (1, 2, 3), frozenset({1, 2, 3}), 7) == PartitionState(
        1, 6, (1, 2, 3), 7)


def test_controlled_shutdown_moves_leadership_unless_no_one_can_take_it() -> None:
    st = PartitionState(1, 2, (1, 2))
    assert next_state(st, (1, 2), frozenset({1, 2}), 3, shutting_down=frozenset({1})) == \
        PartitionState(2, 3, (2,), 3)
    alone = PartitionState(1, 2, (1,))
    assert next_state(alone, (1, 2), frozenset({1, 2}), 3, shutting_down=frozenset({1})) is None


def test_isr_change_must_come_from_the_current_leader_epoch() -> None:
    st = PartitionState(1, 4, (1, 2))
    check_isr_change(st, (1, 2, 3), frozenset({1, 2, 3}), 1, 4, (1, 2, 3))
    with pytest.raises(FencedLeaderEpochError):
        check_isr_change(st, (1, 2, 3), frozenset({1, 2, 3}), 1, 3, (1,))
    with pytest.raises(NotLeaderOrFollowerError):
        check_isr_change(st, (1, 2, 3), frozenset({1, 2, 3}), 2, 4, (2,))
    with pytest.raises(InvalidRequestError):
        check_isr_change(st, (1, 2, 3), frozenset({1, 2}), 1, 4, (1, 2, 3))
