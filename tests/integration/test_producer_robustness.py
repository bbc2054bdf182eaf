"""Producer behaviour found wanting in review: futures that flush()/close() leave pending,
metadata naming the wrong offset, one bad record failing its neighbours, a partition wedged
after a failed batch, order without idempotence, and partitions added while a producer runs.

Each test runs against a real broker process (the module's ``broker`` fixture) and checks
the claim by reading the records back, not by trusting the producer's own metadata.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.partitioner import murmur2
from logstore.errors import ApiError, ErrorCode
from tests.brokers import bounded_producer, new_topic

MiB = 1024 * 1024


def _consume(bootstrap: str, topic: str, partitions: int, expected: int,
             timeout_s: float = 30) -> dict[int, list[tuple[int, bytes | None, bytes]]]:
    """Every partition's records as (offset, key, value), in offset order, once ``expected``
    records have arrived (or the deadline passed: the caller's assertions then say what is
    missing)."""
    out: dict[int, list[tuple[int, bytes | None, bytes]]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got, deadline = 0, time.monotonic() + timeout_s
        while got < expected and time.monotonic() < deadline:
            for tp, table in consumer.poll_arrow(timeout_ms=500).items():
                out[tp.partition] += zip(table.column("offset").to_pylist(),
                                         table.column("key").to_pylist(),
                                         table.column("value").to_pylist(), strict=True)
                got += table.num_rows
    return out


def _where(records: dict[int, list[tuple[int, bytes | None, bytes]]]
           ) -> dict[bytes, tuple[int, int]]:
    """value -> (partition, offset) for records whose values are unique."""
    return {v: (p, o) for p, rows in records.items() for o, _, v in rows}


def _partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# -- flush() and close() ----------------------------------------------------------------------

@pytest.mark.parametrize("settings, rounds, per_round", [
    ({}, 4, 50_000),
    ({"linger_ms": 1000, "batch_size": 64 * MiB}, 2, 150_000),
], ids=["defaults", "long-linger-big-batches"])
def test_flush_returns_only_when_every_future_sent_before_it_is_done(
        broker, settings, rounds, per_round) -> None:
    """Goal: ``flush()`` is a barrier: when it returns, every earlier ``send()`` is resolved.

    Method: several rounds of many keyed sends (so chunks are still being turned into batches
    when flush is called), then ``flush(60)``; right after it returns, count futures that are
    not done. Every future must also have succeeded."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=4)
    with bounded_producer(broker.bootstrap, acks=1, **settings) as producer:
        for r in range(rounds):
            futures = [producer.send(topic, value=b"v" * 100, key=b"k%d" % i)
                       for i in range(per_round)]
            producer.flush(60)
            pending = sum(1 for f in futures if not f.done())
            assert pending == 0, f"round {r}: {pending} of {per_round} futures not done " \
                                 f"right after flush() returned"
            failed = [e for e in (f.exception(0) for f in futures[:: per_round // 100]) if e]
            assert not failed, f"round {r}: sends failed, e.g. {failed[0]!r}"


def test_close_resolves_every_future_sent_before_it(broker) -> None:
    """Goal: ``close()`` delivers (or fails) everything sent before it; no future is left
    pending for ever and nothing sent is silently dropped.

    Method: two producers in turn each send 150k records with a 1 s linger, so most are
    still gathering when ``close(30)`` is called; right after close returns, every future
    must be done and successful, and the partitions' end offsets must add up to the number
    sent."""
    rounds, n = 2, 150_000
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=4)
        for r in range(rounds):
            producer = Producer(broker.bootstrap, acks=1, linger_ms=1000)
            futures = [producer.send(topic, value=b"v" * 100, key=b"k%d" % i) for i in range(n)]
            producer.close(30)
            pending = sum(1 for f in futures if not f.done())
            assert pending == 0, f"round {r}: {pending} of {n} futures not done after close()"
            failed = [e for e in (f.exception(0) for f in futures) if e is not None]
            assert not failed, f"round {r}: {len(failed)} sends failed, e.g. {failed[0]!r}"
        ends = admin.list_offsets({TopicPartition(topic, p): -1 for p in range(4)})
    assert sum(ends.values()) == rounds * n


# -- metadata names where the record is --------------------------------------------------------

def test_send_and_send_batch_from_two_threads_report_where_each_record_really_is(
        broker) -> None:
    """Goal: with ``send()`` and ``send_batch()`` used concurrently on one producer, every
    RecordMetadata and every BatchRecordMetadata names the partition and offsets where the
    records were written.

    Method: one thread sends 50 tables of 2000 unkeyed rows with ``send_batch`` while the main
    thread sends keyed records with ``send``, 200 at a time, for as long as the other thread
    runs (at most 100k); all values are unique. Consume everything back and compare
    value -> (partition, offset) with what the futures said."""
    batches, rows, max_records = 50, 2000, 100_000
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=4)
    start = threading.Barrier(2)
    batch_futures: list = []
    thread_errors: list[BaseException] = []

    def send_batches(producer: Producer) -> None:
        try:
            start.wait(10)
            for b in range(batches):
                table = pa.table({"key": pa.nulls(rows, pa.binary()),
                                  "value": pa.array([b"B%d-%d" % (b, i) for i in range(rows)])})
                batch_futures.append((b, producer.send_batch(topic, table)))
        except BaseException as e:  # reported by the main thread's assertion
            thread_errors.append(e)

    with bounded_producer(broker.bootstrap, acks=1, linger_ms=1) as producer:
        thread = threading.Thread(target=send_batches, args=(producer,))
        thread.start()
        start.wait(10)
        futures: list = []
        while thread.is_alive() and len(futures) < max_records:
            futures += [(b"r%d" % i, producer.send(topic, value=b"r%d" % i, key=b"k%d" % (i % 97)))
                        for i in range(len(futures), len(futures) + 200)]
        records = len(futures)
        thread.join(30)
        assert not thread_errors, f"send_batch thread failed: {thread_errors[0]!r}"
        producer.flush(30)
        metas = {v: f.result(10) for v, f in futures}
        pieces = {b: f.result(10) for b, f in batch_futures}
    where = _where(_consume(broker.bootstrap, topic, 4, records + batches * rows))
    assert len(where) == records + batches * rows, "records missing when consumed back"
    wrong = [(v, (m.partition, m.offset), where.get(v)) for v, m in metas.items()
             if where.get(v) != (m.partition, m.offset)]
    assert not wrong, f"{len(wrong)} send() futures name the wrong place, e.g. " \
                      f"(value, said, actual) {wrong[:3]}"
    at = {pos: v for v, pos in where.items()}
    for b, result in pieces.items():
        assert sum(piece.record_count for piece in result) == rows
        for piece in result:
            held = [at.get((piece.partition, piece.base_offset + i))
                    for i in range(piece.record_count)]
            strangers = [v for v in held if v is None or not v.startswith(b"B%d-" % b)]
            assert not strangers, f"send_batch {b}: piece {piece} holds other records, " \
                                  f"e.g. {strangers[:3]}"


# -- one bad record fails only itself ---------------------------------------------------------

def test_one_oversized_record_fails_only_its_own_future(broker) -> None:
    """Goal: a record the broker rejects (MESSAGE_TOO_LARGE for the topic's
    ``max_message_bytes``) fails its own future, not those of records to other partitions
    sent in the same linger window.

    Method: a 2-partition topic with ``max_message_bytes = 10000``; within one 200 ms linger
    window send 20 small records to partition 0 and one 50 kB record to partition 1. The small
    records must succeed at offsets 0..19 of partition 0, the big one must fail with
    MESSAGE_TOO_LARGE, and partition 1 must stay empty."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=2, max_message_bytes=10_000)
        with bounded_producer(broker.bootstrap, acks=1, linger_ms=200) as producer:
            small = [producer.send(topic, value=b"small%d" % i, partition=0) for i in range(10)]
            big = producer.send(topic, value=b"x" * 50_000, partition=1)
            small += [producer.send(topic, value=b"small%d" % i, partition=0)
                      for i in range(10, 20)]
            producer.flush(10)
            errors = [f.exception(5) for f in small]
            assert errors == [None] * 20, f"small records failed: {errors[:1]!r}"
            assert [f.result(0).offset for f in small] == list(range(20))
            with pytest.raises(ApiError) as e:
                big.result(5)
            assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE
        ends = admin.list_offsets({TopicPartition(topic, 0): -1, TopicPartition(topic, 1): -1})
    assert ends == {TopicPartition(topic, 0): 20, TopicPartition(topic, 1): 0}


@pytest.mark.parametrize("bad", [{"partition": 7}, {"value": {"a": 1}}],
                         ids=["partition-out-of-range", "dict-value-to-untyped-topic"])
def test_invalid_send_raises_from_send_and_spares_the_records_around_it(broker, bad) -> None:
    """Goal: a record that can never be valid (a partition the topic lacks, a dict value for a
    topic without a value schema) is rejected by ``send()`` itself, with an ApiError, and the
    records sent just before and after it in the same linger window are delivered.

    Method: 50 good sends, the bad send (must raise at once), 50 good sends, flush; all 100
    good futures succeed and the topic holds exactly those 100 records."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=2)
        with bounded_producer(broker.bootstrap, acks=1, linger_ms=100) as producer:
            good = [producer.send(topic, value=b"good%d" % i) for i in range(50)]
            with pytest.raises(ApiError) as e:
                producer.send(topic, **{"value": b"bad", **bad})
            assert e.value.code != ErrorCode.UNKNOWN_SERVER_ERROR
            good += [producer.send(topic, value=b"good%d" % i) for i in range(50, 100)]
            producer.flush(10)
            failed = [err for err in (f.exception(5) for f in good) if err is not None]
            assert not failed, f"{len(failed)} of 100 good records failed, e.g. {failed[0]!r}"
        ends = admin.list_offsets({TopicPartition(topic, p): -1 for p in range(2)})
    assert sum(ends.values()) == 100


# -- a partition keeps working after a terminal failure ---------------------------------------

LATER_RECORDS = 50
LATER_RECORDS_DEADLINE_S = 5.0


def _fail_by_message_too_large(admin: Admin, producer: Producer, topic: str) -> None:
    with pytest.raises(ApiError) as e:
        producer.send(topic, value=b"x" * 50_000).result(10)
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE


def _fail_by_expiry(admin: Admin, producer: Producer, topic: str) -> None:
    """acks=all with min_insync_replicas above the replica count: retried until
    delivery_timeout_ms expires the batch; the expiry names why the attempts failed."""
    admin.alter_configs({topic: {"min_insync_replicas": 2}})
    future = producer.send(topic, value=b"expires")
    with pytest.raises(ApiError, match="expired after .*the last attempt failed with "
                                       r"\[NOT_ENOUGH_REPLICAS\]"):
        future.result(15)
    assert future.done(), "the record neither succeeded nor failed within 15 s"
    admin.alter_configs({topic: {"min_insync_replicas": 1}})


@pytest.mark.parametrize("fail", [_fail_by_message_too_large, _fail_by_expiry],
                         ids=["message-too-large", "delivery-timeout-expiry"])
def test_partition_takes_later_records_promptly_and_in_order_after_a_batch_fails(
        broker, fail) -> None:
    """Goal: after a batch to partition p fails for good (rejected as too large, or expired by
    delivery_timeout_ms while retrying), later records to p are not wedged behind it (for
    instance by a sequence gap the sender retries in a hot loop): they succeed promptly, in
    order.

    Method: one partition, an idempotent acks=all producer with a 3 s delivery timeout; one
    record acknowledged, then the failure, then 50 records that must all be acknowledged
    within 5 s of being sent, at increasing offsets, and read back in send order."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=1, max_message_bytes=10_000)
        with bounded_producer(broker.bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=3000,
                      request_timeout_ms=2000) as producer:
            assert producer.send(topic, value=b"before").result(10).offset == 0
            fail(admin, producer, topic)
            started = time.monotonic()
            later = [producer.send(topic, value=b"later%d" % i) for i in range(LATER_RECORDS)]
            outcomes = []
            for f in later:
                try:
                    outcomes.append(f.result(max(started + LATER_RECORDS_DEADLINE_S
                                                 - time.monotonic(), 0.01)).offset)
                except ApiError as e:
                    outcomes.append(e)
            elapsed = time.monotonic() - started
            errors = [o for o in outcomes if isinstance(o, ApiError)]
            assert not errors, f"{len(errors)} of {LATER_RECORDS} later records failed or " \
                               f"were not acknowledged in {LATER_RECORDS_DEADLINE_S} s, " \
                               f"e.g. {errors[0]!r}"
            assert outcomes == sorted(outcomes) and len(set(outcomes)) == LATER_RECORDS
    values = [v for _, _, v in _consume(broker.bootstrap, topic, 1, 1 + LATER_RECORDS)[0]]
    assert values == [b"before"] + [b"later%d" % i for i in range(LATER_RECORDS)], \
        f"later records out of order or missing ({elapsed:.1f} s)"


# -- order without idempotence ------------------------------------------------------------------

def test_records_keep_partition_order_without_idempotence_while_batches_are_retried(
        broker) -> None:
    """Goal: with ``enable_idempotence=False`` and retries, the producer still keeps each
    partition's order (it must not pipeline several batches per partition when a failed one
    could be resent after a later one was written).

    Method: an acks=all producer sends 40 rounds of 300 keyed records to 4 partitions; in the
    middle of each round ``min_insync_replicas`` is flipped to 2 (appends fail with the
    retriable NOT_ENOUGH_REPLICAS, or NOT_ENOUGH_REPLICAS_AFTER_APPEND once written) and back
    to 1, so batches in flight across a flip are retried while later ones may succeed.
    Without idempotence a retry may write a record twice (as in Kafka), so the claim is on
    first occurrences: every record is delivered, and within each partition the first
    occurrences of the values (a global send counter) increase with offset."""
    rounds, per_round, partitions = 40, 300, 4
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=partitions)
        with bounded_producer(broker.bootstrap, acks="all", enable_idempotence=False, retries=50,
                       retry_backoff_ms=20, linger_ms=1) as producer:
            futures = []
            for r in range(rounds):
                futures += [producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 16))
                            for i in range(r * per_round, r * per_round + per_round // 2)]
                admin.alter_configs({topic: {"min_insync_replicas": 2}})
                futures += [producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 16))
                            for i in range(r * per_round + per_round // 2, (r + 1) * per_round)]
                admin.alter_configs({topic: {"min_insync_replicas": 1}})
            producer.flush(60)
            failed = [e for e in (f.exception(0) for f in futures) if e is not None]
            assert not failed, f"{len(failed)} sends failed, e.g. {failed[0]!r}"
            ends = admin.list_offsets({TopicPartition(topic, p): -1 for p in range(partitions)})
    records = _consume(broker.bootstrap, topic, partitions, sum(ends.values()))
    firsts: dict[int, list[int]] = {p: [] for p in records}
    seen: set[int] = set()
    for p, rows in records.items():
        for value in (int(v) for _, _, v in rows):
            if value not in seen:
                seen.add(value)
                firsts[p].append(value)
    assert seen == set(range(rounds * per_round)), "records missing"
    for p, values in firsts.items():
        inversions = [(a, b) for a, b in zip(values, values[1:], strict=False) if b < a]
        assert not inversions, f"partition {p}: {len(inversions)} records written before " \
                               f"records sent earlier, e.g. {inversions[:3]}"


# -- partitions added while a producer runs -----------------------------------------------------

def test_producer_sends_keyed_records_to_partitions_added_after_it_started(broker) -> None:
    """Goal: a producer created before ``Admin.create_partitions`` grows a topic picks up the
    new partition count once its metadata is refreshed (``metadata_max_age_ms``), and keyed
    records then go to ``murmur2(key) % new_count``, including the new partitions.

    Method: a 2-partition topic; the producer (metadata_max_age_ms=1000) sends keyed records
    that land by ``% 2``; the topic grows to 4; keys that hash to partitions 2 and 3 are sent
    (about every 100 ms: the refresh is internal, so there is no condition to wait on) until
    they land there, which must happen within 15 s."""
    keys = [b"key-%d" % i for i in range(200)]
    new_keys = [k for k in keys if _partition_for(k, 4) >= 2][:8]
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="t", partitions=2)
        with bounded_producer(broker.bootstrap, acks=1, linger_ms=0,
                      metadata_max_age_ms=1000) as producer:
            for key in keys[:20]:
                assert producer.send(topic, value=b"v", key=key).result(10).partition == \
                    _partition_for(key, 2)
            admin.create_partitions({topic: 4})
            deadline = time.monotonic() + 15
            landed: dict[bytes, int] = {}
            while time.monotonic() < deadline:
                landed = {k: producer.send(topic, value=b"v", key=k).result(10).partition
                          for k in new_keys}
                if all(p == _partition_for(k, 4) for k, p in landed.items()):
                    break
                # the refresh is internal to the producer (metadata_max_age_ms=1000); this only
                # paces the probe sends so the loop stays bounded in requests as well as time
                time.sleep(0.1)
    assert all(p == _partition_for(k, 4) for k, p in landed.items()), \
        f"15 s after create_partitions, keys for partitions 2/3 still land at {landed}"


def test_close_fails_a_record_sent_during_its_flush_and_ends_the_drainer(broker) -> None:
    """Goal: ``close()`` leaves no future pending and no thread behind: a record another
    thread sends after close()'s flush took the chunks is failed (it used to stay pending for
    ever), and the drainer has ended when close() returns. Method: linger_ms 60 s, so the
    record waits in its chunk; flush wrapped so that a send() follows it inside close(), as
    from another thread at that moment; the future is done with REQUEST_TIMED_OUT."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="close", partitions=1)
    producer = Producer(broker.bootstrap, acks=1, linger_ms=60_000)
    producer.send(topic, b"first", partition=0)
    producer.flush(30)
    late = []
    flush = producer.flush

    def flush_then_send(timeout: float | None = None) -> None:
        flush(timeout)
        late.append(producer.send(topic, b"late", partition=0))

    producer.flush = flush_then_send  # type: ignore[method-assign]
    producer.close(30)
    assert len(late) == 1 and late[0].done()
    with pytest.raises(ApiError) as e:
        late[0].result(0)
    assert e.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert not producer._drainer.is_alive()  # noqa: SLF001
