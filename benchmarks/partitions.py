"""Partitions at scale on one embedded broker process: creation, restart, descriptors, memory.

    .venv/bin/python benchmarks/partitions.py [--partitions N] [--per-topic N] [--json]

Figures (printed, never asserted: machines are shared), for N partitions (default 10,000) in
topics of ``--per-topic`` partitions (default 200), created in one ``create_topics`` request:
- ``create_call_s``: how long that request took to answer;
- ``create_10k_partitions_s``: from sending it until every partition answers list_offsets
  without an error (the logs exist and are led). Target <= 10;
- ``touch_s``: one record produced to every partition, then all of them consumed back;
- ``open_fds_10k_partitions``: the broker's open descriptors after that. Target <= 2,000;
- ``restart_10k_partitions_s``: after a clean stop (SIGTERM), from starting the process to its
  "listening on" line. Target <= 5;
- ``restart_unclean_10k_partitions_s``: the same after kill -9 (logs written since their last
  flush need recovery);
- ``idle_partition_kib``: resident memory per partition of the restarted, idle broker, over
  that of a broker with no partitions; ``touched_partition_kib``: the same while every
  partition has been used (before the restart).
The broker is the test suite's (tests/brokers.py): ``python -m logstore broker start``.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import bench_parser, report

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.messages.log import ListOffsetsPartition, ListOffsetsRequest
from logstore.model import LATEST
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerProcess

WAIT_S = 600.0
POLL_S = 0.05
STARTED = time.perf_counter()


def progress(what: str) -> None:
    print(f"[{time.perf_counter() - STARTED:8.1f} s] {what}", file=sys.stderr, flush=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def topics_of(partitions: int, per_topic: int) -> dict[str, int]:
    counts = {}
    for i in range(0, partitions, per_topic):
        counts[f"scale-{i // per_topic:04d}"] = min(per_topic, partitions - i)
    return counts


def wait_usable(bootstrap: str, topics: dict[str, int]) -> None:
    """Until every partition answers list_offsets (LATEST) without an error."""
    conn = BrokerConnection(bootstrap, timeout_s=WAIT_S)
    pending = dict(topics)
    deadline = time.monotonic() + WAIT_S
    while pending:
        for name, count in list(pending.items()):
            response = conn.call(ListOffsetsRequest(topic=name, partitions=[
                ListOffsetsPartition(partition=p, timestamp=LATEST) for p in range(count)]))
            if all(r.error_code == 0 for r in response.partitions):
                del pending[name]
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(pending)} topic(s) not usable after {WAIT_S:.0f} s")
            time.sleep(POLL_S)


def create(bootstrap: str, topics: dict[str, int]) -> tuple[float, float]:
    """(seconds until the create_topics call returned, seconds until all were usable)."""
    start = time.perf_counter()
    with Admin(bootstrap, request_timeout_ms=int(WAIT_S * 1000)) as admin:
        admin.create_topics([NewTopic(name, count) for name, count in topics.items()])
    called = time.perf_counter() - start
    wait_usable(bootstrap, topics)
    return called, time.perf_counter() - start


def touch(bootstrap: str, topics: dict[str, int]) -> float:
    """Produce one record to every partition, then consume every one back."""
    tps = [TopicPartition(name, p) for name, count in topics.items() for p in range(count)]
    start = time.perf_counter()
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        futures = [producer.send(tp.topic, b"x", partition=tp.partition) for tp in tps]
        for f in futures:
            f.result(WAIT_S)
    with Consumer(bootstrap) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        seen = 0
        deadline = time.monotonic() + WAIT_S
        while seen < len(tps) and time.monotonic() < deadline:
            seen += sum(len(r) for r in consumer.poll(1000).values())
    if seen < len(tps):
        raise RuntimeError(f"consumed {seen} of {len(tps)} records")
    return time.perf_counter() - start


def timed_start(broker: BrokerProcess) -> float:
    start = time.perf_counter()
    broker.start()
    return time.perf_counter() - start


def run(partitions: int, per_topic: int, root: Path) -> dict[str, Any]:
    broker = BrokerProcess(root).start()
    try:
        assert broker.process is not None
        time.sleep(1.0)  # let the startup's background work settle before the baseline
        empty_rss = rss_kib(broker.process.pid)
        topics = topics_of(partitions, per_topic)
        out: dict[str, Any] = {"partitions": partitions}
        progress(f"creating {partitions} partitions in {len(topics)} topics")
        out["create_call_s"], out["create_10k_partitions_s"] = create(broker.bootstrap, topics)
        progress(f"created: {out}")
        out["touch_s"] = touch(broker.bootstrap, topics)
        out["open_fds_10k_partitions"] = open_fds(broker.process.pid)
        out["touched_partition_kib"] = (rss_kib(broker.process.pid) - empty_rss) / partitions
        progress(f"touched: {out}")
        assert broker.stop() == 0, broker.stderr_tail()
        progress("stopped cleanly")
        out["restart_10k_partitions_s"] = timed_start(broker)
        assert broker.process is not None
        out["open_fds_idle"] = open_fds(broker.process.pid)
        out["idle_partition_kib"] = (rss_kib(broker.process.pid) - empty_rss) / partitions
        progress(f"restarted: {out}")
        wait_usable(broker.bootstrap, topics)
        broker.kill(signal.SIGKILL)
        out["restart_unclean_10k_partitions_s"] = timed_start(broker)
        wait_usable(broker.bootstrap, topics)
        progress("restarted after kill -9")
        return out
    finally:
        if broker.running:
            broker.stop()


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--per-topic", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-partitions-bench-") as tmp:
        results = run(args.partitions, args.per_topic, Path(tmp))
    results["load_average"] = os.getloadavg()[0]
    report(results, args.json, lambda k, v: f"{k:<34} {v:>14,.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
