"""Fetch sessions against real broker processes: the broker pushes what a fetch would return.

Goal: a consumer on push sessions (the default) receives exactly what a consumer on plain
fetches receives, whatever it produces, seeks, adds and removes; a consumer that stops
consuming stops the pushes (the broker's unacknowledged bytes stay within the credit it
granted); retention deleting the position resets it as ``auto_offset_reset`` says; a broker
restart ends the session and the consumer reconnects; read_committed sessions push a
transaction once it commits and never an aborted one. Method: real brokers and clients,
``broker_stats`` for what the broker holds, bounded waits on conditions, seeded sequences.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import OffsetOutOfRangeError
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.log import BrokerStatsRequest, BrokerStatsResponse
from logstore.rpc.client import BrokerConnection
from logstore.rpc.session_client import PartitionNews
from tests.brokers import BrokerProcess
from tests.helpers import WAIT_S, wait_for

Records = dict[TopicPartition, list[tuple[int, bytes]]]
TXN_SETTINGS = {"transaction_abort_timed_out_transaction_cleanup_interval_ms": 100}


def stats(broker: BrokerProcess) -> BrokerStatsResponse:
    conn = BrokerConnection(broker.bootstrap, timeout_s=10)
    try:
        return conn.call(BrokerStatsRequest())
    finally:
        conn.close()


def make_topic(broker: BrokerProcess, partitions: int = 1, **config: object) -> str:
    topic = f"sess-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, config={
            k: str(v) for k, v in config.items()})])
    return topic


def read_to(consumer: Consumer, ends: dict[TopicPartition, int]) -> Records:
    """(offset, value) of every record polled until each partition's position reaches its
    end offset in ``ends``."""
    got: Records = {tp: [] for tp in ends}
    deadline = time.monotonic() + WAIT_S
    while any(consumer.position(tp) < end for tp, end in ends.items()):
        assert time.monotonic() < deadline, \
            f"positions {[consumer.position(tp) for tp in ends]} never reached {ends}"
        for tp, table in consumer.poll_arrow(timeout_ms=200).items():
            got[tp] += list(zip(table.column("offset").to_pylist(),
                                table.column("value").to_pylist(), strict=True))
    return got


def test_sessions_deliver_exactly_what_a_plain_fetch_would(broker: BrokerProcess,
                                                           seed: int) -> None:
    """Goal: pushed records are the fetched records, through any sequence of produce, seek,
    add and remove. Method: two consumers, one on a session and one on plain fetches, follow
    the same seeded sequence of 30 steps over a three-partition topic (produce a few batches,
    seek a partition anywhere in its log, or change the assignment, never to nothing); after
    each step both read to the end offsets and must have returned the same records. The
    broker opened one session in all: updates changed it."""
    rng = random.Random(seed)
    topic = make_topic(broker, 3)
    tps = [TopicPartition(topic, p) for p in range(3)]
    opened = stats(broker).fetch_sessions_opened
    with Producer(broker.bootstrap, linger_ms=0) as producer, \
            Consumer(broker.bootstrap, auto_offset_reset="earliest") as pushed, \
            Consumer(broker.bootstrap, auto_offset_reset="earliest",
                     fetch_session=False) as fetched:
        assigned = list(tps)
        for consumer in (pushed, fetched):
            consumer.assign(assigned)
        for step in range(30):
            op = rng.choice(["produce", "produce", "seek", "assign"])
            if op == "produce":
                for _ in range(rng.randint(1, 4)):
                    producer.send(topic, b"%d-%d" % (step, rng.randrange(10**6)),
                                  partition=rng.randrange(3))
                producer.flush(10)
            elif op == "seek":
                tp = rng.choice(assigned)
                offset = rng.randint(0, pushed.end_offsets([tp])[tp])
                for consumer in (pushed, fetched):
                    consumer.seek(tp, offset)
            else:
                assigned = rng.sample(tps, rng.randint(1, 3))
                for consumer in (pushed, fetched):
                    consumer.assign(assigned)
            ends = pushed.end_offsets(assigned)
            assert read_to(pushed, ends) == read_to(fetched, ends), f"step {step} ({op})"
    assert stats(broker).fetch_sessions_opened == opened + 1


@pytest.mark.parametrize("fetch_session", [True, False])
def test_a_batch_larger_than_the_partition_limit_arrives_whole(
        broker: BrokerProcess, fetch_session: bool) -> None:
    """Goal: ``max_partition_fetch_bytes`` (1 MiB by default, as in Kafka) bounds how much of
    a partition one push or fetch carries, never whether a batch arrives: a batch larger than
    it comes whole, on every partition, as Kafka returns the first batch whatever its size.
    Method: two partitions, each given one 3 MiB batch then a small one; a consumer with
    the default limits reads both partitions to their ends, on a session and on fetches."""
    topic = make_topic(broker, partitions=2)
    big = pa.table({"value": [b"b" * 1024] * 3072})
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for p in (0, 1):
            producer.send_batch(topic, big, partition=p)
            producer.send(topic, b"small", partition=p)
        producer.flush(30)
    ends = {TopicPartition(topic, p): 3073 for p in (0, 1)}
    with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                  fetch_session=fetch_session) as consumer:
        consumer.assign(list(ends))
        got = read_to(consumer, ends)
    for tp in ends:
        assert [o for o, _ in got[tp]] == list(range(3073)), tp
        assert got[tp][-1][1] == b"small"


def test_a_state_sent_with_its_first_batch_is_read_as_one_sent_alone(
        broker: BrokerProcess) -> None:
    """Goal: a session opened with ``state_with_first_batch`` (every client and follower of
    this version) and one opened without (a client that predates it) receive the same news:
    each partition's state and the same batches, in the same order, whether a push holds one
    batch or several. Method: two partitions, five batches each; two raw sessions from offset
    0 read until both partitions reach their end; the partition news of both are compared
    field by field, and the first session must have had each state carried by a batch
    frame."""
    topic = make_topic(broker, partitions=2)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for i in range(5):
            for p in (0, 1):
                producer.send_batch(topic, pa.table({"value": [b"%d" % i] * (i + 1)}),
                                    partition=p).result(WAIT_S)
    ends = {0: 15, 1: 15}

    def read(with_state: bool) -> tuple[list[tuple[object, ...]], int]:
        conn = BrokerConnection(broker.bootstrap, timeout_s=10)
        stream = conn.open_fetch_session(FetchSessionRequest(
            topic=topic, credit_bytes=1 << 20, state_with_first_batch=with_state,
            partitions=[FetchPartition(partition=p, offset=0) for p in ends]))
        counted = stream._reader = _Counted(stream._reader)
        got: list[tuple[object, ...]] = []
        positions = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + WAIT_S
        try:
            while positions != ends:
                assert time.monotonic() < deadline, f"positions {positions} never reached {ends}"
                frame = stream.read()
                assert isinstance(frame, PartitionNews), frame
                got.append((frame.state, [(b.partition, b.header, b.batch.to_pydict())
                                          for b in frame.batches]))
                if frame.batches:
                    positions[frame.state.partition] = frame.batches[-1].header.next_offset
        finally:
            stream.close()
            conn.close()
        return got, counted.chunks

    merged, merged_chunks = read(True)
    alone, alone_chunks = read(False)
    assert merged == alone
    states = sum(1 for _, batches in alone if batches)
    assert alone_chunks - merged_chunks == states, (alone_chunks, merged_chunks, states)


class _Counted:
    """A session's Flight reader that counts the frames read through it."""

    def __init__(self, reader: Any) -> None:
        self._reader, self.chunks = reader, 0

    def read_chunk(self) -> Any:
        self.chunks += 1
        return self._reader.read_chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def test_a_consumer_that_stops_consuming_bounds_what_the_broker_pushes(
        broker: BrokerProcess) -> None:
    """Goal: the broker pushes no more than the credit a consumer grants: a consumer that
    stops polling leaves the broker holding nothing more for it, however much is produced.
    Method: a consumer with a 256 KiB window reads one record and stops; 4 MiB are produced
    in 32 KiB batches; once the window is full, the broker's unacknowledged session bytes
    stay within the window plus one batch even after everything is produced; then the
    consumer reads all of it, each record once."""
    window, batch_rows = 256 * 1024, 32
    topic = make_topic(broker)
    tp = TopicPartition(topic, 0)
    value = b"v" * 1024
    pushed_before = stats(broker).fetch_session_pushed_bytes
    with Producer(broker.bootstrap, linger_ms=0) as producer, \
            Consumer(broker.bootstrap, auto_offset_reset="earliest", fetch_max_bytes=window,
                     max_partition_fetch_bytes=window) as consumer:
        consumer.assign([tp])
        producer.send_batch(topic, pa.table({"value": [value] * batch_rows}), partition=0)
        producer.flush(10)
        assert len(consumer.poll(timeout_ms=10_000, max_records=1)[tp]) == 1
        for _ in range(127):
            producer.send_batch(topic, pa.table({"value": [value] * batch_rows}),
                                partition=0)
        producer.flush(30)
        wait_for(lambda: stats(broker).fetch_session_unacknowledged_bytes >= window,
                 "the window to fill")
        end = consumer.end_offsets([tp])[tp]
        assert end == 128 * batch_rows
        held = stats(broker)
        one_batch = batch_rows * 1024 + 4096
        assert held.fetch_session_unacknowledged_bytes <= window + one_batch
        assert held.fetch_session_pushed_bytes - pushed_before <= window + one_batch
        rest = read_to(consumer, {tp: end})[tp]
    assert [o for o, _ in rest] == list(range(1, end))


