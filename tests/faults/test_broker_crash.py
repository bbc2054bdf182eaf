"""The broker killed, stopped or frozen under a connected producer.

kill -9 while a producer sends: every acknowledged record survives the restart, in order,
exactly once. SIGTERM with a producer's stream still open: the broker exits 0 promptly and
keeps its data. SIGSTOP: a send fails with REQUEST_TIMED_OUT within its delivery timeout,
flush() returns, and after SIGCONT the partition takes records again.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from contextlib import suppress

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import ApiError, ErrorCode
from tests.brokers import cores_land_in_the_working_directory


def test_kill_9_during_production_loses_no_acknowledged_record(broker, seed: int) -> None:
    """Goal: after kill -9 and restart, every acknowledged record is read back at the offset
    its acknowledgement named, no record appears twice, and each key's records are in send
    order.

    Method: a thread sends keyed records (200 keys, values a global counter) with acks=all;
    the broker is killed after a random number (seeded) of acknowledgements, restarted, and
    both partitions are consumed to their end offsets."""
    rng = random.Random(seed)
    topic = f"crash-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    acked: list[tuple[int, int, int]] = []  # (value, partition, offset)
    stop = threading.Event()
    kill_after = 2000 + rng.randint(0, 3000)
    enough_acked = threading.Event()  # set by the producer thread once kill_after are acked

    def produce() -> None:
        with Producer(broker.bootstrap, acks="all", linger_ms=1,
                      delivery_timeout_ms=2000, request_timeout_ms=2000) as producer:
            i = 0
            while not stop.is_set() and i < 200_000:
                futures = [(i + j, producer.send(topic, value=b"%d" % (i + j), key=b"%d" % j))
                           for j in range(200)]
                i += 200
                for value, f in futures:
                    try:
                        m = f.result(5)
                        acked.append((value, m.partition, m.offset))
                        if len(acked) >= kill_after:
                            enough_acked.set()
                    except ApiError:
                        pass
            stop.set()
            enough_acked.set()  # ran out of records: kill now rather than wait out the limit

    thread = threading.Thread(target=produce)
    thread.start()
    enough_acked.wait(20)
    broker.kill(signal.SIGKILL)
    stop.set()
    thread.join(30)
    broker.restart()

    tps = [TopicPartition(topic, p) for p in (0, 1)]
    got: dict[int, list[tuple[int, int, bytes]]] = {0: [], 1: []}  # (value, offset, key)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        deadline = time.monotonic() + 30
        while sum(len(v) for v in got.values()) < sum(end.values()) and \
                time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=100_000).items():
                got[tp.partition] += [(int(r.value), r.offset, r.key) for r in records]
    assert acked, f"nothing was acknowledged before the kill (seed {seed})"
    for p in (0, 1):
        values = [v for v, _, _ in got[p]]
        assert len(values) == len(set(values)), f"partition {p}: a record twice (seed {seed})"
    # Each key's values were sent in increasing order, so in its partition they must
    # increase with offset (the consumer returns a partition in offset order).
    by_key: dict[bytes, list[int]] = {}
    for p in (0, 1):
        for value, _, key in got[p]:
            by_key.setdefault(key, []).append(value)
    disorder = {k: vs for k, vs in by_key.items() if vs != sorted(vs)}
    assert not disorder, f"{len(disorder)} keys out of send order, e.g. " \
                         f"{next(iter(disorder.items()))} (seed {seed})"
    stored = {(p, o): v for p in (0, 1) for v, o, _ in got[p]}
    missing = [(v, p, o) for v, p, o in acked if stored.get((p, o)) != v]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]} (seed {seed})"


SIGTERM_DEADLINE_S = 10.0


def _read_back(bootstrap: str, topic: str, partitions: int, expected: int
               ) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value for the first ``expected`` records (30 s at most)."""
    out: dict[tuple[int, int], bytes] = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(out) < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=100_000).items():
                out.update(((tp.partition, r.offset), r.value) for r in records)
    return out


