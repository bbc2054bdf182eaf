"""The record-batch schema and the batch header.

Owns: the Arrow schema of a topic's records, the fixed-layout batch header that rides in each
batch's IPC custom metadata, and the encoding of one producer batch as one encapsulated Arrow
IPC message. Must not: do I/O.

A segment file is an Arrow IPC *stream*: one schema message, then one record-batch message per
producer batch. Each record-batch message carries, under the custom-metadata key
``logstore.batch``, this header (little-endian, 74 bytes):

| field              | type   | meaning                                                         |
|--------------------|--------|-----------------------------------------------------------------|
| magic              | 6s     | ``b"\\x00LSB\\x01\\x00"``: finds the header in the message metadata |
| base_offset        | int64  | offset of the first record                                      |
| last_offset_delta  | int32  | last offset - base offset (>= record_count - 1 after compaction) |
| record_count       | int32  | rows in the batch                                               |
| first_timestamp    | int64  | smallest record timestamp, ms since the epoch                   |
| max_timestamp      | int64  | largest record timestamp, ms since the epoch                    |
| producer_id        | int64  | -1 when the producer is not idempotent                          |
| producer_epoch     | int16  | -1 when the producer is not idempotent                          |
| base_sequence      | int32  | sequence number of the first record, -1 when not idempotent     |
| leader_epoch       | int32  | epoch of the leader that appended the batch                     |
| flags              | int16  | TRANSACTIONAL, CONTROL, HAS_OFFSET_DELTAS, LOG_APPEND_TIME       |
| batch_size         | int32  | bytes of the whole encapsulated IPC message, prefix included    |
| crc                | uint32 | CRC32C of the fields from last_offset_delta on, deltas and body |

A batch whose offsets have gaps (after compaction) sets HAS_OFFSET_DELTAS and stores the
per-record offset deltas under ``logstore.offset_deltas``: ``DELTAS_MAGIC`` then the int32
little-endian deltas in base64, so that they can never contain either magic.

A control batch (FLAG_CONTROL and FLAG_TRANSACTIONAL set, the producer id and epoch of the
transaction it ends, base_sequence -1) is Kafka's transaction marker: one record of the topic's
schema whose ``key`` holds this control record (little-endian, 8 bytes); every other column is
null but ``timestamp`` (the append time):

| field              | type   | meaning                                                         |
|--------------------|--------|-----------------------------------------------------------------|
| version            | int16  | 0                                                               |
| type               | int16  | ``ControlType``: 0 ABORT, 1 COMMIT (Kafka's ControlRecordType)   |
| coordinator_epoch  | int32  | epoch of the transaction coordinator that wrote the marker      |

Kafka splits this between the key (version, type) and the value (version, coordinator epoch);
here it all lives in the key because a typed topic has no binary value column to hold it.

The header is written with ``crc = 0`` and ``batch_size = 0``, the message is serialised once,
and then both fields are patched in place: one serialisation, no second copy of the body. A
batch a producer sent already encoded (``produced.py``) is stored as an ``EncodedBatch``: a copy
of its small metadata prefix, where ``seal_batch`` writes the header, beside the body as it
was received, so the body is never copied on the broker. The
CRC covers every header field from ``last_offset_delta`` to ``batch_size``, the raw offset
deltas (if any) and the body, so a flipped bit in a header field is caught as surely as one in
the data. Like Kafka's, it leaves out the base offset, which the log patches in at append.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import IntEnum
from functools import lru_cache
from typing import TYPE_CHECKING

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import CorruptRecordError, InvalidRecordError

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

HEADER_KEY = b"logstore.batch"
OFFSET_DELTAS_KEY = b"logstore.offset_deltas"
MAGIC = b"\x00LSB\x01\x00"
DELTAS_MAGIC = b"\x00LSD\x01\x00"
_HEADER = struct.Struct("<6sqiiqqqhiihiI")
HEADER_SIZE = _HEADER.size
_CRC_POS = HEADER_SIZE - 4
# As in Kafka, the CRC leaves out the base offset (and the magic before it), so the log can
# assign offsets by patching eight bytes of an already-encoded batch under its append lock.
_CRC_START = struct.calcsize("<6sq")
_SIZE_POS = HEADER_SIZE - 8

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

FLAG_TRANSACTIONAL = 1
FLAG_CONTROL = 2
FLAG_HAS_OFFSET_DELTAS = 4
FLAG_LOG_APPEND_TIME = 8

CONTROL_RECORD_VERSION = 0
_CONTROL_RECORD = struct.Struct("<hhi")

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
RESERVED_COLUMNS = ("key", "timestamp", "headers")
# A typed topic's value columns may not take these names (any case): readers add them beside the
# value columns (Spark matches names case-insensitively), and "value" would make an untyped
# record indistinguishable from a typed one.
RESERVED_VALUE_NAMES = ("key", "value", "topic", "partition", "offset", "timestamp",
                        "timestamptype", "headers")

DEFAULT_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("headers", HEADERS_TYPE),
])


def topic_schema(value_schema: pa.Schema | None = None) -> pa.Schema:
    """The stored schema of a topic: Kafka's by default, or ``key``, the value's own columns,
    ``timestamp`` and ``headers`` for a typed topic."""
    if value_schema is None:
        return DEFAULT_SCHEMA
    clash = [name for name in value_schema.names if name.lower() in RESERVED_VALUE_NAMES]
    if clash:
        raise InvalidRecordError(f"value_schema column(s) {clash} clash with the reserved "
                                 f"names {list(RESERVED_VALUE_NAMES)} (in any case)")
    if len(set(value_schema.names)) != len(value_schema.names):
        raise InvalidRecordError(f"value_schema has duplicate column names {value_schema.names}")
    if len(value_schema) == 0:
        raise InvalidRecordError("value_schema has no columns")
    fields = [DEFAULT_SCHEMA.field("key"), *(f.with_nullable(True) for f in value_schema),
              DEFAULT_SCHEMA.field("timestamp"), DEFAULT_SCHEMA.field("headers")]
    return pa.schema(fields)


def refuse_dictionary_columns(value_schema: pa.Schema) -> None:
    """Raise InvalidRecordError naming the first column whose type is, or holds at any depth, a
    dictionary: a produced batch must be one IPC record-batch message, and an IPC writer sends a
    dictionary message before the batch of such a column, so every write would fail.

    Checked when a topic is created (not in topic_schema): a topic stored before this check
    must still load, so that it can be listed and deleted."""
    for f in value_schema:
        found = _dictionary_column(f.type, f.name)
        if found is not None:
            path, type_ = found
            raise InvalidRecordError(
                f"value_schema column {path!r} has the dictionary type {type_}, which topics "
                f"cannot store (a produced batch is one IPC record-batch message); declare its "
                f"value type {type_.value_type} instead")


def _dictionary_column(type_: pa.DataType, path: str) -> tuple[str, pa.DictionaryType] | None:
    """(the dotted path, the type) of the first dictionary in ``type_``, None if none."""
    if isinstance(type_, pa.DictionaryType):
        return path, type_
    if isinstance(type_, pa.BaseExtensionType):
        return _dictionary_column(type_.storage_type, path)
    for i in range(type_.num_fields):
        child = type_.field(i)
        found = _dictionary_column(child.type, f"{path}.{child.name}")
        if found is not None:
            return found
    return None


def encode_schema(schema: pa.Schema | None) -> str | None:
    """A value schema as base64 text for JSON bodies and metadata files."""
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str | None) -> pa.Schema | None:
    """The inverse of encode_schema; undecodable text is InvalidRecordError."""
    if not text:
        return None
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (ValueError, pa.ArrowException) as e:
        raise InvalidRecordError(f"value_schema is not a base64 Arrow IPC schema ({e})") from None


def value_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` that hold the value (``["value"]`` for untyped topics)."""
    return [name for name in schema.names if name not in RESERVED_COLUMNS]


