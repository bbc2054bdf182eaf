"""Produce/consume round trips against a real broker process on 127.0.0.1."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.client.partitioner import murmur2
from logstore.model import CREATE_TIME, LOG_APPEND_TIME


def _topic(admin: Admin, partitions: int = 3, **config: object) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, config=dict(config))])
    return name


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int,
                 timeout_s: float = 30) -> dict[int, pa.Table]:
    import time

    tables: dict[int, list[pa.Table]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got, deadline = 0, time.monotonic() + timeout_s
        while got < expected and time.monotonic() < deadline:
            for tp, table in consumer.poll_arrow(timeout_ms=500).items():
                tables[tp.partition].append(table)
                got += table.num_rows
    return {p: pa.concat_tables(ts) if ts else None for p, ts in tables.items()}


@pytest.mark.parametrize("acks", ["all", 1, 0])
def test_per_record_round_trip_keeps_order_per_partition(broker, acks) -> None:
    """Every record sent with send() comes back once, in send order within its partition."""
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin)
    n = 3000
    with Producer(broker.bootstrap, acks=acks, linger_ms=2) as producer:
        futures = [producer.send(topic, value=b"v%d" % i, key=b"k%d" % (i % 17),
                                 headers=[("h", b"%d" % i)] if i % 2 else None)
                   for i in range(n)]
        producer.flush(30)
        metas = [f.result(10) for f in futures]
    tables = _consume_all(broker.bootstrap, topic, 3, n)
    seen = []
    for p, table in tables.items():
        if table is None:
            continue
        values = [int(v[1:]) for v in table.column("value").to_pylist()]
        assert values == sorted(values), f"partition {p} out of order"
        assert table.column("offset").to_pylist() == list(range(table.num_rows))
        seen += values
    assert sorted(seen) == list(range(n))
    if acks != 0:
        by_value = {}
        for p, table in tables.items():
            for v, off in zip(table.column("value").to_pylist(),
                              table.column("offset").to_pylist(), strict=True):
                by_value[int(v[1:])] = (p, off)
        assert all(by_value[i] == (m.partition, m.offset) for i, m in enumerate(metas))


def test_columnar_send_batch_round_trip_with_headers(broker) -> None:
    """send_batch partitions a table by key and every row comes back with its headers."""
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, partitions=4)
    n = 20_000
    table = pa.table({
        "key": pa.array([b"key-%d" % (i % 101) for i in range(n)]),
        "value": pa.array([b"x" * 100] * n),
        "headers": pa.array([[{"key": "i", "value": b"%d" % i}] for i in range(n)],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })
    with Producer(broker.bootstrap, acks=1) as producer:
        result = producer.send_batch(topic, table).result(30)
    assert sum(r.record_count for r in result) == n
    tables = _consume_all(broker.bootstrap, topic, 4, n)
    total = sum(t.num_rows for t in tables.values() if t is not None)
    assert total == n
    for p, t in tables.items():
        for key in set(t.column("key").to_pylist()):
            assert (murmur2(key) & 0x7FFFFFFF) % 4 == p


def test_keyed_records_land_where_kafka_puts_them(broker) -> None:
    """The same key and partition count give the same partition as Kafka's Java client."""
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, partitions=7)
    kafka = {b"21": -973932308, b"foobar": -790332482, b"abc": 479470107}
    with Producer(broker.bootstrap) as producer:
        for key, h in kafka.items():
            meta = producer.send(topic, value=b"v", key=key).result(10)
            assert meta.partition == (h & 0x7FFFFFFF) % 7


def test_consumer_seek_positions_and_offset_lookups(broker) -> None:
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, partitions=1)
    with Producer(broker.bootstrap) as producer:
        for i in range(100):
            producer.send(topic, value=b"%d" % i, timestamp_ms=1_000_000 + i)
        producer.flush(10)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 100}
        found = c.offsets_for_times({tp: 1_000_050})[tp]
        assert found is not None and found.offset == 50
        c.seek(tp, 90)
        records = c.poll(timeout_ms=5000)[tp]
        assert [r.offset for r in records] == list(range(90, 100))
        assert c.position(tp) == 100
        c.seek_to_beginning()
        assert c.position(tp) == 0
        c.pause(tp)
        assert c.poll(timeout_ms=100) == {}
        c.resume(tp)
        assert c.poll(timeout_ms=5000)[tp][0].value == b"0"


def test_fetch_end_offset_stops_before_the_batch_at_it(broker) -> None:
    """A fetch with ``end_offset`` (what range readers send) returns no batch that starts at or
    after it, while one without returns everything to the high watermark; the summary's high
    watermark is the same either way."""
    from logstore.messages.fetch import FetchPartition, FetchRequest
    from logstore.rpc.client import BrokerConnection

    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, 1)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for i in range(10):
            producer.send(topic, value=b"%d" % i, partition=0).result(10)  # one batch each
    conn = BrokerConnection(broker.bootstrap)
    try:
        def fetch(end_offset: int | None = None) -> tuple[list[int], int]:
            response = conn.fetch(FetchRequest(topic=topic, max_wait_ms=0, partitions=[
                FetchPartition(partition=0, offset=2, end_offset=end_offset)]))
            return ([b.header.base_offset for b in response.batches],
                    response.partitions[0].high_watermark)

        assert fetch() == (list(range(2, 10)), 10)
        assert fetch(end_offset=5) == ([2, 3, 4], 10)
        assert fetch(end_offset=2) == ([], 10)
    finally:
        conn.close()