def test_sigterm_stops_the_broker_promptly_while_a_producer_stream_is_open(
        broker_factory) -> None:
    """Goal: SIGTERM ends the broker within 10 s with exit code 0 even though a producer
    (not closed) holds its produce stream open, and every acknowledged record is there after
    a restart.

    Method: a producer sends 1000 keyed records and flushes, then stays open while the broker
    gets SIGTERM; the exit code is awaited for 10 s. The producer is closed only afterwards.
    The restarted broker must return every record at the offset its acknowledgement named."""
    broker = broker_factory()
    topic = f"term-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    producer = Producer(broker.bootstrap, acks=1)
    try:
        futures = [(b"%d" % i, producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 13)))
                   for i in range(1000)]
        producer.flush(10)
        acked = {(m.partition, m.offset): v for v, m in ((v, f.result(0)) for v, f in futures)}
        started = time.monotonic()
        assert broker.process is not None
        broker.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = broker.process.wait(SIGTERM_DEADLINE_S)
        except subprocess.TimeoutExpired:
            code = None
        elapsed = time.monotonic() - started
    finally:
        with suppress(ApiError):
            producer.close(5)
    if code is None:  # say how long it did take, and leave no broker behind for teardown
        with suppress(subprocess.TimeoutExpired):
            broker.process.wait(30)
        late = f"exit code {broker.process.returncode} after {time.monotonic() - started:.1f} s" \
            f" (producer closed at {elapsed:.1f} s)"
    assert code is not None, f"broker still running {elapsed:.1f} s after SIGTERM with a " \
                             f"producer connected; {late}\n{broker.stderr_tail()}"
    assert code == 0, f"broker exited {code} on SIGTERM\n{broker.stderr_tail()}"
    broker.start()
    stored = _read_back(broker.bootstrap, topic, 2, len(acked))
    lost = [(pos, v) for pos, v in acked.items() if stored.get(pos) != v]
    assert not lost, f"{len(lost)} acknowledged records not found after restart, e.g. {lost[:3]}"


def test_send_to_a_stopped_broker_times_out_and_the_partition_recovers_after_sigcont(
        broker_factory) -> None:
    """Goal: while the broker is frozen (SIGSTOP), a send with request_timeout_ms=2000 and
    delivery_timeout_ms=3000 fails with REQUEST_TIMED_OUT within 10 s, ``flush(10)`` returns
    (it does not wait for an acknowledgement that never comes), and after SIGCONT later
    records to the same partition are acknowledged promptly and in order.

    Method: one record acknowledged; SIGSTOP; one send followed at once by ``flush(10)``; the
    future must then be done (so the failure is the producer's own timeout, not our wait
    running out) with code REQUEST_TIMED_OUT. SIGCONT; 20 more records must be acknowledged
    within 10 s, and the partition reads back in send order (the timed-out record may or may
    not be there: the broker can still append it once it runs again)."""
    broker = broker_factory()
    topic = f"stop-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    producer = Producer(broker.bootstrap, acks=1, linger_ms=0, request_timeout_ms=2000,
                        delivery_timeout_ms=3000)
    try:
        assert producer.send(topic, value=b"before").result(10).offset == 0
        broker.kill(signal.SIGSTOP)
        try:
            started = time.monotonic()
            future = producer.send(topic, value=b"during")
            producer.flush(10)
            elapsed = time.monotonic() - started
            assert future.done(), "flush() returned but the record is unresolved"
            error = future.exception(0)
            assert error is not None, f"a frozen broker acknowledged {future.result(0)}"
            assert error.code == ErrorCode.REQUEST_TIMED_OUT, error
            assert elapsed <= 10, f"the timeout took {elapsed:.1f} s"
        finally:
            broker.kill(signal.SIGCONT)
        started = time.monotonic()
        later = [producer.send(topic, value=b"later%d" % i) for i in range(20)]
        for f in later:
            f.result(max(started + 10 - time.monotonic(), 0.01))
    finally:
        with suppress(ApiError):
            producer.close(10)
    values = [v for _, v in sorted(_read_back(broker.bootstrap, topic, 1, 21).items())]
    assert [v for v in values if v != b"during"] == \
        [b"before"] + [b"later%d" % i for i in range(20)]


def test_a_crash_in_native_code_leaves_every_threads_python_stack_in_the_log(
        broker_factory) -> None:
    """Goal: a broker that dies of a fault in native code (Arrow, gRPC: a SIGSEGV) says where
    its threads were, the one clue such a crash leaves. Method: SIGSEGV sent to a serving
    broker; its stderr (the broker's log) holds faulthandler's dump of its threads, and the
    report a failing test shows (``stderr_tail``) starts with the crashing thread's Python
    stack and, where the kernel writes cores to a file and gdb is installed, its native one."""
    broker = broker_factory()
    with Admin(broker.bootstrap) as admin:
        admin.list_topics()
    assert broker.kill(signal.SIGSEGV) == -signal.SIGSEGV
    log = broker.stderr_path.read_text()
    assert "Fatal Python error: Segmentation fault" in log
    assert "Thread 0x" in log and "run_broker" in log  # the main thread, waiting for a signal
    report = broker.stderr_tail().splitlines()
    assert report[0] == "Fatal Python error: Segmentation fault", report[:3]
    assert report[1].startswith("Current thread 0x"), report[:3]
    if cores_land_in_the_working_directory() and shutil.which("gdb"):
        assert "native stack of the crashing thread (gdb):" in report, report[:20]
        assert any(line.startswith("#0 ") for line in report), report[:20]
        assert not list(broker.cwd.glob("core*"))  # read once, then removed
    broker.start()  # a later failure of the same broker does not report this crash
    assert not broker.stderr_tail().startswith("Fatal Python error")
