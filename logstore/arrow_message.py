"""A small reader of the Arrow IPC ``Message`` flatbuffer: what a record-batch message says
about where each column's buffers lie in its body, its compression, and where its custom
metadata lies. pyarrow does not expose this (and the ``flatbuffers`` package is not a
dependency), so the few fields needed are read by hand.

Owns: parsing the encapsulated message prefix and the Message/RecordBatch/BodyCompression/
KeyValue tables, and the IPC rule of how many buffers and child nodes each Arrow type has.
Must not: do I/O or build arrays (``tiering/projection.py`` and ``produced.py`` use it).

Encapsulated message (Arrow columnar format, "IPC streaming format"):

| part          | bytes            | meaning                                              |
|---------------|------------------|------------------------------------------------------|
| continuation  | uint32           | 0xFFFFFFFF                                           |
| metadata size | int32            | bytes of the flatbuffer, padding included (8-aligned) |
| metadata      | metadata size    | the ``Message`` flatbuffer below                     |
| body          | Message.bodyLength | the buffers, each at its ``Buffer.offset``         |

Flatbuffer encoding (little-endian): the buffer starts with a uint32 offset to the root table;
a table starts with an int32 ``soffset`` (vtable at table - soffset); a vtable is uint16 vtable
size, uint16 table size, then one uint16 per field (offset of the field from the table start,
0 when absent: the default applies); a field holding a table, vector or string holds a uint32
offset relative to the field's own position; a vector is a uint32 count then its elements.

| table / struct        | field (id)                | type                 | used for            |
|-----------------------|---------------------------|----------------------|---------------------|
| Message               | version (0)               | int16                | -                   |
|                       | header_type (1)           | uint8 (3 = RecordBatch) | checked          |
|                       | header (2)                | offset to table      | RecordBatch         |
|                       | bodyLength (3)            | int64                | batch size          |
|                       | custom_metadata (4)       | [KeyValue]           | produced batches    |
| RecordBatch           | length (0)                | int64                | rows                |
|                       | nodes (1)                 | [FieldNode]          | per field, pre-order |
|                       | buffers (2)               | [Buffer]             | per buffer, pre-order |
|                       | compression (3)           | offset to BodyCompression | codec          |
|                       | variadicBufferCounts (4)  | [int64]              | view types: refused |
| FieldNode (struct 16) | length, null_count        | int64, int64         |                     |
| Buffer (struct 16)    | offset, length            | int64, int64         | relative to the body |
| BodyCompression       | codec (0)                 | int8: 0 LZ4_FRAME, 1 ZSTD (default 0) |      |
|                       | method (1)                | int8: 0 BUFFER       | checked             |
| KeyValue              | key (0), value (1)        | string, string       | the batch header    |

A string is a uint32 byte count, the bytes, then a NUL.

With body compression each non-empty buffer is an int64 uncompressed length (-1: stored
uncompressed) followed by the codec's frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

CONTINUATION = 0xFFFFFFFF
PREFIX = struct.Struct("<Ii")
RECORD_BATCH = 3
CODECS = {0: "lz4", 1: "zstd"}


class MessageFormatError(ValueError):
    """The bytes are not a record-batch message this reader understands."""


class UnsupportedLayoutError(MessageFormatError):
    """A column type whose buffers this reader does not lay out (the caller reads whole)."""


@dataclass(frozen=True, slots=True)
class FieldNode:
    length: int
    null_count: int


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """A buffer's place relative to the start of the message body."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class KeyValueSpan:
    """One custom-metadata entry: its key, and where its value's bytes lie in the flatbuffer."""

    key: bytes
    value_at: int
    value_length: int


@dataclass(frozen=True, slots=True)
class RecordBatchLayout:
    length: int
    nodes: tuple[FieldNode, ...]
    buffers: tuple[BufferSpec, ...]
    codec: str | None
    body_length: int


def message_prefix(data: bytes) -> int:
    """The metadata size of the encapsulated message starting ``data``."""
    if len(data) < PREFIX.size:
        raise MessageFormatError(f"message prefix cut short at {len(data)} bytes")
    continuation, size = PREFIX.unpack_from(data)
    if continuation != CONTINUATION or size <= 0:
        raise MessageFormatError(f"no IPC message prefix (got {continuation:#x}, {size})")
    return int(size)


# The scalars a flatbuffer read takes, compiled once (a leader parses every produced batch's
# flatbuffer: some forty reads, each of which parsed its format again).
_SCALARS = {fmt: struct.Struct(fmt) for fmt in ("<B", "<b", "<H", "<I", "<i", "<q")}