class ControlType(IntEnum):
    """What a transaction marker says (Kafka's ControlRecordType numbers)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """The control record of a transaction marker (layout in the module docstring)."""

    type: ControlType
    coordinator_epoch: int

    def pack(self) -> bytes:
        return _CONTROL_RECORD.pack(CONTROL_RECORD_VERSION, self.type, self.coordinator_epoch)

    @classmethod
    def unpack(cls, data: bytes) -> EndTxnMarker:
        """Raises CorruptRecordError on a wrong size, version or type."""
        if len(data) != _CONTROL_RECORD.size:
            raise CorruptRecordError(f"control record is {len(data)} bytes, expected "
                                     f"{_CONTROL_RECORD.size}")
        version, kind, coordinator_epoch = _CONTROL_RECORD.unpack(data)
        if version != CONTROL_RECORD_VERSION or kind not in ControlType._value2member_map_:
            raise CorruptRecordError(f"unknown control record version {version} type {kind}")
        return cls(ControlType(kind), coordinator_epoch)


def control_batch(schema: pa.Schema, marker: EndTxnMarker, timestamp_ms: int) -> pa.RecordBatch:
    """The one-record batch of ``schema`` that carries ``marker`` (see the module docstring)."""
    if schema.get_field_index("key") < 0 or not schema.field("key").type.equals(pa.binary()):
        raise InvalidRecordError(f"a control batch needs a binary 'key' column; the schema is "
                                 f"{schema}")
    columns = []
    for f in schema:
        if f.name == "key":
            columns.append(pa.array([marker.pack()], pa.binary()))
        elif f.name == "timestamp":
            columns.append(pa.array([timestamp_ms], pa.int64()).cast(f.type))
        else:
            columns.append(pa.nulls(1, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def control_marker(records: pa.RecordBatch) -> EndTxnMarker:
    """The marker in a control batch's decoded records; CorruptRecordError when there is none."""
    i = records.schema.get_field_index("key")
    if records.num_rows != 1 or i < 0:
        raise CorruptRecordError(f"a control batch holds one keyed record, not "
                                 f"{records.num_rows} row(s) of {records.schema.names}")
    key = records.column(i)[0].as_py()
    if not isinstance(key, bytes):
        raise CorruptRecordError("control record has no key")
    return EndTxnMarker.unpack(key)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    last_offset_delta: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    leader_epoch: int = 0
    flags: int = 0
    batch_size: int = 0
    crc: int = 0

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.flags & FLAG_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)

    def pack(self) -> bytes:
        return _HEADER.pack(MAGIC, self.base_offset, self.last_offset_delta, self.record_count,
                            self.first_timestamp, self.max_timestamp, self.producer_id,
                            self.producer_epoch, self.base_sequence, self.leader_epoch,
                            self.flags, self.batch_size, self.crc)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> BatchHeader:
        fields = _HEADER.unpack(data)
        if fields[0] != MAGIC:
            raise CorruptRecordError("batch header has a bad magic")
        return cls(*fields[1:])


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One batch as read back from a log: its header and the undecoded IPC message."""

    header: BatchHeader
    message: ipc.Message
    offset_deltas: np.ndarray | None = None

    def record_batch(self, schema: pa.Schema) -> pa.RecordBatch:
        """Decode the Arrow batch (zero-copy over the message body)."""
        return ipc.read_record_batch(self.message, schema)

    def offsets(self) -> np.ndarray:
        """The offset of every record in the batch, as int64."""
        base = self.header.base_offset
        if self.offset_deltas is not None:
            return base + self.offset_deltas.astype(np.int64)
        return np.arange(base, base + self.header.record_count, dtype=np.int64)

    def message_bytes(self) -> pa.Buffer:
        """The stored message's exact bytes. A message read from one buffer (a segment read,
        a received frame) is a slice of it: its prefix, metadata and body lie back to back and
        are returned as one view of them, no copy; any other message is serialised anew."""
        message = self.message
        metadata, body = message.metadata, message.body
        start = metadata.address - _IPC_PREFIX
        size = body.address + body.size - start
        padding = body.address - (metadata.address + metadata.size)  # Arrow copies a
        # misaligned metadata elsewhere: then the body does not follow it
        if 0 <= padding < 8 and size == self.header.batch_size:
            return pa.foreign_buffer(start, size, base=message)
        return message.serialize()


_IPC_PREFIX = 8  # an IPC message's continuation marker and metadata size

# A replica fetch ships each stored message as one row of this schema: the exact bytes in the
# leader's log, appended by the follower without being decoded and encoded again.
STORED_MESSAGE_SCHEMA = pa.schema([pa.field("message", pa.binary(), nullable=False)])


def stored_message_batch(stored: StoredBatch) -> pa.RecordBatch:
    """One row holding ``stored``'s IPC message bytes (the column wraps them, no copy)."""
    return message_batch(stored.message.serialize())


