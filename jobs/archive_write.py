"""The executor side of the archive job: one offset range -> Parquet files in the warehouse.

Owns: reading a range with the LogStore reader (``datasource/reader.py``, so local files or
fetches as the source chooses), casting it to the table's Parquet shape, cutting it into files
by the table's partitioning and the target file size, writing them with pyarrow through the
warehouse's fsspec filesystem (shipped from the driver), and handing each file's footer back to
the driver, which makes the Iceberg entries. Must not: commit anything (the driver does, once,
for the whole run), plan ranges, or import pyiceberg (tasks pay no catalog import).

File names carry the run id (``archive-<run id>-<topic>-<partition>-<first offset>-<n>``), so
a later run tells its own files from those of a run that died before committing (orphans).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datasource.iceberg_types import to_stored
from datasource.reader import ReadSettings, ReadTask, read_range

FILE_PREFIX = "archive-"
ROW_GROUP_ROWS = 256 * 1024
COMPRESSION = "zstd"


@dataclass(frozen=True)
class WriteJob:
    """What every write task of one run shares (pickled once per task)."""

    run_id: str
    location: str                  # the table's location; files go under <location>/data
    filesystem: Any                # the warehouse's fsspec filesystem (pickles its arguments)
    read: ReadSettings             # target: the source's columns with headers
    stored: pa.Schema              # the Parquet shape, with field ids
    partition_by: str              # date | partition | none
    target_file_size: int


@dataclass(frozen=True)
class WrittenFile:
    """A finished file and its Parquet footer (the driver makes the Iceberg entry from it)."""

    path: str
    records: int
    size: int
    parquet: pq.FileMetaData


def file_name(run_id: str, task: ReadTask, sequence: int) -> str:
    return f"{FILE_PREFIX}{run_id}-{task.tp.topic}-{task.tp.partition}-{task.start}-" \
           f"{sequence:04d}.parquet"


def run_id_of(path: str) -> str | None:
    """The run id in an archive file's name, or None for a file the archive did not write."""
    name = path.rsplit("/", 1)[-1]
    if not (name.startswith(FILE_PREFIX) and name.endswith(".parquet")):
        return None
    return name[len(FILE_PREFIX):].split("-", 1)[0]


def write_range(task: ReadTask, job: WriteJob) -> list[WrittenFile]:
    """Every record of ``task``'s range, in files of at most about ``target_file_size``."""
    files = _Files(task, job)
    try:
        pending: dict[str, list[pa.RecordBatch]] = {}
        for batch in read_range(task, job.read):
            for key, part in _by_partition(to_stored(batch, job.stored), job.partition_by):
                rows = pending.setdefault(key, [])
                rows.append(part)
                if sum(b.num_rows for b in rows) >= ROW_GROUP_ROWS:
                    files.write(key, pending.pop(key))
        for key, rows in pending.items():
            files.write(key, rows)
        return files.close()
    except BaseException:
        files.abandon()
        raise


class _Files:
    """The open file per partition key of one task; a file rolls over at the target size."""

    def __init__(self, task: ReadTask, job: WriteJob) -> None:
        self.task, self.job = task, job
        self.open: dict[str, tuple[str, Any, pq.ParquetWriter]] = {}
        self.done: list[WrittenFile] = []
        self.sequence = 0

    def write(self, key: str, batches: list[pa.RecordBatch]) -> None:
        path, stream, writer = self.open.get(key) or self._create(key)
        writer.write_table(pa.Table.from_batches(batches, schema=self.job.stored),
                           row_group_size=ROW_GROUP_ROWS)
        if stream.tell() >= self.job.target_file_size:
            self._finish(key)

    def _create(self, key: str) -> tuple[str, Any, pq.ParquetWriter]:
        directory = f"{self.job.location}/data/{key}" if key else f"{self.job.location}/data"
        path = f"{directory}/{file_name(self.job.run_id, self.task, self.sequence)}"
        self.sequence += 1
        stream = self.job.filesystem.open(path, "wb")
        writer = pq.ParquetWriter(stream, self.job.stored, compression=COMPRESSION)
        self.open[key] = (path, stream, writer)
        return self.open[key]

    def _finish(self, key: str) -> None:
        path, stream, writer = self.open.pop(key)
        writer.close()
        size = stream.tell()
        stream.close()
        metadata = writer.writer.metadata
        self.done.append(WrittenFile(path, metadata.num_rows, size, metadata))

    def close(self) -> list[WrittenFile]:
        for key in list(self.open):
            self._finish(key)
        return self.done

    def abandon(self) -> None:
        """Close what is open; the files stay as orphans for the next run to remove."""
        for _, stream, writer in self.open.values():
            try:
                writer.close()
                stream.close()
            except Exception:  # noqa: BLE001 - the task's own error is what matters
                pass
        self.open.clear()


def _by_partition(batch: pa.RecordBatch, partition_by: str
                  ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """(directory under data/, rows) per partition value of ``batch``."""
    if partition_by == "none" or batch.num_rows == 0:
        yield "", batch
        return
    if partition_by == "partition":
        topic = batch.column("topic")[0].as_py()
        yield f"topic={topic}/partition={batch.column('partition')[0].as_py()}", batch
        return
    days = pc.cast(pc.cast(batch.column("timestamp"), pa.int64()), pa.int64())
    day_numbers = np.floor_divide(days.to_numpy(zero_copy_only=False), 86_400_000_000)
    for day in np.unique(day_numbers):
        date = datetime.fromtimestamp(int(day) * 86_400, tz=UTC).date().isoformat()
        yield f"timestamp_day={date}", batch.filter(pa.array(day_numbers == day))
