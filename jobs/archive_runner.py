"""Running the archive's write tasks on Spark, with a progress bar, and the end-of-run summary.

Owns: turning a list of offset ranges into one Spark job whose tasks write Parquet files
(``archive_write.write_range``; the records never pass through the JVM), the progress bar
(records and bytes per second, ranges done; updated as tasks finish) and the one-screen
summary. Must not: plan ranges or commit (``archive.py`` does).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from tqdm import tqdm

from datasource.reader import ReadTask
from jobs.archive_write import WriteJob, WrittenFile, write_range
from logstore.model import TopicPartition

PROGRESS_POLL_S = 0.5


class SparkRunner:
    """Runs write tasks as one Spark job per micro-batch in ``spark``."""

    def __init__(self, spark: Any, progress: bool = True) -> None:
        self.spark = spark
        self.progress = progress

    def run(self, tasks: list[ReadTask], job: WriteJob) -> list[WrittenFile]:
        sc = self.spark.sparkContext
        records, size = sc.accumulator(0), sc.accumulator(0)

        def work(task: ReadTask) -> list[WrittenFile]:
            written = write_range(task, job)
            records.add(sum(f.records for f in written))
            size.add(sum(f.size for f in written))
            return written

        rdd = sc.parallelize(tasks, len(tasks)).flatMap(work)
        sc.setJobDescription(f"archive run {job.run_id}: {len(tasks)} range(s)")
        if not self.progress:
            return list(rdd.collect())
        total = sum(t.end - t.start for t in tasks)
        return _with_progress(rdd.collect, total, len(tasks), records, size, sc)


def _with_progress(collect: Any, total: int, ranges: int, records: Any, size: Any,
                   sc: Any) -> list[WrittenFile]:
    """``collect()`` on a thread while the bar follows the accumulators (which grow as tasks
    finish) and Spark's count of finished tasks."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["files"] = collect()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=target, name="archive-collect", daemon=True)
    began = time.monotonic()
    worker.start()
    with tqdm(total=total, unit="rec", unit_scale=True, file=sys.stderr, desc="archive",
              mininterval=PROGRESS_POLL_S) as bar:
        while worker.is_alive():
            worker.join(PROGRESS_POLL_S)
            _update(bar, records.value, size.value, _done_tasks(sc), ranges, began)
        _update(bar, records.value, size.value, ranges, ranges, began)
    if "error" in outcome:
        raise outcome["error"]
    return list(outcome["files"])


def _update(bar: Any, records: int, size: int, done: int, ranges: int, began: float) -> None:
    seconds = max(time.monotonic() - began, 1e-6)
    bar.update(max(records - bar.n, 0))
    bar.set_postfix_str(f"{size / seconds / 1e6:.1f} MB/s, ranges {done}/{ranges}",
                        refresh=False)


def _done_tasks(sc: Any) -> int:
    tracker = sc.statusTracker()
    done = 0
    for job_id in tracker.getActiveJobsIds():
        info = tracker.getJobInfo(job_id)
        for stage_id in (info.stageIds if info else ()):
            stage = tracker.getStageInfo(stage_id)
            done += stage.numCompletedTasks if stage else 0
    return done


# -- the summary -------------------------------------------------------------------------------


@dataclass
class RunTotals:
    """What a run archived, over all its micro-batches."""

    table: str
    group: str
    records: int = 0
    files: int = 0
    bytes: int = 0
    commits: int = 0
    snapshot_id: int | None = None
    ranges: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    lost: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    lag: dict[TopicPartition, int] = field(default_factory=dict)
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent, by phase

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + time.monotonic() - began

    def add_range(self, tp: TopicPartition, start: int, end: int) -> None:
        first, _ = self.ranges.get(tp, (start, end))
        self.ranges[tp] = (first, end)


MAX_PARTITION_LINES = 12


def print_summary(totals: RunTotals, out: IO[str]) -> None:
    rate = totals.records / max(totals.seconds, 1e-9)
    lines = [
        f"archived into {totals.table}: {totals.records:,} records in {totals.files} file(s), "
        f"{totals.bytes / 1e6:,.1f} MB, {totals.commits} commit(s), {totals.seconds:.1f} s "
        f"({rate:,.0f} records/s)",
        f"table snapshot {totals.snapshot_id if totals.snapshot_id is not None else '-'}; "
        f"lag now {sum(totals.lag.values()):,} record(s) (group {totals.group})",
        "time: " + ", ".join(f"{k} {v:.1f} s" for k, v in totals.phases.items()),
    ]
    for tp, (start, end) in sorted(totals.ranges.items())[:MAX_PARTITION_LINES]:
        lines.append(f"  {tp}: offsets [{start}, {end}) archived, lag {totals.lag.get(tp, 0)}")
    if len(totals.ranges) > MAX_PARTITION_LINES:
        lines.append(f"  ... and {len(totals.ranges) - MAX_PARTITION_LINES} more partition(s)")
    for tp, (start, end) in sorted(totals.lost.items()):
        lines.append(f"  {tp}: offsets [{start}, {end}) LOST (deleted before being archived)")
    print("\n".join(lines), file=out, flush=True)