def message_batch(data: pa.Buffer) -> pa.RecordBatch:
    """One row of STORED_MESSAGE_SCHEMA holding ``data`` (the column wraps it, no copy): how a
    replica fetch ships a stored message, and how a producer ships an encoded batch."""
    offsets = pa.py_buffer(np.array([0, data.size], dtype="<i4").tobytes())
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])
    return pa.RecordBatch.from_arrays([column], schema=STORED_MESSAGE_SCHEMA)


def stored_message_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    """The IPC message bytes a ``stored_message_batch`` carries (zero-copy)."""
    return batch.column(0)[0].as_buffer()


@lru_cache(maxsize=256)
def schema_message_size(schema: pa.Schema) -> int:
    """Bytes of the IPC schema message of ``schema`` (cached: it is asked per batch)."""
    return int(schema.serialize().size)


def schema_message(schema: pa.Schema) -> bytes:
    """The IPC schema message that opens every segment file of a topic with this schema."""
    return bytes(schema.serialize().to_pybytes())


# Arrow's defaults, made once: ``ipc.new_stream`` without options builds them per call from two
# environment variables (legacy formats a segment must never be written in).
_WRITE_OPTIONS = ipc.IpcWriteOptions()


def ipc_message(batch: pa.RecordBatch, metadata: dict[bytes, bytes],
                options: ipc.IpcWriteOptions | None = None) -> memoryview:
    """``batch`` as one encapsulated IPC message carrying ``metadata``, without the schema
    message, as a writable view. Written into one buffer allocated from an upper bound of its
    size: a growing output stream copies what it holds each time it grows, which costs as much
    as the encoding itself on a machine copying memory at 0.5 GB/s. A message larger than the
    bound (a compressed body that grew by more than the margin) is encoded again the slow way.
    The buffer comes from the system allocator, not Arrow's default (mimalloc): mimalloc gives
    a freed megabyte back to the kernel within milliseconds, so each batch's message was
    written into fresh memory that the kernel zeroes first (huge pages: a fifth of a columnar
    producer's CPU), where glibc hands the same memory out again."""
    schema_size = schema_message_size(batch.schema)
    body = int(ipc.get_record_batch_size(batch))
    bound = schema_size + body + sum(len(k) + len(v) for k, v in metadata.items()) + 1024
    if options is not None and options.compression is not None:
        bound += body // 64 + 64 * sum(len(c.buffers()) for c in batch.columns)
    options = options or _WRITE_OPTIONS
    buf = pa.allocate_buffer(bound, memory_pool=pa.system_memory_pool())
    sink = pa.FixedSizeBufferWriter(buf)
    try:
        writer = ipc.RecordBatchStreamWriter(sink, batch.schema, options=options)
        writer.write_batch(batch, custom_metadata=metadata)
    except OSError:  # out of bounds
        grown = pa.BufferOutputStream()
        writer = ipc.RecordBatchStreamWriter(grown, batch.schema, options=options)
        writer.write_batch(batch, custom_metadata=metadata)
        # not closed: closing would append an end-of-stream marker
        return memoryview(grown.getvalue()).cast("B")[schema_size:]
    return memoryview(buf).cast("B")[schema_size: sink.tell()]


