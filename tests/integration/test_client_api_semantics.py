"""The client API as a Kafka user relies on it: where LogStore once differed from Kafka's
clients in a way that lost or duplicated records, or failed unclearly.

Goal: a consumer refuses to mix ``assign()`` and ``subscribe()`` (Kafka's
IllegalStateException), so a manual position is never dropped uncommitted and a group's
partitions are never replaced behind the group's back; a closed consumer refuses every call.
Method: one broker shared by the module, a topic per test, every wait a bounded poll.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.client.consumer import ConsumerRebalanceListener
from logstore.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from logstore.messages.topics import MetadataRequest
from tests.helpers import wait_for

WAIT_MS = 10_000


def _topic(broker, partitions: int = 1, records: int = 10) -> str:
    name = f"api-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions)])
    if not records:
        return name
    with Producer(broker.bootstrap, acks=1) as producer:
        for i in range(records):
            producer.send(name, value=b"%d" % i, partition=i % partitions)
        producer.flush(10)
    return name


def _group_consumer(broker) -> Consumer:
    return Consumer(broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                    auto_offset_reset="earliest", session_timeout_ms=6000,
                    heartbeat_interval_ms=500)


def test_subscribe_after_assign_is_refused_and_keeps_the_manual_position(broker) -> None:
    """Goal: ``subscribe()`` on a consumer with a manual assignment fails (as in Kafka) instead
    of dropping the assigned partition's position uncommitted and telling the listener it lost
    a partition the group never gave. Method: assign, read 4 records, subscribe (refused), the
    position is still 4 and the assignment unchanged; after ``unsubscribe()`` subscribing
    works."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    with _group_consumer(broker) as consumer:
        consumer.assign([tp])
        assert len(consumer.poll(WAIT_MS, max_records=4)[tp]) == 4
        with pytest.raises(RuntimeError, match="assign"):
            consumer.subscribe([topic])
        assert consumer.assignment() == {tp}
        assert consumer.position(tp) == 4
        consumer.unsubscribe()
        assert consumer.assignment() == set()
        consumer.subscribe([topic])
        records = consumer.poll(WAIT_MS)
        assert consumer.assignment() == {tp}
        assert [r.offset for r in records[tp]][0] == 0


def test_assign_while_subscribed_is_refused_and_keeps_the_groups_partitions(broker) -> None:
    """Goal: ``assign()`` on a subscribed consumer fails (as in Kafka) instead of replacing
    the group's partitions, whose positions were then never committed and which the
    coordinator refused to take commits for. ``assign([])`` unsubscribes, as Kafka's does.
    Method: subscribe, read 3 records, assign another partition (refused, assignment and
    position unchanged); ``assign([])`` leaves the group with the position committed."""
    topic = _topic(broker, records=10)
    other = _topic(broker)
    tp = TopicPartition(topic, 0)
    with _group_consumer(broker) as consumer:
        consumer.subscribe([topic])
        assert len(consumer.poll(WAIT_MS, max_records=3)[tp]) == 3
        with pytest.raises(RuntimeError, match="subscribe"):
            consumer.assign([TopicPartition(other, 0)])
        assert consumer.assignment() == {tp}
        assert consumer.position(tp) == 3
        consumer.assign([])
        assert consumer.assignment() == set()
        committed = consumer.committed(tp)
        assert committed is not None and committed.offset == 3
        consumer.assign([TopicPartition(other, 0)])  # no longer subscribed: allowed
        assert consumer.assignment() == {TopicPartition(other, 0)}


