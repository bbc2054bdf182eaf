"""datasource/archive_read.py: a history read picks an archive file's row groups by the
statistics of its ``offset`` column, which must be the Parquet *leaf* column of that name: a
typed topic's struct, list and map columns come before ``offset`` and each has one leaf per
nested field, so the Arrow field index names another column's statistics; and it skips the
per-row check of topic, partition and offset only where the row groups' statistics prove it
needless.

Files are written in the archive's own Parquet shape (``stored_schema``/``to_stored``, field
ids included), with small row groups so that pruning matters. No Spark session, no broker.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datasource.archive_read import ArchiveTask, _all_inside, _row_groups, read_archive
from datasource.iceberg_types import iceberg_schema, stored_schema, to_stored
from datasource.schema import source_arrow_schema
from logstore.cli.schema_spec import value_schema_arg
from logstore.model import TopicPartition

TP = TopicPartition("t", 0)
FIRST = 5000
ROWS = 1000
ROW_GROUP = 100
# Nested columns first (every leaf of them precedes "offset"), then a flat one.
NESTED_SPEC = "point:struct<x:int64,y:float64>,tags:list<string>,deep:list<struct<z:uint64>>,n:int64"
MAP_TYPE = pa.map_(pa.string(), pa.int64())


def _value(field: pa.Field, i: int) -> object:
    t = field.type
    if pa.types.is_struct(t):
        return {"x": i, "y": -i / 2}
    if pa.types.is_map(t):
        return [("a", i), ("b", -i)]
    if pa.types.is_list(t) and pa.types.is_struct(t.value_type):
        return [{"z": 2**64 - 1 + i}]  # i <= 0
    if pa.types.is_list(t):
        return [f"t{i}"] * (i % 3)
    return i


def _archive_file(tmp_path: Path, value_schema: pa.Schema) -> tuple[pa.Schema, str]:
    """One archive file of offsets [FIRST, FIRST + ROWS) of ``TP``, in row groups of
    ``ROW_GROUP`` rows; value column j of row i holds a value made from -i (so that another
    column's statistics do not happen to bracket the offsets)."""
    arrow = source_arrow_schema(value_schema, True)
    stored = stored_schema(arrow, iceberg_schema(arrow))
    offsets = range(FIRST, FIRST + ROWS)
    fixed = {"key": pa.array([b"k%d" % i for i in offsets]), "topic": pa.array(["t"] * ROWS),
             "partition": pa.array([0] * ROWS, pa.int32()),
             "offset": pa.array(offsets, pa.int64()),
             "timestamp": pa.array([1_700_000_000_000_000 + i for i in offsets],
                                   arrow.field("timestamp").type),
             "timestampType": pa.array([0] * ROWS, pa.int32()),
             "headers": pa.nulls(ROWS, arrow.field("headers").type)}
    columns = [fixed[f.name] if f.name in fixed else
               pa.array([_value(f, -i) for i in range(ROWS)], f.type) for f in arrow]
    batch = pa.RecordBatch.from_arrays(columns, schema=arrow)
    path = str(tmp_path / f"archive-run-t-0-{FIRST}-0000.parquet")
    with pq.ParquetWriter(path, stored) as writer:
        writer.write_table(pa.Table.from_batches([to_stored(batch, stored)]),
                           row_group_size=ROW_GROUP)
    assert pq.ParquetFile(path).num_row_groups == ROWS // ROW_GROUP
    return arrow, path


def _offsets(arrow: pa.Schema, path: str, start: int, end: int) -> list[int]:
    batches = read_archive(ArchiveTask(TP, start, end, path, None), arrow)
    return [o for b in batches for o in b.column("offset").to_pylist()]


@pytest.mark.parametrize("value_schema", [
    value_schema_arg(NESTED_SPEC),
    pa.schema([pa.field("attrs", MAP_TYPE), pa.field("n", pa.int64())]),
    value_schema_arg("n:int64"),
], ids=["struct-and-lists", "map", "flat"])
@pytest.mark.parametrize(("start", "end"), [
    (FIRST, FIRST + ROWS),           # the whole file
    (FIRST + 150, FIRST + 870),      # across row groups, cut inside the first and the last
    (FIRST + 300, FIRST + 400),      # exactly one row group
    (FIRST + 999, FIRST + 5000),     # the last record, range past the file
])
def test_typed_topic_history_read_finds_every_offset_of_the_range(
        tmp_path: Path, value_schema: pa.Schema, start: int, end: int) -> None:
    """Goal: a history read of an archived range returns every offset of it once, whatever
    nested columns a typed topic puts before ``offset``. Method: an archive file of 10 row
    groups with struct/list/list-of-struct or map value columns, read ranges that start and
    end inside row groups, on group boundaries, and past the file."""
    arrow, path = _archive_file(tmp_path, value_schema)
    got = _offsets(arrow, path, start, end)
    assert got == list(range(start, min(end, FIRST + ROWS)))


def test_row_groups_are_chosen_by_the_offset_leaf(tmp_path: Path) -> None:
    """Goal: pruning uses the ``offset`` leaf's statistics (the Arrow field index of
    ``offset`` names another leaf in this file), so it keeps exactly the row groups that
    meet the range. Method: the nested file; its leaf at the field index is not ``offset``;
    the groups chosen for ranges inside, across and outside the file."""
    arrow, path = _archive_file(tmp_path, value_schema_arg(NESTED_SPEC))
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.schema.column(arrow.get_field_index("offset")).path != "offset"
    assert _row_groups(parquet, FIRST + 300, FIRST + 400) == [3]
    assert _row_groups(parquet, FIRST + 150, FIRST + 301) == [1, 2, 3]
    assert _row_groups(parquet, 0, FIRST) == []
    assert _row_groups(parquet, FIRST + ROWS, FIRST + 2 * ROWS) == []


def _with_null_routing_row(tmp_path: Path, path: str) -> str:
    """A copy of the archive file at ``path`` with one more row, first, whose every column is
    null (so the first row group holds it beside rows of the partition)."""
    table = pq.read_table(path)
    nulls = pa.table({f.name: pa.nulls(1, f.type) for f in table.schema},
                     schema=table.schema)
    out = str(tmp_path / "archive-with-nulls.parquet")
    pq.write_table(pa.concat_tables([nulls, table]), out, row_group_size=ROW_GROUP)
    return out


def _mixed_file(tmp_path: Path) -> tuple[pa.Schema, str]:
    """An archive file (partition_by none) whose row groups hold two partitions of ``t`` and
    one of ``u``, offsets 0-99 each, rows interleaved as a task of several partitions writes
    them."""
    arrow = source_arrow_schema(None, True)
    stored = stored_schema(arrow, iceberg_schema(arrow))
    parts = [("t", 0), ("t", 1), ("u", 0)]
    rows = [(topic, p, o) for o in range(100) for topic, p in parts]
    batch = pa.RecordBatch.from_pydict({
        "key": [None] * len(rows), "value": [b"%s-%d-%d" % (t.encode(), p, o) for t, p, o in rows],
        "topic": [t for t, _, _ in rows], "partition": [p for _, p, _ in rows],
        "offset": [o for _, _, o in rows],
        "timestamp": [1_700_000_000_000_000] * len(rows), "timestampType": [0] * len(rows),
        "headers": [None] * len(rows)}, schema=arrow)
    path = str(tmp_path / "archive-mixed.parquet")
    with pq.ParquetWriter(path, stored) as writer:
        writer.write_table(pa.Table.from_batches([to_stored(batch, stored)]),
                           row_group_size=60)
    return arrow, path


def test_rows_are_checked_unless_statistics_prove_the_whole_row_group_belongs_to_the_range(
        tmp_path: Path) -> None:
    """Goal: a read skips the per-row check only where every row group's statistics show the
    task's topic and partition alone and offsets inside its range; a file mixing partitions
    or topics, or a range cutting a row group, is checked row by row, and each read returns
    exactly its partition's offsets of its range; a row whose routing columns are null (which
    Parquet's min and max pass over) belongs to no task. Method: a one-partition file, the
    same file with one more row of nulls, and a file of three interleaved partitions;
    ``_all_inside`` and the rows read."""
    arrow, path = _archive_file(tmp_path, value_schema_arg("n:int64"))
    meta = pq.ParquetFile(path).metadata
    whole = ArchiveTask(TP, FIRST, FIRST + ROWS, path, None)
    assert _all_inside(meta, list(range(meta.num_row_groups)), whole)
    cut = ArchiveTask(TP, FIRST + 150, FIRST + ROWS, path, None)
    assert not _all_inside(meta, list(range(1, meta.num_row_groups)), cut)
    other = ArchiveTask(TopicPartition("t", 1), FIRST, FIRST + ROWS, path, None)
    assert not _all_inside(meta, list(range(meta.num_row_groups)), other)

    nulls = _with_null_routing_row(tmp_path, path)
    meta = pq.ParquetFile(nulls).metadata
    whole = ArchiveTask(TP, FIRST, FIRST + ROWS, nulls, None)
    assert not _all_inside(meta, list(range(meta.num_row_groups)), whole)
    assert len([o for b in read_archive(whole, arrow) for o in b.column("offset").to_pylist()]
               ) == ROWS

    arrow, path = _mixed_file(tmp_path)
    meta = pq.ParquetFile(path).metadata
    for tp in (TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)):
        task = ArchiveTask(tp, 0, 100, path, None)
        assert not _all_inside(meta, list(range(meta.num_row_groups)), task)
        got = [v for b in read_archive(task, arrow) for v in b.column("value").to_pylist()]
        assert got == [b"%s-%d-%d" % (tp.topic.encode(), tp.partition, o) for o in range(100)]


def test_a_read_of_no_column_still_counts_every_row_of_its_range(tmp_path: Path) -> None:
    """Goal: a read whose schema names no column (a count) yields as many rows as the range
    holds, whole file or cut. Method: the one-partition file, read with an empty schema."""
    _, path = _archive_file(tmp_path, value_schema_arg("n:int64"))
    for start, end in [(FIRST, FIRST + ROWS), (FIRST + 150, FIRST + 870)]:
        batches = list(read_archive(ArchiveTask(TP, start, end, path, None), pa.schema([])))
        assert sum(b.num_rows for b in batches) == end - start
        assert all(b.num_columns == 0 for b in batches)