def encode_batch(
    batch: pa.RecordBatch,
    header: BatchHeader,
    offset_deltas: np.ndarray | None = None,
    options: ipc.IpcWriteOptions | None = None,
) -> memoryview:
    """One encapsulated IPC message for ``batch`` carrying ``header``, with its CRC32C and size
    patched in, as a writable view of the serialised buffer (no copy; see patch_base_offset).
    The schema message is not included."""
    metadata: dict[bytes, bytes] = {HEADER_KEY: header.pack()}
    if offset_deltas is not None:
        metadata[OFFSET_DELTAS_KEY] = DELTAS_MAGIC + base64.b64encode(
            np.ascontiguousarray(offset_deltas, dtype="<i4").tobytes())
    # The message's buffer is mutable, so the header is patched where it lies: on this path
    # every copy of the body counts (a VM here copies memory at about 0.5 GB/s).
    message = ipc_message(batch, metadata, options)
    body_size = ipc.read_message(pa.py_buffer(message)).body.size
    at = _find_header(message[: len(message) - body_size])
    struct.pack_into("<i", message, at + _SIZE_POS, len(message))
    deltas = b"" if offset_deltas is None else np.ascontiguousarray(
        offset_deltas, dtype="<i4").tobytes()
    crc = _batch_crc(message[at + _CRC_START: at + _CRC_POS], deltas,
                     message[len(message) - body_size:])
    struct.pack_into("<I", message, at + _CRC_POS, crc)
    return message


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """An encoded batch message in two parts, written back to back: ``prefix`` (continuation,
    metadata size and the flatbuffer, with the header at ``header_at``: small and mutable, so
    the header is patched in place) and ``body`` (the buffers as they were received)."""

    prefix: bytearray
    header_at: int
    body: pa.Buffer

    def __len__(self) -> int:
        return len(self.prefix) + int(self.body.size)


