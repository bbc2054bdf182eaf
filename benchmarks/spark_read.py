"""Spark reads of LogStore topics (``format("logstore")``), against baselines from the same run.

    .venv/bin/python benchmarks/spark_read.py [--records N] [--json]

One broker process (as in production) and one local[2] Spark session whose Python workers run
on this interpreter; the executors share the broker's disk, so they read segment files directly.

- scan: ``count(*)`` and ``sum(length(value))`` over the topic and over the same records (read
  back by a Consumer) written as Parquet with pyarrow, one file per partition, read by
  ``spark.read.parquet``. Values are random bytes, so neither side gains from compression or
  dictionaries. ``scan_vs_parquet`` = parquet time / logstore time. Beside it, for reading the
  figure: the same query with ``.schema("value binary")`` (Spark does not prune a Python
  source's columns) and over one record per partition (the fixed cost every query pays).
  A second baseline bounds what any Python DataSource can do here: ``python_source_ceiling_s``
  is the same query over an in-memory Python source that yields the same number of ready-made
  10k-row batches of the same schema (no I/O at all); ``ceiling_vs_parquet`` and
  ``scan_vs_ceiling`` place LogStore between the two.
- projection: a typed topic of 20 value columns, summed over all 20 (a user schema naming them)
  and over 2 (``.schema("c0 double, c1 double")``); ``projection_speedup`` = all / two.
  ``typed_load_all_s``: all 20 summed over ``load()`` (every column, no user schema).
- micro-batch: a processing-time stream into the noop sink, fed one record at a time; each
  record is waited for on the query's progress (bounded), never with fixed sleeps. Baseline:
  the same sink and trigger over Spark's built-in ``rate`` source at one row per second.

Every timed query runs once untimed first (the first Python DataSource query pays seconds of
worker start-up), then the median of ``--runs`` runs is reported. Figures are printed, never
asserted: the machine is shared, so the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from common import bench_parser, broker_factory, met, report, timed

from jobs.session import local_session
from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.model import EARLIEST, LATEST

PARTITIONS = 8
VALUE_BYTES = 100
TYPED_COLUMNS = 20
STREAM_WAIT_S = 60.0     # at most this long for one micro-batch record to be processed
PROGRESS_POLL_S = 0.005
SEED = 20240601

TARGETS = {"scan_vs_parquet": ">= 1.0", "projection_speedup": ">= 4",
           "microbatch_overhead_ms": "<= 300"}


# -- data --------------------------------------------------------------------------------------

def random_values(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    """``n`` random ``width``-byte binary values, built from two buffers (no per-row Python)."""
    data = rng.integers(0, 256, size=n * width, dtype=np.uint8)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])


def untyped_batches(records: int, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(partition, batch) round-robin over the partitions: short decimal keys, random values."""
    rng = np.random.default_rng(SEED)
    for i, lo in enumerate(range(0, records, batch_rows)):
        n = min(batch_rows, records - lo)
        keys = pa.array(np.arange(lo, lo + n).astype("S8"), pa.binary())
        yield i % PARTITIONS, pa.record_batch({"key": keys,
                                               "value": random_values(rng, n, VALUE_BYTES)})


def typed_schema() -> pa.Schema:
    half = TYPED_COLUMNS // 2
    return pa.schema([(f"c{i}", pa.float64() if i < half else pa.int64())
                      for i in range(TYPED_COLUMNS)])


