"""A broker in cluster mode killed with kill -9 and restarted before ZooKeeper has noticed: its
old session still holds /brokers/ids/<id> and /controller until the session timeout."""

from __future__ import annotations

import time

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.controller import zk_paths as zp
from tests.brokers import BrokerFactory, bounded_producer
from tests.zookeeper import zk_client

SESSION_TIMEOUT_MS = 3000
RECORDS = 200


def _owners(zk_connect: str) -> tuple[int, int, int]:
    """(session owning the broker znode, session owning /controller, controller epoch)."""
    with zk_client(zk_connect) as zk:
        broker = zk.get(zp.broker_path(1))[1].ephemeralOwner
        controller = zk.get(zp.CONTROLLER)[1].ephemeralOwner
        epoch = zp.decode_controller_epoch(zk.get(zp.CONTROLLER_EPOCH)[0])
    return broker, controller, epoch


def test_restarted_broker_takes_over_its_registration_after_the_old_session_expires(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: kill -9 and an immediate restart neither fail the start (the id looks taken) nor
    leave the broker without its znode or controllership, and acknowledged records survive.
    Method: produce with acks=all, kill -9, restart at once; the restarted broker registers
    only when the old session has expired, so its 'listening' line comes after that. Then its
    znode and /controller belong to one new session, the controller epoch has moved on, and
    every acknowledged record is consumed."""
    broker = broker_factory(broker_id=1, zk_connect=zk_connect,
                            zk_session_timeout_ms=SESSION_TIMEOUT_MS)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("events", 1)])
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        futures = [producer.send("events", value=b"%d" % i) for i in range(RECORDS)]
        producer.flush(30)
        offsets = [f.result(10).offset for f in futures]
    old_broker, old_controller, old_epoch = _owners(zk_connect)
    assert old_broker == old_controller

    broker.kill()
    broker.start()
    new_broker, new_controller, new_epoch = _owners(zk_connect)
    assert new_broker == new_controller and new_broker != old_broker
    assert new_epoch > old_epoch
    values: list[bytes] = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("events", 0)])
        deadline = time.monotonic() + 30
        while len(values) < RECORDS and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                values += table.column("value").to_pylist()
    assert offsets == list(range(RECORDS))
    assert values == [b"%d" % i for i in range(RECORDS)]
