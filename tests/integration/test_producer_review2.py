"""Regression tests for the second producer review: a partition's first batch retried while
later ones were pipelined, a batch written twice after a producer-id reset, the per-partition
in-flight cap, close() while a send waits for buffer memory, one partition's backlog starving
another in poll(), and two stop signals delivered back to back to a broker.

Each test runs against real broker processes and checks its claim by reading the records back
(or by the process's exit code), not by trusting the producer's own metadata. Two tests patch
one client method to see or delay what the network cannot show; each says why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from contextlib import suppress

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client import sender as sender_module
from logstore.errors import ApiError, ErrorCode
from logstore.rpc import client as rpc_client
from tests.brokers import bounded_producer, new_topic
from tests.helpers import wait_for


def _read_all(bootstrap: str, topic: str, partitions: int,
              timeout_s: float = 30) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition's records as (offset, value), up to the end offsets seen at the start
    (or until the deadline: the caller's assertions then say what is missing)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp]
                                                  for tp in tps):
            for tp, table in consumer.poll_arrow(timeout_ms=200).items():
                out[tp.partition] += zip(table.column("offset").to_pylist(),
                                         table.column("value").to_pylist(), strict=True)
    return out


def _send_with_isr_flips(admin: Admin, producer: Producer, topic: str, rounds: int,
                         per_round: int) -> list:
    """``rounds`` rounds of ``per_round`` keyed records (values are a global counter); in the
    middle of each round ``min_insync_replicas`` goes to 2 (on one broker, appends fail with
    the retriable NOT_ENOUGH_REPLICAS) and back to 1, so batches pipelined across a flip are
    retried while later ones succeed. Returns the futures, after a flush."""
    futures = []
    for r in range(rounds):
        base, half = r * per_round, per_round // 2
        futures += [producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 16))
                    for i in range(base, base + half)]
        admin.alter_configs({topic: {"min_insync_replicas": 2}})
        futures += [producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 16))
                    for i in range(base + half, base + per_round)]
        admin.alter_configs({topic: {"min_insync_replicas": 1}})
    producer.flush(60)
    return futures


def _first_occurrence_inversions(records: dict[int, list[tuple[int, bytes]]]
                                 ) -> tuple[set[int], list[tuple[int, int, int]]]:
    """(every value seen, [(partition, earlier, later)] where a value's first occurrence comes
    after the first occurrence of a larger value in the same partition)."""
    seen: set[int] = set()
    inversions = []
    for p, rows in records.items():
        firsts = []
        for value in (int(v) for _, v in rows):
            if value not in seen:
                seen.add(value)
                firsts.append(value)
        inversions += [(p, a, b) for a, b in zip(firsts, firsts[1:], strict=False) if b < a]
    return seen, inversions


# -- idempotent producer: a partition's first batch retried -----------------------------------

def test_idempotent_producer_keeps_every_record_when_a_partitions_first_batch_is_retried(
        broker) -> None:
    """Goal: a default (idempotent) producer delivers every record, once, when the first batch
    of a partition gets a retriable error while later batches are pipelined behind it. (The
    broker accepts any first sequence from a producer id it does not know, so a pipelined
    second batch could be written first; the retried first batch then met
    OUT_OF_ORDER_SEQUENCE_NUMBER until it failed.)

    Method: 10 trials, each with a fresh 4-partition topic and a fresh default producer (so
    every partition starts under a new producer id): 5 rounds of 300 keyed records with
    ``min_insync_replicas`` flipped 2 -> 1 mid-round (``_send_with_isr_flips``). No send may
    fail, and reading back, every value appears exactly once."""
    trials, rounds, per_round, partitions = 10, 5, 300, 4
    with Admin(broker.bootstrap) as admin:
        for trial in range(trials):
            topic = new_topic(admin, prefix="r2", partitions=partitions)
            with bounded_producer(broker.bootstrap, acks="all", retries=50, retry_backoff_ms=20,
                           linger_ms=1) as producer:
                futures = _send_with_isr_flips(admin, producer, topic, rounds, per_round)
                failed = [e for e in (f.exception(0) for f in futures) if e is not None]
            assert not failed, f"trial {trial}: {len(failed)} of {len(futures)} sends " \
                               f"failed, e.g. {failed[0]!r}"
            records = _read_all(broker.bootstrap, topic, partitions)
            values = Counter(int(v) for rows in records.values() for _, v in rows)
            assert set(values) == set(range(rounds * per_round)), \
                f"trial {trial}: {rounds * per_round - len(values)} records missing"
            twice = [v for v, n in values.items() if n > 1]
            assert not twice, f"trial {trial}: {len(twice)} records written more than " \
                              f"once, e.g. {twice[:5]}"


# -- no duplicate after a producer-id reset ---------------------------------------------------

def test_batch_acked_late_after_a_terminal_failure_is_not_written_twice(broker,
                                                                        monkeypatch) -> None:
    """Goal: when batch A of a partition fails for good (MESSAGE_TOO_LARGE, which makes the
    partition move to a fresh producer id) while the next batch B was already written but its
    ack is late (past ``request_timeout_ms``, so the producer resends it), B is written once:
    the resend must keep B's old producer id and sequence so the broker drops it as a
    duplicate, not be renumbered under the new id.

    Method: a 1-partition topic with ``max_message_bytes=10_000``; ``ProduceStream.read_ack``
    is patched (the only way to hold acks back without stopping the broker) so each stream's
    first ack, A's, arrives 0.3 s late (time enough for B to be pipelined behind it, where the
    producer allows that) and its second, B's, 2 s late against a 1 s request timeout. A
    (20 kB) must fail with MESSAGE_TOO_LARGE, B must succeed, and the partition must hold
    exactly [B]."""
    original = rpc_client.ProduceStream.read_ack
    acks_read: Counter[int] = Counter()

    def slow_acks(self):  # noqa: ANN001, ANN202 - same signature as the patched method
        acks_read[id(self)] += 1
        if acks_read[id(self)] == 1:
            time.sleep(0.3)  # A's rejection arrives after B could have been pipelined
        elif acks_read[id(self)] == 2:
            time.sleep(2.0)  # fault injection: B's ack is late (GC pause, slow network...)
        return original(self)

    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r2", partitions=1, max_message_bytes=10_000)
    monkeypatch.setattr(rpc_client.ProduceStream, "read_ack", slow_acks)
    with bounded_producer(broker.bootstrap, acks=1, linger_ms=0, request_timeout_ms=1000,
                   delivery_timeout_ms=10_000, max_request_size=1 << 20) as producer:
        fa = producer.send(topic, value=b"A" * 20_000)
        time.sleep(0.002)  # let A leave on its own, so B is a separate batch behind it
        fb = producer.send(topic, value=b"B")
        error = fa.exception(15)
        assert isinstance(error, ApiError) and error.code == ErrorCode.MESSAGE_TOO_LARGE, \
            f"A: expected MESSAGE_TOO_LARGE, got {error!r}"
        fb.result(15)
    monkeypatch.undo()
    values = [v for _, v in _read_all(broker.bootstrap, topic, 1)[0]]
    assert values == [b"B"], f"partition holds {values!r}, expected B exactly once"


# -- per-partition in-flight cap ---------------------------------------------------------------

@pytest.mark.parametrize("idempotent, cap", [(False, 1), (True, 5)],
                         ids=["not-idempotent", "idempotent"])
def test_batches_in_flight_per_partition_stay_within_the_cap_and_in_order(
        broker, monkeypatch, idempotent, cap) -> None:
    """Goal: without idempotence at most 1 batch per partition is in flight (else a retried
    batch can be overtaken); with it at most ``max_in_flight_requests_per_connection`` (5).
    The cap is per partition, not ``max_in_flight`` times the number of streams. In both
    cases no record is written before one sent earlier to its partition.

    Method: the producer first writes to a second topic, so it has two streams; then 40
    rounds of 300 keyed records to 4 partitions with ``min_insync_replicas`` flipped 2 -> 1
    mid-round (``_send_with_isr_flips``), so batches are retried. In-flight counts are not
    visible from outside, so ``Sender._next_sendable`` is wrapped to record, per partition,
    the sender's own in-flight count right after it hands out a batch. No send may fail; the
    first occurrence of every value (retries without idempotence may duplicate, as in
    Kafka) must be in send order within its partition."""
    rounds, per_round, partitions = 40, 300, 4
    peak: dict[TopicPartition, int] = {}
    original = sender_module.Sender._next_sendable

    def counting_next_sendable(self):  # noqa: ANN001, ANN202 - same signature as patched
        batch = original(self)
        if batch is not None:  # called with the sender's lock held
            peak[batch.tp] = max(peak.get(batch.tp, 0), self._inflight[batch.tp])
        return batch

    monkeypatch.setattr(sender_module.Sender, "_next_sendable", counting_next_sendable)
    with Admin(broker.bootstrap) as admin:
        topic, other = (new_topic(admin, partitions, prefix="r2"),
                        new_topic(admin, 1, prefix="r2"))
        with bounded_producer(broker.bootstrap, acks="all", enable_idempotence=idempotent,
                       retries=50, retry_backoff_ms=20, linger_ms=1) as producer:
            producer.send(other, value=b"x").result(10)  # a second stream now exists
            futures = _send_with_isr_flips(admin, producer, topic, rounds, per_round)
            failed = [e for e in (f.exception(0) for f in futures) if e is not None]
    monkeypatch.undo()
    assert not failed, f"{len(failed)} sends failed, e.g. {failed[0]!r}"
    topic_peak = {tp.partition: n for tp, n in peak.items() if tp.topic == topic}
    assert topic_peak and max(topic_peak.values()) <= cap, \
        f"batches in flight per partition {topic_peak}, cap {cap}"
    if idempotent:  # else the test never exercised pipelining and proves little
        assert max(topic_peak.values()) > 1, f"no partition pipelined: {topic_peak}"
    seen, inversions = _first_occurrence_inversions(_read_all(broker.bootstrap, topic,
                                                              partitions))
    assert seen == set(range(rounds * per_round)), "records missing"
    assert not inversions, f"{len(inversions)} records written before records sent " \
                           f"earlier to their partition, e.g. {inversions[:3]}"


# -- close() while a send waits for buffer memory ---------------------------------------------

def test_close_while_a_send_waits_for_buffer_memory_returns_promptly_and_resolves_all(
        broker_factory) -> None:
    """Goal: ``close(timeout)`` while the producer's drainer is blocked handing a batch to a
    full buffer (``buffer_memory``) returns within about 2 s of its timeout and leaves no
    future pending (before the fix it took several seconds and batches inserted after the
    sender closed never resolved).

    Method: a broker of its own (it is frozen with SIGSTOP, so nothing is acknowledged); a
    producer with ``buffer_memory=4096`` sends 40 records of 500 bytes 10 ms apart (separate
    batches), which fills the buffer; once the drainer holds a chunk it cannot hand over,
    ``close(1)`` must return (raising or not) within 3 s, and every future must be done."""
    broker = broker_factory()
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r2", partitions=1)
    producer = Producer(broker.bootstrap, acks=1, linger_ms=0, buffer_memory=4096,
                        request_timeout_ms=60_000, delivery_timeout_ms=120_000)
    try:
        producer.send(topic, value=b"warm").result(10)
        broker.kill(signal.SIGSTOP)
        futures = []
        for _ in range(40):
            futures.append(producer.send(topic, value=b"x" * 500))
            time.sleep(0.01)  # one chunk, hence one batch, per record
        # Wait (bounded) until the drainer holds a chunk the full buffer does not take.
        deadline = time.monotonic() + 5
        while not producer._draining_chunks and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        started = time.monotonic()
        with suppress(ApiError):  # close() may report the sends it had to fail
            producer.close(1)
        elapsed = time.monotonic() - started
    finally:
        broker.kill(signal.SIGCONT)
    assert elapsed < 3.0, f"close(1) took {elapsed:.1f} s"
    pending = sum(1 for f in futures if not f.done())
    assert pending == 0, f"{pending} of {len(futures)} futures not done after close()"


# -- poll() fairness ----------------------------------------------------------------------------

def test_poll_serves_a_second_partition_within_the_first_polls_despite_a_backlog(
        broker) -> None:
    """Goal: with a backlog in two partitions and a small ``max_poll_records``, ``poll()``
    does not drain the first assigned partition before serving the second: records of
    partition 1 appear within the first few polls.

    Method: 40k records of 100 bytes in each of 2 partitions; a consumer with
    ``max_poll_records=500`` assigned [p0, p1] from the earliest offset polls once (which
    opens its session), then waits until records of both partitions are buffered (pushes
    come a few milliseconds apart, while a poll of buffered records takes a tenth of one);
    partition 1's first record must arrive within the first 4 polls (draining p0 first
    would take 80)."""
    n, pieces = 20_000, 2
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r2", partitions=2)
    table = pa.table({"key": [None] * n, "value": [b"v" * 100] * n},
                     schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]))
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        for partition in (0, 1):
            for _ in range(pieces):
                producer.send_batch(topic, table, partition=partition).result(30)
    counts = {0: 0, 1: 0}
    first_p1 = None
    with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                  max_poll_records=500) as consumer:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        consumer.assign(tps)
        polls, deadline = 0, time.monotonic() + 30
        fetcher = consumer._fetcher  # noqa: SLF001 (what it has buffered)

        def both_buffered() -> bool:
            fetcher.take_arrived()
            return all(fetcher._buffer.get(tp) for tp in tps)  # noqa: SLF001

        while first_p1 is None and polls < 4 * pieces * n // 500 \
                and time.monotonic() < deadline:
            if polls == 1:
                wait_for(both_buffered, "records of both partitions buffered")
            for tp, records in consumer.poll(500).items():
                counts[tp.partition] += len(records)
            polls += 1
            if counts[1]:
                first_p1 = polls
    assert first_p1 is not None and first_p1 <= 4, \
        f"partition 1's first record came at poll {first_p1} after {counts[0]} of partition 0"


def test_poll_takes_in_a_fetch_that_came_back_while_other_records_were_buffered(
        broker) -> None:
    """Goal: ``poll()`` takes in what has already come back before it returns buffered
    records, so a partition whose records arrive after another's is not held back until
    every other buffer is drained. Method: plain fetches (``fetch_session=False``); two
    partitions with 2 MiB batches, over the 1 MiB ``max_partition_fetch_bytes``, so the
    first fetch brings partition 0's batch only (Kafka's rule) and the fetch sent right
    after asks for partition 1; once that fetch is back, the next two polls must bring
    partition 1's records (draining partition 0 first would take 40 polls)."""
    n = 20_000
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, prefix="r2", partitions=2)
    table = pa.table({"key": [None] * n, "value": [b"v" * 100] * n},
                     schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]))
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        for partition in (0, 1):
            producer.send_batch(topic, table, partition=partition).result(30)
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", max_poll_records=500,
                  fetch_session=False) as consumer:
        consumer.assign(tps)
        first = consumer.poll(10_000)
        assert set(first) == {tps[0]}, f"the first fetch brought {sorted(first)}"
        inflight = consumer._fetcher._inflight  # noqa: SLF001 (the fetch sent after it)
        assert inflight, "no fetch was sent for partition 1"
        wait_for(lambda: all(f.done() for _, f in inflight.values()),
                 "the fetch for partition 1 to come back")
        served = {tp.partition for _ in range(2) for tp in consumer.poll(0)}
    assert 1 in served, f"partition 1 was not served in two polls (got {served})"