def typed_batches(records: int, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    rng = np.random.default_rng(SEED + 1)
    schema = typed_schema()
    for i, lo in enumerate(range(0, records, batch_rows)):
        n = min(batch_rows, records - lo)
        columns = {"key": pa.nulls(n, pa.binary())}
        for f in schema:
            columns[f.name] = pa.array(rng.random(n) if pa.types.is_floating(f.type)
                                       else rng.integers(0, 1 << 40, n))
        yield i % PARTITIONS, pa.record_batch(columns)


def produce(bootstrap: str, topic: str, batches: Iterator[tuple[int, pa.RecordBatch]]) -> float:
    """Send every batch with send_batch (a bounded number in flight); returns records/s."""
    sent, start = 0, time.perf_counter()
    with Producer(bootstrap, acks=1) as producer:
        in_flight = []
        for partition, batch in batches:
            in_flight.append(producer.send_batch(topic, batch, partition=partition))
            sent += batch.num_rows
            if len(in_flight) >= 64:
                in_flight.pop(0).result(120)
        for future in in_flight:
            future.result(120)
    return sent / (time.perf_counter() - start)


def write_parquet(bootstrap: str, topic: str, out_dir: Path) -> int:
    """The topic as read by a Consumer, one Parquet file per partition, in the logstore
    DataFrame's columns and types; returns the number of rows written."""
    out_dir.mkdir(parents=True)
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    total = 0
    for p in range(PARTITIONS):
        table = read_partition(bootstrap, TopicPartition(topic, p))
        n = table.num_rows
        table = pa.table({
            "key": table.column("key"), "value": table.column("value"),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": table.column("partition").cast(pa.int32()),
            "offset": table.column("offset"),
            "timestamp": table.column("timestamp").cast(schema.field("timestamp").type),
            "timestampType": pa.array(np.zeros(n, dtype=np.int32))}, schema=schema)
        pq.write_table(table, out_dir / f"part-{p:05d}.parquet")
        total += n
    return total


def read_partition(bootstrap: str, tp: TopicPartition) -> pa.Table:
    with Admin(bootstrap) as admin:
        end = admin.list_offsets({tp: LATEST})[tp]
        start = admin.list_offsets({tp: EARLIEST})[tp]
    tables = []
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + 300
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tp}: the consumer did not reach offset {end}")
            tables.extend(consumer.poll_arrow(timeout_ms=1000).values())
    return pa.concat_tables(tables).combine_chunks()


# -- Spark queries -----------------------------------------------------------------------------

