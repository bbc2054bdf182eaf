"""Arrow types of a topic's records -> Iceberg types of its archive table, and back.

Owns: the type mapping below, the Arrow shape of the Parquet files the archive writes (with
each column's Iceberg field id), the casts to and from it, and the check that an existing table
has the columns a topic needs. Must not: do I/O or know about catalogs (``iceberg.py``).

An archive table holds the columns of ``spark.read.format("logstore")`` with
``includeHeaders=true``: ``key``, the value (``value`` binary, or a typed topic's columns),
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``. So a history
read needs no renaming, and records of several topics (``--topic-pattern``) stay apart.

| Arrow (topic column)                          | Iceberg           | Parquet file (Arrow)   |
|-----------------------------------------------|-------------------|------------------------|
| int8, int16, int32, uint8, uint16             | int               | int32                  |
| int64, uint32                                 | long              | int64                  |
| uint64                                        | decimal(20, 0)    | decimal128(20, 0)      |
| float16, float32                              | float             | float32                |
| float64                                       | double            | float64                |
| bool                                          | boolean           | bool                   |
| string, large_string                          | string            | string                 |
| binary, large_binary                          | binary            | binary                 |
| fixed_size_binary(n)                          | fixed(n)          | fixed_size_binary(n)   |
| date32                                        | date              | date32                 |
| timestamp[s, ms, us] (no zone)                | timestamp         | timestamp[us]          |
| timestamp[s, ms, us, zone]                    | timestamptz       | timestamp[us, UTC]     |
| timestamp[ns] and timestamp[ns, zone]         | long (ns since the epoch, UTC) | int64     |
| decimal128(P, S)                              | decimal(P, S)     | decimal128(P, S)       |
| list<T>, large_list<T>                        | list<T>           | list<T>                |
| struct<name: T, ...>                          | struct<...>       | struct<...>            |
| map<K, V>                                     | map<K, V>         | map<K, V>              |

Why: Iceberg has no unsigned integers (uint32 fits a long; uint64 needs 20 digits) and, before
format version 3 (which pyiceberg cannot write yet), no nanosecond timestamps, so those are kept
exactly as a long rather than truncated to microseconds. Zoned timestamps are instants: Iceberg
stores them in UTC and the zone comes back from the topic's schema on a history read. Every
mapping is lossless; any other Arrow type is refused, naming the column.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from logstore.errors import LogstoreError

FIELD_ID_KEY = b"PARQUET:field_id"
UINT64_DECIMAL = pa.decimal128(20, 0)


class ArchiveSchemaError(LogstoreError, ValueError):
    """A topic column with no Iceberg type, or a table whose columns do not fit the topic."""


def iceberg_schema(arrow: pa.Schema) -> Schema:
    """The Iceberg schema of an archive table whose rows have ``arrow``'s columns (top-level
    columns take ids 1..n, nested fields the ids after them)."""
    ids = itertools.count(len(arrow) + 1)
    return Schema(*(NestedField(i, f.name, iceberg_type(f.type, f.name, ids), required=False)
                    for i, f in enumerate(arrow, start=1)))


def iceberg_type(t: pa.DataType, column: str, ids: Iterator[int]) -> IcebergType:
    """The Iceberg type of Arrow type ``t`` (nested fields take ids from ``ids``)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ListType(next(ids), iceberg_type(t.value_type, f"{column}[]", ids),
                        element_required=False)
    if pa.types.is_map(t):
        key_id, value_id = next(ids), next(ids)
        return MapType(key_id, iceberg_type(t.key_type, f"{column}.key", ids), value_id,
                       iceberg_type(t.item_type, f"{column}.value", ids), value_required=False)
    if pa.types.is_struct(t):
        children = [t.field(i) for i in range(t.num_fields)]
        numbered = [(next(ids), f) for f in children]
        return StructType(*(NestedField(i, f.name, iceberg_type(f.type, f"{column}.{f.name}", ids),
                                        required=False) for i, f in numbered))
    return _primitive(t, column)


def _primitive(t: pa.DataType, column: str) -> IcebergType:
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            return LongType()
        return TimestamptzType() if t.tz else TimestampType()
    if pa.types.is_decimal128(t):
        return DecimalType(t.precision, t.scale)
    if pa.types.is_fixed_size_binary(t):
        return FixedType(t.byte_width)
    for test, iceberg in _PRIMITIVES:
        if test(t):
            return iceberg
    raise ArchiveSchemaError(f"column {column!r} has Arrow type {t}, which has no Iceberg type "
                             "(see the mapping in datasource/iceberg_types.py)")


