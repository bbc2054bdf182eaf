"""Producer behaviour found wanting in a third review: a tombstone on a typed topic stored as
made-up values, one bad record failing the records sharing its chunk (or a bad timestamp or
header being stored at all), metadata giving the client's time on a LogAppendTime topic, and
``send_batch`` raising after part of its table was written; ``send()`` accepting records far
past ``buffer_memory``.

Each test runs against a real broker process (the module's ``broker`` fixture) and checks the
claim by reading the records back, not by trusting the producer's own metadata.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.client import producer as producer_module
from logstore.errors import ApiError, ErrorCode, InvalidRecordError, RequestTimedOutError
from tests.brokers import bounded_producer, new_topic

VALUE_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("ok", pa.bool_())])


def _typed_topic(admin: Admin, value_schema: pa.Schema = VALUE_SCHEMA) -> str:
    name = f"s-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, value_schema=value_schema)])
    return name


def _read(bootstrap: str, topic: str, expected: int, timeout_s: float = 30) -> pa.Table:
    """Partition 0 of ``topic`` from its start, once ``expected`` records have arrived (or the
    deadline passed: the caller's assertions then say what is missing)."""
    tables: list[pa.Table] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got, deadline = 0, time.monotonic() + timeout_s
        while got < expected and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                tables.append(table)
                got += table.num_rows
    return pa.concat_tables(tables) if tables else pa.table({"offset": pa.array([], pa.int64())})


# -- typed topics -----------------------------------------------------------------------------

def test_a_tombstone_on_a_typed_topic_is_read_back_as_nulls(broker) -> None:
    """Goal: ``send(typed_topic, None)`` stores nulls in every value column (as an empty dict
    does), not the 0, "" and False that hide under a null struct slot.

    Method: send None and ``{}`` to a topic whose value_schema has an int, a string and a bool
    column; a consumer reads both records back with every value column null."""
    with Admin(broker.bootstrap) as admin:
        topic = _typed_topic(admin)
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        futures = [producer.send(topic, None, key=b"tombstone"),
                   producer.send(topic, {}, key=b"empty")]
        producer.flush(10)
        assert [f.result(5).offset for f in futures] == [0, 1]
    rows = _read(broker.bootstrap, topic, 2).select(["key", *VALUE_SCHEMA.names]).to_pylist()
    nulls = dict.fromkeys(VALUE_SCHEMA.names)
    assert rows == [{"key": b"tombstone", **nulls}, {"key": b"empty", **nulls}]


def test_a_value_not_fitting_the_schema_fails_alone_naming_topic_and_field(broker) -> None:
    """Goal: a dict value whose field does not fit the typed topic's schema (send() cannot
    check it cheaply) fails its own future with an error naming the topic and the field, and
    the good records sent in the same linger window (so in the same chunk) are stored.

    Method: within one 300 ms linger window send 3 good dicts, one with a string for the int
    column, one bytes value, a tombstone and 2 more good dicts; after flush the two bad
    futures fail with INVALID_RECORD naming the topic (and ``'id'`` for the dict), the others
    succeed at offsets 0..5, and a consumer reads exactly those 6 records."""
    with Admin(broker.bootstrap) as admin:
        topic = _typed_topic(admin)
    values: list[Any] = [{"id": i, "name": f"n{i}", "ok": True} for i in range(3)]
    bad = [{"id": "not-an-int", "name": "bad"}, b"raw bytes"]
    good_after: list[Any] = [None, {"id": 3}, {"id": 4, "ok": False}]
    with bounded_producer(broker.bootstrap, acks=1, linger_ms=300) as producer:
        good = [producer.send(topic, v) for v in values]
        failed = [producer.send(topic, v) for v in bad]
        good += [producer.send(topic, v) for v in good_after]
        producer.flush(10)
        errors = [f.exception(5) for f in failed]
        assert [f.exception(5) for f in good] == [None] * 6, "good records failed"
        assert [f.result(0).offset for f in good] == list(range(6))
    for error in errors:
        assert isinstance(error, InvalidRecordError) and repr(topic) in str(error), error
    assert "field 'id'" in str(errors[0])
    nulls = dict.fromkeys(VALUE_SCHEMA.names)
    rows = _read(broker.bootstrap, topic, 6).select(VALUE_SCHEMA.names).to_pylist()
    assert rows == [{**nulls, **v} if v else nulls for v in values + good_after]


# -- bad timestamps and headers ---------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    {"timestamp_ms": "abc"}, {"timestamp_ms": 2**70}, {"timestamp_ms": 2**63},
    {"timestamp_ms": -5}, {"timestamp_ms": 1.7e12}, {"timestamp_ms": True},
    {"headers": [("h", 5)]}, {"headers": [(b"k", b"v")]}, {"headers": {"k": b"v"}},
    {"headers": [("k", b"v", b"extra")]}, {"headers": ["kv"]},
], ids=lambda bad: f"{next(iter(bad))}={next(iter(bad.values()))!r}")
def test_a_bad_timestamp_or_header_is_refused_by_send_and_spares_its_neighbours(
        broker, bad: dict[str, Any]) -> None:
    """Goal: a timestamp that is not an int of 0 to 2**63-1 ms, or headers that are not a
    list of (str, bytes or None) pairs, are refused by ``send()`` itself (INVALID_RECORD,
    naming the topic), never stored, and the records sent around them in the same linger
    window are delivered.

    Method: 5 good sends, the bad send (must raise at once), 5 good sends with a valid
    timestamp and headers, flush; all 10 good futures succeed and the topic holds exactly
    those 10 records, the last 5 with their timestamp and headers."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=1)
    headers = [("h", b"v"), ("n", None)]
    with bounded_producer(broker.bootstrap, acks=1, linger_ms=200) as producer:
        good = [producer.send(topic, b"good%d" % i) for i in range(5)]
        with pytest.raises(InvalidRecordError) as e:
            producer.send(topic, b"bad", **bad)
        assert repr(topic) in str(e.value) and e.value.code == ErrorCode.INVALID_RECORD
        good += [producer.send(topic, b"good%d" % i, timestamp_ms=1_000 + i, headers=headers)
                 for i in range(5, 10)]
        producer.flush(10)
        failed = [err for err in (f.exception(5) for f in good) if err is not None]
        assert not failed, f"{len(failed)} of 10 good records failed, e.g. {failed[0]!r}"
    table = _read(broker.bootstrap, topic, 10)
    assert table.column("value").to_pylist() == [b"good%d" % i for i in range(10)]
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps[5:] == [1_000 + i for i in range(5, 10)]
    assert [[(h["key"], h["value"]) for h in hs] for hs in table.column("headers").to_pylist()[5:]
            ] == [headers] * 5


# -- LogAppendTime ----------------------------------------------------------------------------

def test_metadata_of_a_log_append_time_topic_gives_the_brokers_append_time(broker) -> None:
    """Goal: on a topic with ``message_timestamp_type = LogAppendTime`` the RecordMetadata
    of a send is the broker's append time (what a consumer reads), as in Kafka, not the
    client's create time.

    Method: send one record with an explicit old create time (1 000 000 ms) and one without;
    each future's timestamp equals the timestamp a consumer reads at its offset, and the first
    is not the create time sent."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=1,
                          message_timestamp_type="LogAppendTime")
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        old = producer.send(topic, b"old", timestamp_ms=1_000_000).result(10)
        new = producer.send(topic, b"new").result(10)
    table = _read(broker.bootstrap, topic, 2)
    stored = dict(zip(table.column("offset").to_pylist(),
                      table.column("timestamp").cast(pa.int64()).to_pylist(), strict=True))
    assert old.timestamp != 1_000_000
    assert (old.timestamp, new.timestamp) == (stored[old.offset], stored[new.offset])


