"""Leader epochs on produce: each batch's metadata names the leader epoch the producer saw, and
the broker refuses an older one (FENCED_LEADER_EPOCH) or a newer one (UNKNOWN_LEADER_EPOCH).
Raw produce streams (rpc BrokerConnection.open_produce) against real broker processes."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pyarrow as pa

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.client.metadata import ClusterMetadata
from logstore.errors import ErrorCode
from logstore.messages.produce import ProduceAck, ProduceBatchMetadata, ProduceRequest
from logstore.records import DEFAULT_SCHEMA
from tests.brokers import BrokerFactory, bounded_producer, raw_produce
from tests.faults.cluster import Cluster


def _batch(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"key": [None] * len(values), "value": values, "timestamp": [None] * len(values),
         "headers": [None] * len(values)}, schema=DEFAULT_SCHEMA)


def _leader_epoch(bootstrap: str | list[str], tp: TopicPartition) -> tuple[int, int]:
    metadata = ClusterMetadata(bootstrap)
    try:
        part = metadata.leader_partition(tp)
        return part.leader, part.leader_epoch
    finally:
        metadata.close()


def _produce(address: str, topic: str, metas: list[dict[str, Any]]) -> list[ProduceAck]:
    """Send one single-record batch per metadata dict (fields of ProduceBatchMetadata) on one
    stream (acks=1), read the acks."""
    return raw_produce(address, ProduceRequest(topic=topic, acks=1, timeout_ms=5000),
                       DEFAULT_SCHEMA, [(_batch([b"v%d" % seq]), ProduceBatchMetadata(
                           seq=seq, partition=0, **meta)) for seq, meta in enumerate(metas)])


def _values(bootstrap: str | list[str], topic: str, expected: int) -> list[bytes]:
    import time

    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while len(values) < expected and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=300).values():
                values += table.column("value").to_pylist()
    return values


def test_produce_with_a_future_epoch_is_refused_and_the_current_one_is_written(broker) -> None:
    topic = f"e-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    _, epoch = _leader_epoch(broker.bootstrap, TopicPartition(topic, 0))
    acks = _produce(broker.bootstrap, topic, [
        {"leader_epoch": epoch + 1}, {"leader_epoch": epoch}, {"leader_epoch": -1}, {}])
    assert acks[0].error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert [a.error_code for a in acks[1:]] == [ErrorCode.NONE] * 3
    assert [a.base_offset for a in acks[1:]] == [0, 1, 2]
    # a normal producer sends the epoch it saw and is accepted
    with bounded_producer(broker.bootstrap, acks="all", enable_idempotence=True) as producer:
        futures = [producer.send(topic, value=b"p%d" % i, partition=0) for i in range(50)]
        producer.flush(30)
        assert [f.result(10).offset for f in futures] == list(range(3, 53))
    assert _values(broker.bootstrap, topic, 53) == \
        [b"v1", b"v2", b"v3"] + [b"p%d" % i for i in range(50)]


def test_after_a_leader_change_a_stale_epoch_is_fenced(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Leadership moves (the leader is killed), so the epoch grows: the new leader fences the
    old epoch and refuses a newer one. The old leader comes back as a follower; a producer
    that still caches it and its epoch is fenced there, refreshes its metadata and delivers
    to the new leader within delivery_timeout_ms."""
    cluster = Cluster(broker_factory, zk_connect, size=2)
    topic = cluster.create_topic(rf=2)
    tp = TopicPartition(topic, 0)
    old_leader, old_epoch = _leader_epoch(cluster.bootstrap, tp)
    with bounded_producer(cluster.bootstrap, acks="all", enable_idempotence=True,
                          delivery_timeout_ms=60_000) as producer:
        producer.send(topic, value=b"before", partition=0).result(30)
        cluster.brokers[old_leader].kill(signal.SIGKILL)
        new_leader = cluster.wait_for_new_leader(topic, old_leader)
        leader, epoch = _leader_epoch(cluster.live_bootstrap(), tp)
        assert leader == new_leader and epoch > old_epoch
        address = cluster.brokers[new_leader].bootstrap
        acks = _produce(address, topic, [
            {"leader_epoch": old_epoch}, {"leader_epoch": epoch + 1},
            {"leader_epoch": epoch}])
        assert [a.error_code for a in acks] == [
            ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NONE]
        cluster.brokers[old_leader].restart()
        cluster.wait_for_isr(topic, 0, 2)
        producer.send(topic, value=b"after", partition=0).result(60)
    assert _values(cluster.live_bootstrap(), topic, 3) == [b"before", b"v2", b"after"]
