"""One partition replica on this broker: its role, leader epoch, ISR and high watermark.

Owns: the leader's view of replication (follower log end offsets, the ISR, advancing the high
watermark to the smallest log end offset in the ISR), waiting for acks, proposing ISR changes,
the follower's appends and its truncation by leader epoch, and the leader-epoch cache. Kafka's
rules: the high watermark never moves back while this broker leads; acks=all needs every ISR
member and at least ``min_insync_replicas`` of them; the ISR changes only once the controller
has committed the change (``alter_isr`` proposes, ``apply_isr`` commits), and until then the
high watermark counts the larger of the two sets (Kafka's "maximal ISR"), so an offset below it
is on every replica that could become leader. Must not: know about the network or ZooKeeper;
time comes from the injected clock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from logstore.clock import Clock
from logstore.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from logstore.model import TopicPartition
from logstore.produced import ProducerData
from logstore.records import ControlType, StoredBatch
from logstore.replication.epoch_cache import LeaderEpochCache
from logstore.segments.log import Log
from logstore.segments.producer_state import VerificationGuard
from logstore.segments.results import AppendInfo

log = logging.getLogger(__name__)

# (partition, leader epoch, proposed ISR): hands a proposal to whoever sends it to the
# controller; the answer comes back through Partition.apply_isr / isr_change_failed.
IsrProposer = Callable[["Partition", int, frozenset[int]], None]
MAX_BEHIND = 1024  # (leader LEO, time) points kept per follower
# (old ISR, new ISR), after the controller committed a change (the broker counts them).
IsrListener = Callable[[frozenset[int], frozenset[int]], None]


@dataclass(frozen=True, slots=True)
class PendingAppend:
    """An append that is on disk (maybe not yet fsynced or replicated)."""

    partition: Partition
    info: AppendInfo
    required_acks: int

    def wait(self, timeout_ms: int) -> AppendInfo:
        self.partition.complete_append(self.info, self.required_acks, timeout_ms)
        return self.info


@dataclass
class FollowerState:
    log_end_offset: int = 0
    last_caught_up_ms: float = 0.0
    # (leader log end offset, when) at the follower's earlier fetches or acknowledgements, not
    # yet reached by it: once it has an offset, it was caught up as of that time (Kafka's
    # rule, for a follower that pipelines and so never acknowledges the leader's LEO of now).
    behind: deque[tuple[int, float]] = field(default_factory=deque)

    def fetched(self, offset: int, leader_end_offset: int, now: float) -> None:
        """The follower has everything below ``offset``, at ``now``."""
        self.log_end_offset = offset
        if offset >= leader_end_offset:
            self.last_caught_up_ms = now
            self.behind.clear()
            return
        while self.behind and self.behind[0][0] <= offset:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.behind.popleft()[1])
        if len(self.behind) >= MAX_BEHIND:
            self.behind.popleft()
        self.behind.append((leader_end_offset, now))


def _no_proposals(partition: Partition, epoch: int, isr: frozenset[int]) -> None:
    partition.apply_isr(epoch, isr)  # embedded mode: no controller to ask


class Partition:
    """A replica of one partition; a leader tracks its followers, a follower only its log."""

    def __init__(self, tp: TopicPartition, log_: Log, broker_id: int, clock: Clock,
                 on_high_watermark: Callable[[TopicPartition], None],
                 propose_isr: IsrProposer | None = None,
                 on_isr_change: IsrListener | None = None) -> None:
        self.tp = tp
        self.log = log_
        self.broker_id = broker_id
        self._clock = clock
        self._on_high_watermark = on_high_watermark
        self._propose_isr = propose_isr or _no_proposals
        self._on_isr_change = on_isr_change
        self._lock = threading.Condition()
        self.leader_id = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self._pending_isr: frozenset[int] | None = None
        self._followers: dict[int, FollowerState] = {}
        self.epochs = LeaderEpochCache(log_.dir)
        self.epochs.truncate_from_end(log_.log_end_offset)  # recovery may have cut the tail

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def topic_id(self) -> str | None:
        """The topic incarnation this replica's log belongs to (None: not known)."""
        return self.log.topic_id

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | (self._pending_isr or frozenset())

    # -- role changes --------------------------------------------------------------------------

    def make_leader(self, leader_epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...]
                    ) -> None:
        with self._lock:
            now = self._clock.monotonic_ms()
            self.leader_id, self.leader_epoch = self.broker_id, leader_epoch
            self.replicas, self.isr = replicas, frozenset(isr) | {self.broker_id}
            self._pending_isr = None
            self._followers = {r: FollowerState(0, now) for r in replicas if r != self.broker_id}
            self.epochs.assign(leader_epoch, self.log.log_end_offset, durable=False)
            self._maybe_advance_high_watermark()
            self._lock.notify_all()
        log.info("%s: leader at epoch %d, isr %s", self.tp, leader_epoch, sorted(self.isr))

    def make_follower(self, leader_id: int, leader_epoch: int, replicas: tuple[int, ...]) -> None:
        with self._lock:
            self.leader_id, self.leader_epoch, self.replicas = leader_id, leader_epoch, replicas
            self.isr, self._followers, self._pending_isr = frozenset(), {}, None
            self._lock.notify_all()
        log.info("%s: follower of %d at epoch %d", self.tp, leader_id, leader_epoch)

    def check_leader_epoch(self, epoch: int) -> None:
        """For requests that name the leader epoch they expect (-1: any)."""
        if epoch < 0 or epoch == self.leader_epoch:
            return
        if epoch < self.leader_epoch:
            raise FencedLeaderEpochError(f"{self.tp}: epoch {epoch} is older than this "
                                         f"broker's {self.leader_epoch}")
        raise UnknownLeaderEpochError(f"{self.tp}: epoch {epoch} is newer than this broker's "
                                      f"{self.leader_epoch}")

    # -- the leader's side of produce ----------------------------------------------------------

    def append_records_to_leader(self, batch: ProducerData, required_acks: int,
                                 current_leader_epoch: int = -1, verify: bool = False,
                                 guard: VerificationGuard | None = None, **producer: int
                                 ) -> PendingAppend:
        """Append as leader now; the returned PendingAppend waits for the acknowledgement that
        ``required_acks`` asks for (durability with flush_ms=0, the ISR for acks=all), so a
        caller can append the next batch while earlier ones wait: group commit then covers
        every batch appended during one fsync, even from a single producer.
        ``current_leader_epoch`` is the epoch the producer saw (-1: unchecked); an older one
        is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, checked before leadership
        so a producer behind a leader change learns its metadata is stale."""
        with self._lock:
            self.check_leader_epoch(current_leader_epoch)
            self._require_leader()
            if required_acks == -1 and len(self.isr) < self.log.config.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{self.tp}: isr {sorted(self.isr)} is smaller than min_insync_replicas "
                    f"{self.log.config.min_insync_replicas}")
            epoch = self.leader_epoch
        self.epochs.make_durable()  # before any batch of the epoch
        info = self.log.append_as_leader(batch, leader_epoch=epoch, verify=verify, guard=guard,
                                         **producer)
        with self._lock:
            self._maybe_advance_high_watermark()
            followers = bool(self._followers)
        if followers:  # wake the followers' long-polling fetches: they read up to LEO
            self._on_high_watermark(self.tp)
        return PendingAppend(self, info, required_acks)

    def append_marker_to_leader(self, producer_id: int, producer_epoch: int,
                                marker: ControlType, coordinator_epoch: int) -> PendingAppend:
        """Append a transaction marker as leader (acks=all, as Kafka writes them); wait on the
        result for its acknowledgement."""
        with self._lock:
            self._require_leader()
            if len(self.isr) < self.log.config.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{self.tp}: isr {sorted(self.isr)} is smaller than min_insync_replicas "
                    f"{self.log.config.min_insync_replicas}")
            epoch = self.leader_epoch
        self.epochs.make_durable()
        info = self.log.append_control_marker(producer_id, producer_epoch, marker,
                                              coordinator_epoch, leader_epoch=epoch)
        with self._lock:
            self._maybe_advance_high_watermark()
            followers = bool(self._followers)
        if followers:
            self._on_high_watermark(self.tp)
        return PendingAppend(self, info, -1)

    def complete_append(self, info: AppendInfo, required_acks: int, timeout_ms: int) -> None:
        """Block until an append is acknowledged as ``required_acks`` asks."""
        if required_acks == 0:
            return
        if self.log.config.flush_ms == 0:
            self.log.flush_until(info.last_offset + 1)
        if required_acks == -1:
            self._wait_for_high_watermark(info.last_offset + 1, timeout_ms)

    def _wait_for_high_watermark(self, offset: int, timeout_ms: int) -> None:
        deadline = self._clock.monotonic_ms() + timeout_ms
        with self._lock:
            while self.log.high_watermark < offset:
                self._require_leader()
                remaining = deadline - self._clock.monotonic_ms()
                if remaining <= 0:
                    raise RequestTimedOutError(
                        f"{self.tp}: offset {offset - 1} not replicated to isr "
                        f"{sorted(self.isr)} within {timeout_ms} ms")
                self._lock.wait(remaining / 1000.0)
            if len(self.isr) < self.log.config.min_insync_replicas:
                raise NotEnoughReplicasAfterAppendError(
                    f"{self.tp}: written, but isr {sorted(self.isr)} shrank below "
                    f"min_insync_replicas {self.log.config.min_insync_replicas}")

    # -- the leader's side of replication ------------------------------------------------------

    def update_follower_fetch(self, follower_id: int, log_end_offset: int) -> None:
        """A follower fetched from ``log_end_offset``: everything below it is on its disk."""
        with self._lock:
            state = self._followers.get(follower_id)
            if state is None or not self.is_leader:
                return
            state.fetched(log_end_offset, self.log.log_end_offset, self._clock.monotonic_ms())
            self._maybe_expand_isr(follower_id, log_end_offset)
            self._maybe_advance_high_watermark()

    @property
    def epoch_start_offset(self) -> int:
        """Where the latest leader epoch this replica knows began (a leader's own epoch: its
        log end offset when it took over); 0 with no epoch known."""
        entries = self.epochs.entries
        return entries[-1].start_offset if entries else 0

    def check_end_known(self) -> None:
        """Raise OFFSET_NOT_AVAILABLE while this leader's high watermark is below the start of
        its epoch: it took over with an older high watermark than its predecessor's, and
        learns the real one as its followers fetch. Until then its end (or a record looked up
        past its high watermark) would show a client the log going backwards (Kafka's
        KAFKA-2334)."""
        start = self.epoch_start_offset
        if self.log.high_watermark < start:
            raise OffsetNotAvailableError(
                f"{self.tp}: leader {self.broker_id} at epoch {self.leader_epoch} has not yet "
                f"learned its high watermark ({self.log.high_watermark}, below the start of "
                f"its epoch at {start}); try again")

    def _maybe_expand_isr(self, follower_id: int, log_end_offset: int) -> None:
        # Kafka's rule: caught up to the high watermark, and to the start of this epoch, so a
        # member of the ISR always holds everything this leader acknowledged.
        if follower_id in self.isr or self._pending_isr is not None:
            return
        if log_end_offset >= max(self.log.high_watermark, self.epoch_start_offset):
            self._propose(self.isr | {follower_id})

    def maybe_shrink_isr(self, replica_lag_time_max_ms: int) -> frozenset[int] | None:
        """Propose dropping followers that have not caught up for the lag time; the proposed
        ISR, or None. The ISR itself changes when the controller commits (``apply_isr``)."""
        with self._lock:
            if not self.is_leader or self._pending_isr is not None:
                return None
            now = self._clock.monotonic_ms()
            lagging = {r for r in self.isr - {self.broker_id} if r in self._followers
                       and now - self._followers[r].last_caught_up_ms > replica_lag_time_max_ms}
            if not lagging:
                return None
            log.warning("%s: followers %s are out of sync; proposing isr %s", self.tp,
                        sorted(lagging), sorted(self.isr - lagging))
            return self._propose(self.isr - lagging)

    def _propose(self, isr: frozenset[int]) -> frozenset[int]:
        self._pending_isr = isr
        epoch = self.leader_epoch
        # Under the lock (a re-entrant one): the proposer only queues the proposal, or in
        # embedded mode applies it at once.
        self._propose_isr(self, epoch, isr)
        return isr

    def apply_isr(self, leader_epoch: int, isr: frozenset[int]) -> None:
        """The controller committed ``isr`` for ``leader_epoch``."""
        with self._lock:
            if not self.is_leader or leader_epoch != self.leader_epoch:
                return
            old = self.isr
            self.isr, self._pending_isr = frozenset(isr) | {self.broker_id}, None
            if self._on_isr_change is not None and self.isr != old:
                self._on_isr_change(old, self.isr)
            now = self._clock.monotonic_ms()
            for r in self.isr - {self.broker_id}:
                self._followers[r].last_caught_up_ms = max(
                    self._followers[r].last_caught_up_ms, now)
            log.info("%s: isr is now %s (epoch %d)", self.tp, sorted(self.isr), leader_epoch)
            self._maybe_advance_high_watermark()
            self._lock.notify_all()

    def isr_change_failed(self, leader_epoch: int) -> None:
        """The proposal was refused or lost; the next check may propose again."""
        with self._lock:
            if leader_epoch == self.leader_epoch:
                self._pending_isr = None

    def _maybe_advance_high_watermark(self) -> None:
        ends = [self.log.log_end_offset]
        ends += [self._followers[r].log_end_offset for r in self.maximal_isr
                 if r in self._followers]
        new_hw = min(ends)
        if new_hw > self.log.high_watermark:
            self.log.update_high_watermark(new_hw)
            self._lock.notify_all()
            self._on_high_watermark(self.tp)

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.tp} "
                f"(leader {self.leader_id}, epoch {self.leader_epoch})")

    # -- the follower's side -------------------------------------------------------------------

    def append_as_follower(self, batches: list[StoredBatch], leader_high_watermark: int,
                           leader_epoch: int) -> bool:
        """Append batches fetched from the leader of ``leader_epoch`` and learn its high
        watermark; False (nothing done) if this replica no longer follows that leader."""
        with self._lock:
            if self.is_leader or leader_epoch != self.leader_epoch:
                return False
            for b in batches:
                if b.header.leader_epoch > self.epochs.latest_epoch:
                    self.epochs.assign(b.header.leader_epoch, b.header.base_offset)
            self.log.append_as_follower(batches)
            self.log.update_high_watermark(min(leader_high_watermark, self.log.log_end_offset))
        if batches:
            self._on_high_watermark(self.tp)
        return True

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetsForLeaderEpoch answers (see epoch_cache.py)."""
        return self.epochs.end_offset_for(epoch, self.log.log_end_offset)

    def truncate_to(self, offset: int) -> None:
        self.log.truncate_to(offset)
        self.epochs.truncate_from_end(self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)
        self.epochs.clear_and_start_at(-1, offset)

    # -- the follower's side of a tiered partition ---------------------------------------------

    def restart_at_leader_local_start(self, offset: int, epochs: list[tuple[int, int]],
                                      leader_epoch: int) -> bool:
        """Kafka's answer to OFFSET_MOVED_TO_TIERED_STORAGE: what this replica lacks below the
        leader's local log start ``offset`` is in the remote tier, so the log restarts empty at
        ``offset`` with the leader's leader-epoch entries up to it (``epochs``), which the
        lineage checks of a later leadership need. False (nothing done) if this replica no
        longer follows the leader of ``leader_epoch``."""
        with self._lock:
            if self.is_leader or leader_epoch != self.leader_epoch:
                return False
            self.log.truncate_fully_and_start_at(offset)
            self.epochs.reset([(e, s) for e, s in epochs if s <= offset])
        log.warning("%s: restarted the log at the leader's local log start offset %d (below it "
                    "is the remote tier); leader epochs %s", self.tp, offset, epochs)
        return True

    def follow_leader_local_log_start(self, offset: int) -> None:
        """A tiered partition's follower deletes what its leader deleted locally (copied and
        past local retention), up to its own high watermark."""
        target = min(offset, self.log.high_watermark)
        if target > self.log.log_start_offset:
            self.log.maybe_increment_log_start_offset(target)
            self.log.delete_old_segments()
