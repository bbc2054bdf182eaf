"""The Spark step of ``make demo``: read the demo topic with ``format("logstore")``.

Owns: one batch query over a topic (rows and value bytes per partition) and its timing. Must
not: start brokers or write data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


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
