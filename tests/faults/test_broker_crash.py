"""kill -9 of the broker while a producer sends: every acknowledged record survives the
restart, in order, exactly once."""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid

import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import ApiError

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_kill_9_during_production_loses_no_acknowledged_record(broker) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic = f"crash-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    acked: list[tuple[int, int, int]] = []  # (value, partition, offset)
    stop = threading.Event()

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
                    except ApiError:
                        pass
            stop.set()

    thread = threading.Thread(target=produce)
    thread.start()
    deadline = time.monotonic() + 20
    while len(acked) < 2000 + rng.randint(0, 3000) and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting on another thread's progress; no condition to wait on
    broker.kill(signal.SIGKILL)
    stop.set()
    thread.join(30)
    broker.restart()

    tps = [TopicPartition(topic, p) for p in (0, 1)]
    got: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        deadline = time.monotonic() + 30
        while sum(len(v) for v in got.values()) < sum(end.values()) and \
                time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=100_000).items():
                got[tp.partition] += [(int(r.value), r.offset) for r in records]
    assert acked, f"nothing was acknowledged before the kill (seed {seed})"
    for p in (0, 1):
        offsets = [o for _, o in got[p]]
        assert offsets == sorted(set(offsets)), f"partition {p}: duplicates or disorder (seed {seed})"
        values = [v for v, _ in got[p]]
        assert len(values) == len(set(values)), f"partition {p}: a record twice (seed {seed})"
    stored = {(p, o): v for p in (0, 1) for v, o in got[p]}
    missing = [(v, p, o) for v, p, o in acked if stored.get((p, o)) != v]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]} (seed {seed})"
