"""Preparing batches for the log: checking a producer batch against the topic, stamping its
timestamps, choosing the IPC write options, and checking a replicated batch.

Owns: the per-batch rules of an append (schema match, non-empty, keys on compacted topics,
timestamps, LogAppendTime), all vectorised with pyarrow.compute. Must not: touch files or the
log's state.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from logstore.config import TopicConfig
from logstore.errors import InvalidRecordError
from logstore.records import FLAG_LOG_APPEND_TIME, BatchHeader, StoredBatch, decode_message


def write_options(config: TopicConfig) -> ipc.IpcWriteOptions | None:
    """IPC options for the topic's compression_type (None: uncompressed)."""
    if config.compression_type in ("lz4", "zstd"):
        return ipc.IpcWriteOptions(compression=config.compression_type)
    return None


def validate_batch(tp: str, batch: pa.RecordBatch, schema: pa.Schema,
                   config: TopicConfig) -> None:
    """Raise InvalidRecordError naming ``tp`` when ``batch`` cannot be appended."""
    if not isinstance(batch, pa.RecordBatch):
        raise InvalidRecordError(f"{tp}: expected a pyarrow.RecordBatch, got "
                                 f"{type(batch).__name__}")
    if batch.num_rows == 0:
        raise InvalidRecordError(f"{tp}: empty batch")
    if not batch.schema.equals(schema):
        check_same_columns(tp, batch.schema, schema)
    if config.compact and "key" in schema.names:
        nulls = batch.column("key").null_count
        if nulls:
            raise InvalidRecordError(f"{tp}: compacted topic: records must have a key "
                                     f"({nulls} null key(s))")


def check_same_columns(tp: str, got: pa.Schema, expected: pa.Schema) -> None:
    """Raise InvalidRecordError naming the first column whose name or type differs (nullability
    and metadata may differ: they do not change the encoded data)."""
    for i in range(max(len(got), len(expected))):
        if i >= len(got) or i >= len(expected):
            name = expected.field(i).name if i < len(expected) else got.field(i).name
            raise InvalidRecordError(f"{tp}: batch schema differs from the topic schema at "
                                     f"column {i} {name!r}: column count {len(got)} != "
                                     f"{len(expected)}")
        a, b = got.field(i), expected.field(i)
        if a.name != b.name or not a.type.equals(b.type):
            raise InvalidRecordError(f"{tp}: batch schema differs from the topic schema at "
                                     f"column {i}: got {a.name!r} {a.type}, expected "
                                     f"{b.name!r} {b.type}")


def stamp_timestamps(batch: pa.RecordBatch, now: int, config: TopicConfig,
                     flags: int) -> tuple[pa.RecordBatch, int, int, int]:
    """Null timestamps (and, under LogAppendTime, all of them) become ``now``. Returns the
    batch, its smallest and largest timestamp, and the flags."""
    i = batch.schema.get_field_index("timestamp")
    if i < 0:
        return batch, now, now, flags
    column = batch.column(i)
    if config.message_timestamp_type == "LogAppendTime":
        column = pa.repeat(pa.scalar(now, type=column.type), len(column))
        return (batch.set_column(i, batch.schema.field(i), column), now, now,
                flags | FLAG_LOG_APPEND_TIME)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(now, type=column.type))
        batch = batch.set_column(i, batch.schema.field(i), column)
    bounds = pc.min_max(column)
    return batch, bounds["min"].value, bounds["max"].value, flags


def follower_bytes(tp: str, batch: StoredBatch) -> tuple[BatchHeader, pa.Buffer]:
    """The CRC-checked header and the exact message bytes of a replicated batch."""
    header = decode_message(batch.message, verify=True).header
    data = batch.message.serialize()
    if data.size != header.batch_size:
        raise InvalidRecordError(f"{tp}: batch at offset {header.base_offset} is {data.size} "
                                 f"bytes but its header says {header.batch_size}")
    return header, data
