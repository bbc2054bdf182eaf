"""What the benchmark scripts share, so that each keeps only what it measures.

- brokers: ``Brokers`` starts embedded brokers in their own processes (the test suite's
  ``tests.brokers.BrokerProcess``: a free port, a config TOML, the wait for "listening on",
  SIGTERM) and stops them on exit; ``broker_factory`` and ``zk_cluster`` wrap the test suite's
  ``BrokerFactory`` and ``Cluster`` (three brokers and a real ZooKeeper) the same way;
- helper processes: ``ready_process`` starts ``python -c <source>`` and waits for its "ready";
- data and timed loops: ``value_batch`` (100-byte values, null keys), ``send_batches_rps``,
  ``record_send_rps``, ``poll_arrow_rps``;
- ratios on a shared machine: ``alternate`` (the two sides of a ratio measured in turn),
  ``median_ratio``, and ``timed`` (the median of runs after a warm-up);
- the command line and output: ``bench_parser`` (the script's docstring as help, ``--json``),
  ``report`` (one JSON object, or one row per figure) and ``met`` (a figure against its target).

The repository root is appended to ``sys.path`` (``tests.*`` must be importable when a script
runs as ``python benchmarks/x.py``), not prepended: a tree named by ``PYTHONPATH`` (the README's
before/after runs) still provides ``logstore``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

from logstore import Consumer, Producer  # noqa: E402
from tests.brokers import BrokerFactory, BrokerProcess, free_port  # noqa: E402

if TYPE_CHECKING:
    from tests.faults.cluster import Cluster

__all__ = ["ROWS_PER_BATCH", "VALUE", "Broker", "Brokers", "alternate", "bench_parser",
           "broker_factory", "free_port", "median_ratio", "met", "poll_arrow_rps",
           "ready_process", "record_send_rps", "report", "send_batches_rps", "timed",
           "value_batch", "zk_cluster"]

VALUE = b"x" * 100
ROWS_PER_BATCH = 10_000
BROKER_STOP_S = 300.0  # a broker closing thousands of logs takes a while
T = TypeVar("T")


# -- brokers -------------------------------------------------------------------------------------


class Broker(BrokerProcess):
    """A benchmark's broker: ``tests.brokers.BrokerProcess`` run with this process's environment
    as it is (so ``PYTHONPATH`` picks the broker's code too), stopped by ``close``."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def close(self, timeout_s: float = BROKER_STOP_S) -> None:
        """SIGTERM; SIGKILL if it has not exited within ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(60)


class Brokers:
    """Starts brokers, each with id 0 in ``workdir/<name>``, and stops them all on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Broker] = []

    def __call__(self, name: str = "broker", prepare: Callable[[Broker], None] | None = None,
                 **settings: Any) -> Broker:
        """Start broker ``name`` with ``settings`` (TOML keys); ``prepare`` sees it before it
        starts, to write into its ``log_dir``."""
        root = self.workdir / name
        root.mkdir(parents=True)
        broker = Broker(root, 0, **settings)
        if prepare is not None:
            prepare(broker)
        self.started.append(broker)
        broker.start()
        return broker

    def __enter__(self) -> Brokers:
        return self

    def __exit__(self, *exc: object) -> None:
        for broker in self.started:
            broker.close()


@contextmanager
def broker_factory(root: Path) -> Iterator[BrokerFactory]:
    """The test suite's ``BrokerFactory`` under ``root`` (made if missing); on exit every broker
    is stopped and must exit 0."""
    root.mkdir(parents=True, exist_ok=True)
    factory = BrokerFactory(root)
    try:
        yield factory
    finally:
        factory.stop_all()


@contextmanager
def zk_cluster(root: Path, chroot: str = "bench", **settings: Any) -> Iterator[Cluster]:
    """A real ZooKeeper under ``root/zookeeper`` and the fault tests' three-broker ``Cluster``
    (``settings`` for every broker) under ``root/brokers``; all stopped on exit."""
    from tests.faults.cluster import Cluster
    from tests.zookeeper import ZooKeeperServer

    zk = ZooKeeperServer(root / "zookeeper").start()
    try:
        with broker_factory(root / "brokers") as factory:
            yield Cluster(factory, f"{zk.connect}/{chroot}", **settings)
    finally:
        zk.stop()


