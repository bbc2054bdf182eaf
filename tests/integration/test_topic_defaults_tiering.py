"""A broker whose ``[topic_defaults]`` tier every topic (``remote_storage_enable = true``) still
serves consumer groups and transactions: the internal compacted topics are never tiered.

Goal: a group commits and reads back its offset, and a transactional producer initialises and
commits, on a real broker with that default (both failed with INVALID_CONFIG on
``__consumer_offsets`` / ``__transaction_state``).
Method: one broker process with a ``file://`` remote store (tests/brokers.py).
"""

from __future__ import annotations

from pathlib import Path

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.model import OffsetAndMetadata
from tests.brokers import BrokerFactory, bounded_producer
from tests.helpers import wait_for


def test_groups_and_transactions_work_when_every_topic_is_tiered_by_default(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker = broker_factory(remote_storage_uri=f"file://{tmp_path / 'tier'}",
                            group_initial_rebalance_delay_ms=0,
                            group_min_session_timeout_ms=100,
                            topic_defaults={"remote_storage_enable": True})
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 1)])
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        producer.send("t", value=b"hello").result(10)
    tp = TopicPartition("t", 0)
    with Consumer(broker.bootstrap, group_id="g", enable_auto_commit=False,
                  auto_offset_reset="earliest", session_timeout_ms=1500,
                  heartbeat_interval_ms=100) as consumer:
        consumer.subscribe(["t"])
        got: list = []
        wait_for(lambda: got.extend(consumer.poll(100).get(tp, [])) or got, "the record")
        consumer.commit({tp: OffsetAndMetadata(1, "")})
        committed = consumer.committed(tp)
        assert committed is not None and committed.offset == 1
    producer = Producer(broker.bootstrap, transactional_id="tx", max_block_ms=10_000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"in a transaction")
        producer.commit_transaction()
    finally:
        producer.close(10)
