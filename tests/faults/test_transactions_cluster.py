"""Transactions survive broker failures on the three-broker cluster (real processes, real
ZooKeeper).

Goal:
- a transaction over 10 partitions on 3 brokers is all-or-none when its coordinator's broker
  is killed -9 at a random point (before, during or after the commit; 6 seeded rounds, 10
  with LOGSTORE_DEEP_FAULTS=1): once a new instance of the producer has initialised (which
  finishes or aborts whatever was left), read_committed readers see all of it or none, and
  all of it whenever the commit returned;
- a partition leader killed while the markers are on their way: the coordinator writes the
  marker to the new leader, and the transaction completes, all of it visible;
- a decided commit (PrepareCommit of prepared transactions, committed with_prepared) survives
  the kill -9 of its coordinator and is completed by the new one;
- zombie fencing across brokers: the old instance's writes never become visible.
Method: ``Cluster`` (tests/faults/cluster.py) with RF=3, min ISR 2 topics and a small
``__transaction_state`` (3 partitions, RF 3); the kill point and its delay come from the
``seed`` fixture (LOGSTORE_TEST_SEED replays), printed in every failure message; every wait is
bounded and polls a condition.
"""

from __future__ import annotations

import random
import signal
import threading
import uuid

import pyarrow as pa
import pytest

from logstore import Producer
from logstore.client.transactions import colocated_transactional_id
from logstore.errors import ApiError, ProducerFencedError
from logstore.messages.groups import KEY_TYPE_TRANSACTION, FindCoordinatorRequest
from logstore.model import TRANSACTION_STATE_TOPIC
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory
from tests.faults.cluster import FAILOVER_ERRORS, SESSION_TIMEOUT_MS, Cluster
from tests.helpers import WAIT_S, fault_rounds, wait_for
from tests.txn_reading import read_values

PARTITIONS = 10
PER_PARTITION = 10
STATE_PARTITIONS = 3
ROUNDS = fault_rounds(6, 10)
TXN_SETTINGS = {"transaction_state_log_num_partitions": STATE_PARTITIONS,
                "transaction_state_log_replication_factor": 3,
                "offsets_topic_num_partitions": 3, "offsets_topic_replication_factor": 3,
                "transaction_abort_timed_out_transaction_cleanup_interval_ms": 200}
FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + WAIT_S


def coordinator_of(cluster: Cluster, tid: str) -> int:
    def ask() -> int | None:
        conn = BrokerConnection(cluster.live_bootstrap()[0], timeout_s=5)
        try:
            found = conn.call(FindCoordinatorRequest(group_id=tid,
                                                     key_type=KEY_TYPE_TRANSACTION))
        finally:
            conn.close()
        live = found.node_id in cluster.brokers and cluster.brokers[found.node_id].running
        return found.node_id if found.error_code == 0 and live else None
    return int(wait_for(ask, f"the coordinator of {tid}", FAILOVER_S, FAILOVER_ERRORS))


def producer(cluster: Cluster, tid: str, **settings: object) -> Producer:
    p = Producer(cluster.bootstrap, transactional_id=tid, linger_ms=1,
                 request_timeout_ms=10_000, **settings)  # type: ignore[arg-type]
    p.init_transactions()
    return p


def write_everywhere(p: Producer, topic: str, tag: str) -> None:
    """PER_PARTITION records of ``tag`` to every partition, acknowledged."""
    for partition in range(PARTITIONS):
        p.send_batch(topic, pa.table({"value": [f"{tag}:{i}".encode()
                                                for i in range(PER_PARTITION)]}),
                     partition=partition)
    p.flush(60)


def visible(cluster: Cluster, topic: str, tag: str) -> int:
    """How many of ``tag``'s records read_committed readers see."""
    values = read_values(cluster.live_bootstrap(), topic, range(PARTITIONS), timeout_s=FAILOVER_S)
    return sum(v.startswith(f"{tag}:".encode()) for vs in values.values() for v in vs)


def heal(cluster: Cluster, topic: str) -> None:
    """Every broker running, every partition of ``topic`` and of the state topic in full
    ISR, so the next round starts from a whole cluster."""
    for b in cluster.brokers.values():
        if not b.running:
            b.start()
    for t, n in ((topic, PARTITIONS), (TRANSACTION_STATE_TOPIC, STATE_PARTITIONS)):
        for p in range(n):
            cluster.wait_for_isr(t, p, 3, timeout_s=FAILOVER_S)


