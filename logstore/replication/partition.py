"""One partition replica on this broker: its role, leader epoch, ISR and high watermark.

Owns: the leader's view of replication (follower log end offsets, the ISR, advancing the high
watermark to the smallest log end offset in the ISR) and waiting for acks. Kafka's rules: the
high watermark never moves back while this broker leads; acks=all needs every ISR member and at
least ``min_insync_replicas`` of them. Must not: know about the network or ZooKeeper; time comes
from the injected clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from logstore.clock import Clock
from logstore.errors import (
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)
from logstore.model import TopicPartition
from logstore.segments.log import AppendInfo, Log

log = logging.getLogger(__name__)


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


class Partition:
    """A replica of one partition; a leader tracks its followers, a follower only its log."""

    def __init__(self, tp: TopicPartition, log_: Log, broker_id: int, clock: Clock,
                 on_high_watermark: Callable[[TopicPartition], None]) -> None:
        self.tp = tp
        self.log = log_
        self.broker_id = broker_id
        self._clock = clock
        self._on_high_watermark = on_high_watermark
        self._lock = threading.Condition()
        self.leader_id = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self._followers: dict[int, FollowerState] = {}

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    def make_leader(self, leader_epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...]
                    ) -> None:
        with self._lock:
            now = self._clock.monotonic_ms()
            self.leader_id, self.leader_epoch = self.broker_id, leader_epoch
            self.replicas, self.isr = replicas, frozenset(isr) | {self.broker_id}
            self._followers = {r: FollowerState(0, now) for r in replicas if r != self.broker_id}
            self._maybe_advance_high_watermark()
        log.info("%s: leader at epoch %d, isr %s", self.tp, leader_epoch, sorted(self.isr))

    def make_follower(self, leader_id: int, leader_epoch: int, replicas: tuple[int, ...]) -> None:
        with self._lock:
            self.leader_id, self.leader_epoch, self.replicas = leader_id, leader_epoch, replicas
            self.isr, self._followers = frozenset(), {}
            self._lock.notify_all()

    def append_records_to_leader(self, batch: pa.RecordBatch, required_acks: int,
                                 **producer: int) -> PendingAppend:
        """Append as leader now; the returned PendingAppend waits for the acknowledgement that
        ``required_acks`` asks for (durability with flush_ms=0, the ISR for acks=all), so a
        caller can append the next batch while earlier ones wait: group commit then covers
        every batch appended during one fsync, even from a single producer."""
        with self._lock:
            self._require_leader()
            if required_acks == -1 and len(self.isr) < self.log.config.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{self.tp}: isr {sorted(self.isr)} is smaller than min_insync_replicas "
                    f"{self.log.config.min_insync_replicas}")
            epoch = self.leader_epoch
        info = self.log.append_as_leader(batch, leader_epoch=epoch, **producer)
        with self._lock:
            self._maybe_advance_high_watermark()
        return PendingAppend(self, info, required_acks)

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

    def update_follower_fetch(self, follower_id: int, log_end_offset: int) -> None:
        """A follower fetched from ``log_end_offset``: everything below it is on its disk."""
        with self._lock:
            state = self._followers.get(follower_id)
            if state is None or not self.is_leader:
                return
            state.log_end_offset = log_end_offset
            if log_end_offset >= self.log.log_end_offset:
                state.last_caught_up_ms = self._clock.monotonic_ms()
            if follower_id not in self.isr and log_end_offset >= self.log.high_watermark:
                self.isr = self.isr | {follower_id}
                log.info("%s: follower %d rejoined isr %s", self.tp, follower_id,
                         sorted(self.isr))
            self._maybe_advance_high_watermark()

    def maybe_shrink_isr(self, replica_lag_time_max_ms: int) -> frozenset[int] | None:
        """Drop followers that have not caught up for the lag time; the new ISR, or None."""
        with self._lock:
            if not self.is_leader:
                return None
            now = self._clock.monotonic_ms()
            lagging = {r for r in self.isr - {self.broker_id}
                       if now - self._followers[r].last_caught_up_ms > replica_lag_time_max_ms}
            if not lagging:
                return None
            self.isr = self.isr - lagging
            log.warning("%s: followers %s left the isr, now %s", self.tp, sorted(lagging),
                        sorted(self.isr))
            self._maybe_advance_high_watermark()
            self._lock.notify_all()
            return self.isr

    def _maybe_advance_high_watermark(self) -> None:
        ends = [self.log.log_end_offset]
        ends += [self._followers[r].log_end_offset for r in self.isr if r in self._followers]
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
