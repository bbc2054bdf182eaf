"""Delivery callbacks on the producer's futures against a real broker: kafka-python's
``add_callback``/``add_errback``/``add_both`` and concurrent.futures' ``add_done_callback``.

Each test runs against the module's broker process. Success is checked against the records
read back (partition and offset of each value), failures against what ``result()`` raises;
nothing waits on time: ``flush()`` returns only once the callbacks of the records it waited
for have run.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.batches import FutureBatchMetadata, FutureRecordMetadata
from logstore.errors import (
    ApiError,
    ErrorCode,
    MessageTooLargeError,
    TransactionAbortableError,
)
from logstore.model import RecordMetadata
from tests.brokers import bounded_producer, new_topic

Outcome = tuple[str, Any, str]  # (kind, metadata or exception, thread name)


def _record(outcomes: dict[int, list[Outcome]], future: FutureRecordMetadata, i: int
            ) -> FutureRecordMetadata:
    """Register a success callback and an errback noting record ``i``'s outcome."""
    def note(kind: str) -> Any:
        return lambda x, i: outcomes.setdefault(i, []).append(
            (kind, x, threading.current_thread().name))
    return future.add_callback(note("ok"), i).add_errback(note("error"), i=i)


def _offsets(bootstrap: str, topic: str, partitions: int, expected: int
             ) -> dict[bytes, tuple[int, int]]:
    """value -> (partition, offset) of every record read back (up to ``expected``)."""
    where: dict[bytes, tuple[int, int]] = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(where) < expected and time.monotonic() < deadline:
            for tp, table in consumer.poll_arrow(timeout_ms=500).items():
                for offset, value in zip(table.column("offset").to_pylist(),
                                         table.column("value").to_pylist(), strict=True):
                    where[value] = (tp.partition, offset)
    return where


def test_success_callbacks_get_each_records_metadata_in_send_order_per_partition(
        broker) -> None:
    """Goal: every record's callback gets the RecordMetadata ``result()`` gives, naming the
    partition and offset where the record really is, and a partition's callbacks run in send
    order, on the producer's threads, all before flush() returns.

    Method: 6,000 keyed records to 3 partitions through 16 KiB chunks (so dozens of chunks
    and pieces, several in flight at once); each callback notes (record, metadata, thread).
    After flush the notes are complete; per partition they come in send order with offsets
    0, 1, 2, ...; each matches its future's result and the record read back."""
    n = 6_000
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="cb")
    delivered: list[tuple[int, RecordMetadata, str]] = []
    failed: list[Exception] = []
    with bounded_producer(broker.bootstrap, acks="all", linger_ms=1,
                          batch_size=16 * 1024) as producer:
        futures = [producer.send(topic, b"v%d" % i, key=b"k%d" % (i % 97))
                   .add_callback(lambda m, i: delivered.append(
                       (i, m, threading.current_thread().name)), i)
                   .add_errback(failed.append) for i in range(n)]
        producer.flush(60)
        assert not failed and len(delivered) == n
        assert all(m == futures[i].result(0) for i, m, _ in delivered)
    assert threading.main_thread().name not in {name for _, _, name in delivered}
    for p in range(3):
        mine = [(i, m.offset) for i, m, _ in delivered if m.partition == p]
        assert [i for i, _ in mine] == sorted(i for i, _ in mine), f"partition {p} out of order"
        assert [o for _, o in mine] == list(range(len(mine)))
    read = _offsets(broker.bootstrap, topic, 3, n)
    assert {b"v%d" % i: (m.partition, m.offset) for i, m, _ in delivered} == read


