"""Admin and the ``logstore`` command on three real broker processes and a real ZooKeeper:
the cluster's brokers and controller, leaders, replicas and ISR of a replicated topic, and
partitions added to one."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from logstore import Consumer, TopicPartition
from tests.brokers import BrokerFactory, bounded_producer, subprocess_env
from tests.faults.cluster import Cluster

CLI_TIMEOUT_S = 60
CONSUME_TIMEOUT_S = 30.0
RACKS = {1: "r1", 2: "r2", 3: "r2"}


def logstore(bootstrap: str, *args: str) -> str:
    """Run the CLI as a user does, as a subprocess; its stdout, after a zero exit."""
    result = subprocess.run([sys.executable, "-m", "logstore", *args, "--bootstrap-server",
                             bootstrap], capture_output=True, text=True, env=subprocess_env(),
                            timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"
    return result.stdout


def fields(line: str) -> dict[str, str]:
    """``Name: value`` pairs of one tab-separated CLI line."""
    pairs = (part.partition(": ") for part in line.strip().split("\t") if ": " in part)
    return {name: value for name, _, value in pairs}


@pytest.fixture
def cluster(broker_factory: BrokerFactory, zk_connect: str) -> Cluster:
    return Cluster(broker_factory, zk_connect, racks=RACKS)


def test_describe_cluster_lists_brokers_with_racks_and_names_the_controller(
        cluster: Cluster) -> None:
    """Goal: Admin.describe_cluster and ``logstore cluster`` show every broker with its
    listener and rack, and which one is the controller. Method: three brokers with racks;
    compare the admin answer with the processes' ports, then parse the CLI's lines (asked of a
    broker that is not the controller) and check the mark is on the controller's line only."""
    controller = cluster.controller_id()
    with cluster.admin() as admin:
        described = admin.describe_cluster()
    assert described.controller_id == controller
    assert [(b.broker_id, b.port, b.rack) for b in described.brokers] == [
        (i, cluster.brokers[i].port, RACKS[i]) for i in (1, 2, 3)]
    other = next(b for i, b in cluster.brokers.items() if i != controller)
    header, *lines = logstore(other.bootstrap, "cluster").splitlines()
    assert fields(header) == {"Brokers": "3", "Controller": str(controller)}
    rows = {int(fields(line)["Broker"]): line for line in lines}
    assert sorted(rows) == [1, 2, 3]
    for i, line in rows.items():
        assert fields(line)["Listener"] == cluster.brokers[i].bootstrap
        assert fields(line)["Rack"] == RACKS[i]
        assert line.endswith("(controller)") == (i == controller), line


def test_topics_describe_shows_leader_replicas_and_isr_of_a_replicated_topic(
        cluster: Cluster) -> None:
    """Goal: ``logstore topics describe`` shows each partition's leader, replicas and ISR on a
    replicated topic, as the cluster has them. Method: an RF=3 topic of three partitions with a
    full ISR; each partition line of the CLI must name three distinct replicas, the ISR of all
    three, and the leader Admin reports, which is one of the replicas; leaders are spread."""
    topic = cluster.create_topic(partitions=3, rf=3)
    with cluster.admin() as admin:
        expected = {p.partition: p for p in admin.describe_topics([topic])[0].partitions}
    out = logstore(cluster.bootstrap[0], "topics", "describe", topic)
    lines = [fields(line) for line in out.splitlines() if "Partition:" in line]
    assert sorted(int(f["Partition"]) for f in lines) == [0, 1, 2]
    for f in lines:
        p = expected[int(f["Partition"])]
        replicas = [int(r) for r in f["Replicas"].split(",")]
        assert replicas == p.replicas and sorted(replicas) == [1, 2, 3]
        assert sorted(int(r) for r in f["Isr"].split(",")) == [1, 2, 3]
        assert int(f["Leader"]) == p.leader and p.leader in replicas
    assert len({f["Leader"] for f in lines}) == 3, out


def consume_partition(cluster: Cluster, tp: TopicPartition, expected: int) -> list[bytes]:
    """The values of one partition from offset 0, until ``expected`` arrived (bounded)."""
    values: list[bytes] = []
    with Consumer(cluster.live_bootstrap(), auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(values) < expected and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=300).values():
                values += table.column("value").to_pylist()
    return values


def test_partitions_added_to_a_replicated_topic_are_replicated_and_take_acks_all(
        cluster: Cluster) -> None:
    """Goal: create_partitions on an RF=3 topic gives the new partitions three replicas on
    distinct brokers, a leader and a full ISR, and they take acks=all writes that are then
    readable. Method: grow a one-partition RF=3, min_insync_replicas=2 topic to four
    partitions; wait for each new partition's ISR of three; produce with acks=all to each new
    partition and consume each back in full."""
    topic = cluster.create_topic(partitions=1, rf=3, min_insync_replicas=2)
    with cluster.admin() as admin:
        admin.create_partitions({topic: 4})
    described = [cluster.wait_for_isr(topic, p, 3) for p in (1, 2, 3)]
    for d in described:
        assert sorted(d.replicas) == [1, 2, 3] and d.leader in d.replicas, d
    assert len({d.leader for d in described}) == 3, described
    with bounded_producer(cluster.bootstrap, acks="all") as producer:
        futures = {p: [producer.send(topic, value=b"%d-%d" % (p, i), partition=p)
                       for i in range(100)] for p in (1, 2, 3)}
        producer.flush(30)
    for p, fs in futures.items():
        assert [f.result(0).offset for f in fs] == list(range(100))
        expected = [b"%d-%d" % (p, i) for i in range(100)]
        assert consume_partition(cluster, TopicPartition(topic, p), 100) == expected