# What the log appends: a serialised message (patched in place) or one in two parts.
Encoded = memoryview | EncodedBatch


def seal_batch(prefix: bytearray, header_at: int, body: pa.Buffer, header: BatchHeader
               ) -> EncodedBatch:
    """``header`` written into ``prefix`` at ``header_at`` with the message's size and the
    CRC32C over its fields and ``body`` (read once, never copied)."""
    batch = EncodedBatch(prefix, header_at, body)
    prefix[header_at: header_at + HEADER_SIZE] = replace(header, batch_size=len(batch),
                                                         crc=0).pack()
    crc = _batch_crc(memoryview(prefix)[header_at + _CRC_START: header_at + _CRC_POS], b"",
                     body)
    struct.pack_into("<I", prefix, header_at + _CRC_POS, crc)
    return batch


def patch_base_offset(message: Encoded, base_offset: int) -> None:
    """Set the base offset of an encoded batch in place (it is outside the CRC)."""
    if isinstance(message, EncodedBatch):
        struct.pack_into("<q", message.prefix, message.header_at + len(MAGIC), base_offset)
        return
    metadata_size = struct.unpack_from("<i", message, 4)[0]
    at = _find_header(message[: 8 + metadata_size])
    struct.pack_into("<q", message, at + len(MAGIC), base_offset)


def _batch_crc(header_prefix: memoryview | bytes, deltas: bytes, body: Buffer) -> int:
    crc = crc32c.crc32c(header_prefix)
    if deltas:
        crc = crc32c.crc32c(deltas, crc)
    return crc32c.crc32c(body, crc)


def _find_header(metadata: memoryview | bytes) -> int:
    at = bytes(metadata).find(MAGIC)
    if at < 0:
        raise CorruptRecordError("batch message carries no logstore header")
    return at


def decode_message(message: ipc.Message, verify: bool = True) -> StoredBatch:
    """The header (and offset deltas) of one record-batch message; checks the CRC when asked.

    Raises CorruptRecordError on a missing header or a CRC mismatch; callers add the file and
    offset to the message."""
    if message.type != "record batch":
        raise CorruptRecordError(f"expected a record batch message, found {message.type!r}")
    meta = message.metadata.to_pybytes()
    at = _find_header(meta)
    header = BatchHeader.unpack(meta[at: at + HEADER_SIZE])
    deltas = None
    if header.flags & FLAG_HAS_OFFSET_DELTAS:
        deltas = _decode_offset_deltas(meta)
    if verify:
        actual = _batch_crc(meta[at + _CRC_START: at + _CRC_POS], b"" if deltas is None else
                            deltas.astype("<i4").tobytes(), message.body)
        if actual != header.crc:
            raise CorruptRecordError(
                f"CRC32C mismatch in batch at offset {header.base_offset}: "
                f"stored {header.crc:#010x}, computed {actual:#010x}")
    return StoredBatch(header, message, deltas)


def _decode_offset_deltas(meta: bytes) -> np.ndarray:
    # The value is DELTAS_MAGIC then base64 text, which ends at the flatbuffer's NUL terminator.
    at = meta.find(DELTAS_MAGIC)
    if at < 0:
        raise CorruptRecordError("batch flags offset deltas but carries none")
    start = at + len(DELTAS_MAGIC)
    end = meta.find(b"\x00", start)
    return np.frombuffer(base64.b64decode(meta[start:end]), dtype="<i4")


