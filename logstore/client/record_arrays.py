"""Records gathered one at a time by ``send()``, turned into Arrow in one go.

Owns: building a topic's record batch from a ``RecordChunk`` (its key and value lists, and the
side table of the few records that set a partition, a timestamp or headers), the timestamps
of the records, and the partitions callers named. Must not: do I/O, partition or split
(``partitioner.py``, ``pieces.py``).

Each column is built by one call that loops in C (``pa.array`` over the list, ``np.full`` for
the defaults); Python loops only over the side table, so the common record (a key and a value)
costs the drainer nothing per record beyond Arrow's own copy of the bytes.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.client.batches import RecordChunk
from logstore.client.metadata import TopicInfo
from logstore.errors import InvalidRecordError
from logstore.records import HEADERS_TYPE, TIMESTAMP_TYPE, null_column

# What pa.array raises for a Python value its type cannot hold.
_CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


class ChunkArrays(NamedTuple):
    batch: pa.RecordBatch  # the topic's schema
    timestamps: np.ndarray  # int64 ms, per record
    partitions: np.ndarray | None  # int32, -1 where the caller named none; None: nowhere
    # row -> why its value does not fit the topic's value_schema (its columns are null in
    # ``batch``; the record must not be sent). Empty unless the whole-chunk conversion failed.
    rejected: dict[int, InvalidRecordError]


def chunk_arrays(chunk: RecordChunk, info: TopicInfo, now_ms: int) -> ChunkArrays:
    """The chunk's records as one batch of ``info.schema``, and the records whose value does
    not fit a typed topic's value_schema (``rejected``: they must fail alone, unsent).
    InvalidRecordError names the topic when a named partition does not exist."""
    n = len(chunk.values)
    keys = chunk.keys
    columns: dict[str, pa.Array] = {
        "key": pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary())}
    values, rejected = _value_columns(chunk, info)
    columns.update(values)
    timestamps = np.full(n, now_ms, dtype=np.int64)
    partitions, headers = _extras(chunk, timestamps, info)
    # Over the numpy buffer, no copy (a cast is a compute kernel call: tens of microseconds
    # a chunk, which the latency of a few records at a time pays in full).
    columns["timestamp"] = pa.Array.from_buffers(TIMESTAMP_TYPE, n,
                                                 [None, pa.py_buffer(timestamps)])
    columns["headers"] = headers
    batch = pa.RecordBatch.from_arrays([columns[name] for name in info.schema.names],
                                       schema=info.schema)
    return ChunkArrays(batch, timestamps, partitions, rejected)


def _value_columns(chunk: RecordChunk, info: TopicInfo
                   ) -> tuple[dict[str, pa.Array], dict[int, InvalidRecordError]]:
    """The value column(s), and the records whose value does not fit a typed topic's
    value_schema. ``send()`` checks no dict against the schema (that would cost every record
    a conversion of its own): the whole chunk is converted at once, and only when that fails
    are the misfits looked for, so that they alone fail."""
    values = chunk.values
    if info.value_schema is None:
        return {"value": pa.array(values, pa.binary())}, {}
    struct_type = pa.struct(list(info.value_schema))
    rejected: dict[int, InvalidRecordError] = {}
    try:
        struct = pa.array(values, struct_type)
    except _CONVERSION_ERRORS:
        misfits: list[int] = []
        _find_misfits(values, 0, len(values), struct_type, misfits)
        if not misfits:
            raise  # no single record is at fault: the chunk fails as a whole
        rejected = {row: _misfit_error(chunk.topic, values[row], info.value_schema)
                    for row in misfits}
        struct = pa.array([None if i in rejected else v for i, v in enumerate(values)],
                          struct_type)
    columns = struct.flatten()
    overflows = _float_overflows(chunk.topic, values, info.value_schema, columns)
    if overflows:
        rejected.update(overflows)
        struct = pa.array([None if i in rejected else v for i, v in enumerate(values)],
                          struct_type)
        columns = struct.flatten()
    # flatten(), not field(): a null value (a tombstone) must leave its columns null, and a
    # child array alone does not carry its parent's validity.
    return dict(zip(info.value_schema.names, columns, strict=True)), rejected


def _float_overflows(topic: str, values: list[Any], value_schema: pa.Schema,
                     columns: list[pa.Array]) -> dict[int, InvalidRecordError]:
    """The records whose number became +-Infinity in a float32 (or narrower) column: too
    large for it, which ``pa.array`` does not refuse. One vectorised check per such column;
    the rows are looked at only when one is infinite."""
    out: dict[int, InvalidRecordError] = {}
    for field, column in zip(value_schema, columns, strict=True):
        if not pa.types.is_floating(field.type) or field.type.bit_width >= 64 or \
                not pc.any(pc.is_inf(column)).as_py():
            continue
        for row in np.flatnonzero(pc.fill_null(pc.is_inf(column), False).to_numpy(
                zero_copy_only=False)):
            given = values[row].get(field.name)
            if math.isfinite(float(given)):
                out.setdefault(int(row), InvalidRecordError(
                    f"send to {topic!r}: field {field.name!r} ({field.type}) cannot take "
                    f"{given!r} (record {row} of its batch): too large for {field.type}, it "
                    "would become Infinity"))
    return out


def _find_misfits(values: list[Any], lo: int, hi: int, struct_type: pa.StructType,
                  misfits: list[int]) -> None:
    """Add the rows of ``values[lo:hi]`` that do not convert to ``struct_type`` to
    ``misfits``, by halving: a few misfits in a large chunk cost a few conversions of the
    chunk's size, not one conversion per record."""
    try:
        pa.array(values[lo:hi], struct_type)
        return
    except _CONVERSION_ERRORS:
        if hi - lo == 1:
            misfits.append(lo)
            return
    mid = (lo + hi) // 2
    _find_misfits(values, lo, mid, struct_type, misfits)
    _find_misfits(values, mid, hi, struct_type, misfits)