def test_a_read_committed_session_pushes_a_transaction_when_it_commits(broker_factory) -> None:
    """Goal: a read_committed session pushes nothing of an open transaction, the committed
    one whole once its marker is written (the last stable offset moved), and never an aborted
    one. Method: the consumer is subscribed before the transactions start; an aborted and an
    open transaction, then the commit; the session consumer's records equal a plain
    read_committed consumer's, and the open transaction's records arrive only after the
    commit."""
    broker = broker_factory(**TXN_SETTINGS)
    topic = make_topic(broker)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer, \
            Producer(broker.bootstrap, transactional_id=f"t-{uuid.uuid4().hex[:6]}",
                     linger_ms=1) as txn, Producer(broker.bootstrap) as plain:
        consumer.assign([tp])
        consumer.poll(timeout_ms=100)  # the session is open
        txn.init_transactions()
        txn.begin_transaction()
        txn.send(topic, b"aborted", partition=0)
        txn.abort_transaction()
        txn.begin_transaction()
        txn.send(topic, b"committed", partition=0)
        txn.flush()
        plain.send(topic, b"plain", partition=0).result(10)
        before = read_to(consumer, consumer.end_offsets([tp]))[tp]
        txn.commit_transaction()
        after = read_to(consumer, consumer.end_offsets([tp]))[tp]
    assert [v for _, v in before] == []  # the open transaction holds the plain record back
    assert [v for _, v in after] == [b"committed", b"plain"]
    with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed", fetch_session=False) as fetched:
        fetched.assign([tp])
        assert read_to(fetched, fetched.end_offsets([tp]))[tp] == after


