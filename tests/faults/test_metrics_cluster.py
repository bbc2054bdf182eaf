"""Metrics of a three-broker cluster on a real ZooKeeper under faults: a stopped follower
(under-replicated partitions), a killed controller (the active controller), and lag of
partitions led by other brokers than the group's coordinator."""

from __future__ import annotations

import signal
import uuid

import pytest

from logstore import Admin, NewTopic, Producer, TopicPartition
from logstore.messages.metrics import DescribeBrokerMetricsResponse
from tests.brokers import BrokerFactory
from tests.faults.cluster import FAILOVER_ERRORS, Cluster
from tests.helpers import wait_for
from tests.scrape import scrape


@pytest.fixture
def cluster(broker_factory: BrokerFactory, zk_connect: str) -> Cluster:
    """Three brokers, each with a metrics endpoint on a port of its own choosing."""
    return Cluster(broker_factory, zk_connect, metrics_listener="127.0.0.1:0",
                   group_initial_rebalance_delay_ms=0)


def endpoints(cluster: Cluster) -> dict[int, str]:
    """Each broker's metrics address, as it answers describe_broker_metrics."""
    with cluster.admin() as admin:
        found = admin.describe_broker_metrics()
    assert all(isinstance(r, DescribeBrokerMetricsResponse) for r in found.values()), found
    return {b: r.metrics_listener for b, r in found.items()
            if isinstance(r, DescribeBrokerMetricsResponse) and r.metrics_listener}


def test_under_replicated_goes_to_one_while_a_follower_is_stopped_then_back_to_zero(
        cluster: Cluster) -> None:
    """Goal: the leader's endpoint reports an under-replicated partition exactly while a
    follower is out of the ISR, and counts the shrink and the expansion. Method: RF=3, one
    partition; SIGSTOP a follower that is not the controller and produce (so the leader
    notices it lagging); the leader's scrape shows 1 under-replicated partition (broker total
    and the partition's own series); SIGCONT; it goes back to 0, with one shrink and one
    expansion counted."""
    addresses = endpoints(cluster)
    topic = cluster.create_topic()
    leader = cluster.describe(topic).leader
    controller = cluster.controller_id()
    stopped = next(b for b in cluster.brokers if b not in (leader, controller))
    at_leader = addresses[leader]
    before = scrape(at_leader)
    shrinks = before.value("kafka_server_replicamanager_isrshrinks_total")
    expands = before.value("kafka_server_replicamanager_isrexpands_total")
    assert before.value("kafka_server_replicamanager_underreplicatedpartitions") == 0
    cluster.freeze(stopped)
    try:
        with Producer(cluster.live_bootstrap(), acks=1) as producer:
            producer.send(topic, value=b"while frozen", partition=0).result(30)
        s = wait_for(lambda: (s := scrape(at_leader)).value(
            "kafka_server_replicamanager_underreplicatedpartitions") == 1 and s,
            "one under-replicated partition on the leader")
        assert s.value("kafka_cluster_partition_underreplicated", topic=topic, partition=0) == 1
        assert s.value("kafka_server_replicamanager_isrshrinks_total") == shrinks + 1
    finally:
        cluster.thaw(stopped)
    s = wait_for(lambda: (s := scrape(at_leader)).value(
        "kafka_server_replicamanager_underreplicatedpartitions") == 0 and s,
        "no under-replicated partition once the follower is back")
    assert s.value("kafka_cluster_partition_underreplicated", topic=topic, partition=0) == 0
    assert s.value("kafka_server_replicamanager_isrexpands_total") == expands + 1


def test_exactly_one_broker_reports_the_active_controller_after_the_controller_is_killed(
        cluster: Cluster) -> None:
    """Goal: ActiveControllerCount summed over the cluster is 1, also after a failover.
    Method: scrape all three (exactly one reports 1, with the epoch it won); kill -9 the
    controller; wait until one of the two others reports 1, then check the other reports 0
    and the new controller's epoch is newer."""
    addresses = endpoints(cluster)
    name = "kafka_controller_kafkacontroller_activecontrollercount"
    epoch = "kafka_controller_kafkacontroller_controllerepoch"
    before = {b: scrape(a) for b, a in addresses.items()}
    active = [b for b, s in before.items() if s.value(name) == 1]
    assert len(active) == 1 and sum(s.value(name) for s in before.values()) == 1, before
    victim = active[0]
    cluster.brokers[victim].kill(signal.SIGKILL)
    live = {b: a for b, a in addresses.items() if b != victim}
    wait_for(lambda: any(scrape(a).value(name) == 1 for a in live.values()),
             "a new active controller", tolerate=FAILOVER_ERRORS)
    after = {b: scrape(a) for b, a in live.items()}
    assert sorted(s.value(name) for s in after.values()) == [0, 1]
    (winner,) = (s for s in after.values() if s.value(name) == 1)
    assert winner.value(epoch) > before[victim].value(epoch)
    assert winner.value("kafka_controller_kafkacontroller_offlinepartitionscount") == 0


def test_lag_of_partitions_led_by_other_brokers_is_asked_of_their_leaders(
        cluster: Cluster) -> None:
    """Goal: a coordinator exports the lag of partitions it does not lead. Method: three
    partitions of RF=1, so each lives on one broker and at most one on the coordinator; 10
    records each; the group commits offset 4 everywhere; Admin shows lag 6 and a lag in
    seconds for each, and the coordinator's endpoint the same offsets."""
    with cluster.admin() as admin:
        topic = f"lag-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 3, 1)])
        wait_for(lambda: all(p.leader >= 0 for p in admin.describe_topics([topic])[0]
                             .partitions), "leaders", tolerate=FAILOVER_ERRORS)
        leaders = {p.leader for p in admin.describe_topics([topic])[0].partitions}
    with Producer(cluster.bootstrap, acks="all") as producer:
        for p in range(3):
            for i in range(10):
                producer.send(topic, value=b"%d" % i, partition=p)
        producer.flush(30)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with Admin(cluster.bootstrap) as admin:
        admin.alter_group_offsets(group, {TopicPartition(topic, p): 4 for p in range(3)})
        lags = admin.list_consumer_group_lag(group)
    assert len(leaders) > 1, "the partitions should be spread over the brokers"
    assert {tp.partition: (p.committed_offset, p.log_end_offset, p.lag)
            for tp, p in lags.items()} == {p: (4, 10, 6) for p in range(3)}
    assert all(p.lag_seconds is not None and p.lag_seconds >= 0 for p in lags.values())
    found = [s for s in (scrape(a) for a in endpoints(cluster).values())
             if s.value("kafka_consumergroup_group_sum_lag", group=group) is not None]
    assert len(found) == 1, "one coordinator exports the group"
    assert found[0].value("kafka_consumergroup_group_sum_lag", group=group) == 18