def iter_messages(buffer: pa.Buffer) -> Iterator[tuple[int, ipc.Message]]:
    """(position, message) for every *complete* IPC message in ``buffer``; stops quietly at a
    truncated tail, which the caller detects by comparing positions with the buffer size."""
    reader = pa.BufferReader(buffer)
    while reader.tell() < buffer.size:
        position = reader.tell()
        try:
            message = ipc.read_message(reader)
        except (pa.ArrowInvalid, OSError, EOFError):
            return
        if message is None:
            return
        yield position, message


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``: columns reordered, safe casts applied (large_binary to
    binary, other timestamp units), missing ``key``/``timestamp``/``headers`` filled with nulls.
    A missing value column, an extra column or an impossible cast is InvalidRecordError naming
    ``where`` and the column."""
    if batch.schema.equals(schema):
        return batch
    extra = [n for n in batch.schema.names if schema.get_field_index(n) < 0]
    if extra:
        raise InvalidRecordError(f"{where}: unexpected column(s) {extra}; the topic's columns "
                                 f"are {schema.names}")
    columns = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            if f.name not in RESERVED_COLUMNS:
                raise InvalidRecordError(f"{where}: missing column {f.name!r} ({f.type})")
            columns.append(null_column(batch.num_rows, f.type))
            continue
        columns.append(_cast_column(batch.column(idx), f, where))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# All-null list columns (immutable), by (rows, type); by rows alone for HEADERS_TYPE itself (as
# record_arrays asks), since hashing a nested type costs more than a small chunk's whole lookup.
_NULL_LISTS: dict[int | tuple[int, pa.DataType], pa.Array] = {}
_NULL_LISTS_CACHED = 128  # columns kept, each of at most _NULL_LISTS_ROWS rows: at most 8 MiB
_NULL_LISTS_ROWS = 16_384  # of offsets for list columns, 16 MiB for large_list ones


def null_column(length: int, type_: pa.DataType) -> pa.Array:
    """An all-null column whose list children are empty. ``pa.nulls`` gives a list column
    children as long as itself, which IPC then writes out in full, even for a slice: 8 bytes a
    row for an all-null ``headers`` column, and a one-row slice of it as large as the whole.
    List columns of up to _NULL_LISTS_ROWS rows are built once per length and type: every
    chunk of ``send()``'s records and every ``send_batch`` without headers asks for one, and
    its three Arrow calls were a tenth of a small chunk's drain."""
    large = pa.types.is_large_list(type_)
    if not (pa.types.is_list(type_) or large):
        return pa.nulls(length, type_)
    # Field metadata is not part of a type's hash or equality: a list whose child field carries
    # some is neither cached nor served from the cache. (Metadata deeper down, on a struct's
    # fields, is not looked at: harmless, since every caller takes the field from its schema.)
    key = length if type_ is HEADERS_TYPE else (length, type_)
    cacheable = length <= _NULL_LISTS_ROWS and (type_ is HEADERS_TYPE or
                                                 not type_.value_field.metadata)
    column = _NULL_LISTS.get(key) if cacheable else None
    if column is not None:
        return column
    # Zeroed buffers, no conversion: a validity bitmap of nulls and offsets all 0 (four
    # times cheaper than building them from numpy arrays).
    validity = pa.py_buffer(bytes((length + 7) // 8))
    offsets = pa.py_buffer(bytes((8 if large else 4) * (length + 1)))
    column = pa.Array.from_buffers(type_, length, [validity, offsets], null_count=length,
                                   children=[pa.nulls(0, type_.value_type)])
    if cacheable:
        if len(_NULL_LISTS) >= _NULL_LISTS_CACHED:
            _NULL_LISTS.clear()
        _NULL_LISTS[key] = column
    return column


def _cast_column(column: pa.Array, target: pa.Field, where: str) -> pa.Array:
    if column.type.equals(target.type):
        return column
    if pa.types.is_integer(column.type) and pa.types.is_timestamp(target.type):
        column = column.cast(pa.int64()).view(pa.timestamp("ms", tz="UTC"))
    try:
        return column.cast(target.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidRecordError(f"{where}: column {target.name!r} is {column.type}, expected "
                                 f"{target.type} ({str(e).splitlines()[0]})") from None