def logstore_df(spark: Any, bootstrap: str, topic: str, schema: str | None = None,
                ending: str = "latest") -> Any:
    reader = spark.read.format("logstore")
    if schema is not None:
        reader = reader.schema(schema)
    return (reader.option("bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("endingOffsets", ending).load())


def scan(df: Any) -> tuple[int, int]:
    from pyspark.sql import functions as F

    row = df.agg(F.count("*"), F.sum(F.length("value"))).collect()[0]
    return int(row[0]), int(row[1])


def sum_columns(df: Any, columns: list[str]) -> list[Any]:
    from pyspark.sql import functions as F

    return list(df.agg(*[F.sum(c) for c in columns]).collect()[0])


def bench_scan(spark: Any, bootstrap: str, topic: str, parquet_dir: Path, runs: int,
               results: dict[str, float]) -> None:
    logstore_s, got = timed(lambda: scan(logstore_df(spark, bootstrap, topic)), runs)
    parquet_s, want = timed(lambda: scan(spark.read.parquet(str(parquet_dir))), runs)
    if got != want:
        raise RuntimeError(f"logstore read (count, bytes) {got}, parquet {want}")
    value_only_s, got = timed(lambda: scan(logstore_df(spark, bootstrap, topic, "value binary")),
                              runs)
    if got != want:
        raise RuntimeError(f"logstore value-only read (count, bytes) {got}, parquet {want}")
    first = json.dumps({topic: {str(p): 1 for p in range(PARTITIONS)}})
    fixed_s, _ = timed(lambda: scan(logstore_df(spark, bootstrap, topic, ending=first)), runs)
    results["logstore_scan_s"], results["parquet_scan_s"] = logstore_s, parquet_s
    results["scan_vs_parquet"] = parquet_s / logstore_s
    results["logstore_value_only_scan_s"] = value_only_s
    results["logstore_one_record_scan_s"] = fixed_s
    results["scan_rows_per_s"] = want[0] / logstore_s


def ceiling_source(rows: int, batch_rows: int) -> Any:
    """A Python DataSource that yields ``rows`` rows as one prebuilt batch, repeated, over
    PARTITIONS partitions: Spark's cost of taking Arrow batches from Python, with no I/O."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.pandas.types import from_arrow_schema

    from datasource.schema import source_arrow_schema

    per_partition = rows // PARTITIONS

    class CeilingReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(p) for p in range(PARTITIONS)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            batch = ceiling_batch(partition.value, batch_rows)
            full, rest = divmod(per_partition, batch_rows)
            for _ in range(full):
                yield batch
            if rest:
                yield batch.slice(0, rest)

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "logstore_bench_ceiling"

        def schema(self) -> Any:
            return from_arrow_schema(source_arrow_schema(None, False))

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader()

    return CeilingSource


def ceiling_batch(partition: int, rows: int) -> pa.RecordBatch:
    """One batch in the exact shape format('logstore') yields (built by its own converter)."""
    from datasource.schema import BatchConverter, source_arrow_schema
    from logstore.records import DEFAULT_SCHEMA

    rng = np.random.default_rng(SEED + partition)
    stored = pa.RecordBatch.from_arrays([
        pa.array([b"key-%d" % i for i in range(rows)]), random_values(rng, rows, VALUE_BYTES),
        pa.array(np.full(rows, 1_700_000_000_000)).cast(pa.timestamp("ms", tz="UTC")),
        pa.nulls(rows, DEFAULT_SCHEMA.field("headers").type)], schema=DEFAULT_SCHEMA)
    converter = BatchConverter(source_arrow_schema(None, False), "scan", partition)
    return converter.convert(stored, np.arange(rows, dtype=np.int64), False, 0, rows)


def bench_ceiling(spark: Any, rows: int, batch_rows: int, parquet_s: float, runs: int,
                  results: dict[str, float]) -> None:
    spark.dataSource.register(ceiling_source(rows, batch_rows))
    ceiling_s, got = timed(lambda: scan(spark.read.format("logstore_bench_ceiling").load()),
                           runs)
    if got[0] != rows // PARTITIONS * PARTITIONS:
        raise RuntimeError(f"ceiling source returned {got[0]} rows")
    results["python_source_ceiling_s"] = ceiling_s
    results["ceiling_vs_parquet"] = parquet_s / ceiling_s
    results["scan_vs_ceiling"] = ceiling_s / results["logstore_scan_s"]


def bench_projection(spark: Any, bootstrap: str, topic: str, runs: int,
                     results: dict[str, float]) -> None:
    schema = typed_schema()
    names = schema.names
    ddl = ", ".join(f"{f.name} {'double' if pa.types.is_floating(f.type) else 'bigint'}"
                    for f in schema)
    all_s, all_sums = timed(lambda: sum_columns(logstore_df(spark, bootstrap, topic, ddl),
                                                names), runs)
    two_s, two_sums = timed(lambda: sum_columns(
        logstore_df(spark, bootstrap, topic, "c0 double, c1 double"), names[:2]), runs)
    if two_sums != all_sums[:2]:
        raise RuntimeError(f"sums of c0, c1 differ: {two_sums} vs {all_sums[:2]}")
    load_s, _ = timed(lambda: sum_columns(logstore_df(spark, bootstrap, topic), names), runs)
    results["typed_all_columns_s"], results["typed_two_columns_s"] = all_s, two_s
    results["projection_speedup"] = all_s / two_s
    results["typed_load_all_s"] = load_s


# -- micro-batch -------------------------------------------------------------------------------

def bench_microbatch(spark: Any, bootstrap: str, topic: str, records: int, checkpoint: Path,
                     results: dict[str, float]) -> None:
    """One record at a time into a running stream; each is waited for before the next."""
    query = (spark.readStream.format("logstore").option("bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .writeStream.format("noop").trigger(processingTime="0 seconds")
             .option("checkpointLocation", str(checkpoint)).start())
    seen: set[int] = set()
    latencies: list[float] = []
    try:
        with Producer(bootstrap, acks=1, linger_ms=0) as producer:
            for i in range(3 + records):  # the first 3 warm up the workers and planner
                start = time.perf_counter()
                producer.send(topic, b"r%d" % i, key=b"k", partition=i % PARTITIONS)
                producer.flush(30)
                wait_for_batch(query, seen)
                if i >= 3:
                    latencies.append((time.perf_counter() - start) * 1000)
        progress = [p for p in query.recentProgress
                    if p.numInputRows == 1 and p.batchId in seen]
    finally:
        query.stop()
    durations = [p.durationMs for p in progress[3:]]
    results["microbatch_overhead_ms"] = median_of(durations, "triggerExecution")
    results["microbatch_end_to_end_ms"] = statistics.median(latencies)
    results["microbatch_batches"] = len(durations)
    for part in ("latestOffset", "addBatch", "walCommit", "commitOffsets"):
        results[f"microbatch_{part}_ms"] = median_of(durations, part)


def median_of(durations: list[dict[str, int]], part: str) -> float:
    return statistics.median(d.get(part, 0) for d in durations)


def bench_rate_baseline(spark: Any, batches: int, checkpoint: Path,
                        results: dict[str, float]) -> None:
    """Spark's own floor: the same sink and trigger over the built-in ``rate`` source at one
    row per second (so each micro-batch has one row)."""
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
             .writeStream.format("noop").trigger(processingTime="0 seconds")
             .option("checkpointLocation", str(checkpoint)).start())
    seen: set[int] = set()
    try:
        for _ in range(3 + batches):
            wait_for_batch(query, seen)
        progress = [p for p in query.recentProgress
                    if p.numInputRows == 1 and p.batchId in seen]
    finally:
        query.stop()
    results["rate_source_trigger_ms"] = median_of([p.durationMs for p in progress[3:]],
                                                  "triggerExecution")


def wait_for_batch(query: Any, seen: set[int]) -> None:
    """Until the query reports a batch with input rows that was not seen before."""
    deadline = time.monotonic() + STREAM_WAIT_S
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"the stream failed: {query.exception()}")
        p = query.lastProgress
        if p is not None and p.numInputRows > 0 and p.batchId not in seen:
            seen.add(p.batchId)
            return
        time.sleep(PROGRESS_POLL_S)  # polling interval of the bounded wait
    raise RuntimeError(f"no new micro-batch with input rows within {STREAM_WAIT_S:.0f}s")


# -- main --------------------------------------------------------------------------------------

def run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    results: dict[str, float] = {"load_1m_start": os.getloadavg()[0]}
    spark = None
    with broker_factory(workdir) as factory:
        try:
            broker = factory()
            bootstrap = broker.bootstrap
            with Admin(bootstrap) as admin:
                admin.create_topics([NewTopic("scan", PARTITIONS), NewTopic("stream", PARTITIONS),
                                     NewTopic("typed", PARTITIONS, value_schema=typed_schema())])
            results["produce_rps"] = produce(bootstrap, "scan",
                                             untyped_batches(args.records, args.batch_rows))
            typed_rows = args.typed_records or args.records
            produce(bootstrap, "typed", typed_batches(typed_rows, args.batch_rows))
            results["parquet_rows"] = write_parquet(bootstrap, "scan", workdir / "parquet")
            spark = local_session("logstore-bench")
            bench_scan(spark, bootstrap, "scan", workdir / "parquet", args.runs, results)
            bench_ceiling(spark, args.records, args.batch_rows, results["parquet_scan_s"],
                          args.runs, results)
            results["load_1m_after_scan"] = os.getloadavg()[0]
            bench_projection(spark, bootstrap, "typed", args.runs, results)
            results["typed_rows"] = typed_rows
            bench_microbatch(spark, bootstrap, "stream", args.stream_records, workdir / "ckpt",
                             results)
            bench_rate_baseline(spark, 10, workdir / "ckpt-rate", results)
        finally:
            if spark is not None:
                spark.stop()
    results["load_1m_end"] = os.getloadavg()[0]
    return results


def row(name: str, value: float) -> str:
    shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3f}"
    target = TARGETS.get(name, "")
    return f"{name:30} {shown:>14}  {target:8} {met(value, target)}"


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000,
                        help="rows per produced batch (each is one stored batch)")
    parser.add_argument("--typed-records", type=int, default=0,
                        help="rows of the 20-column typed topic (default: --records)")
    parser.add_argument("--stream-records", type=int, default=25)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spark-read-bench-") as tmp:
        results = run(args, Path(tmp))
    report(results, args.json, row, header=f"{'figure':30} {'measured':>14}  {'target':8} met")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