_PRIMITIVES: tuple[tuple[Callable[[pa.DataType], bool], IcebergType], ...] = (
    (lambda t: t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()), IntegerType()),
    (lambda t: t in (pa.int64(), pa.uint32()), LongType()),
    (lambda t: t == pa.uint64(), DecimalType(20, 0)),
    (lambda t: t in (pa.float16(), pa.float32()), FloatType()),
    (lambda t: t == pa.float64(), DoubleType()),
    (pa.types.is_boolean, BooleanType()),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), StringType()),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), BinaryType()),
    (pa.types.is_date32, DateType()),
)


# -- the Arrow shape of the Parquet files ------------------------------------------------------


def stored_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type a column of type ``t`` is written to Parquet as (the table above)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field("element", stored_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(stored_type(t.key_type), stored_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, stored_type(f.type))
                          for f in (t.field(i) for i in range(t.num_fields))])
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            return pa.int64()
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    iceberg = _primitive(t, "?")
    stored: dict[type, pa.DataType] = {
        IntegerType: pa.int32(), LongType: pa.int64(), FloatType: pa.float32(),
        DoubleType: pa.float64(), BooleanType: pa.bool_(), StringType: pa.string(),
        BinaryType: pa.binary(), DateType: pa.date32()}
    return stored.get(type(iceberg), UINT64_DECIMAL if t == pa.uint64() else t)


def stored_schema(arrow: pa.Schema, table: Schema) -> pa.Schema:
    """``arrow``'s columns as written to Parquet, each carrying its field id in ``table``."""
    fields = []
    for f in arrow:
        column = table.find_field(f.name)
        fields.append(_with_ids(pa.field(f.name, stored_type(f.type)), column.field_id,
                                column.field_type))
    return pa.schema(fields)


def _with_ids(f: pa.Field, field_id: int, iceberg: IcebergType) -> pa.Field:
    t = f.type
    if isinstance(iceberg, ListType):
        t = pa.list_(_with_ids(t.value_field, iceberg.element_id, iceberg.element_type))
    elif isinstance(iceberg, MapType):
        t = pa.map_(_with_ids(t.key_field, iceberg.key_id, iceberg.key_type),
                    _with_ids(t.item_field, iceberg.value_id, iceberg.value_type))
    elif isinstance(iceberg, StructType):
        t = pa.struct([_with_ids(t.field(i), child.field_id, child.field_type)
                       for i, child in enumerate(iceberg.fields)])
    return pa.field(f.name, t, f.nullable, {FIELD_ID_KEY: str(field_id).encode()})


def to_stored(batch: pa.RecordBatch, stored: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to the Parquet shape ``stored`` (``stored_schema``)."""
    columns = [_cast(batch.column(i), f.type) for i, f in enumerate(stored)]
    return pa.RecordBatch.from_arrays(columns, schema=stored)


def from_stored(column: pa.Array | pa.ChunkedArray, target: pa.DataType
                ) -> pa.Array | pa.ChunkedArray:
    """A column read from an archive file, cast back to the topic's (or Spark's) type."""
    if pa.types.is_timestamp(target) and pa.types.is_integer(column.type):
        column = column.cast(pa.timestamp("ns", tz=target.tz))  # nanoseconds, kept as a long
    return _cast(column, target)


def _cast(column: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if column.type.equals(target):
        return column
    if pa.types.is_timestamp(column.type) and pa.types.is_integer(target):
        return column.cast(pa.timestamp("ns", tz=column.type.tz)).cast(pa.int64())
    return column.cast(target, safe=not pa.types.is_timestamp(target))


# -- checking a table against a topic ----------------------------------------------------------


def shape(t: IcebergType) -> object:
    """``t`` without field ids, for comparing schemas made apart."""
    if isinstance(t, ListType):
        return ("list", shape(t.element_type))
    if isinstance(t, MapType):
        return ("map", shape(t.key_type), shape(t.value_type))
    if isinstance(t, StructType):
        return ("struct", tuple((f.name, shape(f.field_type)) for f in t.fields))
    return str(t)


def check_table_schema(table: Schema, wanted: Schema, table_name: str, topics: list[str]) -> None:
    """The table must have exactly the columns, and types, the topics' records need."""
    have = {f.name: f for f in table.fields}
    need = {f.name: f for f in wanted.fields}
    missing = sorted(set(need) - set(have))
    extra = sorted(set(have) - set(need))
    differ = sorted(n for n in set(need) & set(have)
                    if shape(need[n].field_type) != shape(have[n].field_type))
    if missing or extra or differ:
        detail = "; ".join(part for part in (
            f"missing columns {missing}" if missing else "",
            f"columns the topics do not have {extra}" if extra else "",
            ", ".join(f"column {n!r} is {have[n].field_type} in the table but "
                      f"{need[n].field_type} for the topics" for n in differ)) if part)
        raise ArchiveSchemaError(f"table {table_name!r} does not match topic(s) {topics}: "
                                 f"{detail}; archive them into another --table")