def test_polled_records_carry_their_topics_timestamp_type(broker) -> None:
    """Goal: ``ConsumerRecord.timestamp_type`` is what Kafka's is: 0 (CreateTime) on a topic
    with the default ``message_timestamp_type``, 1 (LogAppendTime) on one with
    LogAppendTime, where the timestamp is the broker's append time, not the one sent.
    Method: a real broker, one topic of each kind, records sent with an old explicit
    timestamp; poll() (records built from the Arrow columns) and a single record by index."""
    with Admin(broker.bootstrap) as admin:
        create_time = _topic(admin, partitions=1)
        append_time = _topic(admin, partitions=1, message_timestamp_type="LogAppendTime")
    with Producer(broker.bootstrap) as producer:
        for topic in (create_time, append_time):
            for i in range(3):
                producer.send(topic, value=b"v%d" % i, timestamp_ms=1_000_000 + i)
        producer.flush(30)
    for topic, expected in ((create_time, CREATE_TIME), (append_time, LOG_APPEND_TIME)):
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            records = []
            for _ in range(60):
                for view in consumer.poll(timeout_ms=500).values():
                    records += list(view)
                    assert view[0].timestamp_type == expected
                if len(records) >= 3:
                    break
        assert [r.value for r in records] == [b"v0", b"v1", b"v2"], topic
        assert [r.timestamp_type for r in records] == [expected] * 3, topic
        created = [r.timestamp == 1_000_000 + i for i, r in enumerate(records)]
        assert all(created) if expected == CREATE_TIME else not any(created), topic

def test_a_records_timestamp_type_is_its_batchs_after_the_topic_is_altered(broker) -> None:
    """Goal: as in Kafka, the timestamp type is each batch's (its header's LogAppendTime
    flag), not the topic's config now: records sent before an alter of
    ``message_timestamp_type`` keep CreateTime, those after get LogAppendTime (before,
    every record got the topic's current type, and Spark, which reads the
    flag, disagreed). Method: 3 records, alter, 3 more; poll all six."""
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, partitions=1)
    with Producer(broker.bootstrap) as producer:
        for i in range(3):
            producer.send(topic, value=b"v%d" % i, timestamp_ms=1_000_000 + i)
        producer.flush(30)
        with Admin(broker.bootstrap) as admin:
            admin.alter_configs({topic: {"message_timestamp_type": "LogAppendTime"}})
        for i in range(3, 6):
            producer.send(topic, value=b"v%d" % i, timestamp_ms=1_000_000 + i).result(30)
    records = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        for _ in range(60):
            for view in consumer.poll(timeout_ms=500).values():
                records += list(view)
            if len(records) >= 6:
                break
    assert [r.timestamp_type for r in records] == [CREATE_TIME] * 3 + [LOG_APPEND_TIME] * 3
    assert records[0].timestamp == 1_000_000 and records[5].timestamp != 1_000_005



def _amount_topic(admin: Admin, name: str, kind: pa.DataType) -> None:
    admin.create_topics([NewTopic(name, 1, value_schema=pa.schema([("amount", kind)]))])


@pytest.mark.parametrize("columnar", [False, True], ids=["send", "send_batch"])
def test_a_batch_encoded_before_its_topic_was_recreated_with_another_schema_is_refused(
        broker, columnar: bool) -> None:
    """Goal: a producer that encoded records under a typed topic's old value schema never
    stores them under the schema the topic was recreated with (amount int64, then double:
    the same buffer layout, so 7 was acknowledged and stored as 3.5e-323). Method: the
    producer writes once (caching the topic's metadata), the topic is deleted and recreated
    as double, the producer sends 7 again: the leader refuses the batch's topic id, and after
    the refresh the batch fails with INVALID_RECORD naming the topic; nothing is stored. Its
    next record is encoded under the new schema and stored as 7.0."""
    from logstore.errors import InvalidRecordError

    name = f"t-{uuid.uuid4().hex[:8]}"

    def send(producer: Producer, value: int) -> object:
        if columnar:
            future = producer.send_batch(name, pa.table({"amount": [value]}))
            producer.flush(30)
            return future.result(30)
        return producer.send(name, value={"amount": value}).result(30)

    with Admin(broker.bootstrap) as admin, Producer(broker.bootstrap, linger_ms=0) as producer:
        _amount_topic(admin, name, pa.int64())
        send(producer, 1)
        admin.delete_topics([name])
        _amount_topic(admin, name, pa.float64())
        with pytest.raises(InvalidRecordError, match=f"topic {name!r} was recreated with "
                                                     "another value schema"):
            send(producer, 7)
        send(producer, 8)
    table = _consume_all(broker.bootstrap, name, 1, 1)[0]
    assert table is not None and table.column("amount").to_pylist() == [8.0]
    assert table.schema.field("amount").type == pa.float64()


def test_a_batch_for_a_recreated_untyped_topic_goes_to_the_new_topic(broker) -> None:
    """Goal: after an untyped topic is deleted and recreated (same default schema), a producer
    that cached its old metadata delivers to the new topic, with no error. Method: write one
    record, delete and recreate the topic, write another with the same producer: it is
    acknowledged at offset 0 of the new topic and is the only record there."""
    with Admin(broker.bootstrap) as admin, Producer(broker.bootstrap, linger_ms=0) as producer:
        name = _topic(admin, 1)
        producer.send(name, b"old").result(30)
        admin.delete_topics([name])
        admin.create_topics([NewTopic(name, 1)])
        assert producer.send(name, b"new").result(30).offset == 0
    table = _consume_all(broker.bootstrap, name, 1, 1)[0]
    assert table is not None and table.column("value").to_pylist() == [b"new"]
