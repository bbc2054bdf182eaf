"""A broker process in cluster mode (``zk_connect`` set) on a real ZooKeeper: it registers,
becomes controller, keeps topics in ZooKeeper, serves produce and consume, and leaves
ZooKeeper (ephemeral znodes gone) when it stops.
"""

from __future__ import annotations

import time

import orjson

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.controller import zk_paths as zp
from tests.brokers import BrokerFactory, bounded_producer
from tests.zookeeper import zk_client

RECORDS = 500
CONSUME_TIMEOUT_S = 30.0


def _consume_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                values += table.column("value").to_pylist()
    return values


def test_broker_on_zookeeper_creates_topics_and_serves_records(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: one broker with zk_connect works end to end, and its state lives in ZooKeeper.
    Method: start it in a fresh chroot; check /brokers/ids/7 and /controller; create a topic
    through Admin, produce with acks=all and consume everything back; check the topic's
    znodes; restart the broker and consume again; after a clean stop its ephemeral znodes are
    gone."""
    broker = broker_factory(broker_id=7, zk_connect=zk_connect, zk_session_timeout_ms=6000)
    with zk_client(zk_connect) as zk:
        assert zp.decode_broker(zk.get(zp.broker_path(7))[0]).port == broker.port
        assert zp.decode_controller(zk.get(zp.CONTROLLER)[0]).broker_id == 7
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("orders", 3)])
        described = {p.partition: p for p in admin.describe_topics(["orders"])[0].partitions}
    assert sorted(described) == [0, 1, 2] and {p.leader for p in described.values()} == {7}
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        futures = [producer.send("orders", value=b"%d" % i) for i in range(RECORDS)]
        producer.flush(30)
        assert all(f.result(10) for f in futures)
    expected = sorted(b"%d" % i for i in range(RECORDS))
    assert sorted(_consume_values(broker.bootstrap, "orders", 3)) == expected
    with zk_client(zk_connect) as zk:
        assert zk.get_children(zp.partitions_path("orders")) is not None
        state = orjson.loads(zk.get(zp.partition_state_path("orders", 0))[0])
        assert state["leader"] == 7 and state["isr"] == [7] and state["controller_epoch"] >= 1

    broker.restart()
    assert sorted(_consume_values(broker.bootstrap, "orders", 3)) == expected
    assert broker.stop() == 0
    with zk_client(zk_connect) as zk:
        assert zk.exists(zp.broker_path(7)) is None and zk.exists(zp.CONTROLLER) is None
        assert zk.exists(zp.topic_path("orders")) is not None


def test_two_brokers_share_topics_through_zookeeper(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: metadata written through one broker reaches the other through ZooKeeper watches.
    Method: two brokers, a replication-factor-1 topic created through broker 2 gets leaders on
    both; records produced through broker 1's bootstrap and consumed through broker 2's all
    come back; deleting the topic through broker 1 removes both brokers' logs. (Replication
    factors above 1 need the replication work of issue 4.)"""
    brokers = [broker_factory(broker_id=i, zk_connect=zk_connect, zk_session_timeout_ms=6000)
               for i in (1, 2)]
    with Admin(brokers[1].bootstrap) as admin:
        admin.create_topics([NewTopic("spread", 4)])
        leaders = {p.leader for p in admin.describe_topics(["spread"])[0].partitions}
    assert leaders == {1, 2}
    with bounded_producer(brokers[0].bootstrap, acks="all") as producer:
        futures = [producer.send("spread", value=b"%d" % i, key=b"%d" % i)
                   for i in range(RECORDS)]
        producer.flush(30)
        assert {f.result(10).partition for f in futures} == {0, 1, 2, 3}
    values = _consume_values(brokers[1].bootstrap, "spread", 4)
    assert sorted(values) == sorted(b"%d" % i for i in range(RECORDS))

    with Admin(brokers[0].bootstrap) as admin:
        admin.delete_topics(["spread"])
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    while [d for b in brokers for d in b.log_dir.glob("spread-*")]:
        assert time.monotonic() < deadline, "a broker kept the deleted topic's logs"
        time.sleep(0.1)  # another process's directory: nothing to wait on but the files
