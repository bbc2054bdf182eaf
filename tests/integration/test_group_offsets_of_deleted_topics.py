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

import time
import uuid
from collections.abc import Iterator

import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.admin import NewTopic
from logstore.client.fetcher import TOPIC_ID_RETRY_BACKOFF_S, FetchConfig, Fetcher
from logstore.errors import InconsistentTopicIdError, UnknownTopicIdError
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


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    with bounded_producer(bootstrap) as producer:
        for value in values:
            producer.send(topic, value=value, partition=partition)
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


def poll_records(consumer: Consumer, n: int, what: str) -> list[tuple[int, bytes]]:
    """(offset, value) of the next ``n`` records ``consumer`` polls (bounded wait)."""
    got: list[tuple[int, bytes]] = []
    wait_for(lambda: got.extend((r.offset, r.value) for rs in consumer.poll(100).values()
                                for r in rs) or len(got) >= n, what)
    return got


@pytest.mark.parametrize("fetch_session", [True, False], ids=["session", "fetch-request"])
def test_a_consumer_polling_across_a_delete_and_recreate_reads_the_new_topic_from_its_reset(
        broker: BrokerProcess, fetch_session: bool) -> None:
    """Goal: a consumer that keeps polling while its topic is deleted and created again under
    its name reads the new topic from ``auto_offset_reset``, not from its position in the old
    one: its fetches carry the topic id its position belongs to, the broker refuses them for
    the new topic (INCONSISTENT_TOPIC_ID), and the consumer resets once its metadata has the
    new id, as Kafka's does with topic ids in fetch (KIP-516). Before, its position of 10
    skipped the new topic's first 10 records without a word. Method: a manually assigned
    consumer (no group) reads t's 10 records, with push sessions and with fetch requests; t is
    deleted and recreated with 15 records while it does not poll; it polls on."""
    topic = f"polled-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin, Consumer(
            broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
            fetch_session=fetch_session) as consumer:
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)])
        consumer.assign([tp])
        assert poll_records(consumer, 10, "the old topic's records") == \
            [(i, b"old-%d" % i) for i in range(10)]
        admin.delete_topics([topic])
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"new-%d" % i for i in range(15)])
        assert poll_records(consumer, 15, "the new topic's records") == \
            [(i, b"new-%d" % i) for i in range(15)]
        assert consumer.position(tp) == 15


def test_a_seek_after_the_topic_was_recreated_is_kept_though_the_metadata_was_stale(
        broker: BrokerProcess) -> None:
    """Goal: a position set after the topic was deleted and created again (a seek), while the
    consumer's cached metadata still had the old topic id, is of the new topic: the consumer
    reads from it, not from its auto_offset_reset. Method: a consumer reads t's 10 records and
    pauses t-0 (no fetch, so nothing refreshes its metadata); t is deleted and recreated with
    15; seek to 5 and resume (the cache, minutes fresh, still has the old id); it reads new-5
    to new-14."""
    topic = f"seek-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin, Consumer(
            broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)])
        consumer.assign([tp])
        assert len(poll_records(consumer, 10, "the old topic's records")) == 10
        consumer.pause(tp)  # no fetch: nothing refreshes its metadata until it resumes
        assert consumer.poll(100) == {}
        admin.delete_topics([topic])
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"new-%d" % i for i in range(15)])
        consumer.seek(tp, 5)
        consumer.resume(tp)
        assert poll_records(consumer, 10, "the new topic's records from 5") == \
            [(i, b"new-%d" % i) for i in range(5, 15)]