@pytest.mark.parametrize("reset", ["earliest", "none"])
def test_retention_past_the_session_position_resets_as_the_policy_says(
        broker_factory, reset: str) -> None:
    """Goal: when retention deletes the records a session was about to push, the consumer
    gets OFFSET_OUT_OF_RANGE and resets to the earliest offset (or raises with 'none').
    Method: 16 KiB segments; a consumer with an 8 KiB window reads one record and stops, so
    the session waits at a low offset; retention_bytes then deletes every sealed segment; the
    consumer reads on: what it had buffered, then (earliest) everything from the new log
    start offset to the end, or (none) OffsetOutOfRangeError."""
    broker = broker_factory(log_retention_check_interval_ms=100)
    topic = make_topic(broker, segment_bytes=16 * 1024)
    tp = TopicPartition(topic, 0)
    with Producer(broker.bootstrap, linger_ms=0) as producer, \
            Consumer(broker.bootstrap, auto_offset_reset=reset, fetch_max_bytes=8192,
                     max_partition_fetch_bytes=8192) as consumer:
        for i in range(200):
            producer.send(topic, b"%04d" % i + b"x" * 500, partition=0)
            producer.flush(10)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        assert len(consumer.poll(timeout_ms=10_000, max_records=1)[tp]) == 1
        with Admin(broker.bootstrap) as admin:
            admin.alter_configs({topic: {"retention_bytes": "1"}})
        start = wait_for(lambda: (o := consumer.beginning_offsets([tp])[tp]) > 100 and o,
                         "retention to delete the sealed segments")
        if reset == "none":
            with pytest.raises(OffsetOutOfRangeError):
                read_to(consumer, {tp: 200})
            return
        got = read_to(consumer, {tp: 200})[tp]
    offsets = [o for o, _ in got]
    resumed = offsets.index(start)
    assert offsets[:resumed] == list(range(1, resumed + 1))  # what was buffered
    assert offsets[resumed:] == list(range(start, 200))