def test_a_transaction_is_all_or_none_when_its_coordinator_is_killed(
        broker_factory: BrokerFactory, zk_connect: str, seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(broker_factory, zk_connect, **TXN_SETTINGS)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    for round_ in range(ROUNDS):
        tid = f"round-{round_}-{uuid.uuid4().hex[:6]}"
        point, delay_s = rng.choice(["before", "during", "after"]), rng.uniform(0, 0.05)
        where = f"seed {seed}, round {round_}, kill {point} the commit (+{delay_s:.3f} s)"
        p = producer(cluster, tid)
        victim = cluster.brokers[coordinator_of(cluster, tid)]
        p.begin_transaction()
        write_everywhere(p, topic, tid)
        kill = threading.Timer(delay_s, victim.kill, (signal.SIGKILL,))
        if point == "before":
            victim.kill(signal.SIGKILL)
        elif point == "during":
            kill.start()
        committed = _commit(p, point == "after" and victim)
        if kill.is_alive() or point == "during":
            kill.join()
        heal(cluster, topic)
        with producer(cluster, tid):  # a new instance finishes or aborts what was left
            pass
        seen = visible(cluster, topic, tid)
        assert seen in (0, PARTITIONS * PER_PARTITION), f"{where}: {seen} records visible"
        if committed:
            assert seen == PARTITIONS * PER_PARTITION, f"{where}: committed, {seen} visible"


def _commit(p: Producer, then_kill: object) -> bool:
    """Commit; True if it returned. ``then_kill``: a broker to kill right after."""
    try:
        p.commit_transaction()
        return True
    except (ApiError, OSError):
        return False
    finally:
        if then_kill:
            then_kill.kill(signal.SIGKILL)  # type: ignore[attr-defined]
        p.close(5)


def test_a_partition_leader_killed_during_the_markers_gets_its_marker_from_the_new_leader(
        broker_factory: BrokerFactory, zk_connect: str, seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(broker_factory, zk_connect, **TXN_SETTINGS)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    tid = f"leader-{uuid.uuid4().hex[:6]}"
    p = producer(cluster, tid)
    coordinator = coordinator_of(cluster, tid)
    leaders = {cluster.describe(topic, q).leader for q in range(PARTITIONS)} - {coordinator}
    victim = cluster.brokers[rng.choice(sorted(leaders))]
    p.begin_transaction()
    write_everywhere(p, topic, tid)
    kill = threading.Timer(rng.uniform(0, 0.02), victim.kill, (signal.SIGKILL,))
    kill.start()
    p.commit_transaction()  # the markers to the dead leader's partitions are retried
    kill.join()
    p.close()
    assert visible(cluster, topic, tid) == PARTITIONS * PER_PARTITION, f"seed {seed}"
    heal(cluster, topic)


def test_a_decided_commit_survives_its_coordinators_kill_and_completes(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Method: two prepared transactions committed with_prepared by a third producer; one
    data partition's leader is frozen (SIGSTOP) so the markers cannot all land; once the
    coordinator shows PrepareCommit it is killed -9, the frozen broker thawed, the killed one
    restarted: the new coordinator completes all three."""
    cluster = Cluster(broker_factory, zk_connect, **TXN_SETTINGS)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    sink = f"sink-{uuid.uuid4().hex[:6]}"
    ids = [colocated_transactional_id(sink, f"{sink}-{i}", STATE_PARTITIONS) for i in range(2)]
    states = []
    for i, tid in enumerate(ids):
        with producer(cluster, tid, transaction_two_phase_commit=True) as task:
            task.begin_transaction()
            write_everywhere(task, topic, f"task{i}")
            states.append(task.prepare_transaction())
    coordinator = coordinator_of(cluster, sink)
    frozen = next(b for b in sorted({cluster.describe(topic, q).leader
                                     for q in range(PARTITIONS)}) if b != coordinator)
    driver = producer(cluster, sink)
    driver.begin_transaction()
    write_everywhere(driver, topic, "driver")
    cluster.freeze(frozen)
    outcome: list[object] = []
    committing = threading.Thread(target=lambda: outcome.append(_try_commit(driver, states)))
    committing.start()
    with cluster.admin() as admin:
        wait_for(lambda: admin.describe_transactions([sink])[0].state == "PrepareCommit",
                 "the decision to be durable", FAILOVER_S, FAILOVER_ERRORS)
    cluster.brokers[coordinator].kill(signal.SIGKILL)
    cluster.thaw(frozen)
    committing.join(FAILOVER_S)
    cluster.brokers[coordinator].start()
    with cluster.admin() as admin:
        wait_for(lambda: {d.state for d in admin.describe_transactions([sink, *ids])}
                 == {"CompleteCommit"}, "the new coordinator to complete them",
                 2 * FAILOVER_S, FAILOVER_ERRORS)
    driver.close(5)
    for tag in ("task0", "task1", "driver"):
        assert visible(cluster, topic, tag) == PARTITIONS * PER_PARTITION, (tag, outcome)


def _try_commit(p: Producer, states: list[object]) -> object:
    try:
        p.commit_transaction(with_prepared=states)  # type: ignore[arg-type]
        return "committed"
    except (ApiError, OSError) as e:
        return e


def test_a_zombie_writes_nothing_visible_across_brokers(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    cluster = Cluster(broker_factory, zk_connect, **TXN_SETTINGS)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    tid = f"zombie-{uuid.uuid4().hex[:6]}"
    old = producer(cluster, tid)
    old.begin_transaction()
    write_everywhere(old, topic, "zombie")
    with producer(cluster, tid) as new:
        new.begin_transaction()
        write_everywhere(new, topic, "new")
        new.commit_transaction()
    late = old.send(topic, value=b"zombie:late", partition=0)  # a partition of its txn
    with pytest.raises(ProducerFencedError, match=tid):
        late.result(30)
    with pytest.raises(ProducerFencedError, match=tid):
        old.commit_transaction()
    old.close(5)
    assert visible(cluster, topic, "zombie") == 0
    assert visible(cluster, topic, "new") == PARTITIONS * PER_PARTITION
