"""Two archive runs on one table (``jobs/archive.py``, ``datasource/iceberg.py``): a run that
took the table over makes every later commit of the older run fail, before it removes orphans,
so no snapshot ever references a file that was deleted as an orphan.

The runs are driven step by step through the job's own table functions (take_ownership,
remove_orphans, commit_files) on a local warehouse with its SQLite catalog: the interleavings
are the ones two real driver processes can produce, made deterministic. No broker, no Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datasource.archive_offsets import ARCHIVED_KEY, coverage_of, encode
from datasource.iceberg import (
    OWNER_SUMMARY,
    ArchiveOwnerError,
    CatalogSettings,
    catalog_settings,
    commit_files,
    data_file,
    filesystem,
    open_catalog,
    open_table,
    owner,
    referenced_files,
    summary,
    take_ownership,
)
from datasource.iceberg_types import stored_schema, to_stored
from datasource.schema import source_arrow_schema
from jobs.archive import remove_orphans
from logstore.model import TopicPartition

TABLE = "ns.t"
TP = TopicPartition("t", 0)
ARROW = source_arrow_schema(None, True)


class Run:
    """One archive run's view of the table: its own loaded Table object, as a driver holds."""

    def __init__(self, settings: CatalogSettings, run_id: str) -> None:
        self.settings, self.run_id = settings, run_id
        self.table: Any = take_ownership(_load(settings), run_id, (ARCHIVED_KEY,))

    def plan(self) -> int | None:
        """The cycle's start: the main snapshot the commit will assert."""
        self.table = self.table.refresh()
        base = self.table.current_snapshot()
        return None if base is None else base.snapshot_id

    def write(self, start: int, end: int) -> tuple[str, Any]:
        """One archive file of offsets [start, end) (named as the job names them)."""
        stored = stored_schema(ARROW, self.table.schema())
        n = end - start
        batch = pa.RecordBatch.from_arrays([
            pa.array([b"k"] * n), pa.array([b"v"] * n), pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()), pa.array(range(start, end), pa.int64()),
            pa.array([1_700_000_000_000_000] * n, ARROW.field("timestamp").type),
            pa.array([0] * n, pa.int32()), pa.nulls(n, ARROW.field("headers").type)],
            schema=ARROW)
        path = f"{self.table.location()}/data/archive-{self.run_id}-t-0-{start}-0000.parquet"
        fs, local = filesystem(self.settings, path)
        with fs.open(local, "wb") as stream:
            writer = pq.ParquetWriter(stream, stored)
            writer.write_table(pa.Table.from_batches([to_stored(batch, stored)]))
            writer.close()
            size = stream.tell()
        return path, data_file(self.table.metadata, path, writer.writer.metadata, size)

    def commit(self, base: int | None, files: list[Any], start: int, end: int) -> None:
        self.table = commit_files(self.table, files, {ARCHIVED_KEY: encode({TP: (0, end)})},
                                  base, self.run_id)


def _load(settings: CatalogSettings) -> Any:
    return open_table(open_catalog(settings), TABLE, ARROW, "none", ["t"])


def _exists(settings: CatalogSettings, url: str) -> bool:
    fs, path = filesystem(settings, url)
    return bool(fs.exists(path))


def _dangling(settings: CatalogSettings) -> list[str]:
    table = _load(settings)
    return [p for p in referenced_files(table) if not _exists(settings, p)]


@pytest.fixture
def settings(tmp_path: Path) -> CatalogSettings:
    return catalog_settings([], str(tmp_path / "warehouse"))


