"""Controlled shutdown on three real broker processes and a real ZooKeeper: a leader stopped
with SIGTERM hands its partitions to other ISR members before it leaves, while acks=all writes
go on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from logstore.controller import zk_paths as zp
from logstore.controller.store import PartitionState
from logstore.messages.topics import MetadataRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, bounded_producer
from tests.faults.cluster import FAILOVER_ERRORS, Cluster, consume_partitions
from tests.helpers import wait_for
from tests.zookeeper import zk_client

PARTITIONS = 3
FLUSH_EVERY = 100
AFTER_EXIT_ACKS = 300


class ZkEvents:
    """Watches on the partitions' state znodes and on one broker's registration, recorded in
    the order ZooKeeper delivered them (one client: notifications arrive in zxid order)."""

    def __init__(self, zk: Any, topic: str, broker_id: int) -> None:
        self.events: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        for p in range(PARTITIONS):
            zk.DataWatch(zp.partition_state_path(topic, p), self._state_watcher(p))
        zk.DataWatch(zp.broker_path(broker_id), self._on_broker)

    def _state_watcher(self, p: int) -> Any:
        def on_state(data: bytes | None, _stat: Any) -> None:
            if data is not None:
                self._record(f"state-{p}", zp.decode_partition_state(data))
        return on_state

    def _on_broker(self, data: bytes | None, _stat: Any) -> None:
        self._record("registered", data is not None)

    def _record(self, kind: str, value: Any) -> None:
        with self._lock:
            self.events.append((kind, value))

    def first(self, kind: str, predicate: Any) -> int:
        """Index of the first event of ``kind`` whose value satisfies ``predicate``, else -1."""
        with self._lock:
            return next((i for i, (k, v) in enumerate(self.events)
                         if k == kind and predicate(v)), -1)


@contextmanager
def producing(cluster: Cluster, topic: str) -> Iterator[dict[str, Any]]:
    """An acks=all producer sending round-robin over the partitions on a thread until the
    block ends; yields its progress: ``futures`` per partition and ``sent``."""
    progress: dict[str, Any] = {"futures": {p: [] for p in range(PARTITIONS)}, "sent": 0}
    stop = threading.Event()

    def run() -> None:
        with bounded_producer(cluster.bootstrap, acks="all", delivery_timeout_ms=60_000,
                              linger_ms=1) as producer:
            while not stop.is_set():
                n, p = progress["sent"], progress["sent"] % PARTITIONS
                progress["futures"][p].append(
                    (b"%d" % n, producer.send(topic, value=b"%d" % n, partition=p)))
                progress["sent"] = n + 1
                if progress["sent"] % FLUSH_EVERY == 0:
                    producer.flush(60)
            producer.flush(60)

    thread = threading.Thread(target=run, name="acks-all-producer")
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive(), "the producer did not finish"


def _leaders_seen_by(cluster: Cluster, broker_id: int, topic: str) -> dict[int, int]:
    conn = BrokerConnection(cluster.brokers[broker_id].bootstrap, timeout_s=5)
    try:
        (t,) = conn.call(MetadataRequest(topics=[topic])).topics
    finally:
        conn.close()
    return {p.partition: p.leader for p in t.partitions}


def test_sigterm_moves_leadership_to_isr_members_before_the_leader_exits(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: a leader stopped with SIGTERM hands each partition it leads to another ISR member,
    with a new leader epoch, before it leaves the cluster, and acks=all writes running
    throughout lose nothing they had acknowledged (issue 4 §1, controlled shutdown).
    Method: three RF=3, min_insync_replicas=2 partitions (one led by each broker); a producer
    sends with acks=all on a thread; SIGTERM the leader of one partition that is not the
    controller. ZooKeeper watches, delivered in zxid order, must show the new leader before the
    victim's registration is deleted; the other brokers serve the new leaders once it exited;
    the producer gets acknowledgements from the new leaders; no send fails, and every
    acknowledged record is consumed in order."""
    cluster = Cluster(broker_factory, zk_connect)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    controller = cluster.controller_id()
    before = {p: cluster.describe(topic, p) for p in range(PARTITIONS)}
    victim = next(d.leader for d in before.values() if d.leader != controller)
    led = [p for p, d in before.items() if d.leader == victim]
    with zk_client(zk_connect) as zk, producing(cluster, topic) as progress:
        old = {p: zp.decode_partition_state(zk.get(zp.partition_state_path(topic, p))[0])
               for p in led}
        events = ZkEvents(zk, topic, victim)
        wait_for(lambda: progress["sent"] >= 2 * FLUSH_EVERY, "the producer to get going")
        assert cluster.brokers[victim].stop() == 0, cluster.brokers[victim].stderr_tail()
        sent_at_exit = progress["sent"]
        left = wait_for(lambda: (i := events.first("registered", lambda v: not v)) >= 0 and i,
                        f"broker {victim}'s registration to go")
        for p in led:
            moved = events.first(f"state-{p}", lambda s, p=p: _moved(old[p], s, victim))
            assert 0 <= moved < left, (p, events.events)
        for b in (b for b in cluster.brokers if b != victim):
            seen = wait_for(lambda b=b: (s := _leaders_seen_by(cluster, b, topic)) and all(
                s[p] not in (-1, victim) for p in led) and s, f"broker {b}'s new leaders",
                tolerate=FAILOVER_ERRORS)
            assert all(seen[p] in old[p].isr for p in led), seen
        wait_for(lambda: progress["sent"] >= sent_at_exit + AFTER_EXIT_ACKS,
                 "sends after the exit")
    for p in led:
        assert any(int(v) >= sent_at_exit and f.exception(0) is None
                   for v, f in progress["futures"][p]), f"no ack from {p}'s new leader"
    failed = [(v, f.exception(0)) for fs in progress["futures"].values() for v, f in fs
              if f.exception(0) is not None]
    assert not failed, failed[:5]
    acked = {p: [v for v, _ in fs] for p, fs in progress["futures"].items()}
    consumed = consume_partitions(cluster, topic, sorted(acked))
    assert consumed == acked


def _moved(old: PartitionState, new: PartitionState, victim: int) -> bool:
    """The controller handed the partition to another member of its ISR, in a new epoch."""
    return new.leader != victim and new.leader in old.isr and \
        new.leader_epoch > old.leader_epoch and victim not in new.isr
