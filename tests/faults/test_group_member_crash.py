"""kill -9 of a consumer-group member.

Goal: when a member dies without leaving, its partitions move to the surviving member once its
session times out, and consumption resumes exactly at the offsets it had committed: nothing
committed is skipped or read again before the committed offset, and every record is consumed.
Method: member A runs in a subprocess (committing synchronously after each small poll, with a
little simulated work per poll so it is mid-topic when killed); member B polls on a thread of
this process; once both own partitions, A gets SIGKILL; B must come to own every partition and
start each of A's former partitions at A's last committed offset.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from logstore import Admin, Consumer, TopicPartition
from tests.brokers import (
    BrokerFactory,
    BrokerProcess,
    bounded_producer,
    new_topic,
    subprocess_env,
)
from tests.helpers import WAIT_S, wait_for

PARTITIONS, RECORDS = 4, 800
SESSION_MS = 1500
MEMBER = textwrap.dedent("""
    import sys, time
    from logstore import Consumer
    bootstrap, group, topic = sys.argv[1:4]
    c = Consumer(bootstrap, group_id=group, enable_auto_commit=False, session_timeout_ms={s},
                 heartbeat_interval_ms=100, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    c.subscribe([topic])
    for _ in range(100_000):  # bounded; the test kills it long before
        records = c.poll(100, max_records=5)
        if records:
            c.commit()
            print("committed", flush=True)
        time.sleep(0.02)  # simulated work per poll, so the member is mid-topic when killed
""").format(s=SESSION_MS)


@pytest.fixture
def gbroker(broker_factory: BrokerFactory) -> Iterator[BrokerProcess]:
    yield broker_factory(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)


def test_killed_member_partitions_move_and_resume_from_committed(gbroker: BrokerProcess
                                                                 ) -> None:
    with Admin(gbroker.bootstrap) as admin:
        topic, group = new_topic(admin, PARTITIONS), f"g-{uuid.uuid4().hex[:8]}"
        with bounded_producer(gbroker.bootstrap) as producer:
            for i in range(RECORDS):
                producer.send(topic, value=b"%d" % i, partition=i % PARTITIONS)
            producer.flush()
        member_a = subprocess.Popen([sys.executable, "-c", MEMBER, gbroker.bootstrap, group,
                                     topic], stdout=subprocess.PIPE, text=True,
                                    env=subprocess_env())
        try:
            assert member_a.stdout is not None
            assert member_a.stdout.readline().startswith("committed")
            first_offsets: dict[TopicPartition, int] = {}
            seen: set[tuple[int, int]] = set()
            stop = threading.Event()
            b = Consumer(gbroker.bootstrap, group_id=group, session_timeout_ms=SESSION_MS,
                         heartbeat_interval_ms=100, auto_offset_reset="earliest",
                         fetch_max_wait_ms=100)
            b.subscribe([topic])

            def poll_b() -> None:
                deadline = time.monotonic() + 3 * WAIT_S
                while not stop.is_set() and time.monotonic() < deadline:
                    for tp, records in b.poll(50).items():
                        first_offsets.setdefault(tp, records[0].offset)
                        seen.update((tp.partition, r.offset) for r in records)

            thread = threading.Thread(target=poll_b, daemon=True)
            thread.start()
            wait_for(lambda: len(b._assignment) == PARTITIONS // 2, "B owns half")
            a_owned = {TopicPartition(topic, p) for p in range(PARTITIONS)} - set(b._assignment)
            member_a.send_signal(signal.SIGKILL)
            member_a.wait(WAIT_S)
            committed = {tp: om.offset for tp, om in admin.list_group_offsets(group).items()}
            wait_for(lambda: len(b._assignment) == PARTITIONS, "B owns every partition")
            wait_for(lambda: all(tp in first_offsets for tp in a_owned), "A's partitions read")
            for tp in a_owned:
                assert first_offsets[tp] == committed.get(tp, 0), tp
            per_partition = RECORDS // PARTITIONS
            wait_for(lambda: all((tp.partition, per_partition - 1) in seen for tp in a_owned),
                     "A's partitions read to the end")
            stop.set()
            thread.join(WAIT_S)
            b.close()
        finally:
            if member_a.poll() is None:
                member_a.kill()
                member_a.wait(WAIT_S)
