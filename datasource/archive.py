"""History reads: ``format("logstore")`` with ``archiveTable`` reads offsets below the log
start from the topic's Iceberg archive and the rest from the log, as one DataFrame.

Owns: planning such a read (the archive's coverage from its current snapshot, EARLIEST and
timestamps resolved over table and log together, each range split between them by
``archive_offsets.split_history``, the archive's data files picked by pyiceberg's pruning) and
the tasks of the archived ranges, packed by size as Spark packs files (``packing.py``; read by
``archive_read.py`` on executors). Must not: change how log ranges are read (they are the
source's own ``RangePartition``\\s) or write anything.

Offsets the table holds are read from the table even where the log still has them too, so
retention moving the log start during a read cannot break it; the log part starts where the
table ends. Offsets in neither (archived too late) are data loss under ``failOnDataLoss``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition

from datasource.archive_offsets import (
    Coverage,
    coverage_of,
    earliest,
    split_history,
    topic_ids_of,
)
from datasource.archive_read import ArchivePartition, ArchiveTask
from datasource.iceberg import (
    ArchivedRange,
    CatalogSettings,
    catalog_settings,
    file_io,
    files_for_range,
    files_for_ranges,
    filesystem,
    open_catalog,
    summary,
)
from datasource.iceberg_types import check_table_schema, iceberg_schema
from datasource.options import OffsetSpec, OptionError, ReadOptions
from datasource.packing import default_min_partitions, pack_by_size
from datasource.planning import (
    DataLossError,
    OffsetRange,
    PartitionInfo,
    Planner,
    check_range,
    narrow,
)
from datasource.schema import source_arrow_schema
from logstore.model import TopicPartition

if TYPE_CHECKING:  # source.py imports this module
    from datasource.source import LogStoreBatchReader

log = logging.getLogger(__name__)


@dataclass
class History:
    """The archive table of one history read (driver side)."""

    options: ReadOptions
    catalog: CatalogSettings
    table: Any
    coverage: dict[TopicPartition, Coverage]

    @classmethod
    def open(cls, options: ReadOptions, planner: Planner, topics: list[str]) -> History:
        assert options.archive_table is not None
        catalog = catalog_settings([f"{k}={v}" for k, v in options.archive_catalog],
                                   options.archive_warehouse)
        table = _load(catalog, options.archive_table)
        wanted = iceberg_schema(source_arrow_schema(planner.value_schema(topics), True))
        check_table_schema(table.schema(), wanted, options.archive_table, topics)
        coverage = coverage_of(summary(table))
        for topic in _recreated(options, planner, topics, topic_ids_of(summary(table))):
            coverage = {tp: c for tp, c in coverage.items() if tp.topic != topic}
        return cls(options, catalog, table, coverage)

    def widened(self, infos: dict[TopicPartition, PartitionInfo]
                ) -> dict[TopicPartition, PartitionInfo]:
        """``infos`` with each log start offset lowered to the table's first offset, so that
        EARLIEST and the range checks mean the whole history."""
        return {tp: replace(i, log_start_offset=earliest(self.coverage.get(tp),
                                                         i.log_start_offset))
                for tp, i in infos.items()}

    def first_at_or_after(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        """The first archived offset of ``tp`` with a timestamp >= ``timestamp_ms``."""
        covered = self.coverage.get(tp)
        if covered is None:
            return None
        best: int | None = None
        for file in files_for_range(self.table, tp.topic, tp.partition, covered.first,
                                    covered.end, timestamp_ms * 1000):
            rows = _read(self.catalog, file.path, tp, covered.first, covered.end, ["offset"],
                         timestamp_ms)
            if rows.num_rows:
                found = int(pc.min(rows.column("offset")).as_py())
                best = found if best is None else min(best, found)
        return best


def _recreated(options: ReadOptions, planner: Planner, topics: list[str],
               archived_ids: dict[str, str]) -> list[str]:
    """Topics whose id is not the one the table archived (deleted and created again: the
    table's offsets name the old topic's records). A DataLossError under failOnDataLoss;
    otherwise they are read from the log alone."""
    out = []
    for topic in topics:
        was, now = archived_ids.get(topic), planner.metadata.topic(topic).topic_id
        if not was or not now or was == now:
            continue
        message = (f"archiveTable {options.archive_table!r}: topic {topic!r} is not the one "
                   f"the table archived (topic id {now}, the table's {was}): it was deleted "
                   "and created again, so the table's offsets name another topic's records")
        if options.fail_on_data_loss:
            raise DataLossError(f"{message}; read it without archiveTable, or set "
                                "failOnDataLoss=false to read its log alone")
        log.warning("%s; reading its log alone (failOnDataLoss=false)", message)
        out.append(topic)
    return out


def _load(catalog: CatalogSettings, name: str) -> Any:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return open_catalog(catalog).load_table(name)
    except NoSuchTableError:
        raise OptionError(f"archiveTable: table {name!r} does not exist in the "
                          f"{catalog.describe()}") from None


def plan_history(scan: LogStoreBatchReader, planner: Planner, infos: dict[TopicPartition, PartitionInfo]
                 ) -> list[InputPartition]:
    """The batch reader's plan (``LogStoreBatchReader._plan``) over table and log."""
    options: ReadOptions = scan.options
    history = History.open(options, planner, sorted({tp.topic for tp in infos}))
    wide = history.widened(infos)
    starts = _resolve(history, planner, options.starting, wide, "starting")
    ends = _resolve(history, planner, options.ending, wide, "ending")
    log_ranges: list[OffsetRange] = []
    archive_ranges: list[OffsetRange] = []
    for tp, info in sorted(infos.items()):
        split = split_history(starts[tp], ends[tp], info.log_start_offset,
                              history.coverage.get(tp))
        _missing(tp, split.missing, options.fail_on_data_loss)
        if split.archive is not None:
            archive_ranges.append(OffsetRange(tp, *split.archive))
        for start, end in split.log:
            r = check_range(tp, start, end, info, options.fail_on_data_loss)
            if r is not None:
                log_ranges.append(r)
    if scan.constraints.empty:
        return []
    log_ranges = narrow(log_ranges, scan.constraints)
    log_ranges = narrow(log_ranges, scan.constraints, scan._timestamp_starts(planner, log_ranges))
    archived = _archive_partitions(history, narrow(archive_ranges, scan.constraints),
                                   default_min_partitions(options.min_partitions))
    return [*archived, *scan._tasks(planner, log_ranges, infos)]


