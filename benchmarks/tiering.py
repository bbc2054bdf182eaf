"""Tiered storage against the raw object store, every ratio from one run.

    .venv/bin/python benchmarks/tiering.py [--mb 96] [--typed-rows 400000] [--json]

The object store is moto's S3 server on 127.0.0.1 in a process of its own (so it shares a GIL
with neither side of a comparison), counting the bytes of every GET it answers; one broker
process tiers to it through s3fs, as in production. Baselines are s3fs itself, in this
process, on the same files and objects.

- ``tier_upload_vs_raw_s3fs``: segment bytes per second the broker copies (tiering switched on
  for a topic whose sealed segments are all local, until its copy lag is zero: metadata
  writes and scheduling included) against s3fs ``put`` of the same files (each segment with
  its offset and time indexes and an epoch checkpoint, in one ``put`` call, which sends them
  concurrently as the tier does; segment after segment, as the tier's one copier thread).
- ``remote_read_vs_raw_s3fs``: a Consumer reading a remote-only range (local_retention_ms 0,
  every sealed segment copied and gone from disk), bytes per second of the segments read,
  against s3fs ``cat`` of the same objects (one call for them all: s3fs fetches them
  concurrently, as the broker reads partitions concurrently). ``local_read_mb_s``, the same
  Consumer over the topic while it was all local, is what the consumer path itself does here.
- ``remote_fetch_first_byte_ms``: one fetch of 64 KiB at a segment's first offset, cold (its
  index and first chunk not cached) and warm (the same fetch again); medians over partitions.
- ``spark_remote_projection_bytes_ratio``: bytes S3 sent for a Spark read (readMode=remote) of
  2 of 20 float64 columns against all 20.
- ``spark_remote_scan_vs_local``: the same all-columns sum over the remote-only range and over
  the same rows of an untiered copy of the topic read from the local files (local time /
  remote time: 1.0 means the remote scan is as fast).

Figures are printed, never asserted; the machine is shared, so its load is printed too.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from common import bench_parser, broker_factory, met, report

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.messages.fetch import FetchPartition, FetchRequest
from logstore.rpc.client import BrokerConnection
from tests.moto_s3 import CREDENTIALS_ENV, serve_forever

PARTITIONS = 4
SEGMENT_BYTES = 8 * 1024 * 1024
BATCH_ROWS = 10_000
VALUE_BYTES = 100
TYPED_COLUMNS = 20
POLL_S = 0.02
WAIT_S = 300.0
FIRST_BYTE_FETCH_BYTES = 64 * 1024
TARGETS = {"tier_upload_vs_raw_s3fs": ">= 0.8", "remote_read_vs_raw_s3fs": ">= 0.8",
           "spark_remote_projection_bytes_ratio": "<= 0.2"}


# -- the object store ----------------------------------------------------------------------------


class Moto:
    """moto's S3 server in a child process, and a bucket on it."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.sent = ctx.Value("q", 0)
        ready = ctx.Queue()
        self.process = ctx.Process(target=serve_forever, args=(ready, self.sent), daemon=True)
        self.process.start()
        self.port = int(ready.get(timeout=60))
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        import boto3

        self.bucket = "tiering-bench"
        boto3.client("s3", endpoint_url=self.endpoint_url,
                     region_name="us-east-1").create_bucket(Bucket=self.bucket)

    @property
    def bytes_sent(self) -> int:
        return int(self.sent.value)

    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url,
                "client_kwargs": {"region_name": "us-east-1"}}

    def fs(self) -> Any:
        import s3fs  # the baseline talks to S3 the way the broker's adapter does

        return s3fs.S3FileSystem(endpoint_url=self.endpoint_url,
                                 client_kwargs={"region_name": "us-east-1"})

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)


# -- data ----------------------------------------------------------------------------------------


def value_batches(mb: int) -> list[tuple[int, pa.RecordBatch]]:
    rng = np.random.default_rng(7)
    rows = mb * 1_000_000 // (VALUE_BYTES + 8)
    out = []
    for i, lo in enumerate(range(0, rows, BATCH_ROWS)):
        n = min(BATCH_ROWS, rows - lo)
        data = rng.integers(0, 256, n * VALUE_BYTES, dtype=np.uint8).tobytes()
        offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
        keys = pa.array(np.arange(lo, lo + n).astype("S8"), pa.binary())
        out.append((i % PARTITIONS, pa.record_batch({"key": keys, "value": values})))
    return out


