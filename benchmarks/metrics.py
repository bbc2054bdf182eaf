"""What metrics cost: produce with the endpoint scraped against without it, and one scrape of
a broker hosting 10,000 partitions.

    .venv/bin/python benchmarks/metrics.py [--records N] [--rounds R] [--partitions N]
                                           [--only overhead|scrape] [--json]

Embedded brokers run as separate processes on loopback. For the overhead, two alike brokers
(an 8-partition topic written to, and 200 more partitions so that a scrape has work), one with
``metrics_listener`` and a thread in this process scraping it every second, the other without;
each round produces ``--records`` records columnar (``send_batch``, 10k-row batches of 100-byte
values, acks=1) to one then the other, alternating which goes first; the ratio is the median of
the rounds' ratios (one run). For the scrape, one broker hosting ``--partitions`` partitions
(10,000, as topics of 1,000; the wait for them asks ``describe_broker_metrics``, not the
endpoint, whose scrapes would slow the creation) is scraped ``SCRAPES`` times a second apart;
the figure is the median wall time of a scrape (HTTP GET to the last byte), with the largest
beside it. ``--only overhead`` or ``--only scrape`` runs one half.

| figure                          | what                                             | target  |
|---------------------------------|--------------------------------------------------|---------|
| metrics_overhead                | produce rps scraped every second / without       | >= 0.97 |
| scrape_10k_partitions_s         | one scrape of 10,000 partitions (median)         | report  |

Figures are printed, never asserted: machines are shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logstore import Admin, NewTopic, Producer  # noqa: E402
from tests.brokers import free_port, write_broker_toml  # noqa: E402

VALUE = b"x" * 100
ROWS_PER_BATCH = 10_000
TOPIC = "bench"
PARTITIONS = 8
PADDING_PARTITIONS = 200
SCRAPES = 5
WIDE_TOPIC_PARTITIONS = 1_000


class Broker:
    def __init__(self, workdir: Path, name: str, **settings: Any) -> None:
        self.bootstrap = f"127.0.0.1:{free_port()}"
        conf = write_broker_toml(workdir / f"{name}.toml", {
            "broker_id": 0, "listener": self.bootstrap,
            "log_dirs": [str(workdir / name)], **settings})
        self.proc = subprocess.Popen([sys.executable, "-m", "logstore", "broker", "start",
                                      "--config", str(conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"broker {name} did not start: {line!r}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(300)  # closing thousands of logs takes a while
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)


def get(address: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=60) as response:
        return bytes(response.read())


class Scraper:
    """Scrapes ``address`` once a second until stopped (as Prometheus would, a little more
    often than its usual 15 s)."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._stop = threading.Event()
        self.scrapes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            get(self._address)
            self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def produce_rps(bootstrap: str, batches: list[pa.RecordBatch]) -> float:
    with Producer(bootstrap, acks=1) as producer:
        start = time.perf_counter()
        futures = [producer.send_batch(TOPIC, b, partition=i % PARTITIONS)
                   for i, b in enumerate(batches)]
        for f in futures:
            f.result(300)
        elapsed = time.perf_counter() - start
    return float(sum(b.num_rows for b in batches)) / elapsed


def overhead(workdir: Path, records: int, rounds: int) -> dict[str, float]:
    address = f"127.0.0.1:{free_port()}"
    on = Broker(workdir, "on", metrics_listener=address)
    off = Broker(workdir, "off")
    batch = pa.RecordBatch.from_pydict({"key": [None] * ROWS_PER_BATCH,
                                        "value": [VALUE] * ROWS_PER_BATCH})
    batches = [batch] * max(1, records // ROWS_PER_BATCH)
    try:
        for b in (on, off):
            with Admin(b.bootstrap) as admin:
                admin.create_topics([NewTopic(TOPIC, PARTITIONS),
                                     NewTopic("padding", PADDING_PARTITIONS)])
        scraper = Scraper(address)
        ratios: list[float] = []
        on_rps: list[float] = []
        off_rps: list[float] = []
        for r in range(rounds):
            order = [(on, on_rps), (off, off_rps)] if r % 2 == 0 else [(off, off_rps),
                                                                      (on, on_rps)]
            for broker, out in order:
                out.append(produce_rps(broker.bootstrap, batches))
            ratios.append(on_rps[-1] / off_rps[-1])
        scraper.stop()
    finally:
        on.stop()
        off.stop()
    return {"produce_rps_metrics_on": statistics.median(on_rps),
            "produce_rps_metrics_off": statistics.median(off_rps),
            "metrics_overhead": statistics.median(ratios),
            "scrapes_during_overhead": float(scraper.scrapes)}


def scrape_wide(workdir: Path, partitions: int) -> dict[str, float]:
    address = f"127.0.0.1:{free_port()}"
    broker = Broker(workdir, "wide", metrics_listener=address)
    try:
        started = time.perf_counter()
        with Admin(broker.bootstrap, request_timeout_ms=600_000) as admin:
            for i, first in enumerate(range(0, partitions, WIDE_TOPIC_PARTITIONS)):
                count = min(WIDE_TOPIC_PARTITIONS, partitions - first)
                admin.create_topics([NewTopic(f"wide-{i}", count)])
            deadline = time.monotonic() + 3600
            while hosted(admin) < partitions:  # the broker opens the logs after
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{hosted(admin)} of {partitions} partitions hosted")
                time.sleep(2.0)
        created_s = time.perf_counter() - started
        times, size = [], 0
        for _ in range(SCRAPES):
            time.sleep(1.0)
            start = time.perf_counter()
            size = len(get(address))
            times.append(time.perf_counter() - start)
    finally:
        broker.stop()
    return {"scrape_10k_partitions_s": statistics.median(times),
            "scrape_10k_partitions_max_s": max(times), "scrape_bytes": float(size),
            "partitions_scraped": float(partitions), "create_partitions_s": created_s}


def hosted(admin: Admin) -> int:
    answer = admin.describe_broker_metrics(0)[0]
    return answer.partitions if not isinstance(answer, Exception) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--only", choices=("overhead", "scrape"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="logstore-bench-metrics-") as tmp:
        if args.only != "scrape":
            figures.update(overhead(Path(tmp), args.records, args.rounds))
            print(json.dumps(figures), file=sys.stderr, flush=True)  # kept if the rest fails
        if args.only != "overhead":
            figures.update(scrape_wide(Path(tmp), args.partitions))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, value in figures.items():
        print(f"{name:32s} {value:>14,.3f}")


if __name__ == "__main__":
    main()
