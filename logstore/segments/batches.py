"""Preparing batches for the log: checking a producer batch against the topic, stamping its
timestamps, choosing the IPC write options, encoding what a leader appends (producer batches and
transaction markers), and checking a replicated batch. A batch the producer sent encoded
(``produced.py``) is stored as it came when its codec is the topic's and stamping changes
nothing; otherwise it is decoded and encoded again like any other.

Owns: the per-batch rules of an append (schema match, non-empty, keys on compacted topics,
timestamps, LogAppendTime, which flags a producer may set), all vectorised with
pyarrow.compute, and reading the marker of a replicated control batch. Must not: touch files or
the log's state.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from logstore.config import TopicConfig
from logstore.errors import CorruptRecordError, InvalidRecordError, MessageTooLargeError
from logstore.produced import DECOMPRESSED_FACTOR, ProducedMessage, max_decompressed_bytes
from logstore.produced import ProducerData as ProducerData  # the log appends these
from logstore.records import (
    FLAG_CONTROL,
    FLAG_LOG_APPEND_TIME,
    FLAG_TRANSACTIONAL,
    NO_SEQUENCE,
    BatchHeader,
    Encoded,
    EncodedBatch,
    EndTxnMarker,
    StoredBatch,
    control_batch,
    control_marker,
    decode_message,
    encode_batch,
)

E = TypeVar("E", memoryview, EncodedBatch)


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
    first, last = _min_max(column)
    return batch, first, last, flags


def _min_max(column: pa.Array) -> tuple[int, int]:
    """The smallest and largest of a timestamp column without nulls, read over its int64
    buffer (a compute call costs a fifth of a small batch's append on the leader)."""
    if not len(column) or column.type.bit_width != 64:
        bounds = pc.min_max(column)
        return bounds["min"].value, bounds["max"].value
    values = np.frombuffer(column.buffers()[1], dtype=np.int64, count=len(column),
                           offset=column.offset * 8)
    return int(values.min()), int(values.max())


def follower_bytes(tp: str, batch: StoredBatch) -> tuple[BatchHeader, pa.Buffer]:
    """The CRC-checked header and the exact message bytes of a replicated batch."""
    header = decode_message(batch.message, verify=True).header
    data = StoredBatch(header, batch.message).message_bytes()  # a view of what was received
    if data.size != header.batch_size:
        raise InvalidRecordError(f"{tp}: batch at offset {header.base_offset} is {data.size} "
                                 f"bytes but its header says {header.batch_size}")
    return header, data


def check_producer_flags(tp: str, flags: int, producer_id: int) -> None:
    """A producer may flag a batch transactional (with a producer id), never control: markers
    come from the transaction coordinator (Log.append_control_marker)."""
    if flags & FLAG_CONTROL:
        raise InvalidRecordError(f"{tp}: producers cannot write control batches; transaction "
                                 "markers come from the transaction coordinator")
    if flags & FLAG_TRANSACTIONAL and producer_id < 0:
        raise InvalidRecordError(f"{tp}: a transactional batch needs a producer id")


def follower_marker(tp: str, batch: StoredBatch, schema: pa.Schema) -> EndTxnMarker | None:
    """The marker of a replicated control batch (None for a data batch)."""
    if not batch.header.is_control:
        return None
    try:
        return control_marker(batch.record_batch(schema))
    except (CorruptRecordError, pa.ArrowException) as e:
        raise CorruptRecordError(f"{tp}: control batch at offset {batch.header.base_offset} "
                                 f"holds no transaction marker: {e}") from e


class LeaderBatches:
    """Encodes what a leader appends under one topic's schema and config, before the log's lock:
    the header's base offset (0 here) and the offsets are the log's to assign."""

    def __init__(self, tp: str, schema: pa.Schema, config: TopicConfig) -> None:
        self._tp = tp
        self._schema = schema
        self._config = config
        self._options = write_options(config)
        self._codec = None if self._options is None else config.compression_type

    def producer_batch(self, batch: pa.RecordBatch | ProducedMessage, now: int,
                       leader_epoch: int, producer_id: int, producer_epoch: int,
                       base_sequence: int, flags: int) -> tuple[Encoded, BatchHeader]:
        """A producer's batch, checked and stamped; of ``flags`` only FLAG_TRANSACTIONAL is
        taken (a control flag is refused). A produced message whose stamping changes nothing
        and whose codec is the topic's is stored as it came (one copy: into the file)."""
        received = batch if isinstance(batch, ProducedMessage) else None
        if received is not None:
            if received.codec is not None:
                self._check_decompressed(received)
            batch = received.record_batch(self._schema, self._tp)
        assert isinstance(batch, pa.RecordBatch)
        validate_batch(self._tp, batch, self._schema, self._config)
        check_producer_flags(self._tp, flags, producer_id)
        stamped, first_ts, max_ts, flags = stamp_timestamps(batch, now, self._config,
                                                            flags & FLAG_TRANSACTIONAL)
        n = batch.num_rows
        header = BatchHeader(0, n - 1, n, first_ts, max_ts, producer_id, producer_epoch,
                             base_sequence, leader_epoch, flags)
        if received is not None and stamped is batch and received.codec == self._codec:
            return self._checked(received.seal(header)), header
        return self._encode(stamped, header), header

    def marker_batch(self, now: int, producer_id: int, producer_epoch: int,
                     marker: EndTxnMarker, leader_epoch: int) -> tuple[memoryview, BatchHeader]:
        """The control batch of a transaction marker (records.py)."""
        batch, first_ts, max_ts, flags = stamp_timestamps(
            control_batch(self._schema, marker, now), now, self._config,
            FLAG_CONTROL | FLAG_TRANSACTIONAL)
        header = BatchHeader(0, 0, 1, first_ts, max_ts, producer_id, producer_epoch,
                             NO_SEQUENCE, leader_epoch, flags)
        return self._encode(batch, header), header

    def _check_decompressed(self, received: ProducedMessage) -> None:
        """MESSAGE_TOO_LARGE, before anything is decompressed, for a compressed batch whose
        body would decompress past what this topic stores (its max_message_bytes when it
        stores batches uncompressed) or past ``max_decompressed_bytes``."""
        limit = self._config.max_message_bytes
        if self._codec is not None:
            limit = max_decompressed_bytes(limit)
        declared = received.decompressed_size(self._tp)
        if declared > limit:
            raise MessageTooLargeError(
                f"{self._tp}: a {received.codec} batch of {received.size} bytes decompresses "
                f"to {declared} bytes, more than {limit} (max_message_bytes "
                f"{self._config.max_message_bytes}"
                f"{f', times {DECOMPRESSED_FACTOR} for a compressed topic' if self._codec else ''})")

    def _encode(self, batch: pa.RecordBatch, header: BatchHeader) -> memoryview:
        return self._checked(encode_batch(batch, header, options=self._options))

    def _checked(self, data: E) -> E:
        if len(data) > self._config.max_message_bytes:
            raise MessageTooLargeError(
                f"{self._tp}: batch of {len(data)} bytes exceeds max_message_bytes "
                f"{self._config.max_message_bytes}")
        return data
