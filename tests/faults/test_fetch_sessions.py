"""Fetch sessions across a leader change: three real brokers and a real ZooKeeper.

Goal: a consumer reading on a push session continues from the new leader after kill -9 of the
old one, without losing or repeating a record, while a producer keeps writing with acks=all.
Method: the producer thread sends numbered records; once the consumer has read some, the
leader is killed; the consumer then reads to the high watermark the producer's last
acknowledgement left. Every offset is read exactly once and every acknowledged value is
among them; the new leader served the consumer on a session of its own.
"""

from __future__ import annotations

import signal
import threading
import time

from logstore import Consumer, Producer, TopicPartition
from logstore.errors import ApiError
from logstore.messages.log import BrokerStatsRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory
from tests.faults.cluster import FAILOVER_ERRORS, Cluster
from tests.helpers import WAIT_S, wait_for

RECORDS = 3000


def test_a_session_consumer_continues_from_the_new_leader_after_kill_9(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: no record lost or repeated across a leader change under a session. Method: as
    the module says (3,000 records in acks=all chunks of 100, kill -9 after 600 are read)."""
    cluster = Cluster(broker_factory, zk_connect)
    topic = cluster.create_topic(rf=3, min_insync_replicas=2)
    tp = TopicPartition(topic, 0)
    acked: list[bytes] = []
    read: list[tuple[int, bytes]] = []
    done = threading.Event()

    def produce() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=1, delivery_timeout_ms=60_000,
                      request_timeout_ms=5000) as producer:
            for start in range(0, RECORDS, 100):  # chunk by chunk: the kill lands mid-way
                chunk = [(b"%d" % i, producer.send(topic, b"%d" % i, partition=0))
                         for i in range(start, start + 100)]
                for value, future in chunk:
                    try:
                        future.result(60)
                        acked.append(value)
                    except ApiError:
                        pass
        done.set()

    victim = cluster.leader(topic)
    thread = threading.Thread(target=produce)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        thread.start()
        while len(read) < RECORDS // 5:
            for table in consumer.poll_arrow(timeout_ms=300).values():
                read.extend(zip(table.column("offset").to_pylist(),
                                table.column("value").to_pylist(), strict=True))
        victim.kill(signal.SIGKILL)
        done.wait(WAIT_S * 4)
        thread.join(10)
        new_leader = cluster.wait_for_new_leader(topic, victim.broker_id)
        end = wait_for(lambda: consumer.end_offsets([tp])[tp], "the high watermark",
                       tolerate=FAILOVER_ERRORS)
        deadline = time.monotonic() + WAIT_S
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read to {consumer.position(tp)} of {end}"
            for table in consumer.poll_arrow(timeout_ms=300).values():
                read.extend(zip(table.column("offset").to_pylist(),
                                table.column("value").to_pylist(), strict=True))
        conn = BrokerConnection(cluster.brokers[new_leader].bootstrap)
        try:
            sessions = conn.call(BrokerStatsRequest()).fetch_sessions
        finally:
            conn.close()
    assert [o for o, _ in read] == list(range(end)), "an offset lost or read twice"
    assert set(acked) <= {v for _, v in read}, "an acknowledged record was not read"
    assert len(acked) > RECORDS // 5
    assert sessions >= 1, "the new leader never served the consumer on a session"
