"""The leader's side of ISR changes: proposing them to the controller, and the lag check.

Owns: ``AlterIsrSender``, a thread that sends each queued proposal (``alter_isr``) to the
controller and hands the answer back to the partition (Kafka's AlterPartition: only the
controller writes partition state), and ``IsrExpirer``, a thread that asks every led partition
to drop followers lagging longer than ``replica_lag_time_max_ms``. Must not: import the
transport or ZooKeeper (the controller is reached through the injected ``send``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from logstore.errors import ApiError
from logstore.messages.cluster import AlterIsrRequest, AlterIsrResponse
from logstore.replication.partition import Partition

log = logging.getLogger(__name__)

# A request -> the controller's response; raises ApiError when it cannot be reached.
SendToController = Callable[[AlterIsrRequest], AlterIsrResponse]
_STOP = None


class AlterIsrSender:
    def __init__(self, broker_id: int, send: SendToController) -> None:
        self._broker_id = broker_id
        self._send = send
        self._queue: queue.Queue[tuple[Partition, int, frozenset[int]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="alter-isr", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def propose(self, partition: Partition, leader_epoch: int, isr: frozenset[int]) -> None:
        """The ``IsrProposer`` partitions call (under their lock: only queues)."""
        self._queue.put((partition, leader_epoch, isr))

    def stop(self, timeout_s: float) -> None:
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            partition, epoch, isr = item
            try:
                self._send_one(partition, epoch, isr)
            except Exception as e:  # boundary: the next lag check or fetch proposes again
                log.warning("%s: alter_isr %s failed: %s", partition.tp, sorted(isr), e)
                partition.isr_change_failed(epoch)

    def _send_one(self, partition: Partition, epoch: int, isr: frozenset[int]) -> None:
        tp = partition.tp
        resp = self._send(AlterIsrRequest(broker_id=self._broker_id, topic=tp.topic,
                                          partition=tp.partition, leader_epoch=epoch,
                                          isr=sorted(isr), topic_id=partition.topic_id))
        resp.raise_error()
        partition.apply_isr(resp.leader_epoch, frozenset(resp.isr))


class IsrExpirer:
    """Every half lag time, ask each partition this broker leads to shrink its ISR."""

    def __init__(self, partitions: Callable[[], Iterable[Partition]],
                 replica_lag_time_max_ms: int) -> None:
        self._partitions = partitions
        self._lag_ms = replica_lag_time_max_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isr-expirer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._lag_ms / 2000.0):
            for p in self._partitions():
                try:
                    p.maybe_shrink_isr(self._lag_ms)
                except (ApiError, OSError) as e:  # boundary: one partition stays its own
                    log.warning("%s: isr check failed: %s", p.tp, e)
