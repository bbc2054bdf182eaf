"""The archive job killed -9 at random points while producers write: the table ends with every
record exactly once, and no orphan file is left.

Each run is the real job (``python -m jobs.archive``: its own Spark driver and local[1]
executors) in batch or stream mode; the kill comes at a seeded point: while Spark starts, while
tasks write files, or just after a table commit (before or during the group-offset commit).
Four kills (ten with LOGSTORE_DEEP_FAULTS=1), the mode of each drawn from the seed, then one
run to the end; the table is compared record by record with a Consumer read.
LOGSTORE_TEST_SEED replays a failure.
"""

from __future__ import annotations

import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from datasource.iceberg import catalog_settings, referenced_files, stored_files
from jobs.archive_write import run_id_of
from logstore import Admin
from tests.brokers import REPO_ROOT, BrokerProcess, bounded_producer, new_topic, spark_job_env
from tests.helpers import fault_rounds
from tests.spark.archive_helpers import load_table, table_rows, warehouse_args
from tests.spark.helpers import consumer_rows

KILLS = fault_rounds(4, 10)
RUN_TIMEOUT_S = 180.0
PHASES = ("startup", "writing", "committed")


class _Producers:
    """Records into every partition, a small batch every 50 ms, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with bounded_producer(self.bootstrap, linger_ms=5) as producer:
            while not self.stop.wait(0.05):  # a steady trickle, not a condition to wait for
                for _ in range(20):
                    producer.send(self.topic, value=b"v%d" % self.sent, key=b"k%d" % self.sent)
                    self.sent += 1
            producer.flush(30)


def _job(argv: list[str], mode: str, log_path: Path) -> tuple[subprocess.Popen[str],
                                                              queue.Queue[str | None]]:
    command = [sys.executable, "-m", "jobs.archive", *argv, "--mode", mode,
               "--trigger-interval", "1", "--master", "local[1]", "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=spark_job_env(), cwd=REPO_ROOT)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        with open(log_path, "a") as out:
            for line in process.stderr:
                out.write(line)
                lines.put(line)
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return process, lines


def _kill_at(process: subprocess.Popen[str], lines: queue.Queue[str | None], phase: str,
             rng: random.Random) -> str:
    """SIGKILL the job at ``phase``; what happened, for the failure message."""
    marker = {"startup": "archives", "writing": "writing", "committed": "committed snapshot"}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:
            return f"ended by itself ({process.wait()}) before {phase}"
        if marker[phase] in line:
            time.sleep(rng.uniform(0, 2.0 if phase == "startup" else 0.3))  # the random point
            process.send_signal(signal.SIGKILL)
            return f"killed {phase}: {process.wait()}"
    process.kill()
    raise AssertionError(f"the job never reached {phase} in {RUN_TIMEOUT_S:.0f} s")


def test_archive_killed_repeatedly_keeps_every_record_exactly_once(
        broker: BrokerProcess, tmp_path: Path, seed: int) -> None:
    """Goal: exactly once under crashes at any point, in batch and stream mode, with no orphan
    left. Method: producers write all along; KILLS runs killed -9 at seeded points (mode and
    phase drawn from the seed); then producers stop and one batch run finishes; the table
    equals a Consumer read (so nothing twice, nothing skipped) and every archive file in the
    data directory is one the table references."""
    rng = random.Random(seed)
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="kill")
    where = warehouse_args(tmp_path)
    argv = ["--topic", topic, "--table", "ns.kill", *where,
            "--bootstrap-server", broker.bootstrap, "--target-file-size", "8k"]
    producers = _Producers(broker.bootstrap, topic)
    producers.thread.start()
    history = []
    try:
        for _ in range(KILLS):
            mode = rng.choice(("batch", "stream"))
            phase = rng.choices(PHASES, weights=(1, 2, 2))[0]  # mostly where files are at stake
            process, lines = _job(argv, mode, tmp_path / "job.log")
            history.append(f"{mode}: {_kill_at(process, lines, phase, rng)}")
    finally:
        producers.stop.set()
        producers.thread.join(60)
    final = subprocess.run([sys.executable, "-m", "jobs.archive", *argv, "--no-progress",
                            "--master", "local[1]"], capture_output=True, text=True,
                           env=spark_job_env(), cwd=REPO_ROOT, timeout=RUN_TIMEOUT_S)
    assert final.returncode == 0, f"{history}\n{final.stderr[-3000:]}"
    print("kills:", *history, sep="\n  ")
    table = load_table(where, "ns.kill")
    assert table_rows(table) == consumer_rows(broker.bootstrap, topic), history
    settings = catalog_settings([], str(tmp_path / "warehouse"))
    ours = {p for p in stored_files(settings, table.location()) if run_id_of(p) is not None}
    assert ours == referenced_files(table), f"orphans left: {sorted(ours - referenced_files(table))}"
    assert producers.sent > 0 and len(history) == KILLS
