"""datasource/iceberg.py ``files_for_ranges``: the files a history read plans for its
archived ranges, from one scan of the manifests, are every file ``files_for_range`` (a
pyiceberg plan per range) finds, and every file that holds a row of the range, whatever the
table's partitioning; bounds Iceberg truncated (topic names past 16 characters that share
that prefix) only add files, which the executors then filter row by row.

Real archive tables on a local warehouse with its SQLite catalog, files written and
committed through the job's own table functions. No broker, no Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datasource.archive_offsets import ARCHIVED_KEY, encode
from datasource.iceberg import (
    ArchivedRange,
    catalog_settings,
    commit_files,
    data_file,
    files_for_range,
    files_for_ranges,
    filesystem,
    open_catalog,
    open_table,
    take_ownership,
)
from datasource.iceberg_types import stored_schema, to_stored
from datasource.schema import source_arrow_schema
from logstore.model import TopicPartition

ARROW = source_arrow_schema(None, True)
LONG_A = "events-with-a-long-name-a"  # 25 characters: bounds truncated to a shared prefix
LONG_B = "events-with-a-long-name-b"
WINDOWS = [(0, 100), (100, 200)]
DAY_US = 86_400_000_000


def _write(table: Any, settings: Any, topic: str, partition: int, start: int, end: int,
           day: int) -> tuple[str, Any]:
    """One archive file of offsets [start, end) of topic-partition, all on ``day``."""
    stored = stored_schema(ARROW, table.schema())
    n = end - start
    batch = pa.RecordBatch.from_arrays([
        pa.array([b"k"] * n), pa.array([b"v"] * n), pa.array([topic] * n),
        pa.array([partition] * n, pa.int32()), pa.array(range(start, end), pa.int64()),
        pa.array([day * DAY_US + 1000] * n, ARROW.field("timestamp").type),
        pa.array([0] * n, pa.int32()), pa.nulls(n, ARROW.field("headers").type)],
        schema=ARROW)
    path = f"{table.location()}/data/archive-run-{topic}-{partition}-{start}-0000.parquet"
    fs, local = filesystem(settings, path)
    with fs.open(local, "wb") as stream:
        writer = pq.ParquetWriter(stream, stored)
        writer.write_table(pa.Table.from_batches([to_stored(batch, stored)]))
        writer.close()
        size = stream.tell()
    return path, data_file(table.metadata, path, writer.writer.metadata, size)


@pytest.mark.parametrize("partition_by", ["none", "partition", "date"])
@pytest.mark.parametrize("topics", [("a", "b"), (LONG_A, LONG_B)], ids=["short", "truncated"])
def test_one_scan_plans_every_file_each_range_needs(tmp_path: Path, partition_by: str,
                                                     topics: tuple[str, str]) -> None:
    """Goal: per range, the one-scan plan holds every file the per-range plans hold and every
    file holding a row of the range; with untruncated bounds exactly those. Method: two
    topics x two partitions x two offset windows (a file each, on a day each), committed in
    one snapshot; ranges inside a window, across both, and past the archive."""
    settings = catalog_settings([], str(tmp_path / "warehouse"))
    table = take_ownership(open_table(open_catalog(settings), "ns.h", ARROW, partition_by,
                                      list(topics)), "run", (ARCHIVED_KEY,))
    holding: dict[tuple[str, int, int], str] = {}  # (topic, partition, first offset) -> file
    files = []
    for day, (topic, partition, (start, end)) in enumerate(
            (t, p, w) for t in topics for p in (0, 1) for w in WINDOWS):
        path, entry = _write(table, settings, topic, partition, start, end, 19_000 + day)
        holding[(topic, partition, start)] = path
        files.append(entry)
    spans = {TopicPartition(t, p): (0, 200) for t in topics for p in (0, 1)}
    base = table.current_snapshot()
    table = commit_files(table, files, {ARCHIVED_KEY: encode(spans)},
                         None if base is None else base.snapshot_id, "run")

    ranges = [ArchivedRange(t, p, s, e) for t in topics for p in (0, 1)
              for s, e in [(0, 100), (150, 160), (50, 150), (200, 300)]]
    planned = files_for_ranges(table, ranges)
    assert len(planned) == len(ranges)
    for r, got in zip(ranges, planned, strict=True):
        paths = {f.path for f in got}
        truth = {holding[(r.topic, r.partition, s)] for s, e in WINDOWS
                 if s < r.end and e > r.start}
        per_range = {f.path for f in files_for_range(table, r.topic, r.partition, r.start,
                                                     r.end)}
        assert per_range <= paths, r
        assert truth <= paths, r
        if topics == ("a", "b"):
            assert paths == truth, r
    assert files_for_ranges(table, []) == []
