"""Archive topics into an Iceberg table, exactly once: ``spark-submit jobs/archive.py ...`` or
``logstore archive ...`` (the options are ``logstore/cli/archive.py``'s).

Owns: the driver of the job: resolving topics and their schema, opening or creating the table,
removing orphan files, each micro-batch (plan from the table's recorded offsets, write with
Spark tasks, commit once), the ``archive.<table>`` group offsets, stream mode's trigger loop,
and the exit status. Must not: read records itself (the tasks do, in ``archive_write.py``) or
talk to pyiceberg except through ``datasource/iceberg.py``.

Exactly once. The table is the only record of what is archived: every commit is one Iceberg
snapshot holding the run's files *and*, in its summary, the coverage of every partition after
it (``datasource/archive_offsets.py``), applied only if the table's current snapshot is still
the one the micro-batch planned from. So a micro-batch is in the table entirely or not at all,
and the next one (in this run, or in a run after a crash at any point) starts where the table
says. Files of a micro-batch that never committed are orphans: at start, and after a failed
micro-batch, every archive file under the table's ``data/`` that no snapshot references is
deleted. One run per table at a time: a run takes the table over with a commit of its own
(the owner property and an empty snapshot that moves the main branch, carrying the coverage)
*before* it removes orphans. Every commit of an older run that is still going asserts the main
snapshot it planned from, so it fails (``ArchiveOwnerError``, naming the table and both runs)
and can never reference a file the new run deleted. Orphan removal lists the files first and
checks ownership after, so a stale run deletes nothing the new owner writes.

The group offsets are only a copy, for ``logstore groups describe`` (lag), and nothing reads
them back: a run always resumes from the table's current snapshot. They are committed after
each table commit and are not atomic with it: the table lives in a catalog and an object
store, the group on the brokers, and no commit spans both (a transactional offset commit
would make them atomic with produced records, not with an Iceberg commit, so the job uses a
plain one). A run that dies between the two leaves the group behind the table until the next
run, which copies the table's offsets at start; a run that lost the table stops copying, but
a copy it had already sent can land after the new owner's and show an older position until
the new owner's next commit. Lag from the group can therefore be overstated, never hide
records that are not archived: the group never runs ahead of the table.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from datasource.archive_offsets import (
    ARCHIVED_KEY,
    LOST_KEY,
    RANGES_KEY,
    RUN_KEY,
    TOPIC_IDS_KEY,
    ArchiveDataLossError,
    Coverage,
    NextRanges,
    coverage_of,
    encode,
    encode_topic_ids,
    next_ranges,
    topic_ids_of,
)
from datasource.iceberg import (
    ArchiveCatalogError,
    ArchiveOwnerError,
    CatalogSettings,
    catalog_settings,
    check_owner,
    check_warehouse,
    commit_files,
    data_file,
    delete_file,
    filesystem,
    open_catalog,
    open_table,
    referenced_files,
    stored_files,
    summary,
    take_ownership,
)
from datasource.iceberg_types import stored_schema
from datasource.options import ReadOptions, parse_read_options
from datasource.planning import OffsetRange, PartitionInfo, Planner, split_ranges
from datasource.reader import ReadSettings, ReadTask
from datasource.schema import source_arrow_schema
from jobs.archive_runner import RunTotals, SparkRunner, print_summary
from jobs.archive_write import WriteJob, WrittenFile, run_id_of
from jobs.session import job_session
from logstore.cli.archive import add_archive_arguments
from logstore.client.admin import Admin
from logstore.errors import LogstoreError
from logstore.model import LATEST, TopicPartition

log = logging.getLogger("jobs.archive")

READ_LOSS_RETRIES = 3


class ArchiveError(LogstoreError, RuntimeError):
    """The archive run cannot go on; the message says why and names what is at fault."""


@dataclass(frozen=True)
class ArchiveConfig:
    topics: tuple[str, ...]
    pattern: str | None
    table: str
    catalog: CatalogSettings
    mode: str
    trigger_interval_s: float
    target_file_size: int
    partition_by: str
    fail_on_data_loss: bool
    isolation_level: str
    bootstrap: str
    progress: bool

    @property
    def group(self) -> str:
        return f"archive.{self.table}"

    def read_options(self) -> ReadOptions:
        which = {"subscribePattern": self.pattern} if self.pattern is not None else \
            {"subscribe": ",".join(self.topics)}
        return parse_read_options({"bootstrap.servers": self.bootstrap, **which,
                                   "kafka.isolation.level": self.isolation_level}, False)


def config_from(args: argparse.Namespace) -> ArchiveConfig:
    return ArchiveConfig(
        topics=tuple(args.topic or ()), pattern=args.topic_pattern, table=args.table,
        catalog=catalog_settings(args.catalog, args.warehouse), mode=args.mode,
        trigger_interval_s=args.trigger_interval, target_file_size=args.target_file_size,
        partition_by=args.partition_by, fail_on_data_loss=args.fail_on_data_loss,
        isolation_level=args.isolation_level, bootstrap=args.bootstrap_server,
        progress=not args.no_progress and args.mode == "batch")


# -- the reads ---------------------------------------------------------------------


def read_settings(config: ArchiveConfig, target: Any) -> ReadSettings:
    """The reader's settings: the isolation level (read_committed drops aborted records and
    control batches on every read path). Reads always fail on lost offsets: the driver
    decides what a loss means (re-plan)."""
    return ReadSettings(config.bootstrap, target, "auto", True,
                        isolation_level=config.isolation_level)


def end_offset(info: PartitionInfo) -> int:
    """Where a micro-batch ends: the high watermark, or with read_committed the last stable
    offset (the planner asks for the read's isolation level)."""
    return info.end_offset


def remove_orphans(settings: CatalogSettings, table: Any, run_id: str) -> int:
    """Delete the archive files under ``table``'s ``data/`` that no snapshot references, as
    run ``run_id``, which must own the table. The listing comes first and the ownership check
    after it: a file listed was written before the check, and a run that takes the table over
    later writes only after that, so a run that lost the table deletes nothing of the new
    owner's (it raises ``ArchiveOwnerError`` instead). Files the listing holds cannot be
    committed any more: only the owner commits, and it is here, between micro-batches."""
    stored = stored_files(settings, table.location())
    table = table.refresh()
    check_owner(table, run_id)
    referenced = referenced_files(table)
    orphans = [p for p in stored if run_id_of(p) is not None and p not in referenced]
    for path in orphans:
        delete_file(settings, path)
    if orphans:
        log.warning("removed %d orphan file(s) of runs that did not commit", len(orphans))
    return len(orphans)


# -- the driver --------------------------------------------------------------------------------


class Archiver:
    def __init__(self, config: ArchiveConfig, out: IO[str]) -> None:
        self.config = config
        self.runner: SparkRunner | None = None  # set after prepare(): no Spark for bad options
        self.out = out
        self.run_id = uuid.uuid4().hex[:12]
        self.planner = Planner(config.read_options())
        self.totals = RunTotals(config.table, config.group)
        self.stopping = threading.Event()
        self.table: Any = None
        self.job: WriteJob | None = None
        self.arrow: Any = None
        self.began = time.monotonic()

    def close(self) -> None:
        self.planner.close()

    def prepare(self) -> None:
        began = time.monotonic()
        topics = self._topics()
        arrow = source_arrow_schema(self.planner.value_schema(topics), include_headers=True)
        check_warehouse(self.config.catalog)
        catalog = open_catalog(self.config.catalog)
        table = open_table(catalog, self.config.table, arrow, self.config.partition_by, topics)
        self.table = take_ownership(table, self.run_id, (ARCHIVED_KEY, TOPIC_IDS_KEY))
        fs, _ = filesystem(self.config.catalog, self.table.location())
        self.job = WriteJob(self.run_id, self.table.location(), fs,
                            read_settings(self.config, arrow),
                            stored_schema(arrow, self.table.schema()), self.config.partition_by,
                            self.config.target_file_size)
        self.arrow = arrow
        self.remove_orphans()
        self.commit_group_offsets(coverage_of(summary(self.table)))
        self.totals.phases["prepare"] = time.monotonic() - began
        log.info("run %s archives %s into %s (%s)", self.run_id, topics, self.config.table,
                 self.table.location())

    def _topics(self) -> list[str]:
        topics = self.planner.topics()
        if not topics:
            raise ArchiveError(f"--topic-pattern {self.config.pattern!r} matches no topic")
        return topics

    def remove_orphans(self) -> int:
        """Delete archive files no snapshot references (left by a run that died)."""
        return remove_orphans(self.config.catalog, self.table, self.run_id)

    def cycle(self) -> int:
        """One micro-batch: plan from the table, write, commit. Records archived."""
        for attempt in range(READ_LOSS_RETRIES):
            try:
                return self._cycle()
            except Exception as e:  # a task's DataLossError arrives wrapped by Spark
                if "DataLossError" not in str(e) or self.config.fail_on_data_loss:
                    raise
                log.warning("offsets vanished while being read (attempt %d): re-planning",
                            attempt + 1)
                self.remove_orphans()
        raise ArchiveError(f"retention kept deleting offsets before they could be read "
                           f"({READ_LOSS_RETRIES} attempts)")

    def _cycle(self) -> int:
        self.table = self.table.refresh()
        check_owner(self.table, self.run_id)
        base = self.table.current_snapshot()
        coverage = coverage_of(summary(self.table))
        plan, infos = self._plan(coverage, topic_ids_of(summary(self.table)))
        if not plan.ranges and not plan.lost:
            return 0
        log.info("writing %d range(s) of %d record(s)", len(plan.ranges),
                 sum(s.end - s.start for s in plan.ranges))
        with self.totals.timed("write"):
            written = self._write(plan, infos)
        with self.totals.timed("commit"):
            files = [data_file(self.table.metadata, w.path, w.parquet, w.size) for w in written]
            self.table = commit_files(self.table, files, self._properties(plan),
                                      None if base is None else base.snapshot_id, self.run_id)
        self._account(plan, written)
        log.info("committed snapshot %s: %d file(s)", self.totals.snapshot_id, len(written))
        with self.totals.timed("group offsets"):
            self.commit_group_offsets(plan.coverage)
        return sum(w.records for w in written)

    def _plan(self, coverage: dict[TopicPartition, Coverage], archived_ids: dict[str, str]
              ) -> tuple[NextRanges, dict[TopicPartition, PartitionInfo]]:
        tps = self.planner.partitions()
        new_topics = sorted({tp.topic for tp in tps})
        if source_arrow_schema(self.planner.value_schema(new_topics), True) != self.arrow:
            raise ArchiveError(f"topics {new_topics} no longer share the table's schema")
        infos = self.planner.describe(tps)
        logs = {tp: (i.log_start_offset, end_offset(i))
                for tp, i in infos.items()}
        ids = {t: self.planner.metadata.topic(t).topic_id for t in new_topics}
        for t, now in sorted(ids.items()):
            was = archived_ids.get(t)
            if was and now and was != now and not self.config.fail_on_data_loss:
                log.warning("topic %r was created again (id %s, the table's %s); archiving on "
                            "after the table's offsets (--no-fail-on-data-loss)", t, now, was)
        plan = next_ranges(coverage, logs, self.config.fail_on_data_loss, archived_ids, ids)
        for lost in plan.lost:
            log.warning("%s: offsets [%d, %d) were deleted before being archived; skipped "
                        "(--no-fail-on-data-loss)", lost.tp, lost.start, lost.end)
        return plan, infos

    def _write(self, plan: NextRanges, infos: dict[TopicPartition, PartitionInfo]
               ) -> list[WrittenFile]:
        if not plan.ranges:
            return []
        assert self.runner is not None and self.job is not None
        parallelism = int(self.runner.spark.sparkContext.defaultParallelism)
        pieces = split_ranges([OffsetRange(s.tp, s.start, s.end) for s in plan.ranges],
                              parallelism, None)
        tasks = [ReadTask(r.tp, r.start, r.end, infos[r.tp].leader, infos[r.tp].path,
                          infos[r.tp].incarnation) for r in pieces]
        return self.runner.run(tasks, self.job)

    def _properties(self, plan: NextRanges) -> dict[str, str]:
        props = {ARCHIVED_KEY: encode({tp: (c.first, c.end) for tp, c in plan.coverage.items()}),
                 RANGES_KEY: encode({s.tp: (s.start, s.end) for s in plan.ranges}),
                 RUN_KEY: self.run_id}
        if plan.topic_ids:
            props[TOPIC_IDS_KEY] = encode_topic_ids(plan.topic_ids)
        if plan.lost:
            props[LOST_KEY] = encode({s.tp: (s.start, s.end) for s in plan.lost})
        return props

    def _account(self, plan: NextRanges, written: list[WrittenFile]) -> None:
        t = self.totals
        t.records += sum(w.records for w in written)
        t.files += len(written)
        t.bytes += sum(w.size for w in written)
        t.commits += 1
        snapshot = self.table.current_snapshot()
        t.snapshot_id = None if snapshot is None else snapshot.snapshot_id
        for s in plan.ranges:
            t.add_range(s.tp, s.start, s.end)
        for s in plan.lost:
            t.lost[s.tp] = (s.start, s.end)

    def commit_group_offsets(self, coverage: dict[TopicPartition, Coverage]) -> None:
        """The table's offsets, copied to group ``archive.<table>`` (for lag); a failure is
        logged, not fatal: the table stays the source of truth and the next commit (or the
        next run's start) repeats. Skipped once another run owns the table, so that a stale
        run's copy does not move the group back behind the new owner's (a narrow window
        remains: the copy is not atomic with the table; see the module's docstring)."""
        if not coverage:
            return
        try:
            check_owner(self.table.refresh(), self.run_id)
        except ArchiveOwnerError as e:
            log.warning("not copying offsets to group %s: %s", self.config.group, e)
            return
        try:
            with Admin(self.config.bootstrap) as admin:
                admin.alter_group_offsets(self.config.group,
                                          {tp: c.end for tp, c in coverage.items()})
        except LogstoreError as e:
            log.warning("could not commit offsets of group %s: %s", self.config.group, e)

    def lag(self) -> dict[TopicPartition, int]:
        coverage = coverage_of(summary(self.table.refresh()))
        with Admin(self.config.bootstrap) as admin:
            ends = admin.list_offsets(dict.fromkeys(coverage, LATEST)) if coverage else {}
        return {tp: max(ends[tp] - c.end, 0) for tp, c in coverage.items()}

    def run(self) -> int:
        """Batch: one micro-batch; stream: until stopped. Then the summary."""
        if self.config.mode == "batch":
            self.cycle()
        else:
            self.stream()
        self.totals.seconds = time.monotonic() - self.began
        snapshot = self.table.current_snapshot()
        self.totals.snapshot_id = None if snapshot is None else snapshot.snapshot_id
        self.totals.lag = self.lag()
        print_summary(self.totals, self.out)
        return 0

    def stream(self) -> None:
        """A micro-batch every trigger interval (from the start of the last one) until
        SIGTERM or Ctrl-C."""
        interval = self.config.trigger_interval_s
        log.info("stream mode: a micro-batch every %.1f s until stopped", interval)
        while not self.stopping.is_set():
            started = time.monotonic()
            records = self.cycle()
            if records:
                print(f"micro-batch: {records:,} records committed (snapshot "
                      f"{self.totals.snapshot_id})", file=self.out, flush=True)
            self.stopping.wait(max(interval - (time.monotonic() - started), 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="archive", description=__doc__.split("\n")[0])
    add_archive_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "pyiceberg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    archiver: Archiver | None = None
    handler = None
    try:
        config = config_from(args)
        archiver = Archiver(config, sys.stdout)
        archiver.prepare()  # every check that needs no Spark, before Spark starts
        archiver.runner = SparkRunner(job_session("logstore-archive", args.master),
                                       config.progress)
        handler = _stop_on_signal(archiver)
        return archiver.run()
    except (LogstoreError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
        if archiver is not None:
            archiver.close()


def _stop_on_signal(archiver: Archiver) -> Any:
    def stop(signum: int, frame: FrameType | None) -> None:
        archiver.stopping.set()
    previous = signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return previous


__all__ = ["ArchiveCatalogError", "ArchiveConfig", "ArchiveDataLossError", "ArchiveOwnerError",
           "Archiver", "main", "remove_orphans"]

if __name__ == "__main__":
    sys.exit(main())
