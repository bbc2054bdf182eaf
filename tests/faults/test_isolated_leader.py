"""A leader cut off from ZooKeeper and from its followers, on three real broker processes and
a real ZooKeeper of the test's own: it cannot acknowledge acks=all writes, and nothing
acknowledged is lost once the cluster heals."""

from __future__ import annotations

from logstore.errors import ErrorCode
from tests.brokers import BrokerFactory, bounded_producer
from tests.faults.cluster import LAG_TIME_MS, Cluster, consume_partitions
from tests.helpers import wait_for
from tests.zookeeper import ZooKeeperServer

REQUEST_TIMEOUT_MS = 5000
REFUSED = {ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
           ErrorCode.REQUEST_TIMED_OUT}
SHRINK_PROPOSED = "out of sync; proposing isr"


def test_leader_cut_off_from_zookeeper_and_followers_acknowledges_no_acks_all_write(
        private_zookeeper: ZooKeeperServer, broker_factory: BrokerFactory) -> None:
    """Goal: a leader that can reach neither ZooKeeper nor its followers acknowledges no
    acks=all write, even with min_insync_replicas=1, where an ISR shrunk to the leader alone
    would let it; after healing every acknowledged record is there (issue 4 §1). Method: RF=3
    on a ZooKeeper of the test's own (requested first, so it outlives the brokers); 50 records
    acknowledged with acks=all; then ZooKeeper is killed and both followers SIGSTOPped; once
    the leader has proposed dropping them from the ISR (which no controller can commit), 20
    acks=all sends straight to the leader, without retries, must all fail with
    NOT_ENOUGH_REPLICAS(_AFTER_APPEND) or REQUEST_TIMED_OUT. Then the followers thaw,
    ZooKeeper restarts, the ISR is full again, 20 more acks=all writes succeed, and every
    acknowledged record is consumed, in order."""
    cluster = Cluster(broker_factory, f"{private_zookeeper.connect}/logstore")
    topic = cluster.create_topic(min_insync_replicas=1)
    acked = _send_all(cluster.bootstrap, topic, [b"a%d" % i for i in range(50)])
    leader = cluster.leader(topic)
    followers = [b for b in cluster.brokers if b != leader.broker_id]
    with bounded_producer([leader.bootstrap], acks="all", retries=0, enable_idempotence=False,
                          request_timeout_ms=REQUEST_TIMEOUT_MS) as producer:
        producer.partitions_for(topic)  # metadata while every broker answers
        private_zookeeper.kill()
        for b in followers:
            cluster.freeze(b)
        try:
            wait_for(lambda: SHRINK_PROPOSED in leader.stderr_tail(200),
                     "the leader to propose a smaller isr", timeout_s=LAG_TIME_MS / 1000 + 10)
            futures = [producer.send(topic, value=b"x%d" % i, partition=0) for i in range(20)]
            producer.flush(REQUEST_TIMEOUT_MS / 1000 * 4)
            errors = [f.exception(0) for f in futures]
            assert all(getattr(e, "code", None) in REFUSED for e in errors), errors
        finally:
            for b in followers:
                cluster.thaw(b)
            private_zookeeper.start()
    cluster.wait_for_isr(topic, 0, 3)
    acked += _send_all(cluster.bootstrap, topic, [b"b%d" % i for i in range(20)])
    values = consume_partitions(cluster, topic, [0])[0]
    assert [v for v in values if v in set(acked)] == acked


def _send_all(bootstrap: list[str], topic: str, values: list[bytes]) -> list[bytes]:
    """Send with acks=all to partition 0; the values, once every one is acknowledged."""
    with bounded_producer(bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value=v, partition=0) for v in values]
        producer.flush(30)
        assert all(f.exception(0) is None for f in futures)
    return list(values)
