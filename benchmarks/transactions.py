"""Transactions: their cost on produce and on read_committed reads, and commit latency.

    .venv/bin/python benchmarks/transactions.py [--records N] [--commits N] [--json]
        [--only-sink] [--sink-records N]

Figures (ratios from one run; printed, never asserted: machines are shared):
- ``txn_produce_vs_idempotent``: columnar produce (``send_batch`` of 10k-record batches over 4
  partitions) in transactions committed every 100 ms, divided by the same producer's rate
  without transactions (idempotent, acks=all), one broker process. Target >= 0.8.
- ``read_committed_vs_uncommitted``: ``poll_arrow`` over a whole topic in which one
  transaction in ten is aborted (10k-record transactions), read_committed divided by
  read_uncommitted, as offsets read per second (the best of five alternated scans each,
  after one that warms the page cache). Target >= 0.9.
- ``txn_commit_ms_p50`` / ``txn_commit_ms_p99``: ``commit_transaction()`` of a transaction
  over 10 partitions (RF 3, min ISR 2) on three brokers and a real ZooKeeper, its records
  already acknowledged: the coordinator's two appends and the markers. Reported.
- ``eos_sink_overhead_ms``: the exactly-once Spark sink's cost per micro-batch: the median
  micro-batch time (Spark's ``triggerExecution``) of a query reading a topic with the logstore
  source and writing it with ``writeStream.format("logstore")`` (``exactlyOnce=true``), minus
  the same query's with ``exactlyOnce=false`` (at least once), 10k-record batches over 4
  partitions, local[2], one broker: the median over 4 pairs of adjacent runs (one of each
  mode, so both see the same load) of the difference of their median batch times, the first
  batches of each run (Python workers starting) left out. Target <= 100. ``eos_phase_ms_*`` break the exactly-once
  sink's driver commit down (timed in this process, outside Spark).
Brokers and ZooKeeper are the test suite's helpers (tests/brokers.py, tests/zookeeper.py).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import (
    ROWS_PER_BATCH,
    alternate,
    bench_parser,
    broker_factory,
    report,
    value_batch,
    zk_cluster,
)

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.client.transactions import colocated_transactional_id

ROWS = ROWS_PER_BATCH
PARTITIONS = 4
COMMIT_EVERY_S = 0.1
TARGETS = {"txn_produce_vs_idempotent": ">= 0.8", "read_committed_vs_uncommitted": ">= 0.9",
           "eos_sink_overhead_ms": "<= 100"}
BATCH = value_batch(ROWS)


def produce_rps(bootstrap: str, topic: str, records: int, transactional: bool) -> float:
    """Records per second of columnar produce, in transactions committed every 100 ms or
    without transactions."""
    tid = f"bench-{uuid.uuid4().hex[:6]}" if transactional else None
    with Producer(bootstrap, transactional_id=tid, linger_ms=5) as producer:
        if tid is not None:
            producer.init_transactions()
            producer.begin_transaction()
        producer.send_batch(topic, BATCH, partition=0).result(60)  # warm up, not timed
        start = last_commit = time.perf_counter()
        for i in range(records // ROWS):
            producer.send_batch(topic, BATCH, partition=i % PARTITIONS)
            if tid is not None and time.perf_counter() - last_commit >= COMMIT_EVERY_S:
                producer.commit_transaction()
                producer.begin_transaction()
                last_commit = time.perf_counter()
        if tid is not None:
            producer.commit_transaction()
        producer.flush()
        return (records // ROWS) * ROWS / (time.perf_counter() - start)


def fill_with_aborts(bootstrap: str, topic: str, records: int) -> None:
    """``records`` in 10k-record transactions over all partitions, one in ten aborted."""
    with Producer(bootstrap, transactional_id=f"fill-{uuid.uuid4().hex[:6]}",
                  linger_ms=5) as producer:
        producer.init_transactions()
        for i in range(records // ROWS):
            producer.begin_transaction()
            producer.send_batch(topic, BATCH, partition=i % PARTITIONS)
            (producer.abort_transaction if i % 10 == 9 else producer.commit_transaction)()


def scan_s(bootstrap: str, topic: str, isolation_level: str) -> float:
    """Seconds to poll_arrow the whole topic (to its end for the isolation level)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level,
                  fetch_max_wait_ms=50) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        start = time.perf_counter()
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            consumer.poll_arrow(timeout_ms=200)
        return time.perf_counter() - start


def single_broker(records: int, root: Path) -> dict[str, float]:
    with broker_factory(root) as factory:
        broker = factory()
        with Admin(broker.bootstrap) as admin:
            plain, txn, mixed = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("p", "t", "m"))
            admin.create_topics([NewTopic(t, PARTITIONS) for t in (plain, txn, mixed)])
        idempotent = produce_rps(broker.bootstrap, plain, records, False)
        transactional = produce_rps(broker.bootstrap, txn, records, True)
        fill_with_aborts(broker.bootstrap, mixed, records)
        scan_s(broker.bootstrap, mixed, "read_uncommitted")  # warm the page cache
        # Alternated, the best of five each: the order of two scans must not decide.
        uncommitted_s, committed_s = alternate(
            5, lambda: scan_s(broker.bootstrap, mixed, "read_uncommitted"),
            lambda: scan_s(broker.bootstrap, mixed, "read_committed"))
        uncommitted, committed = min(uncommitted_s), min(committed_s)
        return {"idempotent_rps": idempotent, "transactional_rps": transactional,
                "txn_produce_vs_idempotent": transactional / idempotent,
                "read_uncommitted_s": uncommitted, "read_committed_s": committed,
                "read_committed_vs_uncommitted": uncommitted / committed}