def _archive_partitions(history: History, ranges: list[OffsetRange], min_partitions: int
                        ) -> list[ArchivePartition]:
    """One read per (range, data file that may hold it), packed into tasks by file size as
    Spark packs a file source's files (``packing.py``)."""
    fs, _ = filesystem(history.catalog, history.table.location())
    files = files_for_ranges(history.table, [ArchivedRange(r.tp.topic, r.tp.partition, r.start,
                                                           r.end) for r in ranges])
    reads = [(ArchiveTask(r.tp, r.start, r.end, file.path, fs), file.size_bytes)
             for r, held in zip(ranges, files, strict=True) for file in held]
    groups = pack_by_size([size for _, size in reads], min_partitions)
    return [ArchivePartition(tuple(reads[i][0] for i in group)) for group in groups]


def _resolve(history: History, planner: Planner, spec: OffsetSpec,
             infos: dict[TopicPartition, PartitionInfo], side: str) -> dict[TopicPartition, int]:
    """``Planner.resolve`` over the widened infos; a timestamp found in the table wins over
    the log's answer (which cannot see below the log start)."""
    out = planner.resolve(spec, infos, side)
    if not spec.by_timestamp:
        return out
    for tp in infos:
        ts = spec.timestamps.get(tp, spec.timestamp_ms)
        if ts is None:
            continue
        found = history.first_at_or_after(tp, ts)
        if found is not None and found < out[tp]:
            out[tp] = found
    return out


def _missing(tp: TopicPartition, missing: list[tuple[int, int]], fail: bool) -> None:
    for start, end in missing:
        lost = f"{tp}: offsets [{start}, {end}) are neither in the archive table nor in the log"
        if fail:
            raise DataLossError(f"{lost}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)


def _read(catalog: CatalogSettings, path: str, tp: TopicPartition, start: int, end: int,
          columns: list[str], timestamp_min_ms: int | None = None) -> pa.Table:
    condition = ((pc.field("topic") == tp.topic) & (pc.field("partition") == tp.partition)
                 & (pc.field("offset") >= start) & (pc.field("offset") < end))
    if timestamp_min_ms is not None:
        condition = condition & (pc.field("timestamp") >= pa.scalar(
            timestamp_min_ms * 1000, pa.timestamp("us", tz="UTC")))
    with file_io(catalog, path).new_input(path).open() as stream:
        return pq.read_table(stream, columns=columns, filters=condition)
