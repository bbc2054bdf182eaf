"""The Spark step of ``make demo``: read the demo topic with ``format("logstore")``.

``logstore demo`` finds ``SparkStep`` through the entry point ``spark`` of the group
``logstore.demo_steps`` (pyproject.toml), so the core demo never imports this edge.

Owns: one batch query over a topic (rows and value bytes per partition) and its timing, and the
demo step around it: a local[2] session (one given, or its own, stopped afterwards), a cold run
and a timed warm run, and the per-partition table. Must not: start brokers or write data.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import IO, Any

from logstore.demo import Phase


@dataclass(frozen=True)
class QueryResult:
    rows: int
    payload_bytes: int
    seconds: float
    table: str  # the per-partition result, as Spark's show() prints it


def count_topic(spark: Any, bootstrap: str, topic: str) -> QueryResult:
    """``count`` and ``sum(length(key) + length(value))`` per partition, earliest to latest."""
    from pyspark.sql import functions as F

    began = time.perf_counter()
    df = (spark.read.format("logstore").option("bootstrap.servers", bootstrap)
          .option("subscribe", topic).load())
    per_partition = (df.groupBy("partition")
                     .agg(F.count("*").alias("records"),
                          F.sum(F.coalesce(F.length("key"), F.lit(0))
                                + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
                          F.min("offset").alias("first_offset"),
                          F.max("offset").alias("last_offset"))
                     .orderBy("partition").collect())
    seconds = time.perf_counter() - began
    header = f"{'partition':>9} {'records':>10} {'bytes':>12} {'first_offset':>12} " \
             f"{'last_offset':>11}"
    lines = [header] + [f"{r.partition:>9} {r.records:>10,} {r.bytes:>12,} "
                        f"{r.first_offset:>12} {r.last_offset:>11}" for r in per_partition]
    return QueryResult(sum(r.records for r in per_partition),
                       sum(r.bytes for r in per_partition), seconds, "\n".join(lines))


class SparkStep:
    """``spark.read.format("logstore")`` over the whole topic, grouped by partition, in
    ``spark`` or a local[2] session of its own. The session start is not timed; the query
    runs twice and the second, warm run is the phase's time."""

    reads_as = "read by Spark"

    def __init__(self, spark: Any = None) -> None:
        if spark is None and importlib.util.find_spec("pyspark") is None:
            raise ValueError("the demo's Spark step needs pyspark: pip install 'logstore[spark]'"
                             " (or run logstore demo --no-spark)")
        self._spark = spark

    def run(self, bootstrap: str, topic: str, expected: int, out: IO[str]) -> Phase:
        from jobs.session import local_session

        print("\nspark.read.format('logstore') over the demo topic (starting local[2] Spark)...",
              file=out, flush=True)
        session = local_session("logstore-demo") if self._spark is None else self._spark
        try:
            cold = count_topic(session, bootstrap, topic)  # pays Python-worker start-up
            result = count_topic(session, bootstrap, topic)
        finally:
            if self._spark is None:
                session.stop()
        print(result.table, file=out, flush=True)
        print(f"(the first run of the query took {cold.seconds:.1f} s, most of it Spark "
              f"starting its Python workers; the table's time is the second run)",
              file=out, flush=True)
        if result.rows != expected:
            print(f"FAILED: Spark read {result.rows:,} records, expected {expected:,}", file=out)
        return Phase("spark read (format logstore)", result.rows, result.payload_bytes,
                     result.seconds)