def test_the_fetcher_resets_a_position_of_a_deleted_topic_once_the_metadata_has_its_successor(
        ) -> None:
    """Goal: INCONSISTENT_TOPIC_ID (or UNKNOWN_TOPIC_ID) for a partition hands its position to
    the consumer's reset (``auto_offset_reset``; with 'none' the consumer raises
    OffsetOutOfRangeError with this message) naming the partition, both topic ids and the
    position, only once the refreshed metadata has another id than the position's and a
    leader answered for that position under its id before; a position never answered for
    takes the new id (it was taken from stale metadata: a seek after the recreate is of the
    new topic); with the same id (the leader knew the new topic before this consumer's
    metadata did) the metadata is refreshed and the partition fetched again after a backoff
    (TOPIC_ID_RETRY_BACKOFF_S: not every round trip while they disagree), no reset. Method:
    the fetcher's error handling with stub metadata."""
    resets: list[tuple[TopicPartition, str]] = []
    refreshed: list[list[str]] = []

    class Metadata:
        topic_id = "new-id"

        def refresh(self, topics: list[str]) -> None:
            refreshed.append(topics)

        def known_topic_id(self, name: str) -> str:
            return self.topic_id

    tp = TopicPartition("t", 0)
    fetcher = Fetcher(Metadata(), FetchConfig(fetch_session=False),  # type: ignore[arg-type]
                      lambda tp, e: resets.append((tp, e.message)))
    try:
        fetcher._fetch_offsets[tp], fetcher._fetch_ids[tp] = 10, "old-id"
        fetcher._on_partition_error(tp, InconsistentTopicIdError("t-0: refused"))
        assert refreshed == [["t"]] and resets == []  # never answered for: adopts the new id
        assert fetcher._fetch_ids[tp] == "new-id"

        fetcher._fetch_ids[tp] = "old-id"
        fetcher._confirmed.add(tp)  # a leader answered for it under the old id
        fetcher._on_partition_error(tp, InconsistentTopicIdError("t-0: refused"))
        assert resets == [(tp, "t-0: the topic was deleted and created again (topic id "
                               "old-id, now new-id), so position 10 belongs to a topic that "
                               "is gone")]
        fetcher._fetch_ids[tp] = "new-id"
        assert fetcher.retry_in() is None
        fetcher._on_partition_error(tp, UnknownTopicIdError("t-0: refused"))
        assert len(resets) == 1 and refreshed == [["t"]] * 3
        # the leader and metadata disagree: tp backs off instead of being refetched at once
        retry_in = fetcher.retry_in()
        assert retry_in is not None and 0 < retry_in <= TOPIC_ID_RETRY_BACKOFF_S
        assert fetcher._targets([tp], lambda _: 0) == {}
        fetcher.forget(tp)
        assert fetcher.retry_in() is None
    finally:
        fetcher.close()


def test_a_pushed_fetch_waits_no_longer_than_a_partitions_topic_id_backoff() -> None:
    """Goal: with fetch sessions, a partition backing off on a topic id rejoins its session
    when the backoff ends, not once a whole poll timeout passed with nothing pushed for the
    other partitions. Method: the fetcher's pushed fetch with stub metadata and sessions
    that record how long they are waited on; one of two partitions backs off."""
    waits: list[float] = []

    class Metadata:
        def leader(self, tp: TopicPartition) -> int:
            return 0

        def known_topic_id(self, name: str) -> str:
            return "id"

    class Sessions:
        def sync(self, targets: object) -> None:
            pass

        def grant_owed(self, waiting: bool = False) -> None:
            pass

        def wait(self, timeout_s: float) -> list[object]:
            waits.append(timeout_s)
            return []

    backing_off, other = TopicPartition("t", 0), TopicPartition("t", 1)
    fetcher = Fetcher(Metadata(), FetchConfig(fetch_session=False),  # type: ignore[arg-type]
                      lambda tp, e: None)
    try:
        fetcher._backoff_until[backing_off] = time.monotonic() + TOPIC_ID_RETRY_BACKOFF_S
        assert fetcher._fetch_pushed(Sessions(), [backing_off, other],  # type: ignore[arg-type]
                                     lambda _: 0, 30.0)
        assert 0 < waits[0] <= TOPIC_ID_RETRY_BACKOFF_S
        fetcher.forget(backing_off)
        assert fetcher._fetch_pushed(Sessions(), [other], lambda _: 0, 30.0)  # type: ignore[arg-type]
        assert waits[1] == 30.0
    finally:
        fetcher.close()


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


def test_a_position_of_the_deleted_topic_is_not_committed_as_the_recreated_topics_offset(
        broker: BrokerProcess) -> None:
    """Goal: a commit of the consumer's positions (commit() without offsets, and auto-commit,
    which commits the same way) names the topic id the position's records were fetched
    under, not the id the metadata now has: in the poll where the refreshed metadata first
    shows the topic recreated, the position is still the deleted topic's (the refused fetch
    that resets it comes after), and committing it as the new topic's offset would make the
    group skip the new topic's first records after a restart. Method: a group member reads
    t's 10 records; t is deleted and recreated with 15; the consumer's metadata is refreshed
    (as a poll would) without fetching; commit() fails with UNKNOWN_TOPIC_ID and the group
    has no offset of the new topic; polling on, it reads the new topic from its start."""
    topic, group = f"pos-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)])
        with Consumer(broker.bootstrap, group_id=group, **FAST) as consumer:
            consumer.assign([tp])
            assert len(poll_records(consumer, 10, "the old topic's records")) == 10
            consumer.pause(tp)
            admin.delete_topics([topic])
            admin.create_topics([NewTopic(topic, 1)])
            produce(broker.bootstrap, topic, [b"new-%d" % i for i in range(15)])
            consumer._metadata.refresh([topic])  # what the next poll's fetch would do
            with pytest.raises(UnknownTopicIdError, match=topic):
                consumer.commit()
            assert tp not in admin.list_group_offsets(group)
            consumer.resume(tp)
            assert poll_records(consumer, 15, "the new topic's records") == \
                [(i, b"new-%d" % i) for i in range(15)]
            consumer.commit()
        assert admin.list_group_offsets(group)[tp].offset == 15


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
