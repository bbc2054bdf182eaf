"""``make demo`` end to end, small, in the shared Spark session."""

from __future__ import annotations

import io
from typing import Any

from jobs.demo_query import SparkRemoteStep, SparkStep
from logstore.demo import run_demo


def test_demo_ends_with_a_spark_query_that_counts_every_record(spark: Any) -> None:
    """The demo's phases (columnar and per-record produce, consume, Spark read) all see every
    record, and the summary names the Spark phase; the tiered topic's remote-only range is
    read back by a consumer and by Spark straight from S3 (moto on 127.0.0.1)."""
    out = io.StringIO()
    assert run_demo(records=20_000, per_record=2_000, out=out, steps=[SparkStep(spark)],
                    tier_steps=[SparkRemoteStep(spark)]) == 0, out.getvalue()
    text = out.getvalue()
    assert "spark read (format logstore)" in text
    assert "OK: all 22,000 records consumed back and read by Spark; " in text
    assert "read back from the remote tier by a consumer and by Spark straight from object " \
           "storage" in text
    for phase in ("copy to object storage", "consume remote tier", "spark read (remote tier)"):
        assert phase in text
    assert "copied to S3 (moto) at http://127.0.0.1:" in text