def test_expired_records_call_their_errbacks_with_the_exception_result_raises(broker) -> None:
    """Goal: a record that fails (here: expired by delivery_timeout_ms while every attempt is
    refused) calls its errback, add_both and add_done_callback, not its success callback,
    with the very exception ``result()`` raises, in send order.

    Method: a topic whose min_insync_replicas (2) the single broker cannot meet, an acks=all
    producer with a 3 s delivery timeout, 5 records; after flush each record's errback was
    called once with its future's exception: REQUEST_TIMED_OUT naming the expiry, or, when
    the attempt refused last was answered after the deadline, NOT_ENOUGH_REPLICAS (as
    Kafka's producer fails a batch it may not retry with the refusal itself)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="cb-expire", min_insync_replicas=2)
    outcomes: dict[int, list[Outcome]] = {}
    order: list[int] = []
    done: list[FutureRecordMetadata] = []
    with bounded_producer(broker.bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=3000,
                          request_timeout_ms=2000) as producer:
        futures = [_record(outcomes, producer.send(topic, b"e%d" % i), i)
                   .add_both(lambda e, i: order.append(i), i)
                   .add_done_callback(done.append) for i in range(5)]
        producer.flush(30)
    assert order == list(range(5)) and done == futures
    for i, future in enumerate(futures):
        [(kind, error, _)] = outcomes[i]
        assert kind == "error" and error is future.exception(0)
        assert error.code == ErrorCode.NOT_ENOUGH_REPLICAS or \
            error.code == ErrorCode.REQUEST_TIMED_OUT and "expired" in str(error)


def test_a_transaction_abort_calls_the_errbacks_of_its_unacknowledged_records(broker) -> None:
    """Goal: a transactional producer's ``send()`` futures take callbacks too: a record the
    abort fails calls its errback with the TRANSACTION_ABORTABLE ``result()`` raises, while a
    record acknowledged earlier in the transaction had its success callback.

    Method: one record to a writable topic, acknowledged; one to a topic whose
    min_insync_replicas the broker cannot meet, so it is retried unwritten; abort with a
    0.5 s timeout (in a thread: the abort's marker waits for the ISR, restored once the
    errback has run)."""
    with Admin(broker.bootstrap) as admin:
        ok_topic = new_topic(admin, 1, prefix="cb-txn")
        stuck = new_topic(admin, 1, prefix="cb-stuck", min_insync_replicas=2)
    outcomes: dict[int, list[Outcome]] = {}
    errback_ran = threading.Event()
    with Producer(broker.bootstrap, transactional_id=f"cb-{ok_topic}", linger_ms=1
                  ) as producer, ThreadPoolExecutor(1) as pool:
        producer.init_transactions()
        producer.begin_transaction()
        acked = _record(outcomes, producer.send(ok_topic, b"acked"), 0)
        acked.result(30)
        late = _record(outcomes, producer.send(stuck, b"aborted"), 1)
        late.add_errback(lambda e: errback_ran.set())
        aborting = pool.submit(producer.abort_transaction, 0.5)
        assert errback_ran.wait(30), "the aborted record's errback never ran"
        with Admin(broker.bootstrap) as admin:
            admin.alter_configs({stuck: {"min_insync_replicas": 1}})
        aborting.result(60)
    [(kind, meta, _)] = outcomes[0]
    assert kind == "ok" and meta == acked.result(0)
    [(kind, error, _)] = outcomes[1]
    assert kind == "error" and isinstance(error, TransactionAbortableError)
    with pytest.raises(TransactionAbortableError) as raised:
        late.result(0)
    assert raised.value is error


def test_a_record_failed_by_close_calls_its_errback(broker) -> None:
    """Goal: a record the producer's close() fails (sent while close() flushed) calls its
    errback with the REQUEST_TIMED_OUT ``result()`` raises. Method: as the robustness test of
    close, flush wrapped so that a send() follows it inside close(); the errback is
    registered before close goes on."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="cb-close")
    producer = Producer(broker.bootstrap, acks=1, linger_ms=60_000)
    outcomes: dict[int, list[Outcome]] = {}
    late: list[FutureRecordMetadata] = []
    flush = producer.flush

    def flush_then_send(timeout: float | None = None) -> None:
        flush(timeout)
        late.append(_record(outcomes, producer.send(topic, b"late", partition=0), 0))

    producer.flush = flush_then_send  # type: ignore[method-assign]
    producer.close(30)
    [(kind, error, _)] = outcomes[0]
    assert kind == "error" and error is late[0].exception(0)
    assert error.code == ErrorCode.REQUEST_TIMED_OUT