def test_a_broker_restart_ends_the_session_and_the_consumer_reconnects(broker_factory) -> None:
    """Goal: a restart ends the session (the broker tells it BROKER_NOT_AVAILABLE, or the
    connection drops); the consumer opens a new one on the restarted broker and loses or
    repeats nothing. Method: read 50 records, restart the broker, produce 50 more; the
    consumer reads offsets 50..99 exactly once, on a session the new broker process opened."""
    broker = broker_factory()
    topic = make_topic(broker)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        with Producer(broker.bootstrap) as producer:
            for i in range(50):
                producer.send(topic, b"%d" % i, partition=0)
        first = read_to(consumer, {tp: 50})[tp]
        broker.restart()
        with Producer(broker.bootstrap) as producer:
            for i in range(50, 100):
                producer.send(topic, b"%d" % i, partition=0)
        second = read_to(consumer, {tp: 100})[tp]
        assert stats(broker).fetch_sessions == 1
    assert [o for o, _ in first + second] == list(range(100))
    assert [v for _, v in first + second] == [b"%d" % i for i in range(100)]


def _typed_values(consumer: Consumer, tp: TopicPartition, end: int) -> list[tuple[Any, str]]:
    """(amount, its Arrow type) of every record polled until ``tp``'s position reaches
    ``end``."""
    got: list[tuple[Any, str]] = []
    deadline = time.monotonic() + WAIT_S
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"position {consumer.position(tp)} never reached {end}"
        for table in consumer.poll_arrow(timeout_ms=200).values():
            kind = str(table.schema.field("amount").type)
            got += [(v, kind) for v in table.column("amount").to_pylist()]
    return got


@pytest.mark.parametrize("fetch_session", [True, False], ids=["session", "plain-fetch"])
def test_a_recreated_topic_is_read_with_its_new_value_schema(broker: BrokerProcess,
                                                            fetch_session: bool) -> None:
    """Goal: a consumer that keeps its position across a typed topic's delete and recreate
    with another value schema of the same buffer layout (amount int64, then double) reads the
    new records as doubles: a session opened under the old schema must not push them decoded
    as int64 (it did: 1.5 read as 4609434218613702656). Method: read the int64 record, delete
    and recreate the topic as double, produce three doubles from a fresh producer; the same
    consumer reads the new topic as what was written, from its start (its position was of the
    old topic: auto_offset_reset, see test_group_offsets_of_deleted_topics.py), as a plain
    fetch does; a session consumer does so on a new session (the broker ended the old one)."""
    topic = f"sess-schema-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, value_schema=pa.schema([("amount", pa.int64())]))])
        with Producer(broker.bootstrap, linger_ms=0) as producer:
            producer.send(topic, value={"amount": 7}).result(WAIT_S)
        with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                      fetch_session=fetch_session) as consumer:
            consumer.assign([tp])
            assert _typed_values(consumer, tp, 1) == [(7, "int64")]
            opened = stats(broker).fetch_sessions_opened
            admin.delete_topics([topic])
            admin.create_topics([NewTopic(topic, 1, value_schema=pa.schema(
                [("amount", pa.float64())]))])
            with Producer(broker.bootstrap, linger_ms=0) as producer:
                for v in (1.5, 2.5, 3.5):
                    producer.send(topic, value={"amount": v}).result(WAIT_S)
            assert _typed_values(consumer, tp, 3) == \
                [(1.5, "double"), (2.5, "double"), (3.5, "double")]
            if fetch_session:
                assert stats(broker).fetch_sessions_opened > opened
