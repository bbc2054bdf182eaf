"""A consumer group's offsets do not outlive their topic: a topic deleted and recreated under
its name is read from the group's auto_offset_reset, not from the old topic's positions.

Goal: as Kafka (GroupCoordinator.onPartitionsDeleted): when a topic is deleted, the group
coordinator tombstones the offsets committed for it (the broker's metadata sync reports the
deletion with the deleted topic's id); a group then consuming the recreated topic starts at
``auto_offset_reset`` (earliest) and reads every new record, none skipped, none of the old.
Method: one embedded broker; a group consumes and commits 10 records of t (the consumer
sends t's id with its commit); t is deleted: the group's offsets go (waited for: the
tombstones are written on a coordinator thread, not the sync's); t is recreated with 15 new
records, more than the old committed offset, so a stale position would skip 10 of them; a
consumer of the group reads exactly the 15.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.admin import NewTopic
from logstore.errors import UnknownTopicIdError
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer
from tests.helpers import wait_for

FAST = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 100,
        "auto_offset_reset": "earliest", "fetch_max_wait_ms": 100,
        "enable_auto_commit": False}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("deleted-topics"))
    yield factory(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)
    factory.stop_all()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    with bounded_producer(bootstrap) as producer:
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.flush()


def consume_all(bootstrap: str, group: str, topic: str, n: int) -> list[bytes]:
    """Subscribe as a member of ``group``, read ``n`` records, commit, leave; their values."""
    got: list[bytes] = []
    with Consumer(bootstrap, group_id=group, **FAST) as c:
        c.subscribe([topic])
        wait_for(lambda: got.extend(r.value for rs in c.poll(100).values() for r in rs) or
                 len(got) >= n, f"{n} records of {topic}")
        c.commit()
    return got


def test_a_group_reads_a_recreated_topic_from_its_reset_not_from_the_old_offsets(
        broker: BrokerProcess) -> None:
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)])
        assert consume_all(broker.bootstrap, group, topic, 10) == \
            [b"old-%d" % i for i in range(10)]
        assert admin.list_group_offsets(group)[tp].offset == 10

        admin.delete_topics([topic])
        wait_for(lambda: tp not in admin.list_group_offsets(group),
                 "the deleted topic's offsets tombstoned")
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"new-%d" % i for i in range(15)])
        assert tp not in admin.list_group_offsets(group)

        assert consume_all(broker.bootstrap, group, topic, 15) == \
            [b"new-%d" % i for i in range(15)]
        assert admin.list_group_offsets(group)[tp].offset == 15


def test_a_commit_with_the_deleted_topics_id_fails_naming_it_and_the_next_one_lands(
        broker: BrokerProcess) -> None:
    """Goal: a consumer whose metadata still has a deleted topic's id commits to the topic
    recreated under its name: the commit fails with UNKNOWN_TOPIC_ID naming the topic (before,
    it was acknowledged and then hidden: lost without a word), and the consumer's metadata is
    refreshed so that its next commit names the new id and lands. Method: a manually
    assigned consumer caches t's id; t is deleted and recreated; commit, then commit again."""
    topic, group = f"stale-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        with Consumer(broker.bootstrap, group_id=group, **FAST) as consumer:
            consumer.assign([tp])
            consumer.commit({tp: 3})  # caches t's id
            admin.delete_topics([topic])
            admin.create_topics([NewTopic(topic, 1)])
            with pytest.raises(UnknownTopicIdError, match=topic):
                consumer.commit({tp: 7})
            consumer.commit({tp: 5})
        assert admin.list_group_offsets(group)[tp].offset == 5


def test_a_transactions_offsets_for_a_recreated_topic_are_refused_once_then_land(
        broker: BrokerProcess) -> None:
    """Goal: a transactional producer whose metadata still has a deleted topic's id sends
    offsets of the topic recreated under its name: that transaction fails (UNKNOWN_TOPIC_ID,
    abortable) and the producer refreshes the topic, so the next transaction's offsets land;
    before, every later transaction failed the same way until the producer happened to send
    to that topic. Method: the producer writes to a (caching its id); a is deleted and
    recreated; two transactions write to b and send offsets of a-0."""
    a, b, group = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("a", "b", "g"))
    tp = TopicPartition(a, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(a, 1), NewTopic(b, 1)])
        with Producer(broker.bootstrap, transactional_id=f"tx-{group}") as producer, \
                Consumer(broker.bootstrap, group_id=group, **FAST) as consumer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(a, value=b"x", partition=0)
            producer.commit_transaction()
            admin.delete_topics([a])
            admin.create_topics([NewTopic(a, 1)])
            outcomes: list[str | None] = []
            for offset in (1, 2):
                producer.begin_transaction()
                producer.send(b, value=b"y", partition=0)
                try:
                    producer.send_offsets_to_transaction({tp: offset},
                                                         consumer.group_metadata())
                    producer.commit_transaction()
                    outcomes.append(None)
                except UnknownTopicIdError:
                    outcomes.append("UNKNOWN_TOPIC_ID")
                    producer.abort_transaction()
        assert outcomes == ["UNKNOWN_TOPIC_ID", None]
        assert admin.list_group_offsets(group)[tp].offset == 2
