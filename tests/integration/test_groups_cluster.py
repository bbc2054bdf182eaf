"""Consumer groups on a two-broker ZooKeeper cluster: coordinators follow offsets-partition
leadership.

Goal: with ``__consumer_offsets`` spread over the brokers, each group is coordinated by the
leader of its partition, whatever broker a client bootstraps from; a broker that does not lead
a group's partition answers NOT_COORDINATOR; the admin lists groups of every broker. Method:
two brokers on a real ZooKeeper with ``offsets_topic_replication_factor = 1`` (routing only;
coordinator failover over a replicated offsets topic is tested in
tests/faults/test_group_coordinator_failover.py); pick two group ids whose offsets partitions
are led by different brokers, consume and commit through broker 1's bootstrap, and check the
committed offsets through broker 2's.
"""

from __future__ import annotations

import time
import uuid

from logstore import Admin, Consumer, TopicPartition
from logstore.errors import ErrorCode
from logstore.groups.offsets import partition_for
from logstore.messages.groups import FindCoordinatorRequest, OffsetFetchRequest
from logstore.model import OFFSETS_TOPIC
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, bounded_producer, new_topic

PARTITIONS = 4
WAIT_S = 30.0


def test_groups_are_coordinated_by_their_offsets_partition_leader(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    settings = {"zk_connect": zk_connect, "zk_session_timeout_ms": 6000,
                "offsets_topic_num_partitions": PARTITIONS,
                "offsets_topic_replication_factor": 1, "group_initial_rebalance_delay_ms": 0,
                "group_min_session_timeout_ms": 100}
    brokers = [broker_factory(broker_id=i, **settings) for i in (1, 2)]
    conn = BrokerConnection(brokers[0].bootstrap)
    assert conn.call(FindCoordinatorRequest(group_id="probe")).error_code == 0
    with Admin(brokers[0].bootstrap) as admin:
        leaders = {p.partition: p.leader for p in
                   admin.describe_topics([OFFSETS_TOPIC])[0].partitions}
        assert set(leaders.values()) == {1, 2}
        groups: dict[int, str] = {}
        for _ in range(1000):  # bounded: a group id for each broker turns up quickly
            g = f"g-{uuid.uuid4().hex[:8]}"
            groups.setdefault(leaders[partition_for(g, PARTITIONS)], g)
            if len(groups) == 2:
                break
        topic = new_topic(admin, 2)
        with bounded_producer(brokers[0].bootstrap) as producer:
            for i in range(40):
                producer.send(topic, value=b"%d" % i, partition=i % 2)
            producer.flush()
    for broker_id, group in groups.items():
        found = conn.call(FindCoordinatorRequest(group_id=group))
        assert found.node_id == broker_id
        with Consumer(brokers[0].bootstrap, group_id=group, auto_offset_reset="earliest",
                      session_timeout_ms=1500, heartbeat_interval_ms=100) as c:
            c.subscribe([topic])
            got = 0
            deadline = time.monotonic() + WAIT_S
            while got < 40 and time.monotonic() < deadline:
                got += sum(len(rs) for rs in c.poll(100).values())
            assert got == 40
            c.commit()
        other = brokers[0] if broker_id == 2 else brokers[1]
        wrong = BrokerConnection(other.bootstrap)
        assert wrong.call(OffsetFetchRequest(group_id=group)).error_code == \
            ErrorCode.NOT_COORDINATOR
        wrong.close()
    with Admin(brokers[1].bootstrap) as admin:
        assert {g.group_id for g in admin.list_groups()} >= set(groups.values())
        for group in groups.values():
            assert {tp: om.offset for tp, om in admin.list_group_offsets(group).items()} == {
                TopicPartition(topic, 0): 20, TopicPartition(topic, 1): 20}
    conn.close()
