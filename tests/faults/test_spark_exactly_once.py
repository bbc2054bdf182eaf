"""The Spark exactly-once job (jobs/exactly_once_copy_spark.py, the exactly-once sink)
survives kill -9 at random points.

Goal: however often the whole Spark application dies (driver, JVM and Python workers killed -9
together: while tasks stage, while the driver publishes, just after), restarting the same
command copies every input record exactly once: the output read read_committed holds each
record once, transformed, each key's records in input order, and no transaction is left open.
Method: 200k keyed records (100 keys, a sequence number per key) in a 4-partition topic on a
real broker; the job runs as a subprocess in its own process group (the command the README
gives, ``--once``) and the group is killed -9 three times (ten with LOGSTORE_DEEP_FAULTS=1, or
LOGSTORE_SPARK_KILLS), each after a seeded random number of published micro-batches plus a
seeded random delay (LOGSTORE_TEST_SEED replays), then started again on the same checkpoint;
the last run exits once it has copied everything. The input is 80 micro-batches: at 0.3 s a
batch, ten kills with delays of up to 1 s use about 37 of them and about 70 at worst (with 40
batches and delays of up to 1.5 s, seed 3215354417 saw the job finish after nine kills); the
last run, never killed, drains the rest with a larger ``--max-records-per-batch`` (a limit
changed across a restart, as users do). Each run starts a Spark session (10-20 s idle,
minutes on a loaded machine), about 30 s a run on two cores: three kills keep the test near
two minutes of the suite's budget, and each run of the suite draws a fresh seed.
"""

from __future__ import annotations

import os
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
from tests.brokers import REPO_ROOT, BrokerFactory, BrokerProcess, spark_job_env
from tests.helpers import WAIT_S, fault_rounds
from tests.txn_reading import assert_copied_once, end_offsets

RECORDS = 200_000
KEYS = 100
PARTITIONS = 4
KILLS = int(os.environ.get("LOGSTORE_SPARK_KILLS") or fault_rounds(3, 10))
BATCH = 2_500  # 80 micro-batches: the kills use 2 and a delay's worth each on average
LAST_RUN_BATCH = 50_000
KILL_DELAY_S = 1.0  # the longest wait after the published batch that triggers a kill
RUN_TIMEOUT_S = 900.0


@pytest.fixture
def kbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    (tmp_path / "broker").mkdir()
    factory = BrokerFactory(tmp_path / "broker")
    yield factory()
    factory.stop_all()


def produce_input(bootstrap: str, topic: str) -> None:
    """RECORDS records, key ``k<i % KEYS>``, value ``k<key>:<sequence of the key>``."""
    keys = np.array([b"k%d" % k for k in range(KEYS)], dtype=object)
    with Producer(bootstrap, linger_ms=5) as producer:
        for lo in range(0, RECORDS, 20_000):
            n = np.arange(lo, lo + 20_000)
            producer.send_batch(topic, pa.table({
                "key": pa.array(keys[n % KEYS], pa.binary()),
                "value": pa.array([b"k%d:%d" % (i % KEYS, i // KEYS) for i in n],
                                  pa.binary())}))
        producer.flush(60)


def job_command(broker: BrokerProcess, source: str, sink: str, checkpoint: Path,
                batch: int = BATCH) -> list[str]:
    return [sys.executable, "-m", "jobs.exactly_once_copy_spark", "--bootstrap-server",
            broker.bootstrap, "--input", source, "--output", sink, "--checkpoint",
            str(checkpoint), "--max-records-per-batch", str(batch), "--once"]


def run(command: list[str], stderr: Path, kill_after: tuple[int, float] | None) -> bool:
    """Run the job; with ``kill_after`` (batches, delay) kill its process group -9 once it
    printed that many published batches and the delay passed: True if it was killed, False
    if it finished first (a failure of its own fails the test)."""
    with open(stderr, "a") as err:
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                               env=spark_job_env(), cwd=REPO_ROOT, start_new_session=True)
    assert job.stdout is not None
    seen = 0
    try:
        for line in job.stdout:
            seen += line.startswith("committed batch")
            if kill_after is not None and seen >= kill_after[0]:
                time.sleep(kill_after[1])  # the fault's timing, drawn from the seed
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(WAIT_S)
                return True
        code = job.wait(RUN_TIMEOUT_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(WAIT_S)
    assert code == 0, f"the job failed ({code}): {stderr.read_text()[-3000:]}"
    return False


@pytest.mark.timeout(3600)
def test_the_spark_job_copies_every_record_exactly_once_through_repeated_kills(
        kbroker: BrokerProcess, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    source, sink = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("in", "out"))
    with Admin(kbroker.bootstrap) as admin:
        admin.create_topics([NewTopic(source, PARTITIONS), NewTopic(sink, PARTITIONS)])
    produce_input(kbroker.bootstrap, source)
    command = job_command(kbroker, source, sink, tmp_path / "checkpoint")
    stderr = tmp_path / "job.stderr"
    kills = 0
    while kills < KILLS:
        if not run(command, stderr, (rng.randint(1, 3), rng.uniform(0, KILL_DELAY_S))):
            break  # it finished the input before the kills ran out
        kills += 1
    # The last run drains the rest in larger micro-batches (about 40 of 2,500 records were
    # 20-30 s of the test): Spark replays the batch the dead run planned with the offsets it
    # logged, whatever the option says now, and plans the next ones with the new limit.
    run(job_command(kbroker, source, sink, tmp_path / "checkpoint", LAST_RUN_BATCH), stderr,
        None)
    assert kills == KILLS, f"seed {seed}: the job finished after {kills} kills"
    assert_copied_once(kbroker.bootstrap, sink, range(PARTITIONS), KEYS, RECORDS // KEYS,
                       f"seed {seed}")
    assert end_offsets(kbroker.bootstrap, sink, range(PARTITIONS)) == \
        end_offsets(kbroker.bootstrap, sink, range(PARTITIONS), "read_uncommitted"), \
        f"seed {seed}: a transaction is still open on the output"