def typed_schema() -> pa.Schema:
    return pa.schema([(f"c{i}", pa.float64()) for i in range(TYPED_COLUMNS)])


def typed_batches(rows: int) -> list[tuple[int, pa.RecordBatch]]:
    rng = np.random.default_rng(8)
    out = []
    for i, lo in enumerate(range(0, rows, BATCH_ROWS)):
        n = min(BATCH_ROWS, rows - lo)
        columns: dict[str, pa.Array] = {"key": pa.nulls(n, pa.binary())}
        columns.update({f.name: pa.array(rng.random(n)) for f in typed_schema()})
        out.append((i % PARTITIONS, pa.record_batch(columns)))
    return out


def produce(bootstrap: str, topic: str, batches: list[tuple[int, pa.RecordBatch]]) -> None:
    with Producer(bootstrap, acks=1) as producer:
        futures = [producer.send_batch(topic, b, partition=p) for p, b in batches]
        for f in futures:
            f.result(120)


# -- helpers -------------------------------------------------------------------------------------


def tiers(admin: Admin, topic: str) -> list[Any]:
    return [p.log_tiers for p in admin.describe_topics([topic], include_log_tiers=True)[0]
            .partitions]


def wait(condition: Callable[[], Any], what: str, poll_s: float = POLL_S) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise RuntimeError(f"timed out waiting for {what}")


def last_finished_ms(log_dir: Path, topic: str) -> int:
    """When the embedded broker recorded its last copy of ``topic`` FINISHED (its metadata
    file, read as the broker's own store reads it)."""
    from logstore.controller.local import METADATA_FILE, LocalMetadataStore
    from logstore.tiering.metadata import TopicIdPartition

    store = LocalMetadataStore(log_dir / METADATA_FILE, -1)
    store.start()
    topic_id = store.topics()[topic].topic_id
    return max(m.state_timestamp_ms for p in range(PARTITIONS) for m in
               store.remote_log_segments(TopicIdPartition(topic, topic_id, p)) if m.is_finished)


def copied(admin: Admin, topic: str, local_gone: bool) -> list[Any] | None:
    ts = tiers(admin, topic)
    done = all(t is not None and t.copy_lag_segments == 0 and t.remote_segments > 0
               and (not local_gone or t.local_log_start_offset > 0) for t in ts)
    return ts if done else None


def remote_keys(fs: Any, bucket: str, topic: str) -> list[str]:
    return sorted(p for p in fs.find(f"{bucket}/logstore") if f"/{topic}-" in p
                  and p.endswith(".arrow"))


# -- upload and read -----------------------------------------------------------------------------


def segment_files(log_dir: Path, topic: str, workdir: Path) -> list[list[Path]]:
    """Per sealed segment, the files the tier uploads: the segment, its offset and time
    indexes, its producer snapshot if kept, and (written here) an epoch checkpoint."""
    checkpoint = workdir / "epoch-checkpoint"
    checkpoint.write_bytes(b"0\n1\n0 0\n")
    out = []
    for p in range(PARTITIONS):
        segments = sorted((log_dir / f"{topic}-{p}").glob("*.arrow"))[:-1]  # not the active
        for seg in segments:
            sidecars = [seg.with_suffix(".index"), seg.with_suffix(".timeindex")]
            out.append([seg, *[f for f in sidecars if f.exists()], checkpoint])
    return out