def ready_process(source: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """``python -c source args`` (a bare server, a scraper), once it has printed "ready"."""
    process = subprocess.Popen([sys.executable, "-c", source, *args], text=True,
                               stdin=subprocess.PIPE if stdin else None, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise RuntimeError(f"helper process did not start: {line!r}")
    return process


# -- data and timed loops ------------------------------------------------------------------------


def value_batch(rows: int = ROWS_PER_BATCH) -> pa.RecordBatch:
    """``rows`` records of a null binary key and the 100-byte ``VALUE``."""
    return pa.record_batch({"key": pa.nulls(rows, pa.binary()),
                            "value": pa.array([VALUE] * rows, pa.binary())})


def send_batches_rps(producer: Producer, topic: str, batches: Sequence[pa.RecordBatch],
                     partitions: int = 1, timeout_s: float = 300.0) -> float:
    """Records/s of ``send_batch`` of every batch (round robin over ``partitions``), from the
    first send to the last acknowledgement."""
    start = time.perf_counter()
    futures = [producer.send_batch(topic, b, partition=i % partitions)
               for i, b in enumerate(batches)]
    for f in futures:
        f.result(timeout_s)
    elapsed = time.perf_counter() - start
    return float(sum(b.num_rows for b in batches)) / elapsed


def record_send_rps(bootstrap: str, topic: str, n: int, acks: str | int = 1) -> float:
    """Records/s of ``n`` per-record ``send()`` calls of ``VALUE`` (linger_ms=5) and a flush."""
    with Producer(bootstrap, acks=acks, linger_ms=5) as producer:
        send = producer.send
        start = time.perf_counter()
        for _ in range(n):
            send(topic, VALUE)
        producer.flush(300)
        return n / (time.perf_counter() - start)


def poll_arrow_rps(consumer: Consumer, records: int) -> float:
    """Records/s of ``poll_arrow`` on an assigned consumer until ``records`` have arrived."""
    start, got = time.perf_counter(), 0
    while got < records:
        got += sum(t.num_rows for t in consumer.poll_arrow(timeout_ms=1000).values())
    return got / (time.perf_counter() - start)


# -- ratios on a shared machine ------------------------------------------------------------------


def alternate(rounds: int, first: Callable[[], T], second: Callable[[], T], swap: bool = False
              ) -> tuple[list[T], list[T]]:
    """``rounds`` measurements of each side, taken in turn (with ``swap`` the order turns every
    other round), so that a burst of load does not land on one side of a ratio only."""
    a: list[T] = []
    b: list[T] = []
    for r in range(rounds):
        if swap and r % 2:
            b.append(second())
            a.append(first())
        else:
            a.append(first())
            b.append(second())
    return a, b


def timed(query: Callable[[], T], runs: int) -> tuple[float, T]:
    """Median seconds of ``runs`` runs of ``query`` after one untimed warm-up run; and the
    last run's result."""
    result = query()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = query()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def median_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The medians of ``a`` and of ``b``, and the median of their rounds' ratios a/b."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


# -- command line and output ---------------------------------------------------------------------


def bench_parser(description: str) -> argparse.ArgumentParser:
    """The script's parser: ``description`` (its docstring, as written) and ``--json``."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def met(value: float, target: str) -> str:
    """"met" or "MISSED" for a target such as ">= 0.8" or "<= 300"; "" for no target."""
    if not target:
        return ""
    op, bound = target.split()
    ok = value >= float(bound) if op == ">=" else value <= float(bound)
    return "met" if ok else "MISSED"


def report(results: Mapping[str, Any], as_json: bool, row: Callable[[str, Any], str], *,
           header: str | None = None, digits: int | None = 3, indent: int | None = None
           ) -> None:
    """Print the figures: with ``as_json`` one JSON object (floats rounded to ``digits``, None:
    as measured), else ``header`` and ``row(name, value)`` for each figure."""
    if as_json:
        shown = {k: round(v, digits) if digits is not None and isinstance(v, float) else v
                 for k, v in results.items()}
        print(json.dumps(shown, indent=indent))
        return
    if header is not None:
        print(header)
    for name, value in results.items():
        print(row(name, value))
