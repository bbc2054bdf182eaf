"""The DataFrame shape of a topic, and turning stored Arrow batches into it.

Owns: the output schema (Spark's Kafka source columns; a typed topic's value columns in place
of ``value``), checking a user-given schema against it, and the executor-side conversion of one
stored batch into exactly the Arrow schema Spark expects. Must not: do I/O.

Untyped topic, as Spark's Kafka source::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key string, value binary>>]

Typed topic (created with a value schema ``a int64, b string``)::

    key binary, a bigint, b string, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers ...]

Spark does not push column pruning down to Python sources, so ``.schema("a bigint, offset
long")`` is how a reader asks for fewer columns: only those are decoded and sent to the JVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa

from logstore.errors import LogstoreError
from logstore.model import CREATE_TIME, LOG_APPEND_TIME
from logstore.records import RESERVED_COLUMNS, topic_schema

# Columns computed from the batch rather than stored in it.
META_COLUMNS = ("topic", "partition", "offset", "timestampType")
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


class SchemaError(LogstoreError, ValueError):
    """A requested column the topic does not have, or with the wrong type."""


def source_arrow_schema(value_schema: pa.Schema | None, include_headers: bool) -> pa.Schema:
    """The full output schema as Arrow, in Spark's column order (every field nullable). Value
    columns never clash with the added ones: ``topic_schema`` reserves those names."""
    stored = topic_schema(value_schema)
    values = [f.with_nullable(True) for f in stored if f.name not in RESERVED_COLUMNS]
    fields = [pa.field("key", pa.binary()), *values,
              pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
              pa.field("offset", pa.int64()), pa.field("timestamp", TIMESTAMP_TYPE),
              pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(stored.field("headers").with_nullable(True))
    return pa.schema(fields)


def check_requested(requested: pa.Schema, available: pa.Schema, topics: list[str]) -> None:
    """A user-given schema may name a subset of the columns, in any order, with their types."""
    for f in requested:
        i = available.get_field_index(f.name)
        if i < 0:
            raise SchemaError(f"column {f.name!r} is not in topic(s) {topics}; their columns "
                              f"are {available.names} (headers need includeHeaders=true)")
        have = available.field(i).type
        if not f.type.equals(have) and not _castable(have, f.type):
            raise SchemaError(f"column {f.name!r} of topic(s) {topics} is {have}, but the "
                              f"schema asks for {f.type}; read it as {have} and cast in Spark")


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Widening the timestamp unit, nested fields made nullable (a DDL schema's
    ``struct<x: int>`` for a non-null ``x``) and similar lossless casts Arrow does for us."""
    return bool((pa.types.is_timestamp(src) and pa.types.is_timestamp(dst))
                or dst.equals(_nullable_inside(src)))


def _nullable_inside(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field (struct fields, list items, map values) nullable."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable_inside(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(_nullable_inside(t.value_type))
    if pa.types.is_large_list(t):
        return pa.large_list(_nullable_inside(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _nullable_inside(t.item_type))
    return t


@dataclass(frozen=True)
class BatchConverter:
    """Stored batches of one partition -> record batches of ``target`` (executor side)."""

    target: pa.Schema
    topic: str
    partition: int

    def convert(self, batch: pa.RecordBatch, offsets: np.ndarray, log_append_time: bool,
                start: int, end: int) -> pa.RecordBatch | None:
        """The rows of ``batch`` whose offsets are in [start, end), in ``target``'s shape;
        None when there are none."""
        batch, offsets = _slice(batch, offsets, start, end)
        n = batch.num_rows
        if n == 0:
            return None
        columns = [self._column(f, batch, offsets, log_append_time, n) for f in self.target]
        return pa.RecordBatch.from_arrays(columns, schema=self.target)

    def _column(self, f: pa.Field, batch: pa.RecordBatch, offsets: np.ndarray,
                log_append_time: bool, n: int) -> pa.Array:
        if f.name == "topic":
            return constant_string(self.topic, n)
        if f.name == "partition":
            return pa.array(np.full(n, self.partition, dtype=np.int32))
        if f.name == "offset":
            return pa.array(offsets, type=pa.int64())
        if f.name == "timestampType":
            return pa.array(np.full(n, LOG_APPEND_TIME if log_append_time else CREATE_TIME,
                                    dtype=np.int32))
        column = batch.column(f.name)
        return column if column.type.equals(f.type) else column.cast(f.type)


def _slice(batch: pa.RecordBatch, offsets: np.ndarray, start: int, end: int
           ) -> tuple[pa.RecordBatch, np.ndarray]:
    if offsets[0] >= start and offsets[-1] < end:
        return batch, offsets
    lo = int(np.searchsorted(offsets, start, side="left"))
    hi = int(np.searchsorted(offsets, end, side="left"))
    return batch.slice(lo, hi - lo), offsets[lo:hi]


def constant_string(value: str, n: int) -> pa.Array:
    """A string column of ``n`` copies of ``value``, built from two buffers (no per-row work)."""
    return _constant_string(value, n)


@lru_cache(maxsize=64)
def _constant_string(value: str, n: int) -> pa.Array:
    data = value.encode()
    offsets = np.arange(0, (n + 1) * len(data), len(data) or 1, dtype=np.int32)[: n + 1]
    if not data:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(data * n))