# -- broker: two stop signals back to back ------------------------------------------------------

def test_broker_exits_cleanly_on_sigterm_then_sigint_back_to_back(broker_factory) -> None:
    """Goal: a broker sent SIGTERM and SIGINT back to back exits within 15 s with code 0
    (the second handler used to run inside the first and block on a non-reentrant lock, so
    the process never exited).

    Method: 5 brokers, started first; then each gets SIGTERM and SIGINT with no pause in
    between and must exit 0 within 15 s (a hung one is killed so teardown stays bounded)."""
    brokers = [broker_factory() for _ in range(5)]
    results = []
    for broker in brokers:
        pid = broker.process.pid
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        try:
            code: int | str = broker.process.wait(15)
        except subprocess.TimeoutExpired:
            broker.process.kill()
            broker.process.wait(15)
            code = "hung"
        results.append(code)
    bad = [(b.broker_id, code, b.stderr_tail(10)) for b, code in zip(brokers, results,
                                                                       strict=True) if code != 0]
    assert not bad, f"brokers that did not exit 0 within 15 s: {bad}"


def test_flush_waits_only_for_records_sent_before_it_while_another_thread_keeps_sending(
        broker) -> None:
    """Goal: flush() is not starved by other threads' sends (Kafka's flush covers the records
    sent before it, not the producer going idle).

    Method: a second thread sends without pause for up to 10 s; meanwhile one record is sent
    and flushed with a 5 s timeout. flush must return, with that record acknowledged."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="r2")
    stop = threading.Event()
    with bounded_producer(broker.bootstrap, linger_ms=5) as producer:
        def busy() -> None:
            deadline = time.monotonic() + 10
            while not stop.is_set() and time.monotonic() < deadline:
                producer.send(topic, value=b"busy", partition=1)

        sender = threading.Thread(target=busy)
        sender.start()
        try:
            mine = producer.send(topic, value=b"mine", partition=0)
            producer.flush(5)
            assert mine.done() and mine.result(0).offset == 0
        finally:
            stop.set()
            sender.join(15)
