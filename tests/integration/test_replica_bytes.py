"""Followers store what their leader stored, byte for byte: a replica fetch ships the stored
IPC messages untouched (records.stored_message_batch), on three real broker processes."""

from __future__ import annotations

import pytest

from tests.brokers import BrokerFactory, bounded_producer
from tests.faults.cluster import Cluster


@pytest.mark.parametrize("compression_type", ["none", "zstd"])
def test_replica_segment_files_are_identical_to_the_leaders(
        broker_factory: BrokerFactory, zk_connect: str, compression_type: str) -> None:
    """Goal: every replica of a partition holds the same segment bytes as its leader, whatever
    the topic's compression (a follower that decoded and re-encoded batches would store a zstd
    topic uncompressed). Method: an RF=3 topic, 20 batches acknowledged with acks=all, the
    full ISR; then all brokers stop and each replica's .arrow files are compared."""
    cluster = Cluster(broker_factory, zk_connect)
    topic = cluster.create_topic(compression_type=compression_type, min_insync_replicas=3)
    with bounded_producer(cluster.bootstrap, acks="all", linger_ms=0) as producer:
        for i in range(20):
            producer.send(topic, value=b"v%d" % i * 50, partition=0).result(30)
    cluster.wait_for_isr(topic, 0, 3)
    for b in cluster.brokers.values():
        assert b.stop() == 0, b.stderr_tail()
    files = [{f.name: f.read_bytes() for f in sorted((b.log_dir / f"{topic}-0").glob("*.arrow"))}
             for b in cluster.brokers.values()]
    assert files[0] and files[0] == files[1] == files[2]