# -- send_batch -------------------------------------------------------------------------------

def test_send_batch_with_a_bad_value_in_a_later_window_sends_nothing(
        broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: ``send_batch`` of a table cut into several windows, with a value that cannot be
    cast to the topic's type in the last one, raises INVALID_RECORD naming the column and the
    row, and writes nothing (every window is checked before the first is sent).

    Method: a typed topic with an int32 column; windows made small (WINDOW_BYTES 0 and
    max_request_size 16 KiB: windows of 64 KiB) and a 2 000-row table of ~200 KB whose last
    id does not fit int32; send_batch raises, the error names ``'id'`` and row 1999, and the
    partition's end offset stays 0."""
    monkeypatch.setattr(producer_module, "WINDOW_BYTES", 0)
    value_schema = pa.schema([("id", pa.int32()), ("payload", pa.binary())])
    n = 2_000
    ids = np.arange(n, dtype=np.int64)
    ids[-1] = 2**40
    table = pa.table({"id": ids, "payload": pa.array([b"x" * 100] * n, pa.binary())})
    with Admin(broker.bootstrap) as admin:
        topic = _typed_topic(admin, value_schema)
        tp = TopicPartition(topic, 0)
        with bounded_producer(broker.bootstrap, acks=1, max_request_size=16 * 1024) as producer:
            with pytest.raises(InvalidRecordError) as e:
                producer.send_batch(topic, table)
            producer.flush(10)
            written = admin.list_offsets({tp: -1})[tp]
            assert written == 0, f"{written} rows of the failed send_batch were written"
            assert "'id'" in str(e.value) and "row 1999" in str(e.value), e.value
            assert str(e.value).count("INVALID_RECORD") == 1, e.value
            # the same table without the bad value goes, in several pieces
            ids[-1] = 0
            fine = pa.table({"id": ids, "payload": table.column("payload")})
            pieces = producer.send_batch(topic, fine).result(10)
        assert len(pieces) > 1 and sum(p.record_count for p in pieces) == n
        assert admin.list_offsets({tp: -1}) == {tp: n}


def test_send_batch_with_a_column_missing_raises_before_sending(broker) -> None:
    """Goal: the up-front check leaves schema errors as they were: a missing value column is
    INVALID_RECORD naming it, with no row (none is at fault).

    Method: send_batch to a typed topic a table without its ``payload`` column, whose ``id``
    column needs a cast; the error names the column and no row; nothing is written."""
    value_schema = pa.schema([("id", pa.int32()), ("payload", pa.binary())])
    with Admin(broker.bootstrap) as admin:
        topic = _typed_topic(admin, value_schema)
        with bounded_producer(broker.bootstrap, acks=1) as producer, \
                pytest.raises(ApiError) as e:
            producer.send_batch(topic, pa.table({"id": pa.array([1, 2], pa.int64())}))
        assert "payload" in str(e.value) and "row" not in str(e.value), e.value
        assert admin.list_offsets({TopicPartition(topic, 0): -1}) == {
            TopicPartition(topic, 0): 0}


def test_send_blocks_once_buffer_memory_is_held_however_far_the_drainer_lags(
        broker_factory: Any) -> None:
    """Goal: ``buffer_memory`` bounds what ``send()`` accepts, as in Kafka: records count from
    the moment their chunk is handed to the drainer, not only once they are encoded batches,
    and a chunk holds at most ``batch_size`` bytes (a topic's first chunk used to take 1,000
    records whatever their size). Before, with the broker stalled and buffer_memory 100 kB,
    28,818 sends of 1 kB were accepted (19 MiB held in chunks) before one blocked.
    Method: a broker of its own, frozen with SIGSTOP after one acknowledged record; a
    producer with buffer_memory 100 kB, batch_size 16 kB and max_block_ms 1 s sends 1 kB
    records until send() raises RequestTimedOutError (at most 5,000); what it accepted must
    stay within twice buffer_memory plus a batch."""
    broker = broker_factory()
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r3", partitions=1)
    producer = producer_module.Producer(
        broker.bootstrap, acks=1, linger_ms=0, buffer_memory=100_000, batch_size=16_384,
        max_block_ms=1_000, request_timeout_ms=60_000, delivery_timeout_ms=120_000)
    accepted = 0
    try:
        producer.send(topic, b"warm").result(10)
        broker.kill(signal.SIGSTOP)
        with pytest.raises(RequestTimedOutError, match="buffer_memory"):
            while accepted < 5_000:
                producer.send(topic, b"x" * 1000)
                accepted += 1
    finally:
        broker.kill(signal.SIGCONT)
        with contextlib.suppress(ApiError):
            producer.close(10)
    assert accepted * 1000 <= 2 * 100_000 + 16_384, accepted


def test_send_to_a_partition_added_since_the_metadata_was_cached_is_sent(broker: Any) -> None:
    """Goal: as Kafka's send() waits for metadata that has the partition, a record for a
    partition added after the producer cached the topic's metadata (within
    metadata_max_age_ms) is sent, not refused; a numpy integer partition is taken as an int;
    a partition that does not exist even after a refresh is still refused, naming the topic.
    Method: a producer sends to a one-partition topic, the topic grows to three, the same
    producer sends to partition 2 (given as numpy.int64) and to partition 5."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r3", partitions=1)
        with bounded_producer(broker.bootstrap, acks=1) as producer:
            producer.send(topic, b"first", partition=0).result(10)
            admin.create_partitions({topic: 3})
            metadata = producer.send(topic, b"later", partition=np.int64(2)).result(10)
            assert (metadata.partition, metadata.offset) == (2, 0)
            with pytest.raises(InvalidRecordError, match=f"{topic}.*no partition 5"):
                producer.send(topic, b"nowhere", partition=5)
