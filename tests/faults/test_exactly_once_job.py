"""The Python exactly-once job (jobs/exactly_once_copy.py) survives kill -9 at random points.

Goal: however often the job dies (kill -9 between or inside its transactions), the output read
read_committed holds every input record exactly once, transformed, and each key's records in
input order. Method: 200k keyed records (100 keys, a sequence number per key) in a 4-partition
topic on a real broker; the job runs as a subprocess (the command the README gives) and is
killed -9 ten times, each time after a seeded random number of committed transactions plus a
seeded random delay (LOGSTORE_TEST_SEED replays), then restarted; the last run exits once idle.
The job's transactions are small (1000 records) and its timeout short, so every run gets
through a few before its kill and the whole test stays within about a minute.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from logstore import Admin, NewTopic, Producer
from tests.brokers import REPO_ROOT, BrokerFactory, BrokerProcess, subprocess_env
from tests.helpers import WAIT_S
from tests.txn_reading import assert_copied_once

RECORDS = 200_000
KEYS = 100
PARTITIONS = 4
KILLS = 10
JOB_TIMEOUT_S = 120.0
SETTINGS = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100,
            "transaction_abort_timed_out_transaction_cleanup_interval_ms": 100}


@pytest.fixture
def jbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path)
    yield factory(**SETTINGS)
    factory.stop_all()


def produce_input(bootstrap: str, topic: str) -> None:
    """RECORDS records, key ``k<i % KEYS>``, value ``k<key>:<sequence of the key>``."""
    n = np.arange(RECORDS)
    keys = [b"k%d" % k for k in range(KEYS)]
    with Producer(bootstrap, linger_ms=5) as producer:
        for lo in range(0, RECORDS, 20_000):
            chunk = n[lo:lo + 20_000]
            producer.send_batch(topic, pa.table({
                "key": pa.array([keys[i % KEYS] for i in chunk], pa.binary()),
                "value": pa.array([b"k%d:%d" % (i % KEYS, i // KEYS) for i in chunk],
                                  pa.binary())}))
        producer.flush(60)


def job_command(broker: BrokerProcess, source: str, sink: str, group: str) -> list[str]:
    return [sys.executable, "-m", "jobs.exactly_once_copy", "--bootstrap-server",
            broker.bootstrap, "--input", source, "--output", sink, "--group", group,
            "--transactional-id", f"{group}-copy", "--instance-id", f"{group}-0",
            "--max-records-per-transaction", "1000", "--transaction-timeout-ms", "5000",
            "--session-timeout-ms", "3000", "--idle-exit-ms", "3000"]


def run_until_killed(command: list[str], commits: int, delay_s: float, stderr: Path
                     ) -> bool:
    """Start the job, kill -9 it once it printed ``commits`` commit lines and ``delay_s``
    more passed; False if it finished first (a failure of its own fails the test)."""
    with open(stderr, "a") as err:
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                               env=subprocess_env(), cwd=REPO_ROOT)
    assert job.stdout is not None
    seen = 0
    for line in job.stdout:
        seen += line.startswith("committed")
        if seen >= commits:
            time.sleep(delay_s)  # the fault's timing, drawn from the seed
            job.send_signal(signal.SIGKILL)
            job.wait(WAIT_S)
            return True
    code = job.wait(WAIT_S)
    assert code == 0, f"the job failed ({code}): {stderr.read_text()[-2000:]}"
    return False


def test_the_job_copies_every_record_exactly_once_through_ten_kills(
        jbroker: BrokerProcess, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    source, sink, group = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("in", "out", "copy"))
    with Admin(jbroker.bootstrap) as admin:
        admin.create_topics([NewTopic(source, PARTITIONS), NewTopic(sink, PARTITIONS)])
    produce_input(jbroker.bootstrap, source)
    command = job_command(jbroker, source, sink, group)
    kills = 0
    deadline = time.monotonic() + 4 * JOB_TIMEOUT_S
    while kills < KILLS and time.monotonic() < deadline:
        if not run_until_killed(command, rng.randint(1, 3), rng.uniform(0, 0.1),
                                tmp_path / "job.stderr"):
            break  # it finished the input before the kills ran out
        kills += 1
    final = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(),
                           cwd=REPO_ROOT, timeout=JOB_TIMEOUT_S, check=False)
    assert final.returncode == 0, f"seed {seed}: {final.stderr[-2000:]}"
    assert kills == KILLS, f"seed {seed}: the job finished after {kills} kills"
    assert_copied_once(jbroker.bootstrap, sink, range(PARTITIONS), KEYS, RECORDS // KEYS,
                       f"seed {seed}")