def test_subscribe_to_no_topics_unsubscribes(broker) -> None:
    """Goal: ``subscribe([])`` leaves the group as ``unsubscribe()`` does (Kafka's rule), so
    ``assign()`` works after it, instead of a membership of nothing that refused
    ``assign()`` as subscribed. Method: subscribe and read, subscribe([]), then assign."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    with _group_consumer(broker) as consumer:
        consumer.subscribe([topic])
        assert len(consumer.poll(WAIT_MS, max_records=2)[tp]) == 2
        consumer.subscribe([])
        assert consumer.assignment() == set()
        assert consumer.committed(tp).offset == 2
        consumer.assign([tp])
        assert consumer.assignment() == {tp}


def test_a_closed_consumer_refuses_every_call(broker) -> None:
    """Goal: after ``close()`` every call fails clearly (Kafka's "This consumer has already
    been closed."), instead of seeks and assigns that silently did nothing and offset lookups
    and commits sent on connections the close had shut. ``close()`` twice is fine. Method:
    close a group consumer with an assigned partition, then call each method."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    consumer = _group_consumer(broker)
    consumer.assign([tp])
    consumer.poll(WAIT_MS, max_records=1)
    consumer.close()
    consumer.close()
    calls = {
        "poll": lambda: consumer.poll(0),
        "assign": lambda: consumer.assign([tp]),
        "subscribe": lambda: consumer.subscribe([topic]),
        "unsubscribe": consumer.unsubscribe,
        "position": lambda: consumer.position(tp),
        "seek": lambda: consumer.seek(tp, 0),
        "seek_to_beginning": lambda: consumer.seek_to_beginning(tp),
        "seek_to_end": lambda: consumer.seek_to_end(tp),
        "pause": lambda: consumer.pause(tp),
        "resume": lambda: consumer.resume(tp),
        "beginning_offsets": lambda: consumer.beginning_offsets([tp]),
        "end_offsets": lambda: consumer.end_offsets([tp]),
        "offsets_for_times": lambda: consumer.offsets_for_times({tp: 0}),
        "commit": lambda: consumer.commit({tp: 1}),
        "commit_async": lambda: consumer.commit_async({tp: 1}),
        "committed": lambda: consumer.committed(tp),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="closed"):
            call()
            pytest.fail(f"{name}() on a closed consumer did not raise")


def test_a_multi_topic_admin_call_names_every_failure_and_what_was_done(broker) -> None:
    """Goal: when one topic of a delete_topics, alter_configs or create_partitions fails,
    the error raised names every topic that failed and every one the call changed all the
    same (the broker applies each topic on its own, as Kafka's does), instead of the first
    failure alone while other topics were silently deleted or altered; ``raise_errors=False``
    gives the outcome per topic, as create_topics does. Method: one existing topic and two
    missing ones per call; check the message, then the per-topic answers."""
    kept, gone = _topic(broker, records=0), _topic(broker, records=0)
    missing = [f"missing-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(UnknownTopicOrPartitionError) as raised:
            admin.alter_configs({missing[0]: {"retention_ms": 1}, kept: {"retention_ms": 1234},
                                 missing[1]: {"retention_ms": 1}})
        message = raised.value.message
        assert all(repr(name) in message for name in [*missing, kept]), message
        assert admin.describe_configs([kept])[kept]["retention_ms"] == 1234
        assert admin.alter_configs({kept: {"retention_ms": 99}, missing[0]: {}},
                                   raise_errors=False).keys() == {kept, missing[0]}
        with pytest.raises(InvalidPartitionsError) as raised:
            admin.create_partitions({kept: 1, gone: 2})
        assert repr(kept) in raised.value.message and repr(gone) in raised.value.message
        outcomes = admin.create_partitions({kept: 2, missing[0]: 2}, raise_errors=False)
        assert outcomes[kept] is None
        assert isinstance(outcomes[missing[0]], UnknownTopicOrPartitionError)
        with pytest.raises(UnknownTopicOrPartitionError) as raised:
            admin.delete_topics([*missing, gone])
        message = raised.value.message
        assert all(repr(name) in message for name in [*missing, gone]), message
        assert "deleted" in message
        assert gone not in admin.list_topics()
        outcomes = admin.delete_topics([kept, missing[0], kept], raise_errors=False)
        assert outcomes[kept] is None  # given twice, deleted once: not "does not exist"
        assert isinstance(outcomes[missing[0]], UnknownTopicOrPartitionError)


def test_a_partition_added_after_the_consumer_looked_at_its_topic_can_be_assigned(
        broker) -> None:
    """Goal: ``assign()`` of a partition the topic gained after this consumer cached its
    metadata asks the broker again instead of failing with "has no partition 3 (it has 2)"
    until ``metadata_max_age_ms`` (5 minutes) passed. Method: assign partition 1 of a
    2-partition topic and poll, grow the topic to 4, produce to partition 3, assign it and
    read the record; a partition that really is missing still fails naming it."""
    topic = _topic(broker, partitions=2, records=2)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 1)])
        assert len(consumer.poll(WAIT_MS)[TopicPartition(topic, 1)]) == 1
        with Admin(broker.bootstrap) as admin:
            admin.create_partitions({topic: 4})
        with Producer(broker.bootstrap, acks=1) as producer:
            producer.send(topic, value=b"new", partition=3).result(10)
        tp = TopicPartition(topic, 3)
        consumer.assign([tp])
        assert [r.value for r in consumer.poll(WAIT_MS)[tp]] == [b"new"]
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 4 .it has 4"):
            consumer.assign([TopicPartition(topic, 4)])