def commit_latency_ms(commits: int, root: Path) -> dict[str, float]:
    with zk_cluster(root, transaction_state_log_num_partitions=3) as cluster:
        topic = cluster.create_topic(partitions=10, rf=3, min_insync_replicas=2)
        small = pa.record_batch({"value": pa.array([b"x" * 100] * 10, pa.binary())})
        times = []
        with Producer(cluster.bootstrap, transactional_id="commit-bench", linger_ms=0) as p:
            p.init_transactions()
            for _ in range(commits + 5):
                p.begin_transaction()
                for partition in range(10):
                    p.send_batch(topic, small, partition=partition)
                p.flush()
                start = time.perf_counter()
                p.commit_transaction()
                times.append((time.perf_counter() - start) * 1000)
        times = sorted(times[5:])  # the first ones find coordinators and leaders
        return {"txn_commit_ms_p50": statistics.median(times),
                "txn_commit_ms_p99": times[min(len(times) - 1, int(len(times) * 0.99))]}


SINK_RECORDS = 200_000
SINK_BATCH = 10_000
SINK_WARMUP_BATCHES = 3
SINK_PAIRS = 4


def sink_batch_ms(spark: Any, bootstrap: str, source: str, exactly_once: bool, root: Path
                  ) -> list[float]:
    """Micro-batch times of one AvailableNow run of the copy query, warm-up batches left out."""
    sink = f"out-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(sink, PARTITIONS)])
    query = (spark.readStream.format("logstore").option("bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", SINK_BATCH).load()
             .selectExpr("key", "value").writeStream.format("logstore")
             .option("bootstrap.servers", bootstrap).option("topic", sink)
             .option("exactlyOnce", str(exactly_once).lower())
             .option("checkpointLocation", str(root / sink)).trigger(availableNow=True).start())
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return [float(p["durationMs"]["triggerExecution"]) for p in batches[SINK_WARMUP_BATCHES:]]


def commit_phases_ms(bootstrap: str, topic: str, rounds: int = 20) -> dict[str, float]:
    """Median time of each step of the exactly-once driver commit (two staged tasks)."""
    from datasource.sink import stage
    from datasource.sink_commit import SinkCommitter
    from datasource.writer import parse_sink_options

    settings = parse_sink_options({"bootstrap.servers": bootstrap, "topic": topic}, True)
    sink = f"bench-{uuid.uuid4().hex[:6]}"
    committer = SinkCommitter(settings, sink)
    with Admin(bootstrap) as admin:
        n = admin.transaction_state_partitions()
    times: dict[str, list[float]] = {"stage": [], "leftovers": [], "progress": [],
                                     "publish": []}
    batch = pa.record_batch({"value": pa.array([b"x" * 100] * 1000)})
    for batch_id in range(rounds):
        t0 = time.perf_counter()
        staged = [stage(settings, colocated_transactional_id(sink, f"{sink}-{p}-0", n),
                        iter([batch]))[2] for p in range(2)]
        t1 = time.perf_counter()
        committer.abort_leftovers(keep={s.transactional_id for s in staged if s is not None})
        t2 = time.perf_counter()
        committer.recorded_batch()
        t3 = time.perf_counter()
        committer.publish([s for s in staged if s is not None], f"batch {batch_id}",
                          (batch_id, 2000))
        t4 = time.perf_counter()
        for name, took in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[name].append(took * 1000)
    return {f"eos_phase_ms_{k}": statistics.median(v) for k, v in times.items()}


def sink_overhead(root: Path, records: int = SINK_RECORDS) -> dict[str, float]:
    from jobs.session import local_session

    spark = None
    with broker_factory(root / "broker") as factory:
        try:
            broker = factory()
            source = f"src-{uuid.uuid4().hex[:6]}"
            with Admin(broker.bootstrap) as admin:
                admin.create_topics([NewTopic(source, PARTITIONS)])
            with Producer(broker.bootstrap, linger_ms=5) as producer:
                for i in range(records // ROWS):
                    producer.send_batch(source, BATCH, partition=i % PARTITIONS)
            spark = local_session("logstore-bench-sink")
            times: dict[bool, list[float]] = {False: [], True: []}
            differences = []
            for _ in range(SINK_PAIRS):  # adjacent runs share the machine's load of the moment
                pair = {eo: sink_batch_ms(spark, broker.bootstrap, source, eo, root)
                        for eo in (False, True)}
                differences.append(statistics.median(pair[True]) - statistics.median(pair[False]))
                for eo, batch_ms in pair.items():
                    times[eo] += batch_ms
            alo, eos = statistics.median(times[False]), statistics.median(times[True])
            return {"sink_batch_ms_at_least_once": alo, "sink_batch_ms_exactly_once": eos,
                    "eos_sink_overhead_ms": statistics.median(differences),
                    **commit_phases_ms(broker.bootstrap, source)}
        finally:
            if spark is not None:
                spark.stop()


def row(name: str, value: float | None) -> str:
    shown = "-" if value is None else f"{value:,.3f}"
    return f"{name:<32} {shown:>14}  {TARGETS.get(name, '')}"


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--only-sink", action="store_true",
                        help="only the Spark sink's figures (eos_sink_overhead_ms)")
    parser.add_argument("--sink-records", type=int, default=SINK_RECORDS,
                        help=f"input of each sink run (default {SINK_RECORDS:,}; "
                             f"{SINK_BATCH:,} per micro-batch)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-txn-bench-") as tmp:
        results: dict[str, float | None] = {}
        if not args.only_sink:
            results |= single_broker(args.records, Path(tmp) / "single")
            results |= commit_latency_ms(args.commits, Path(tmp) / "cluster")
        results |= sink_overhead(Path(tmp) / "sink", args.sink_records)
    report(results, args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