def bench_upload(admin: Admin, moto: Moto, log_dir: Path, topic: str, workdir: Path,
                 results: dict[str, float]) -> None:
    """The tier's copying against s3fs putting the same files: per segment its files in one
    ``put`` (s3fs sends them concurrently, as the tier does), segment after segment."""
    began_ms = time.time() * 1000
    admin.alter_configs({topic: {"remote_storage_enable": True}})
    ts = wait(lambda: copied(admin, topic, local_gone=False), "the copy lag to drain",
              poll_s=0.25)
    # The copies' end is when the last one was recorded FINISHED (the broker's clock is this
    # machine's), so slow polling costs the broker no CPU and the figure no precision.
    seconds = (last_finished_ms(log_dir, topic) - began_ms) / 1000
    results["tier_upload_mb_s"] = sum(t.remote_bytes for t in ts) / seconds / 1e6
    fs = moto.fs()
    segments = segment_files(log_dir, topic, workdir)
    began = time.perf_counter()
    for i, files in enumerate(segments):
        fs.put([str(f) for f in files], [f"{moto.bucket}/raw/{i}/{f.name}" for f in files])
    raw_seconds = time.perf_counter() - began
    results["raw_s3fs_put_mb_s"] = sum(files[0].stat().st_size for files in segments) / \
        raw_seconds / 1e6
    results["tier_upload_vs_raw_s3fs"] = results["tier_upload_mb_s"] / \
        results["raw_s3fs_put_mb_s"]


def first_byte(bootstrap: str, topic: str, offsets: dict[int, int]) -> list[float]:
    conn = BrokerConnection(bootstrap)
    out = []
    try:
        for p, offset in offsets.items():
            began = time.perf_counter()
            response = conn.fetch(FetchRequest(topic=topic, max_wait_ms=0,
                                               max_bytes=FIRST_BYTE_FETCH_BYTES,
                                               partitions=[FetchPartition(
                                                   partition=p, offset=offset)]))
            out.append((time.perf_counter() - began) * 1000)
            assert response.batches, f"{topic}-{p}: nothing at {offset}"
    finally:
        conn.close()
    return out