def test_a_commit_lands_after_the_async_commits_asked_for_before_it(broker) -> None:
    """Goal: commits take effect in the order they were asked for, as Kafka's commitSync
    completes the commitAsync calls made before it: a sync commit (or close()'s final
    auto-commit) once went straight to the coordinator while older commit_async calls still
    waited in the background, which then landed after it and moved the committed offset back
    (records read again after a restart). Method: queue 20 commit_async of offset 1, commit
    offset 5 synchronously, close (which waits for the background commits); a new consumer
    of the group sees 5."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    consumer = _group_consumer(broker)
    group_id = consumer.group_metadata().group_id
    consumer.assign([tp])
    futures = [consumer.commit_async({tp: 1}) for _ in range(20)]
    consumer.commit({tp: 5})
    assert all(f.done() for f in futures)  # completed before the sync commit returned
    consumer.close()
    with Consumer(broker.bootstrap, group_id=group_id, enable_auto_commit=False) as reader:
        committed = reader.committed(tp)
    assert committed is not None and committed.offset == 5


def test_a_subscribed_topic_created_after_subscribe_is_consumed_soon(broker) -> None:
    """Goal: a consumer subscribed to a topic that does not exist yet (started before its
    producer) gets its partitions soon after the topic is created, as Kafka's consumer asks
    again for an unknown subscribed topic, instead of only at the next
    ``metadata_max_age_ms`` check (5 minutes). Method: subscribe to a missing topic and poll
    once (the group forms with nothing), create the topic and produce, then poll until the
    record arrives, bounded far below 5 minutes."""
    topic = f"later-{uuid.uuid4().hex[:8]}"
    with _group_consumer(broker) as consumer:
        consumer.subscribe([topic])
        assert consumer.poll(100) == {}
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 1)])
        with Producer(broker.bootstrap, acks=1) as producer:
            producer.send(topic, value=b"first").result(10)
        tp = TopicPartition(topic, 0)
        values = wait_for(lambda: [r.value for r in consumer.poll(200).get(tp, [])],
                          f"the record of {topic}, created after subscribe()", timeout_s=30)
        assert values == [b"first"]


def test_a_missing_subscribed_topic_is_asked_for_with_the_others_in_one_request(
        broker) -> None:
    """Goal: the frequent check for a subscribed topic that does not exist yet asks for all
    the subscribed topics in one metadata request (before: one request per topic, twice a
    second, for as long as one was missing). Method: subscribe to three existing topics and
    a missing one; poll until three checks asked for the missing one; each asked for all."""
    topics = [_topic(broker, records=0) for _ in range(3)] + [f"none-{uuid.uuid4().hex[:8]}"]
    with _group_consumer(broker) as consumer:
        asked: list[list[str] | None] = []
        call = consumer._metadata.call

        def counting(request: Any, *args: Any) -> Any:
            if isinstance(request, MetadataRequest):
                asked.append(request.topics)
            return call(request, *args)
        consumer._metadata.call = counting  # type: ignore[method-assign]
        consumer.subscribe(topics)
        wait_for(lambda: consumer.poll(50) == {} and
                 sum(topics[-1] in (t or []) for t in asked) >= 3,
                 "three checks for the missing topic")
    checks = [t for t in asked if t and topics[-1] in t]
    assert all(sorted(t) == sorted(topics) for t in checks), checks


def test_a_listener_commit_during_close_lands(broker) -> None:
    """Goal: Kafka's common pattern, a commit in on_partitions_revoked, works when close()
    revokes (before, close() marked the consumer closed first, so the listener's commit
    raised 'the consumer is closed' and the final commit was lost). Method: a group member
    without auto-commit reads records, closes; its listener commits; a reader checks."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    consumer = Consumer(broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=6000, heartbeat_interval_ms=500)
    errors: list[Exception] = []

    class CommitOnRevoke(ConsumerRebalanceListener):
        def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
            try:
                consumer.commit()
            except Exception as e:
                errors.append(e)
                raise

    consumer.subscribe([topic], listener=CommitOnRevoke())
    got = wait_for(lambda: consumer.poll(200).get(tp), "records")
    consumer.close()
    assert errors == []
    with Consumer(broker.bootstrap, group_id=consumer.group_metadata().group_id,
                  enable_auto_commit=False) as reader:
        committed = reader.committed(tp)
    assert committed is not None and committed.offset == got[-1].offset + 1


