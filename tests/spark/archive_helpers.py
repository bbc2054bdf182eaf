"""Running the archive job inside the tests' Spark session, and reading archive tables back.

Owns: ``run_archive`` (the job's driver, ``jobs.archive.Archiver``, with the shared local[2]
session instead of one of its own), the catalog options of a local or moto ``s3://``
warehouse, and the rows of a table in the shape of ``tests/spark/helpers.consumer_rows``.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

from datasource.iceberg import catalog_settings, open_catalog
from datasource.iceberg_types import from_stored
from jobs.archive import Archiver, config_from
from jobs.archive_runner import SparkRunner
from logstore.cli.archive import add_archive_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_archive_arguments(parser)
    return parser.parse_args(list(argv))


def run_archive(spark: Any, *argv: str) -> Archiver:
    """One run of the job (batch mode unless ``argv`` says otherwise) in ``spark``; raises
    what the job would print as ``error: ...``."""
    archiver = Archiver(config_from(parse(*argv, "--no-progress")), io.StringIO())
    try:
        archiver.prepare()
        archiver.runner = SparkRunner(spark, progress=False)
        archiver.run()
    finally:
        archiver.close()
    return archiver


def warehouse_args(tmp: Path, s3_url: str | None = None, endpoint: str | None = None
                   ) -> list[str]:
    """--warehouse/--catalog of a local warehouse, or of ``s3_url`` on a moto endpoint (the
    SQLite catalog stays local: SQLite cannot live in a bucket)."""
    if s3_url is None:
        return ["--warehouse", str(tmp / "warehouse")]
    return ["--warehouse", s3_url, "--catalog", f"uri=sqlite:///{tmp / 'catalog.db'}",
            *sum((["--catalog", f"{k}={v}"] for k, v in s3_properties(endpoint or "").items()),
                 [])]


def s3_properties(endpoint: str) -> dict[str, str]:
    return {"s3.endpoint": endpoint, "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing", "s3.region": "us-east-1",
            "s3.connect-timeout": "2", "s3.request-timeout": "10"}


def load_table(argv: list[str], table: str) -> Any:
    args = parse("--topic", "x", "--table", table, *argv)
    return open_catalog(catalog_settings(args.catalog, args.warehouse)).load_table(table)


def table_rows(table: Any) -> list[tuple[Any, ...]]:
    """(partition, offset, key, value, timestamp_ms, headers) of every row, sorted."""
    data = table.scan().to_arrow()
    stamps = data.column("timestamp").cast("int64").to_pylist()
    rows = zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(),
               data.column("key").to_pylist(), data.column("value").to_pylist(), stamps,
               data.column("headers").to_pylist(), strict=True)
    return sorted(((p, o, k, v, ts // 1000, tuple((h["key"], h["value"]) for h in hs or ()))
                   for p, o, k, v, ts, hs in rows), key=lambda r: (r[0], r[1]))


def typed_rows(table: Any, value_schema: Any) -> list[tuple[Any, ...]]:
    """(partition, offset, *value columns in the topic's types) of every row, sorted."""
    data = table.scan().to_arrow()
    columns = [pylist(from_stored(data.column(f.name), f.type)) for f in value_schema]
    keys = zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(),
               *columns, strict=True)
    return sorted(keys, key=lambda r: (r[0], r[1]))


def pylist(column: Any) -> list[Any]:
    """``column.to_pylist()``, nanosecond timestamps as integers (datetime has microseconds)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type) and column.type.unit == "ns":
        column = column.cast(pa.int64())
    return list(column.to_pylist())