def consume(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    """Seconds a Consumer takes to read every partition from 0 to its end."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    began = time.perf_counter()
    with Consumer(bootstrap, max_partition_fetch_bytes=SEGMENT_BYTES,
                  fetch_max_bytes=4 * SEGMENT_BYTES) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            consumer.poll_arrow(timeout_ms=500)
            if time.perf_counter() - began > WAIT_S:
                raise RuntimeError("the read did not finish")
    return time.perf_counter() - began


def bench_read(admin: Admin, moto: Moto, bootstrap: str, log_dir: Path, topic: str,
               results: dict[str, float]) -> None:
    """The topic read by a Consumer while it is all local (what the consumer path does on
    this machine: the ceiling of a remote read), then its remote-only range once the local
    segments are gone; and s3fs ``cat`` of the same objects."""
    ts = tiers(admin, topic)
    ends = {p: t.high_watermark for p, t in enumerate(ts)}
    consume(bootstrap, topic, ends)  # warms the page cache and the consumer path
    local_bytes = sum(f.stat().st_size for f in log_dir.glob(f"{topic}-*/*.arrow"))
    results["local_read_mb_s"] = local_bytes / consume(bootstrap, topic, ends) / 1e6
    admin.alter_configs({topic: {"local_retention_ms": 0}})
    ts = wait(lambda: copied(admin, topic, local_gone=True), "local segments to go")
    ends = {p: t.local_log_start_offset for p, t in enumerate(ts)}
    read_bytes = sum(t.remote_bytes for t in ts)
    cold = first_byte(bootstrap, topic, {p: 0 for p in range(PARTITIONS)})
    warm = first_byte(bootstrap, topic, {p: 0 for p in range(PARTITIONS)})
    results["remote_fetch_first_byte_ms_cold"] = statistics.median(cold)
    results["remote_fetch_first_byte_ms_warm"] = statistics.median(warm)
    results["remote_read_mb_s"] = read_bytes / consume(bootstrap, topic, ends) / 1e6
    fs = moto.fs()
    keys = remote_keys(fs, moto.bucket, topic)
    began = time.perf_counter()
    raw = fs.cat(keys)
    raw_seconds = time.perf_counter() - began
    results["raw_s3fs_cat_mb_s"] = sum(len(v) for v in raw.values()) / raw_seconds / 1e6
    results["remote_read_vs_raw_s3fs"] = results["remote_read_mb_s"] / \
        results["raw_s3fs_cat_mb_s"]


# -- Spark ---------------------------------------------------------------------------------------


def remote_df(spark: Any, bootstrap: str, topic: str, ends: dict[int, int], schema: str,
              mode: str) -> Any:
    return (spark.read.format("logstore").option("bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("readMode", mode)
            .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
            .schema(schema).load())


def timed_sum(df: Any, columns: list[str]) -> float:
    from pyspark.sql import functions as F

    began = time.perf_counter()
    df.agg(*[F.sum(c) for c in columns]).collect()
    return time.perf_counter() - began


def bench_spark(moto: Moto, bootstrap: str, tiered: str, local: str, ends: dict[int, int],
                results: dict[str, float]) -> None:
    from jobs.session import local_session

    spark = local_session("tiering-bench")
    try:
        every = [f"c{i}" for i in range(TYPED_COLUMNS)]
        all_schema = ", ".join(f"{c} double" for c in every)
        two_schema = "c3 double, c17 double"
        timed_sum(remote_df(spark, bootstrap, tiered, ends, two_schema, "remote"), ["c3"])
        sent = moto.bytes_sent
        timed_sum(remote_df(spark, bootstrap, tiered, ends, two_schema, "remote"),
                  ["c3", "c17"])
        two_bytes, sent = moto.bytes_sent - sent, moto.bytes_sent
        remote_s = timed_sum(remote_df(spark, bootstrap, tiered, ends, all_schema, "remote"),
                             every)
        all_bytes = moto.bytes_sent - sent
        results["spark_remote_two_columns_mb"] = two_bytes / 1e6
        results["spark_remote_all_columns_mb"] = all_bytes / 1e6
        results["spark_remote_projection_bytes_ratio"] = two_bytes / all_bytes
        timed_sum(remote_df(spark, bootstrap, local, ends, all_schema, "auto"), every)
        local_s = timed_sum(remote_df(spark, bootstrap, local, ends, all_schema, "auto"), every)
        results["spark_remote_scan_s"] = remote_s
        results["spark_local_scan_s"] = local_s
        results["spark_remote_scan_vs_local"] = local_s / remote_s
    finally:
        spark.stop()


# -- the run -------------------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    os.environ.update(CREDENTIALS_ENV)  # dummy credentials: the broker's and executors' env
    results: dict[str, float] = {"load_1m_start": os.getloadavg()[0]}
    moto = Moto()
    try:
        with broker_factory(workdir) as factory:
            broker = factory(remote_storage_uri=f"s3://{moto.bucket}/logstore",
                             remote_storage_options=moto.options(),
                             remote_log_manager_task_interval_ms=100)
            bootstrap = broker.bootstrap
            base = {"segment_bytes": SEGMENT_BYTES, "retention_ms": -1}
            with Admin(bootstrap) as admin:
                admin.create_topics([
                    NewTopic("values", PARTITIONS, config=dict(base)),
                    NewTopic("typed", PARTITIONS, config={**base, "remote_storage_enable": True,
                                                          "local_retention_ms": 0},
                             value_schema=typed_schema()),
                    NewTopic("typed-local", PARTITIONS, config=dict(base),
                             value_schema=typed_schema())])
                produce(bootstrap, "values", value_batches(args.mb))
                bench_upload(admin, moto, broker.log_dir, "values", workdir, results)
                bench_read(admin, moto, bootstrap, broker.log_dir, "values", results)
                typed = typed_batches(args.typed_rows)
                produce(bootstrap, "typed", typed)
                produce(bootstrap, "typed-local", typed)
                ts = wait(lambda: copied(admin, "typed", local_gone=True), "typed tiered")
            ends = {p: t.local_log_start_offset for p, t in enumerate(ts)}
            results["load_1m_before_spark"] = os.getloadavg()[0]
            bench_spark(moto, bootstrap, "typed", "typed-local", ends, results)
    finally:
        moto.stop()
    results["load_1m_end"] = os.getloadavg()[0]
    return results


def row(name: str, value: float) -> str:
    target = TARGETS.get(name, "")
    return f"{name:38} {value:>10.3f}  {target:8} {met(value, target)}"


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--mb", type=int, default=96, help="MB of values to tier and read")
    parser.add_argument("--typed-rows", type=int, default=400_000,
                        help="rows of the 20-column float64 topic read by Spark")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiering-bench-") as tmp:
        results = run(args, Path(tmp))
    report(results, args.json, row, header=f"{'figure':38} {'measured':>10}  {'target':8} met")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