def test_a_raising_callback_stops_neither_the_other_callbacks_nor_the_producer(
        broker, caplog: pytest.LogCaptureFixture) -> None:
    """Goal: a user callback that raises is logged with the record's topic-partition; the
    record's other callbacks, the other records' callbacks and the producer's I/O threads go
    on. Method: 300 records to 2 partitions, each with a raising callback first and a noting
    one after; after flush every record was noted and 300 errors logged naming the
    partitions; then a second round through the same producer is acknowledged and noted."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="cb-raise")

    def explode(meta: RecordMetadata) -> None:
        raise RuntimeError(f"user callback failed at offset {meta.offset}")

    noted: list[RecordMetadata] = []
    with caplog.at_level(logging.ERROR, logger="logstore.client.callbacks"), \
            bounded_producer(broker.bootstrap, acks=1, linger_ms=1) as producer:
        for i in range(300):
            producer.send(topic, b"r%d" % i, partition=i % 2).add_callback(explode) \
                .add_callback(noted.append)
        producer.flush(30)
        assert len(noted) == 300
        raised = [r for r in caplog.records if r.name == "logstore.client.callbacks"]
        assert len(raised) == 300
        assert {r.getMessage().split(":")[0] for r in raised} == {f"{topic}-0", f"{topic}-1"}
        assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in raised)
        again = [producer.send(topic, b"again", partition=p).add_callback(noted.append)
                 for p in (0, 1)]
        producer.flush(30)
        assert noted[-2:] == [f.result(0) for f in again]
        assert [m.offset for m in noted[-2:]] == [150, 150]


def test_callbacks_added_after_completion_run_at_once_on_the_callers_thread(broker) -> None:
    """Goal: a callback registered on a future already done runs before the call returns, on
    the calling thread, with the same outcome; for a success and for a record failed alone
    (too large for the topic). Method: wait for ``result()``, then register each kind."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="cb-late", max_message_bytes=10_000)
    calls: list[tuple[str, Any, threading.Thread]] = []

    def note(kind: str) -> Any:
        return lambda x: calls.append((kind, x, threading.current_thread()))

    with bounded_producer(broker.bootstrap, acks=1, linger_ms=0) as producer:
        ok = producer.send(topic, b"small")
        meta = ok.result(10)
        assert ok.add_callback(note("ok")).add_errback(note("error")) \
            .add_done_callback(note("done")) is ok
        assert calls == [("ok", meta, threading.current_thread()),
                         ("done", ok, threading.current_thread())]
        calls.clear()
        big = producer.send(topic, b"x" * 50_000)
        with pytest.raises(MessageTooLargeError) as raised:
            big.result(10)
        big.add_callback(note("ok")).add_both(note("both"))
        assert calls == [("both", raised.value, threading.current_thread())]


def test_a_send_batch_future_takes_the_same_callbacks(broker) -> None:
    """Goal: ``send_batch``'s future (FutureBatchMetadata) has the same four methods: its
    callback gets the list ``result()`` returns once every piece is acknowledged, before
    flush returns; one added afterwards runs at once. Method: 1,000 keyed rows to 3
    partitions, a callback registered at once and one after the result."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="cb-batch")
    table = pa.table({"key": [b"k%d" % i for i in range(1000)],
                      "value": [b"v%d" % i for i in range(1000)]})
    got: list[Any] = []
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        future = producer.send_batch(topic, table)
        assert isinstance(future, FutureBatchMetadata)
        assert future.add_callback(got.append).add_errback(got.append) is future
        producer.flush(30)
        assert got == [future.result(0)]
        assert sum(m.record_count for m in got[0]) == 1000
        assert {m.partition for m in got[0]} == {0, 1, 2}
        future.add_done_callback(got.append)
        assert got[-1] is future
    assert not any(isinstance(g, ApiError) for g in got)
