"""The archive's side of pyiceberg: catalogs, archive tables, data files and conditional commits.

Owns: catalog properties (``key=value`` pairs or a file; by default a SQL catalog on SQLite in
a local warehouse), opening or creating an archive table and checking it against the topics,
the file IO (fsspec, so ``s3://`` works without a Spark S3 connector), turning a written
Parquet file into an Iceberg ``DataFile`` (on executors), the one commit that appends a run's
files together with its offsets only if the table did not change since the run planned (never
re-based by pyiceberg's retries), the commit by which a run takes a table over, and listing
the files the table references or holds. Must not: read topics, or import pyspark.

pyiceberg is reached only here and in ``iceberg_types.py`` (its types).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThan,
    Or,
)
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AssertRefSnapshotId
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import PrimitiveType

from datasource.iceberg_types import ArchiveSchemaError, check_table_schema, iceberg_schema
from logstore.errors import LogstoreError

log = logging.getLogger(__name__)

FSSPEC_IO = "pyiceberg.io.fsspec.FsspecFileIO"
PARTITION_BY = ("date", "partition", "none")
OWNER_PROPERTY = "logstore.archive.owner"
OWNER_SUMMARY = "logstore.owner"  # in the summary of the snapshot a run took the table with
OWNERSHIP_ATTEMPTS = 5
CATALOG_NAME = "logstore"


class ArchiveCatalogError(LogstoreError, ValueError):
    """A catalog, warehouse or table that cannot be used; the message names it."""


class ArchiveConflictError(LogstoreError, RuntimeError):
    """The table changed between planning and commit (another run committed)."""


class ArchiveOwnerError(ArchiveConflictError):
    """Another run took the table over: this (stale) run must stop without committing."""


@dataclass(frozen=True, slots=True)
class CatalogSettings:
    """pyiceberg catalog properties (shipped to executors for the file IO)."""

    properties: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.properties.get('type', 'rest')} catalog " \
               f"{self.properties.get('uri', self.properties.get('warehouse', ''))}".strip()


def catalog_settings(pairs: Iterable[str], warehouse: str | None) -> CatalogSettings:
    """``key=value`` pairs and ``@file`` (JSON object or key=value lines) over the defaults:
    a SQL catalog on SQLite at ``<warehouse>/catalog.db`` for a local warehouse, fsspec IO."""
    given: dict[str, str] = {}
    for item in pairs:
        given.update(_pairs_file(item[1:]) if item.startswith("@") else dict([_pair(item)]))
    props = {"py-io-impl": FSSPEC_IO, **given}
    if warehouse:
        props.setdefault("warehouse", _warehouse_url(warehouse))
    props.setdefault("type", "sql")
    if props["type"] == "sql" and "uri" not in props:
        where = props.get("warehouse", "")
        if not where.startswith("file://"):
            raise ArchiveCatalogError(
                "--catalog: a SQL catalog needs uri=sqlite:////path/catalog.db (or another "
                f"database) when the warehouse is not a local path (got {where or 'none'!r})")
        root = Path(urlparse(where).path)
        root.mkdir(parents=True, exist_ok=True)
        props["uri"] = f"sqlite:///{root / 'catalog.db'}"
    return CatalogSettings(props)


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ArchiveCatalogError(f"--catalog: expected key=value or @file, got {item!r}")
    return key.strip(), value.strip()


def _pairs_file(path: str) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ArchiveCatalogError(f"--catalog: cannot read {path}: {e.strerror}") from None
    if text.lstrip().startswith("{"):
        return {str(k): str(v) for k, v in json.loads(text).items()}
    return dict(_pair(line) for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("#"))


def _warehouse_url(warehouse: str) -> str:
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return f"file://{Path(warehouse).expanduser().resolve()}"


def open_catalog(settings: CatalogSettings) -> Catalog:
    try:
        return load_catalog(CATALOG_NAME, **dict(settings.properties))
    except Exception as e:  # pyiceberg raises ValueError, ImportError, SQLAlchemy errors...
        raise ArchiveCatalogError(f"--catalog: cannot load the {settings.describe()}: "
                                  f"{type(e).__name__}: {e}") from None


def file_io(settings: CatalogSettings, location: str) -> FileIO:
    return load_file_io(dict(settings.properties), location)


def check_warehouse(settings: CatalogSettings) -> None:
    """Fail early, naming the warehouse, when it cannot be listed (before any commit)."""
    where = settings.properties.get("warehouse")
    if not where:
        return
    try:
        fs, path = filesystem(settings, where)
        fs.makedirs(path, exist_ok=True)
        # an object store has no empty directories: list the bucket then
        fs.ls(path if fs.isdir(path) else path.split("/", 1)[0])
    except Exception as e:  # botocore, OSError, aiohttp... all mean the same here
        raise ArchiveCatalogError(f"--warehouse {where}: cannot reach it "
                                  f"({type(e).__name__}: {e})") from None


def filesystem(settings: CatalogSettings, url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path) for ``url``, from the catalog's fsspec file IO."""
    io = file_io(settings, url)
    get_fs = getattr(io, "get_fs", None)
    if get_fs is None:
        raise ArchiveCatalogError(f"--catalog: py-io-impl must be {FSSPEC_IO} (the archive lists "
                                  f"and writes files through fsspec), got {type(io).__name__}")
    scheme = urlparse(url).scheme or "file"
    fs = get_fs(scheme)
    return fs, fs._strip_protocol(url)


