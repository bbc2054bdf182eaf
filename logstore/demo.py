"""``logstore demo``: the embedded end-to-end demo behind ``make demo``.

A broker in a temporary directory on 127.0.0.1 (a free port), a topic ``demo`` with 4
partitions, records produced columnar with ``send_batch`` (10k-row Arrow batches) and one at a
time with ``send``, all consumed back with ``poll_arrow`` and counted, then read again by each
``DemoStep`` given (``make demo`` has one: Spark's ``spark.read.format("logstore")``,
per-partition counts); progress bars on stderr and a throughput table on stdout. Exits non-zero
when a count is wrong.

Owns: the demo's phases, its report, and finding steps installed under the entry-point group
``logstore.demo_steps`` (the Spark step is ``jobs.demo_query:SparkStep``, declared in
pyproject.toml). Must not: reach into broker internals beyond starting and stopping one
embedded Broker (it uses the public client API like any application), or import ``jobs/``,
``datasource/`` or pyspark: the core knows a step only by its entry-point name.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import IO, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

TOPIC = "demo"
PARTITIONS = 4
BATCH_ROWS = 10_000
VALUE_BYTES = 100
KEY_SPACE = 1_000_000  # keys are key-0 .. key-999999
CONSUME_STALL_S = 30.0  # give up when no record arrives for this long
MB = 1_000_000
DEMO_STEPS_GROUP = "logstore.demo_steps"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Phase:
    name: str
    records: int
    payload_bytes: int  # keys + values
    seconds: float

    def row(self) -> str:
        secs = max(self.seconds, 1e-9)
        return (f"{self.name:<28} {self.records:>11,} {self.seconds:>8.2f} "
                f"{self.records / secs:>13,.0f} {self.payload_bytes / secs / MB:>8.1f}")


class DemoStep(Protocol):
    """A phase run after the demo's own, against the live broker, that must read every record
    of the topic (``reads_as`` completes the final line: "consumed back and read by Spark")."""

    reads_as: str

    def run(self, bootstrap: str, topic: str, expected: int, out: IO[str]) -> Phase: ...


def load_step(name: str) -> DemoStep | None:
    """The step installed as entry point ``name`` of ``logstore.demo_steps``, made with no
    arguments, or None when the installed package declares none by that name."""
    found = entry_points(group=DEMO_STEPS_GROUP, name=name)
    if not found:
        return None
    step: DemoStep = next(iter(found)).load()()
    return step


def run_demo(records: int = 1_000_000, per_record: int = 100_000,
             out: IO[str] | None = None, steps: Sequence[DemoStep] = ()) -> int:
    """Run every phase against an embedded broker, then each of ``steps``; 0 when every
    record came back, through the consumer and through each step."""
    out = out or sys.stdout
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    expected = records + per_record
    with tempfile.TemporaryDirectory(prefix="logstore-demo-") as tmp, _embedded_broker(tmp) as port:
        bootstrap = f"127.0.0.1:{port}"
        print(f"demo broker on {bootstrap}, data in {tmp}", file=out, flush=True)
        _create_topic(bootstrap)
        phases = [_produce_columnar(bootstrap, records), _produce_per_record(bootstrap, per_record)]
        checked = [_consume_all(bootstrap, expected)]
        checked += [step.run(bootstrap, TOPIC, expected, out) for step in steps]
    _print_summary(phases + checked, out)
    wrong = [p for p in checked if p.records != expected]
    if wrong:
        print(f"FAILED: produced {expected:,} records but {wrong[0].name} read "
              f"{wrong[0].records:,}", file=out, flush=True)
        return 1
    print(f"OK: all {expected:,} records consumed back"
          f"{''.join(f' and {step.reads_as}' for step in steps)}", file=out, flush=True)
    return 0


@contextmanager
def _embedded_broker(data_dir: str) -> Iterator[int]:
    from logstore.config import BrokerConfig
    from logstore.main import build_broker

    broker = build_broker(BrokerConfig(broker_id=0, listener="127.0.0.1:0",
                                       log_dirs=(data_dir,)))
    broker.start()
    serving = threading.Thread(target=broker.serve, name="demo-broker", daemon=True)
    serving.start()
    try:
        yield broker.port
    finally:
        broker.stop()
        serving.join(timeout=30)


def _create_topic(bootstrap: str) -> None:
    from logstore import Admin, NewTopic

    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS)])


# -- produce ---------------------------------------------------------------------------------


def _values(rng: np.random.Generator, rows: int) -> pa.Array:
    """``rows`` random 100-byte values built from one buffer, with no per-row Python work."""
    data = pa.py_buffer(rng.integers(0, 256, rows * VALUE_BYTES, dtype=np.uint8).tobytes())
    offsets = pa.py_buffer(np.arange(0, (rows + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32))
    return pa.Array.from_buffers(pa.binary(), rows, [None, offsets, data])


def _keys(start: int, rows: int) -> pa.Array:
    numbers = pa.array(np.arange(start, start + rows, dtype=np.int64) % KEY_SPACE)
    return pc.binary_join_element_wise("key-", pc.cast(numbers, pa.string()), "").cast(
        pa.binary())


def _batch(rng: np.random.Generator, start: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([_keys(start, rows), _values(rng, rows)],
                                      names=["key", "value"])


def _produce_columnar(bootstrap: str, records: int) -> Phase:
    from logstore import Producer

    rng = np.random.default_rng(0)
    batches = [_batch(rng, start, min(BATCH_ROWS, records - start))
               for start in range(0, records, BATCH_ROWS)]  # built before the clock starts
    payload = sum(_payload_bytes(b) for b in batches)
    with _bar(records, "produce columnar") as bar, Producer(
            bootstrap_servers=bootstrap, acks=1, linger_ms=5) as producer:
        began = time.perf_counter()
        futures = []
        for batch in batches:
            futures.append(producer.send_batch(TOPIC, batch))
            bar.update(batch.num_rows)
        producer.flush()
        for future in futures:
            future.result(timeout=60)
        seconds = time.perf_counter() - began
    return Phase("produce columnar (10k/batch)", records, payload, seconds)


def _produce_per_record(bootstrap: str, records: int) -> Phase:
    from logstore import Producer

    value = np.random.default_rng(1).integers(0, 256, VALUE_BYTES, dtype=np.uint8).tobytes()
    keys = [b"key-%d" % (i % KEY_SPACE) for i in range(records)]
    payload = sum(map(len, keys)) + records * VALUE_BYTES
    with _bar(records, "produce per record") as bar, Producer(
            bootstrap_servers=bootstrap, acks=1, linger_ms=5) as producer:
        began = time.perf_counter()
        futures = []
        for i, key in enumerate(keys):
            futures.append(producer.send(TOPIC, value=value, key=key))
            if i % 10_000 == 9_999:
                bar.update(10_000)
        producer.flush()
        for future in futures:
            future.result(timeout=60)
        bar.update(records - bar.n)
        seconds = time.perf_counter() - began
    return Phase("produce per record (send)", records, payload, seconds)


# -- consume ---------------------------------------------------------------------------------


def _consume_all(bootstrap: str, expected: int) -> Phase:
    """Read every partition from the beginning to its end offset with poll_arrow."""
    from logstore import Consumer, TopicPartition

    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    count = payload = 0
    with _bar(expected, "consume (poll_arrow)") as bar, Consumer(
            bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        end = consumer.end_offsets(tps)
        began = last = time.perf_counter()
        while any(consumer.position(tp) < end[tp] for tp in tps):
            tables = consumer.poll_arrow(timeout_ms=500)
            rows = sum(t.num_rows for t in tables.values())
            if rows:
                count, last = count + rows, time.perf_counter()
                payload += sum(_payload_bytes(t) for t in tables.values())
                bar.update(rows)
            elif time.perf_counter() - last > CONSUME_STALL_S:
                log.error("no records for %.0fs; positions %s, end offsets %s", CONSUME_STALL_S,
                          {str(tp): consumer.position(tp) for tp in tps}, end)
                break
        seconds = time.perf_counter() - began
    return Phase("consume (poll_arrow)", count, payload, seconds)


def _payload_bytes(data: pa.Table | pa.RecordBatch) -> int:
    """Key and value bytes (nulls count 0)."""
    return sum(pc.sum(pc.binary_length(data.column(name))).as_py() or 0
               for name in ("key", "value"))


# -- report ----------------------------------------------------------------------------------


@contextmanager
def _bar(total: int, name: str) -> Iterator[Any]:
    with tqdm(total=total, desc=f"{name:<22}", unit="rec", unit_scale=True,
              file=sys.stderr, mininterval=0.25) as bar:
        yield bar


def _print_summary(phases: list[Phase], out: IO[str]) -> None:
    header = f"{'phase':<28} {'records':>11} {'seconds':>8} {'records/s':>13} {'MB/s':>8}"
    print("", header, "-" * len(header), *(p.row() for p in phases), sep="\n", file=out)
    print(f"(MB/s counts key and value bytes; values are {VALUE_BYTES} bytes; "
          f"topic '{TOPIC}' has {PARTITIONS} partitions, acks=1)", file=out, flush=True)
