"""``make demo`` end to end, small, in the shared Spark session."""

from __future__ import annotations

import io
from typing import Any

from jobs.demo_query import SparkStep
from logstore.demo import run_demo


def test_demo_ends_with_a_spark_query_that_counts_every_record(spark: Any) -> None:
    """The demo's phases (columnar and per-record produce, consume, Spark read) all see every
    record, and the summary names the Spark phase."""
    out = io.StringIO()
    assert run_demo(records=20_000, per_record=2_000, out=out,
                    steps=[SparkStep(spark)]) == 0, out.getvalue()
    text = out.getvalue()
    assert "spark read (format logstore)" in text
    assert "OK: all 22,000 records consumed back and read by Spark" in text