class _Flat:
    """Bounds-checked reads of one flatbuffer."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._size = len(data)

    def _unpack(self, fmt: str, at: int) -> int:
        scalar = _SCALARS[fmt]
        if at < 0 or at + scalar.size > self._size:
            raise MessageFormatError(f"flatbuffer read at {at} runs past its {self._size} "
                                     "bytes")
        return int(scalar.unpack_from(self.data, at)[0])

    def root(self) -> int:
        return self._unpack("<I", 0)

    def field(self, table: int, index: int) -> int | None:
        """Absolute position of field ``index`` of the table at ``table``, None if absent."""
        vtable = table - self._unpack("<i", table)
        vtable_size = self._unpack("<H", vtable)
        if 4 + 2 * index >= vtable_size:
            return None
        offset = self._unpack("<H", vtable + 4 + 2 * index)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str, default: int = 0) -> int:
        at = self.field(table, index)
        return default if at is None else self._unpack(fmt, at)

    def target(self, table: int, index: int) -> int | None:
        """Where the table/vector referenced by field ``index`` starts."""
        at = self.field(table, index)
        return None if at is None else at + self._unpack("<I", at)

    def structs(self, table: int, index: int) -> list[tuple[int, int]]:
        """A vector of 16-byte structs of two int64s."""
        vector = self.target(table, index)
        if vector is None:
            return []
        count = self._unpack("<I", vector)
        if vector + 4 + 16 * count > len(self.data):
            raise MessageFormatError(f"vector of {count} structs runs past the flatbuffer")
        return [struct.unpack_from("<qq", self.data, vector + 4 + 16 * i) for i in range(count)]

    def vector_length(self, table: int, index: int) -> int:
        vector = self.target(table, index)
        return 0 if vector is None else self._unpack("<I", vector)

    def tables(self, table: int, index: int) -> list[int]:
        """The positions of the tables a vector of tables (field ``index``) references."""
        vector = self.target(table, index)
        if vector is None:
            return []
        count = self._unpack("<I", vector)
        if vector + 4 + 4 * count > len(self.data):
            raise MessageFormatError(f"vector of {count} tables runs past the flatbuffer")
        slots = [vector + 4 + 4 * i for i in range(count)]
        return [at + self._unpack("<I", at) for at in slots]

    def string(self, table: int, index: int) -> tuple[int, int]:
        """(position, byte count) of string field ``index``; (0, 0) when absent."""
        at = self.target(table, index)
        if at is None:
            return 0, 0
        length = self._unpack("<I", at)
        if at + 4 + length > len(self.data):
            raise MessageFormatError(f"string of {length} bytes runs past the flatbuffer")
        return at + 4, length


def parse_record_batch(metadata: bytes) -> RecordBatchLayout:
    """The layout of a record-batch message from its flatbuffer ``metadata``. Raises
    MessageFormatError for anything else or anything malformed."""
    flat = _Flat(metadata)
    message, batch = _record_batch(flat)
    if flat.vector_length(batch, 4):
        raise UnsupportedLayoutError("variadic buffers (view types)")
    return RecordBatchLayout(
        flat.scalar(batch, 0, "<q"),
        tuple(FieldNode(n, c) for n, c in flat.structs(batch, 1)),
        tuple(BufferSpec(o, n) for o, n in flat.structs(batch, 2)),
        _codec(flat, batch), flat.scalar(message, 3, "<q"))


def message_summary(metadata: bytes) -> tuple[int, str | None, int]:
    """(rows, codec, body length) of a record-batch message's flatbuffer ``metadata``, any
    column types. Raises MessageFormatError for anything else or anything malformed."""
    flat = _Flat(metadata)
    message, batch = _record_batch(flat)
    return flat.scalar(batch, 0, "<q"), _codec(flat, batch), flat.scalar(message, 3, "<q")


def _record_batch(flat: _Flat) -> tuple[int, int]:
    """The Message table and its RecordBatch table."""
    message = flat.root()
    if flat.scalar(message, 1, "<B") != RECORD_BATCH:
        raise MessageFormatError("not a record batch message")
    batch = flat.target(message, 2)
    if batch is None:
        raise MessageFormatError("record batch message without its header")
    return message, batch


def _codec(flat: _Flat, batch: int) -> str | None:
    compression = flat.target(batch, 3)
    if compression is None:
        return None
    if flat.scalar(compression, 1, "<b") != 0:
        raise UnsupportedLayoutError("body compression other than per buffer")
    codec = CODECS.get(flat.scalar(compression, 0, "<b"))
    if codec is None:
        raise MessageFormatError("unknown body compression codec")
    return codec


def custom_metadata(metadata: bytes) -> tuple[KeyValueSpan, ...]:
    """The custom-metadata entries of a message's flatbuffer ``metadata``, in order. Raises
    MessageFormatError when malformed."""
    flat = _Flat(metadata)
    entries = []
    for table in flat.tables(flat.root(), 4):
        key_at, key_length = flat.string(table, 0)
        value_at, value_length = flat.string(table, 1)
        entries.append(KeyValueSpan(metadata[key_at: key_at + key_length], value_at,
                                    value_length))
    return tuple(entries)


def buffer_count(type_: pa.DataType) -> int:
    """Buffers an array of ``type_`` has in IPC (validity first), its children not counted."""
    t = pa.types
    if t.is_null(type_):
        return 0
    if t.is_struct(type_) or t.is_fixed_size_list(type_):
        return 1
    if t.is_list(type_) or t.is_large_list(type_) or t.is_map(type_):
        return 2
    if (t.is_binary(type_) or t.is_string(type_) or t.is_large_binary(type_)
            or t.is_large_string(type_)):
        return 3
    if (t.is_primitive(type_) or t.is_decimal(type_) or t.is_fixed_size_binary(type_)) and \
            not t.is_dictionary(type_):
        return 2
    raise UnsupportedLayoutError(f"type {type_}")


def child_types(type_: pa.DataType) -> list[pa.DataType]:
    """The types of an array's children, in IPC order."""
    if pa.types.is_struct(type_):
        return [type_.field(i).type for i in range(type_.num_fields)]
    if pa.types.is_map(type_):
        return [pa.struct([type_.key_field, type_.item_field])]
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or \
            pa.types.is_fixed_size_list(type_):
        return [type_.value_type]
    return []


def layout_size(type_: pa.DataType) -> tuple[int, int]:
    """(field nodes, buffers) a column of ``type_`` takes, children included."""
    nodes, buffers = 1, buffer_count(type_)
    for child in child_types(type_):
        n, b = layout_size(child)
        nodes, buffers = nodes + n, buffers + b
    return nodes, buffers