# -- tables ------------------------------------------------------------------------------------


def partition_spec(schema: Schema, partition_by: str) -> PartitionSpec:
    if partition_by == "none":
        return UNPARTITIONED_PARTITION_SPEC
    if partition_by == "date":
        return PartitionSpec(PartitionField(schema.find_field("timestamp").field_id, 1000,
                                            DayTransform(), "timestamp_day"))
    return PartitionSpec(
        PartitionField(schema.find_field("topic").field_id, 1000, IdentityTransform(), "topic"),
        PartitionField(schema.find_field("partition").field_id, 1001, IdentityTransform(),
                       "partition"))


def spec_kind(table: Table) -> str:
    """Which ``--partition-by`` made ``table``'s spec."""
    names = [f.name for f in table.spec().fields]
    return {(): "none", ("timestamp_day",): "date", ("topic", "partition"): "partition"}.get(
        tuple(names), "other")


def open_table(catalog: Catalog, name: str, arrow: pa.Schema, partition_by: str,
               topics: list[str], create: bool = True) -> Table:
    """The archive table ``name`` (namespace.table), created for ``arrow``'s columns when
    missing; an existing one must fit the topics and the partitioning asked for."""
    namespace, _, table_name = name.rpartition(".")
    if not namespace or not table_name:
        raise ArchiveCatalogError(f"--table must be namespace.name, got {name!r}")
    wanted = iceberg_schema(arrow)
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        if not create:
            raise ArchiveCatalogError(f"archive table {name!r} does not exist in the "
                                      f"catalog") from None
        catalog.create_namespace_if_not_exists(namespace)
        log.info("creating archive table %s (partitioned by %s)", name, partition_by)
        return catalog.create_table(name, schema=wanted,
                                    partition_spec=partition_spec(wanted, partition_by))
    check_table_schema(table.schema(), wanted, name, topics)
    have = spec_kind(table)
    if have != partition_by:
        raise ArchiveSchemaError(f"table {name!r} is partitioned by {have!r}, not "
                                 f"{partition_by!r}: pass --partition-by {have}")
    return table


def take_ownership(table: Table, run_id: str, carried: Iterable[str]) -> Table:
    """Make ``run_id`` the run archiving into ``table`` (one run per table at a time).

    One commit sets the owner property *and* moves the main branch to a new snapshot with no
    new files (its summary carries the current snapshot's ``carried`` keys, the coverage, and
    names the run). Every commit of an older run asserts the main snapshot it planned from,
    so once this returns no older run can commit again: its next commit fails, whatever it
    wrote becomes an orphan, and the new run may delete orphans safely afterwards."""
    keep = set(carried)
    for _ in range(OWNERSHIP_ATTEMPTS):
        table = table.refresh()
        base = table.current_snapshot()
        properties = {k: v for k, v in summary(table).items() if k in keep}
        properties[OWNER_SUMMARY] = run_id
        tx = _without_retries(table).transaction()
        tx.set_properties({OWNER_PROPERTY: run_id})
        _assert_main(tx, None if base is None else base.snapshot_id)
        with tx.update_snapshot(snapshot_properties=properties).fast_append():
            pass  # no files: the snapshot exists to move main
        try:
            return tx.commit_transaction()
        except CommitFailedException:
            log.info("table %s changed while run %s took it over; trying again", table.name(),
                     run_id)
    raise ArchiveConflictError(f"table {_name(table)}: run {run_id} could not take it over "
                               f"({OWNERSHIP_ATTEMPTS} attempts, other commits kept landing)")


