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

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from logstore.client.batches import RecordChunk
from logstore.client.metadata import TopicInfo
from logstore.errors import InvalidRecordError
from logstore.records import HEADERS_TYPE, TIMESTAMP_TYPE, null_column


class ChunkArrays(NamedTuple):
    batch: pa.RecordBatch  # the topic's schema
    timestamps: np.ndarray  # int64 ms, per record
    partitions: np.ndarray | None  # int32, -1 where the caller named none; None: nowhere


def chunk_arrays(chunk: RecordChunk, info: TopicInfo, now_ms: int) -> ChunkArrays:
    """The chunk's records as one batch of ``info.schema``; InvalidRecordError names the
    topic when a value does not fit its schema or a named partition does not exist."""
    n = len(chunk.values)
    keys = chunk.keys
    columns: dict[str, pa.Array] = {
        "key": pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary())}
    columns.update(_value_columns(chunk.values, info))
    timestamps = np.full(n, now_ms, dtype=np.int64)
    partitions, headers = _extras(chunk, timestamps, info)
    # Over the numpy buffer, no copy (a cast is a compute kernel call: tens of microseconds
    # a chunk, which the latency of a few records at a time pays in full).
    columns["timestamp"] = pa.Array.from_buffers(TIMESTAMP_TYPE, n,
                                                 [None, pa.py_buffer(timestamps)])
    columns["headers"] = headers
    batch = pa.RecordBatch.from_arrays([columns[name] for name in info.schema.names],
                                       schema=info.schema)
    return ChunkArrays(batch, timestamps, partitions)


def _value_columns(values: list[Any], info: TopicInfo) -> dict[str, pa.Array]:
    if info.value_schema is None:
        return {"value": pa.array(values, pa.binary())}
    struct = pa.array(values, pa.struct(list(info.value_schema)))
    return {name: struct.field(name) for name in info.value_schema.names}


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