def _member_with_records(broker) -> tuple[Consumer, TopicPartition]:
    """A group member without auto-commit, subscribed to a new topic's one partition, that
    has read records of it."""
    topic = _topic(broker)
    tp = TopicPartition(topic, 0)
    consumer = Consumer(broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=6000, heartbeat_interval_ms=500)
    consumer.subscribe([topic])
    wait_for(lambda: consumer.poll(200).get(tp), "records")
    return consumer, tp


def test_close_lets_pending_commit_async_calls_land_before_leaving_the_group(broker) -> None:
    """Goal: commit_async calls still queued when close() runs are sent as the member's,
    before it leaves the group (Kafka waits for them): before, the group was left first, so
    in a group with other members they failed (UNKNOWN_MEMBER_ID, NON_EMPTY_GROUP). Method:
    the member's group client (auto-commit off: close() commits nothing itself) records each
    commit (and whether it is the member's) and the leave, in order; 20 commit_async then
    close(), the first one's callback holding the commit thread until the group is left (or
    1 s: the order this test wants never sets it), so that the rest are still queued when
    close() starts."""
    consumer, tp = _member_with_records(broker)
    group = consumer._group
    assert group is not None
    order: list[object] = []
    leave, commit = group.close, group.commit
    left = threading.Event()
    group.close = lambda **kw: (order.append("leave"), left.set(), leave(**kw))[2]  # type: ignore
    group.commit = lambda offsets, as_member, topic_ids=None: (  # type: ignore
        order.append(as_member), commit(offsets, as_member, topic_ids))[1]
    results: list[Exception | None] = []
    consumer.commit_async({tp: 1}, callback=lambda _o, e: (left.wait(1), results.append(e)))
    for i in range(1, 20):
        consumer.commit_async({tp: i + 1}, callback=lambda _o, e: results.append(e))
    consumer.close()
    assert results == [None] * 20
    assert order[-1] == "leave" and order[:20] == [True] * 20, order


def test_close_from_a_commit_async_callback_leaves_the_group(broker) -> None:
    """Goal: close() called from a commit_async callback (on the commit thread, which cannot
    wait for itself) still leaves the group and closes the consumer (before, it raised
    'cannot join current thread' and left the member in the group, its heartbeats running).
    Method: a member's commit_async callback closes it; the group becomes empty."""
    consumer, tp = _member_with_records(broker)
    errors: list[Exception] = []

    def close_here(_offsets: object, _error: object) -> None:
        try:
            consumer.close()
        except Exception as e:
            errors.append(e)
    assert consumer.commit_async({tp: 1}, callback=close_here).exception(WAIT_MS / 1000) is None
    assert errors == []
    with Admin(broker.bootstrap) as admin:
        group = consumer.group_metadata().group_id
        wait_for(lambda: not admin.describe_groups([group])[0].members, "the member to leave")
