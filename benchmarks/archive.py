"""The archive job and history reads, against baselines from the same run.

    .venv/bin/python benchmarks/archive.py [--records N] [--json]

One broker process, one moto S3 server on 127.0.0.1 (tests/moto_s3.py) and one local[2] Spark
session whose Python workers run on this interpreter.

- ``archive_vs_raw_parquet``: records/s of a batch archive run (plan, Spark tasks reading the
  topic and writing zstd Parquet to the moto ``s3://`` warehouse, one pyiceberg commit), against
  pyarrow writing the same records (already in memory, same columns, same compression, one file
  per partition) to the same bucket through the same fsspec filesystem. Spark start-up is not
  timed (the job's driver runs in this process with the session already up), and one untimed
  archive run of a small topic comes first (Python workers start, pyiceberg is imported).
- ``archive_stream_lag_s``: ``python -m jobs.archive --mode stream`` (its own Spark, local
  warehouse, ``--trigger-interval``) while a producer writes 50k records/s for ``--stream-s``
  seconds; for every record, the time from its produce timestamp to the commit time of the
  snapshot that holds it; the median. Target: <= trigger interval + 5 s.
- ``history_read_vs_log_read``: the same Spark query (``count``, ``sum(length(value))`` over
  ``.schema("partition int, offset long, value binary")``) over offsets that are in both the
  table (local warehouse) and the log: read with ``archiveTable`` (every offset comes from the
  table's Parquet files) against the plain read from the log. Each query runs once untimed,
  then ``--runs`` times, the two alternating (the order turning every round, so a burst of
  load lands on neither side only); the medians of each side, and the median of the rounds'
  ratios log time / archive time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from common import alternate, bench_parser, broker_factory, median_ratio, report

from datasource.archive_offsets import RANGES_KEY, decode
from datasource.iceberg import catalog_settings, filesystem
from jobs.session import local_session
from logstore import Admin, NewTopic, Producer
from tests.brokers import REPO_ROOT, subprocess_env
from tests.spark.archive_helpers import load_table, run_archive, warehouse_args

PARTITIONS = 4
VALUE_BYTES = 100
BATCH_ROWS = 10_000
STREAM_RATE = 50_000
SEED = 20241124


def produce(bootstrap: str, topic: str, records: int) -> None:
    rng = np.random.default_rng(SEED)
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        futures = []
        for start in range(0, records, BATCH_ROWS):
            n = min(BATCH_ROWS, records - start)
            values = rng.integers(0, 256, n * VALUE_BYTES, dtype=np.uint8).tobytes()
            offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
            value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                           pa.py_buffer(values)])
            keys = pa.array([b"k%d" % (i % 1000) for i in range(start, start + n)])
            futures.append(producer.send_batch(topic, pa.table({"key": keys, "value": value})))
        producer.flush()
        for f in futures:
            f.result(60)


def archive_vs_raw(spark: Any, bootstrap: str, topic: str, records: int, tmp: Path,
                   s3_url: str, endpoint: str) -> dict[str, float]:
    where = warehouse_args(tmp / "s3cat", s3_url + "/wh", endpoint)
    (tmp / "s3cat").mkdir()
    with Admin(bootstrap) as admin:  # an untimed run first: Python workers, imports
        admin.create_topics([NewTopic("warm-up", PARTITIONS)])
    produce(bootstrap, "warm-up", 1000)
    run_archive(spark, "--topic", "warm-up", "--table", "bench.warm", *where,
                "--bootstrap-server", bootstrap)
    began = time.perf_counter()
    archiver = run_archive(spark, "--topic", topic, "--table", "bench.raw", *where,
                           "--bootstrap-server", bootstrap)
    archive_s = time.perf_counter() - began
    phases = {f"archive_{k.replace(' ', '_')}_s": v for k, v in archiver.totals.phases.items()}
    table = load_table(where, "bench.raw").scan().to_arrow()  # the same records, in memory
    fs, root = filesystem(catalog_settings(where[3::2], s3_url), s3_url + "/raw")
    began = time.perf_counter()
    for p in range(PARTITIONS):
        part = table.filter(pc.equal(table.column("partition"), p))
        with fs.open(f"{root}/part-{p}.parquet", "wb") as out:
            pq.write_table(part, out, compression="zstd", row_group_size=256 * 1024)
    raw_s = time.perf_counter() - began
    assert table.num_rows == records, (table.num_rows, records)
    return {"archive_s": archive_s, "raw_parquet_s": raw_s,
            "archive_rps": records / archive_s, "raw_parquet_rps": records / raw_s,
            "archive_vs_raw_parquet": raw_s / archive_s, **phases}


def history_vs_log(spark: Any, bootstrap: str, topic: str, tmp: Path, runs: int
                   ) -> dict[str, float]:
    from pyspark.sql import functions as F

    run_archive(spark, "--topic", topic, "--table", "bench.hist", "--warehouse",
                str(tmp / "local-wh"), "--bootstrap-server", bootstrap)

    def query(**extra: str) -> Callable[[], float]:
        def go() -> float:
            reader = (spark.read.format("logstore").option("bootstrap.servers", bootstrap)
                      .option("subscribe", topic)
                      .schema("partition int, offset long, value binary"))
            for k, v in extra.items():
                reader = reader.option(k, v)
            began = time.perf_counter()
            reader.load().agg(F.count("*"), F.sum(F.length("value"))).collect()
            return time.perf_counter() - began
        go()  # untimed: plans and Python workers warm
        return go

    log_s, archive_s, ratio = median_ratio(*alternate(
        runs, query(), query(archiveTable="bench.hist", archiveWarehouse=str(tmp / "local-wh")),
        swap=True))
    return {"log_read_s": log_s, "history_read_s": archive_s,
            "history_read_vs_log_read": ratio}


def stream_lag(bootstrap: str, tmp: Path, seconds: float, trigger_s: float) -> dict[str, float]:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("lag", PARTITIONS)])
    command = [sys.executable, "-m", "jobs.archive", "--topic", "lag", "--table", "bench.lag",
               "--warehouse", str(tmp / "lag-wh"), "--mode", "stream", "--trigger-interval",
               str(trigger_s), "--bootstrap-server", bootstrap, "--no-progress"]
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, env=subprocess_env(), cwd=REPO_ROOT)
    ready = threading.Event()

    def pump() -> None:
        assert job.stderr is not None
        for line in job.stderr:
            if "stream mode" in line:
                ready.set()
    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(120):
        job.kill()
        raise RuntimeError("the stream archive job did not start within 120 s")
    produced = _produce_at_rate(bootstrap, "lag", STREAM_RATE, seconds)
    _wait_archived(tmp / "lag-wh", produced, trigger_s * 3 + 30)
    job.send_signal(signal.SIGTERM)
    job.wait(60)
    delays = _delays(load_table(["--warehouse", str(tmp / "lag-wh")], "bench.lag"))
    return {"archive_stream_lag_s": float(np.median(delays)),
            "archive_stream_lag_p90_s": float(np.percentile(delays, 90)),
            "stream_records": float(produced), "trigger_interval_s": trigger_s}


def _produce_at_rate(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    step = 0.1
    rows = int(rate * step)
    sent = 0
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            now = int(time.time() * 1000)
            producer.send_batch(topic, pa.table({
                "key": pa.array([None] * rows, pa.binary()),
                "value": pa.array([b"x" * VALUE_BYTES] * rows),
                "timestamp": pa.array([now] * rows, pa.timestamp("ms", tz="UTC"))}))
            sent += rows
            time.sleep(max(began + sent / rate - time.monotonic(), 0))  # pacing the producer
        producer.flush()
    return sent


def _wait_archived(warehouse: Path, records: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            table = load_table(["--warehouse", str(warehouse)], "bench.lag")
            snapshot = table.current_snapshot()
            if snapshot is not None and int(snapshot.summary["total-records"]) >= records:
                return
        except Exception:  # noqa: BLE001 - the table may not exist yet
            pass
        time.sleep(0.5)  # another process commits; nothing to block on
    raise RuntimeError(f"the stream archive did not reach {records} records")


def _delays(table: Any) -> np.ndarray:
    """Per record: its snapshot's commit time minus its timestamp, in seconds."""
    rows = table.scan(selected_fields=("partition", "offset", "timestamp")).to_arrow()
    committed: dict[int, list[tuple[int, int, int]]] = {}
    for snapshot in table.snapshots():
        for tp, (start, end) in decode(snapshot.summary.additional_properties.get(
                RANGES_KEY)).items():
            committed.setdefault(tp.partition, []).append((start, end, snapshot.timestamp_ms))
    out = []
    for p, ranges in committed.items():
        mine = rows.filter(pc.equal(rows.column("partition"), p))
        offsets = mine.column("offset").to_numpy()
        stamps = mine.column("timestamp").cast(pa.int64()).to_numpy() // 1000
        ranges.sort()
        starts = np.array([r[0] for r in ranges])
        at = np.array([r[2] for r in ranges])
        which = np.searchsorted(starts, offsets, side="right") - 1
        out.append((at[which] - stamps) / 1000.0)
    return np.concatenate(out)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=8,
                        help="timed runs of each history/log query, alternating")
    parser.add_argument("--stream-s", type=float, default=30.0)
    parser.add_argument("--trigger-interval", type=float, default=5.0)
    args = parser.parse_args()
    from tests.moto_s3 import CREDENTIALS_ENV, MotoS3

    os.environ.update(CREDENTIALS_ENV)
    with tempfile.TemporaryDirectory(prefix="bench-archive-") as tmp_name, \
            broker_factory(Path(tmp_name)) as brokers:
        tmp = Path(tmp_name)
        broker = brokers()
        moto = MotoS3().start()
        spark = local_session("bench-archive")
        try:
            with Admin(broker.bootstrap) as admin:
                admin.create_topics([NewTopic("bench", PARTITIONS)])
            produce(broker.bootstrap, "bench", args.records)
            s3_url = f"s3://{moto.create_bucket()}"
            results = archive_vs_raw(spark, broker.bootstrap, "bench", args.records, tmp,
                                     s3_url, moto.endpoint_url)
            results |= history_vs_log(spark, broker.bootstrap, "bench", tmp, args.runs)
            results |= stream_lag(broker.bootstrap, tmp, args.stream_s, args.trigger_interval)
        finally:
            spark.stop()
            moto.stop()
    results["load_average_1m"] = os.getloadavg()[0]
    report(results, args.json, lambda k, v: f"{k:<28} {v:,.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