def check_owner(table: Table, run_id: str) -> None:
    """Raise ``ArchiveOwnerError`` unless ``run_id`` owns ``table`` (as last loaded)."""
    now = owner(table)
    if now != run_id:
        raise ArchiveOwnerError(f"table {_name(table)} is now archived by run {now}; this run "
                                f"({run_id}) stops without committing (one archive run per "
                                f"table at a time)")


def _name(table: Table) -> str:
    return repr(".".join(table.name()))


def _assert_main(tx: Any, snapshot_id: int | None) -> None:
    """Make ``tx`` apply only if main is still ``snapshot_id`` (None: main does not exist)."""
    condition = AssertRefSnapshotId.model_validate({"ref": "main", "snapshot-id": snapshot_id})
    tx._apply((), (condition,))  # pyiceberg's own appends assert only what they loaded


def _without_retries(table: Table) -> Table:
    """``table`` whose commits never retry. pyiceberg retries a failed snapshot commit by
    re-basing it on the new main and dropping every main-branch assertion (table property
    ``commit.retry.num-retries``, default 4), which would let a stale run's files land on top
    of another run's commit. The override lives only in this copy, never in the catalog."""
    metadata = table.metadata.model_copy(update={"properties": {
        **table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog,
                 table.config)


def owner(table: Table) -> str | None:
    return table.properties.get(OWNER_PROPERTY)


def summary(table: Table) -> dict[str, str]:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return {}
    return dict(snapshot.summary.additional_properties)


# -- data files --------------------------------------------------------------------------------


def data_file(metadata: TableMetadata, path: str, parquet: pq.FileMetaData, size: int
              ) -> DataFile:
    """The Iceberg entry of a Parquet file written with the table's field ids (executor side:
    statistics from the writer's footer, no second read of the file)."""
    schema = metadata.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema))
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
        partition=stats.partition(metadata.spec(), schema), file_size_in_bytes=size,
        sort_order_id=None, spec_id=metadata.default_spec_id, equality_ids=None,
        key_metadata=None, **stats.to_serialized_dict())


def commit_files(table: Table, files: list[DataFile], properties: dict[str, str],
                 expected_snapshot_id: int | None, run_id: str) -> Table:
    """Append ``files`` as one snapshot whose summary carries ``properties``, only if the
    table's current snapshot is still ``expected_snapshot_id``: the catalog applies it
    atomically (compare-and-swap of the metadata location) or not at all, never re-based.
    When it does not apply because another run took the table over (``take_ownership``),
    ``ArchiveOwnerError`` names that run."""
    tx = _without_retries(table).transaction()
    _assert_main(tx, expected_snapshot_id)
    with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for f in files:
            append.append_data_file(f)
    try:
        return tx.commit_transaction()
    except CommitFailedException as e:
        failure = str(e)
    check_owner(table.refresh(), run_id)
    raise ArchiveConflictError(f"table {_name(table)}: another commit landed since run {run_id} "
                               f"planned ({failure}); nothing of this run was committed")


