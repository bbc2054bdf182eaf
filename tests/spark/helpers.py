"""Reading topics the plain way (a Consumer) to compare with what Spark reads."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from logstore import Admin, Consumer
from logstore.model import EARLIEST, LATEST, TopicPartition

READ_TIMEOUT_S = 60.0


def consumer_rows(bootstrap: str, topic: str) -> list[tuple[Any, ...]]:
    """Every committed record of ``topic`` as (partition, offset, key, value, timestamp_ms,
    headers) tuples, read with the Consumer, sorted by partition then offset."""
    with Admin(bootstrap) as admin:
        parts = [TopicPartition(topic, p.partition)
                 for p in admin.describe_topics([topic])[0].partitions]
        ends = admin.list_offsets({tp: LATEST for tp in parts})
        starts = admin.list_offsets({tp: EARLIEST for tp in parts})
    rows: list[tuple[Any, ...]] = []
    with Consumer(bootstrap) as consumer:
        consumer.assign(parts)
        for tp in parts:
            consumer.seek(tp, starts[tp])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for tp, records in consumer.poll(timeout_ms=200).items():
                rows.extend((tp.partition, r.offset, r.key, r.value, r.timestamp,
                             tuple(r.headers)) for r in records if r.offset < ends[tp])
    return sorted(rows, key=lambda r: (r[0], r[1]))


def spark_rows(df: Any) -> list[tuple[Any, ...]]:
    """(partition, offset, key, value, timestamp_ms, headers) of a logstore DataFrame (read
    through Arrow, so no per-row Spark conversion), sorted."""
    table = df.toArrow() if hasattr(df, "toArrow") else pa.Table.from_pandas(df.toPandas())
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    headers = (table.column("headers").to_pylist() if "headers" in table.column_names
               else [None] * table.num_rows)
    rows = zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
               table.column("key").to_pylist(), table.column("value").to_pylist(), stamps,
               headers, strict=True)
    return sorted(((p, o, k, v, ts // 1000, tuple((h["key"], h["value"]) for h in hs or ()))
                   for p, o, k, v, ts, hs in rows), key=lambda r: (r[0], r[1]))


def read(spark: Any, bootstrap: str, **options: Any) -> Any:
    reader = spark.read.format("logstore").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()
