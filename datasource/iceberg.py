"""The archive's side of pyiceberg: catalogs, archive tables, data files and conditional commits.

Owns: catalog properties (``key=value`` pairs or a file; by default a SQL catalog on SQLite in
a local warehouse), opening or creating an archive table and checking it against the topics,
the file IO (fsspec, so ``s3://`` works without a Spark S3 connector), turning a written
Parquet file into an Iceberg ``DataFile`` (on executors), the one commit that appends a run's
files together with its offsets only if the table did not change since the run planned, and
listing the files the table references or holds. Must not: read topics, or import pyspark.

pyiceberg is reached only here and in ``iceberg_types.py`` (its types).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThan,
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
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AssertRefSnapshotId
from pyiceberg.transforms import DayTransform, IdentityTransform

from datasource.iceberg_types import ArchiveSchemaError, check_table_schema, iceberg_schema
from logstore.errors import LogstoreError

log = logging.getLogger(__name__)

FSSPEC_IO = "pyiceberg.io.fsspec.FsspecFileIO"
PARTITION_BY = ("date", "partition", "none")
OWNER_PROPERTY = "logstore.archive.owner"
CATALOG_NAME = "logstore"


class ArchiveCatalogError(LogstoreError, ValueError):
    """A catalog, warehouse or table that cannot be used; the message names it."""


class ArchiveConflictError(LogstoreError, RuntimeError):
    """The table changed between planning and commit (another run committed)."""


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


def take_ownership(table: Table, run_id: str) -> Table:
    """Mark ``run_id`` as the run archiving into ``table``; an older run still going sees it
    before its next commit and stops (one archive run per table at a time)."""
    with table.transaction() as tx:
        tx.set_properties({OWNER_PROPERTY: run_id})
    return table.refresh()


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
                 expected_snapshot_id: int | None) -> Table:
    """Append ``files`` as one snapshot whose summary carries ``properties``, only if the
    table's current snapshot is still ``expected_snapshot_id``: the catalog applies it
    atomically (compare-and-swap of the metadata location) or not at all."""
    tx = table.transaction()
    condition = AssertRefSnapshotId.model_validate(
        {"ref": "main", "snapshot-id": expected_snapshot_id})
    tx._apply((), (condition,))  # pyiceberg's own appends assert nothing about the base
    with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for f in files:
            append.append_data_file(f)
    try:
        return tx.commit_transaction()
    except CommitFailedException as e:
        raise ArchiveConflictError(f"table {table.name()}: another commit landed since this run "
                                   f"planned ({e}); nothing of this run was committed") from None


def referenced_files(table: Table) -> set[str]:
    """Every data file any snapshot of ``table`` references."""
    if table.current_snapshot() is None:
        return set()
    return set(table.inspect.all_files().column("file_path").to_pylist())


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


def files_for_range(table: Table, topic: str, partition: int, start: int, end: int,
                    timestamp_min_us: int | None = None) -> list[str]:
    """The data files that may hold offsets [start, end) of ``topic``-``partition`` (pruned
    by the partition spec and the files' column bounds)."""
    parts = [_predicate(EqualTo, "topic", topic), _predicate(EqualTo, "partition", partition),
             _predicate(GreaterThanOrEqual, "offset", start),
             _predicate(LessThan, "offset", end)]
    if timestamp_min_us is not None:
        parts.append(_predicate(GreaterThanOrEqual, "timestamp", timestamp_min_us))
    condition: BooleanExpression = And(*parts)
    return sorted(t.file.file_path for t in table.scan(row_filter=condition).plan_files())


def _predicate(kind: Any, column: str, value: Any) -> BooleanExpression:
    """``kind(column, value)`` (pyiceberg's predicates take a column name and a literal; their
    pydantic signatures say otherwise to mypy)."""
    predicate: BooleanExpression = kind(column, value)
    return predicate