def referenced_files(table: Table) -> set[str]:
    """Every data file any snapshot of ``table`` references (read from the manifests:
    ``inspect.all_files`` fails on a table whose snapshots have none, as when a run took an
    empty table over)."""
    paths: set[str] = set()
    seen: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            paths.update(entry.data_file.file_path for entry in
                         manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    return paths


def stored_files(settings: CatalogSettings, location: str) -> list[str]:
    """Every file under ``<location>/data`` (full URLs)."""
    fs, root = filesystem(settings, f"{location}/data")
    if not fs.exists(root):
        return []
    scheme = urlparse(location).scheme
    prefix = f"{scheme}://" if scheme else ""
    return [f"{prefix}{p}" for p in fs.find(root)]


def delete_file(settings: CatalogSettings, url: str) -> None:
    fs, path = filesystem(settings, url)
    fs.rm(path)


class ArchivedFile(NamedTuple):
    """A data file of the archive table, as a scan planned it."""

    path: str
    size_bytes: int


def files_for_range(table: Table, topic: str, partition: int, start: int, end: int,
                    timestamp_min_us: int | None = None) -> list[ArchivedFile]:
    """The data files that may hold offsets [start, end) of ``topic``-``partition`` (pruned
    by the partition spec and the files' column bounds), by path."""
    condition = _range_condition(topic, partition, start, end, timestamp_min_us)
    return sorted(ArchivedFile(t.file.file_path, t.file.file_size_in_bytes)
                  for t in table.scan(row_filter=condition).plan_files())


class ArchivedRange(NamedTuple):
    """Offsets [start, end) of one topic partition, to be read from the archive."""

    topic: str
    partition: int
    start: int
    end: int


def files_for_ranges(table: Table, ranges: Sequence[ArchivedRange]) -> list[list[ArchivedFile]]:
    """Per range, the data files that may hold it (those ``files_for_range`` gives, or more
    where a file has no bounds), from one scan of the manifests: the files any range may
    need, each file's topic, partition and offset bounds decoded once, then compared with
    each range (a pyiceberg plan per range read every manifest again, 4 ms each)."""
    if not ranges:
        return []
    conditions = [_range_condition(*r) for r in ranges]
    anywhere = conditions[0] if len(conditions) == 1 else Or(*conditions)
    schema = table.schema()
    files = sorted((_FileBounds.of(t.file, schema)
                    for t in table.scan(row_filter=anywhere).plan_files()),
                   key=lambda f: f.file.path)
    return [[f.file for f in files if f.may_hold(r)] for r in ranges]


class _FileBounds(NamedTuple):
    """A data file with the lower and upper bounds of its routing columns (None: unknown)."""

    file: ArchivedFile
    lower: tuple[Any, Any, Any]  # topic, partition, offset
    upper: tuple[Any, Any, Any]

    @classmethod
    def of(cls, data_file: DataFile, schema: Schema) -> _FileBounds:
        fields = [schema.find_field(name) for name in ("topic", "partition", "offset")]

        def bounds(found: dict[int, bytes] | None) -> tuple[Any, Any, Any]:
            got = [from_bytes(f.field_type, found[f.field_id])
                   if found and f.field_id in found and isinstance(f.field_type, PrimitiveType)
                   else None for f in fields]
            return got[0], got[1], got[2]

        return cls(ArchivedFile(data_file.file_path, data_file.file_size_in_bytes),
                   bounds(data_file.lower_bounds), bounds(data_file.upper_bounds))

    def may_hold(self, r: ArchivedRange) -> bool:
        """Whether the bounds allow a row of ``r`` (a truncated string bound is still a
        bound: Iceberg truncates a lower bound down and an upper bound up)."""
        (topic_lo, partition_lo, offset_lo), (topic_hi, partition_hi, offset_hi) = \
            self.lower, self.upper
        return ((topic_lo is None or topic_lo <= r.topic)
                and (topic_hi is None or r.topic <= topic_hi)
                and (partition_lo is None or partition_lo <= r.partition)
                and (partition_hi is None or r.partition <= partition_hi)
                and (offset_lo is None or offset_lo < r.end)
                and (offset_hi is None or offset_hi >= r.start))


def _range_condition(topic: str, partition: int, start: int, end: int,
                     timestamp_min_us: int | None = None) -> BooleanExpression:
    parts = [_predicate(EqualTo, "topic", topic), _predicate(EqualTo, "partition", partition),
             _predicate(GreaterThanOrEqual, "offset", start),
             _predicate(LessThan, "offset", end)]
    if timestamp_min_us is not None:
        parts.append(_predicate(GreaterThanOrEqual, "timestamp", timestamp_min_us))
    condition: BooleanExpression = And(*parts)
    return condition


def _predicate(kind: Any, column: str, value: Any) -> BooleanExpression:
    """``kind(column, value)`` (pyiceberg's predicates take a column name and a literal; their
    pydantic signatures say otherwise to mypy)."""
    predicate: BooleanExpression = kind(column, value)
    return predicate
