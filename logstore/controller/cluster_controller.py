"""The elected controller's duties: partition leadership across the cluster.

Owns: reacting (on its own thread) to metadata changes while this broker is the controller:
electing leaders when brokers die, shrinking the ISR, moving leadership back to preferred
replicas and away from brokers in controlled shutdown; answering ``alter_isr`` from leaders
and ``controlled_shutdown`` from brokers; and telling brokers about every partition state they
have not been told yet (``leader_and_isr`` carrying the controller epoch, and per partition
the id of the topic incarnation its state is for). Every write is the
store's conditional ``set_partition_state``, fenced by the controller epoch.
Must not: touch logs, or reach the network but through the injected ``notify``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from logstore.controller.partition_election import check_isr_change, next_state
from logstore.controller.store import MetadataStore, PartitionState, TopicRecord
from logstore.errors import (
    InconsistentTopicIdError,
    NotControllerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from logstore.messages.cluster import LeaderAndIsrPartition, LeaderAndIsrRequest

log = logging.getLogger(__name__)

# (broker id, leader_and_isr request): delivers it to that broker (asynchronously).
Notify = Callable[[int, LeaderAndIsrRequest], None]
Key = tuple[str, int]
WRITE_ATTEMPTS = 5
IDLE_RECHECK_S = 5.0


class ClusterController:
    def __init__(self, store: MetadataStore, broker_id: int, notify: Notify) -> None:
        self._store = store
        self._broker_id = broker_id
        self._notify = notify
        self._lock = threading.RLock()
        self._epoch = 0
        self._active = False
        # What each partition's brokers were last told: its topic id and state.
        self._told: dict[Key, tuple[str, PartitionState]] = {}
        self._live_told: frozenset[int] = frozenset()
        self._shutting_down: set[int] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)

    @property
    def epoch(self) -> int:
        return self._epoch

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- election and events -------------------------------------------------------------------

    def on_elected(self, epoch: int) -> None:
        with self._lock:
            self._epoch, self._active = epoch, True
            self._told, self._live_told, self._shutting_down = {}, frozenset(), set()
        self._wake.set()

    def on_resigned(self) -> None:
        with self._lock:
            self._active = False

    def on_metadata_change(self) -> None:
        if self._active:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(IDLE_RECHECK_S)
            self._wake.clear()
            if self._stop.is_set() or not self._active:
                continue
            try:
                self.reconcile()
            except Exception:  # boundary: the next change or recheck tries again
                log.exception("controller %d: reconciling failed", self._broker_id)
                self._stop.wait(0.2)
                self._wake.set()

    # -- reconciling ---------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Bring every partition to the state the election rules want, then tell brokers."""
        with self._lock:
            if not self._active:
                return
            live = frozenset(self._store.brokers())
            self._shutting_down &= live  # gone now; when it registers again it is back
            for name, record in self._store.topics().items():
                states = self._store.partition_states(name)
                for p, replicas in record.replicas.items():
                    if p in states:
                        self._elect(name, p, states[p], replicas, record, live)
            self._tell_brokers(live)

    def _elect(self, topic: str, p: int, state: PartitionState, replicas: tuple[int, ...],
               record: TopicRecord, live: frozenset[int]) -> None:
        unclean = bool(record.config.get("unclean_leader_election_enable", False))
        new = next_state(state, replicas, live, self._epoch, unclean,
                         frozenset(self._shutting_down))
        if new is None:
            return
        if self._store.set_partition_state(topic, p, new, expected_epoch=state.leader_epoch):
            log.info("controller %d: %s-%d leader %d -> %d, epoch %d, isr %s", self._broker_id,
                     topic, p, state.leader, new.leader, new.leader_epoch, list(new.isr))
        else:
            self._wake.set()  # lost a race (an alter_isr): look again

    def _tell_brokers(self, live: frozenset[int]) -> None:
        """Send each live broker the states of its partitions it has not been sent (all of
        them to a broker that just came back)."""
        returned = live - self._live_told
        per_broker: dict[int, list[LeaderAndIsrPartition]] = {}
        told: dict[Key, tuple[str, PartitionState]] = {}
        for name, record in self._store.topics().items():
            states = self._store.partition_states(name)
            for p, replicas in record.replicas.items():
                st = states.get(p)
                if st is None:
                    continue
                # A topic created again under its name starts with its first state, maybe
                # the old one's: it is news all the same.
                told[(name, p)] = (record.topic_id, st)
                fresh = self._told.get((name, p)) != (record.topic_id, st)
                entry = LeaderAndIsrPartition(
                    topic=name, partition=p, leader=st.leader, leader_epoch=st.leader_epoch,
                    isr=list(st.isr), controller_epoch=st.controller_epoch,
                    replicas=list(replicas), topic_id=record.topic_id)
                for b in replicas:
                    if b in live and (fresh or b in returned):
                        per_broker.setdefault(b, []).append(entry)
        self._told, self._live_told = told, live
        for b, entries in per_broker.items():
            self._notify(b, LeaderAndIsrRequest(controller_id=self._broker_id,
                                                controller_epoch=self._epoch, partitions=entries))

    # -- requests from brokers ------------------------------------------------------------------

    def alter_isr(self, broker_id: int, topic: str, partition: int, leader_epoch: int,
                  isr: tuple[int, ...], topic_id: str | None = None) -> PartitionState:
        """A leader's ISR change; the committed state (or ApiError). ``topic_id``: the leader's
        replica's (None: unchecked); another than the topic's is INCONSISTENT_TOPIC_ID, as
        Kafka's AlterPartition: a replica of a deleted topic says nothing of the one created
        again under its name, whose first leader epoch is the same 0."""
        with self._lock:
            self._require_active()
            for _ in range(WRITE_ATTEMPTS):
                state, replicas = self._current(topic, partition, topic_id)
                eligible = frozenset(self._store.brokers()) - self._shutting_down
                check_isr_change(state, replicas, eligible, broker_id, leader_epoch, isr)
                if set(isr) == set(state.isr):
                    return state
                new = PartitionState(state.leader, state.leader_epoch, tuple(sorted(isr)),
                                     self._epoch)
                if self._store.set_partition_state(topic, partition, new, state.leader_epoch):
                    self._wake.set()
                    return new
        raise RequestTimedOutError(f"{topic}-{partition}: isr change lost {WRITE_ATTEMPTS} races")

    def controlled_shutdown(self, broker_id: int) -> list[str]:
        """Move leadership (and ISR membership) away from ``broker_id``; the partitions it
        still leads afterwards (empty: it may go)."""
        with self._lock:
            self._require_active()
            self._shutting_down.add(broker_id)
            self.reconcile()
            others = frozenset(self._store.brokers()) - self._shutting_down
            return [f"{name}-{p}" for name in self._store.topics()
                    for p, st in self._store.partition_states(name).items()
                    if st.leader == broker_id and set(st.isr) & others]

    def _current(self, topic: str, partition: int, topic_id: str | None = None
                 ) -> tuple[PartitionState, tuple[int, ...]]:
        record = self._store.topics().get(topic)
        state = self._store.partition_states(topic).get(partition)
        if record is None or state is None or partition not in record.replicas:
            raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
        if topic_id is not None and record.topic_id and topic_id != record.topic_id:
            raise InconsistentTopicIdError(
                f"{topic}-{partition}: the ISR change is for topic id {topic_id}, but "
                f"{topic!r} is now topic id {record.topic_id} (deleted and created again)")
        return state, record.replicas[partition]

    def _require_active(self) -> None:
        if not self._active:
            raise NotControllerError(f"broker {self._broker_id} is not the controller")
