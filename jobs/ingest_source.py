"""``format("logstore-files")``: the lines of the files in a directory (a local path or any
fsspec URL: ``s3://`` works with no Spark S3 connector) as rows ``(value, file)``, in batch
(every file there now) and as a Structured Streaming source.

Owns: the Spark side of ``jobs/ingest_files.py``. Offsets are ``{"files": n}``: the first ``n``
files of the file log (``fileLog``, required when streaming), so each micro-batch's files are
fixed by the offsets Spark checkpoints and a restarted or replayed query reads the same files.
``maxFilesPerTrigger`` limits a micro-batch; Trigger.AvailableNow stops at the files listed
when the query started. Partitions read whole files on the executors through fsspec.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from jobs.ingest_files import (
    SPARK_SCHEMA,
    FileLog,
    IngestError,
    SourceOptions,
    bins,
    files_of,
    list_files,
    next_end,
    offset,
    ordered,
    parse_source_options,
    read_lines,
)


class FilesPartition(InputPartition):
    """The URLs of the files one task reads."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls)
        self.urls = urls


class _Reading:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilesPartition)
        yield from read_lines(partition.urls, self.options.storage_options)


class FilesBatchReader(_Reading, DataSourceReader):
    """Every file in the directory now, in admission order."""

    def partitions(self) -> Sequence[InputPartition]:
        files = ordered(list_files(self.options.url, self.options.storage_options))
        return [FilesPartition(urls) for urls in bins(files)]


class FilesStreamReader(_Reading, DataSourceStreamReader,
                        SupportsTriggerAvailableNow):
    """Micro-batches of newly listed files; offsets index the file log."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        if options.file_log is None:
            raise IngestError("fileLog (where the stream logs the files it admitted, e.g. "
                              "in the checkpoint) is required for readStream")
        self._log: FileLog | None = None
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_log": None}  # executors only read files

    @property
    def log(self) -> FileLog:
        if self._log is None:
            assert self.options.file_log is not None
            self._log = FileLog(self.options.file_log)
        return self._log

    def _admit(self) -> int:
        return self.log.admit(list_files(self.options.url, self.options.storage_options))

    def initialOffset(self) -> dict[str, int]:
        return offset(0)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._admit()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_files_per_trigger is not None:
            return ReadMaxFiles(self.options.max_files_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        admitted = self._target if self._target is not None else self._admit()
        most = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        return offset(next_end(files_of(start), admitted, most))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        files = self.log.between(files_of(start), files_of(end))
        return [FilesPartition(urls) for urls in bins(files)]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint holds the offsets, the file log the files."""


class FilesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "logstore-files"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return FilesBatchReader(parse_source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FilesStreamReader(parse_source_options(self.options))
