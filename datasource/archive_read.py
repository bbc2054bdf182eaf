"""The executor side of a history read: archived offset ranges of Parquet files.

Owns: the input partition of archived ranges (``ArchivePartition``: reads of one range from
one file each, packed by the planner) and reading them: the row groups whose offset
statistics meet the range, the rows of the range, the scan's columns cast back from the
archive's Parquet shape. Must not: import pyiceberg (an executor reading history
pays no catalog import: the driver ships the file's fsspec filesystem with the task) or plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition

from datasource.iceberg_types import from_stored
from logstore.model import TopicPartition

ROUTING = ("topic", "partition", "offset")


@dataclass(frozen=True)
class ArchiveTask:
    tp: TopicPartition
    start: int
    end: int
    path: str
    filesystem: Any  # an fsspec filesystem (picklable: it pickles its arguments)


class ArchivePartition(InputPartition):
    """One Spark input partition of a history read: reads of archived offset ranges, each
    from one archive file, one after another."""

    def __init__(self, tasks: tuple[ArchiveTask, ...]) -> None:
        super().__init__(tasks)
        self.tasks = tasks

    def __repr__(self) -> str:
        reads = ", ".join(f"{t.tp} [{t.start}, {t.end}) from {t.path}" for t in self.tasks)
        return f"ArchivePartition({reads})"


def read_archive_partition(partition: ArchivePartition, target: pa.Schema
                           ) -> Iterator[pa.RecordBatch]:
    """The rows of every read of ``partition``, in its order."""
    for task in partition.tasks:
        yield from read_archive(task, target)


def read_archive(task: ArchiveTask, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of ``task``'s file in its range, as record batches of ``target`` (in offset
    order: the archive writes each file in offset order). Where the statistics of the row
    groups read show that they hold only the task's partition and only offsets of its range
    (the common case: a file of one partition, read whole), no row is checked and the routing
    columns are not read unless asked for: a tenth of the read's time."""
    wanted = [f.name for f in target]
    with _open(task) as source:
        parquet = pq.ParquetFile(source, memory_map=isinstance(source, str))
        groups = _row_groups(parquet, task.start, task.end)
        if not groups:
            return
        inside = _all_inside(parquet.metadata, groups, task) and bool(wanted)
        columns = list(dict.fromkeys(wanted if inside else [*wanted, *ROUTING]))
        for batch in parquet.iter_batches(row_groups=groups, columns=columns):
            if not inside:
                batch = _in_range(batch, task)
            if not batch.num_rows:
                continue
            if not wanted:  # no column asked for (a count): rows without columns
                yield batch.select([])
                continue
            yield pa.RecordBatch.from_arrays(
                [from_stored(batch.column(f.name), f.type) for f in target], schema=target)


@contextmanager
def _open(task: ArchiveTask) -> Iterator[Any]:
    """A local file by its path (Arrow maps it: no Python in the read path), anything else
    through its fsspec filesystem."""
    if task.path.startswith("file://") or "://" not in task.path:
        yield task.path.removeprefix("file://")
        return
    with task.filesystem.open(task.path, "rb") as stream:
        yield stream


def _row_groups(parquet: pq.ParquetFile, start: int, end: int) -> list[int]:
    """Row groups whose offset statistics meet [start, end) (all when there are none)."""
    index = _leaf_column(parquet.metadata, "offset")
    if index is None:
        return list(range(parquet.num_row_groups))
    out = []
    for i in range(parquet.num_row_groups):
        stats = parquet.metadata.row_group(i).column(index).statistics
        if stats is None or not stats.has_min_max or (stats.min < end and stats.max >= start):
            out.append(i)
    return out


def _all_inside(metadata: pq.FileMetaData, groups: list[int], task: ArchiveTask) -> bool:
    """Whether the statistics of every row group in ``groups`` prove it holds rows of the
    task's topic and partition only, with offsets in its range (False when any is missing,
    and where a routing column holds a null: min and max pass nulls over)."""
    leaves = [_leaf_column(metadata, name) for name in ROUTING]
    if any(leaf is None for leaf in leaves):
        return False
    topic, partition, offset = leaves
    for i in groups:
        group = metadata.row_group(i)
        stats = [group.column(leaf).statistics for leaf in (topic, partition, offset)]
        if any(s is None or not s.has_min_max or not s.has_null_count or s.null_count
               for s in stats):
            return False
        t, p, o = stats
        if not (t.min == t.max == task.tp.topic and p.min == p.max == task.tp.partition
                and o.min >= task.start and o.max < task.end):
            return False
    return True


def _leaf_column(metadata: pq.FileMetaData, path: str) -> int | None:
    """The index of the Parquet leaf column at ``path`` (a row group's statistics are per
    leaf: a struct, list or map column before it has one leaf per nested field, so the Arrow
    field index is not the leaf index), or None when the file has no such column."""
    schema = metadata.schema
    for i in range(len(schema)):
        if schema.column(i).path == path:
            return i
    return None


def _in_range(batch: pa.RecordBatch, task: ArchiveTask) -> pa.RecordBatch:
    """``batch`` cut to the task's partition and range (a no-op for a batch all inside)."""
    offsets = batch.column("offset")
    bounds = pc.min_max(offsets)
    topics = pc.unique(batch.column("topic"))
    partitions = pc.unique(batch.column("partition"))
    if (bounds["min"].as_py() >= task.start and bounds["max"].as_py() < task.end
            and topics.to_pylist() == [task.tp.topic]
            and partitions.to_pylist() == [task.tp.partition]):
        return batch
    mask = pc.and_(pc.and_(pc.greater_equal(offsets, task.start), pc.less(offsets, task.end)),
                   pc.and_(pc.equal(batch.column("topic"), task.tp.topic),
                           pc.equal(batch.column("partition"), task.tp.partition)))
    return batch.filter(mask)