def _misfit_error(topic: str, value: Any, value_schema: pa.Schema) -> InvalidRecordError:
    """Why a record's value does not fit the value_schema of ``topic``, naming the field at
    fault."""
    where = f"send to {topic!r}"
    if not isinstance(value, dict):
        return InvalidRecordError(
            f"{where}: the topic is typed, so a value must be a dict of its value_schema "
            f"columns {value_schema.names} or None, got {type(value).__name__}")
    for field in value_schema:
        try:
            pa.array([value.get(field.name)], field.type)
        except _CONVERSION_ERRORS as e:
            return InvalidRecordError(
                f"{where}: field {field.name!r} ({field.type}) cannot take "
                f"{value.get(field.name)!r}: {type(e).__name__}: {e}")
    return InvalidRecordError(f"{where}: the value does not fit the value_schema "
                              f"{value_schema}")


def _extras(chunk: RecordChunk, timestamps: np.ndarray, info: TopicInfo
            ) -> tuple[np.ndarray | None, pa.Array]:
    """Apply the side table: timestamps in place; the named partitions and the headers."""
    n = len(timestamps)
    if not chunk.extras:
        return None, null_column(n, HEADERS_TYPE)
    partitions = np.full(n, -1, dtype=np.int32)
    headers: list[Any] | None = None  # built only when a record has headers
    for row, (partition, timestamp_ms, record_headers) in chunk.extras.items():
        if partition is not None:
            partitions[row] = partition
        if timestamp_ms is not None:
            timestamps[row] = timestamp_ms
        if record_headers is not None:
            if headers is None:
                headers = [None] * n
            headers[row] = record_headers
    bad = partitions[partitions >= info.num_partitions]
    if len(bad):
        raise InvalidRecordError(f"topic {chunk.topic!r} has no partition {int(bad[0])} "
                                 f"(it has {info.num_partitions})")
    named = partitions if (partitions >= 0).any() else None
    if headers is None:
        return named, null_column(n, HEADERS_TYPE)
    return named, pa.array(headers, HEADERS_TYPE)