def test_stale_run_cannot_commit_files_the_new_run_removed(settings: CatalogSettings) -> None:
    """Goal: the reviewer's interleaving. Run A plans and writes; run B takes the table over
    and removes A's file as an orphan; A's commit must fail naming the table and both runs,
    and the table must reference no deleted file. Method: the steps in that order."""
    a = Run(settings, "runA")
    base = a.plan()
    path, entry = a.write(0, 10)
    b = Run(settings, "runB")
    assert remove_orphans(settings, b.table, "runB") == 1
    assert not _exists(settings, path)
    with pytest.raises(ArchiveOwnerError,
                       match=r"table 'ns.t' is now archived by run runB; this run \(runA\)"):
        a.commit(base, [entry], 0, 10)
    assert _dangling(settings) == []
    assert coverage_of(summary(_load(settings))) == {}


def test_stale_commit_is_never_rebased_onto_the_new_runs_commit(
        settings: CatalogSettings) -> None:
    """Goal: a stale run's commit is refused, not retried on top of the new main (pyiceberg
    re-bases failed appends by default, which would archive [0, 10) twice). Method: A plans
    and writes; B takes over, writes and commits [0, 10); A commits: refused; the table holds
    B's file only, and its coverage is B's."""
    a = Run(settings, "runA")
    base_a = a.plan()
    _, entry_a = a.write(0, 10)
    b = Run(settings, "runB")
    base_b = b.plan()
    path_b, entry_b = b.write(0, 10)
    b.commit(base_b, [entry_b], 0, 10)
    with pytest.raises(ArchiveOwnerError, match="runB.*runA"):
        a.commit(base_a, [entry_a], 0, 10)
    table = _load(settings)
    assert referenced_files(table) == {path_b}
    assert coverage_of(summary(table))[TP].end == 10


def test_taking_over_moves_main_and_keeps_the_coverage(settings: CatalogSettings) -> None:
    """Goal: taking a table over is a commit that moves main (so older runs' commits
    conflict) and carries the coverage (so the new run resumes where the table ends), on an
    empty table too. Method: take over an empty table, commit [0, 10), take over again."""
    a = Run(settings, "runA")
    first = a.table.current_snapshot()
    assert first is not None and summary(a.table)[OWNER_SUMMARY] == "runA"
    _, entry = a.write(0, 10)
    a.commit(first.snapshot_id, [entry], 0, 10)
    committed = a.table.current_snapshot().snapshot_id
    b = Run(settings, "runB")
    taken = b.table.current_snapshot()
    assert taken.snapshot_id != committed and taken.parent_snapshot_id == committed
    assert owner(b.table) == "runB" and summary(b.table)[OWNER_SUMMARY] == "runB"
    assert coverage_of(summary(b.table))[TP].end == 10
    assert len(referenced_files(b.table)) == 1  # no file added, none dropped
    stored = _load(settings).properties  # the no-retry override never reaches the catalog
    assert stored == {"logstore.archive.owner": "runB"}


def test_racing_takeovers_leave_one_owner(settings: CatalogSettings) -> None:
    """Goal: two runs taking the table over from the same loaded state both succeed in turn
    (the loser of the compare-and-swap tries again on the new state) and the last one owns
    it. Method: two Table objects loaded before either takes over."""
    one, two = _load(settings), _load(settings)
    take_ownership(one, "runA", (ARCHIVED_KEY,))
    table = take_ownership(two, "runB", (ARCHIVED_KEY,))
    assert owner(table) == "runB" and len(table.snapshots()) == 2


def test_stale_run_removes_no_file_of_the_new_owner(settings: CatalogSettings) -> None:
    """Goal: a stale run cleaning up (after a failed micro-batch) must not delete the new
    owner's files that are written but not yet committed. Method: B takes over and writes;
    A's orphan removal refuses with ArchiveOwnerError; B's file is there and commits."""
    a = Run(settings, "runA")
    b = Run(settings, "runB")
    base = b.plan()
    path, entry = b.write(0, 10)
    with pytest.raises(ArchiveOwnerError, match="runA"):
        remove_orphans(settings, a.table, "runA")
    assert _exists(settings, path)
    b.commit(base, [entry], 0, 10)
    assert _dangling(settings) == [] and referenced_files(_load(settings)) == {path}
