"""Projected reads of remote segments, for Spark executors that read the remote tier straight
from object storage: per batch, fetch the IPC message metadata and then only the byte ranges of
the buffers that belong to the projected top-level columns, and assemble record batches of just
those columns with their batch headers (so offsets are right).

Owns: walking a remote segment object batch by batch with range reads, finding each column's
buffers through the message flatbuffer (``arrow_message.py``), coalescing nearby ranges into
one request, decompressing (lz4/zstd bodies) and building the arrays, nested ones included;
falling back to reading a batch whole when a column type's layout is not one this reader lays
out (views, unions, dictionaries). Must not: import fsspec or pyspark, or hold sockets when
pickled (the ObjectStore pickles as its URL).

Integrity: a batch's CRC32C covers its whole body, which a projected read does not fetch. So
the copy uploads a ``.colcrc`` sidecar (``column_checksums``): per batch, the CRC32C of its
message prefix and metadata, and per top-level column the CRC32C of that column's buffers as
stored; a projected read checks the metadata and exactly the column bytes it fetched against
it. A batch the sidecar has no entry for (a segment uploaded before sidecars existed, or a
layout this reader does not lay out) is read whole and its batch CRC checked, as with
``verify=True``. Besides, a projected read checks the message prefix, the flatbuffer (bounds,
counts of nodes and buffers against the schema), that buffers lie inside the body, the batch
size and offsets against the header and the segment, and the assembled arrays (``validate``).
Errors are CorruptRecordError naming topic, partition, offset and object.
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.arrow_message import (
    BufferSpec,
    FieldNode,
    MessageFormatError,
    RecordBatchLayout,
    UnsupportedLayoutError,
    buffer_count,
    child_types,
    layout_size,
    message_prefix,
    parse_record_batch,
)
from logstore.errors import ApiError, CorruptRecordError
from logstore.records import (
    DELTAS_MAGIC,
    FLAG_HAS_OFFSET_DELTAS,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    decode_message,
)
from logstore.segments.format import INDEX_SUFFIX, PREFIX_SIZE, SEGMENT_SUFFIX
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import COLUMN_CRC_SUFFIX, segment_key
from logstore.tiering.remote_cache import locate, parse_offset_index
from logstore.tiering.store import ObjectStore, RemoteObjectNotFoundError

# Ranges closer than this are fetched in one request: a request costs more than a few KiB.
DEFAULT_COALESCE_GAP_BYTES = 4096
_FIRST_METADATA_GUESS = 1024

# The .colcrc sidecar: head (magic, version, column count), then per batch its position in the
# segment object, the CRC32C of its prefix and metadata and one CRC32C per top-level column,
# then the CRC32C of all that (little-endian throughout).
COLUMN_CRC_MAGIC = b"LSCC"
COLUMN_CRC_VERSION = 1
_CRC_HEAD = struct.Struct("<4sHI")
_CRC_ENTRY = struct.Struct("<QI")
_CRC_TRAILER = struct.Struct("<I")

# position -> (metadata CRC32C, CRC32C per top-level column)
ColumnCrcs = dict[int, tuple[int, tuple[int, ...]]]


@dataclass(frozen=True, slots=True)
class ProjectedBatch:
    """One stored batch, with only the projected columns decoded."""

    header: BatchHeader
    batch: pa.RecordBatch
    offset_deltas: np.ndarray | None = None

    def offsets(self) -> np.ndarray:
        """The offset of every record in the batch, as int64."""
        base = self.header.base_offset
        if self.offset_deltas is not None:
            return base + self.offset_deltas.astype(np.int64)
        return np.arange(base, base + self.header.record_count, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class _Message:
    """A batch message's place and what its metadata says."""

    position: int
    metadata_size: int
    header: BatchHeader
    layout: RecordBatchLayout
    offset_deltas: np.ndarray | None
    metadata_crc: int  # of the prefix and metadata, as stored

    @property
    def body_start(self) -> int:
        return self.position + PREFIX_SIZE + self.metadata_size


class ProjectedSegmentReader:
    """Projected reads of one remote segment (picklable: store, segment metadata, schema).
    Not shared between threads: it remembers the last metadata size as its next guess."""

    def __init__(self, store: ObjectStore, segment: RemoteLogSegmentMetadata,
                 schema: pa.Schema | None = None,
                 coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES) -> None:
        self._store = store
        self._segment = segment
        self._key = segment_key(segment, SEGMENT_SUFFIX)
        self._schema = schema
        self._gap = coalesce_gap_bytes
        self._guess = _FIRST_METADATA_GUESS
        self._crcs: ColumnCrcs | None = None
        self._crcs_read = False

    def read(self, columns: Sequence[str], start_offset: int | None = None,
             end_offset: int | None = None, verify: bool = False) -> Iterator[ProjectedBatch]:
        """The batches holding offsets in ``[start_offset, end_offset)`` (the whole segment by
        default), each with only ``columns`` (top-level names of the stored schema). The
        fetched bytes are checked against the segment's ``.colcrc`` sidecar; ``verify`` (or
        no sidecar) reads each batch whole and checks its CRC instead."""
        schema = self.schema()
        fields = [schema.field(c) for c in columns]
        start = self._segment.base_offset if start_offset is None else start_offset
        end = self._segment.next_offset if end_offset is None else end_offset
        position, expected = self._start(start_offset)
        first = True
        while position < self._segment.size_bytes:
            message = self._message_at(position, expected, exact=first)
            first, expected = False, message.header.next_offset
            if message.header.base_offset >= end:
                return
            if message.header.next_offset > start:
                yield self._project(message, schema, fields, verify)
            position += message.header.batch_size

    def schema(self) -> pa.Schema:
        """The stored schema, from the segment's schema message unless given."""
        if self._schema is None:
            size = self._metadata_size(0, self._range(0, PREFIX_SIZE))
            data = self._range(0, PREFIX_SIZE + size)
            try:
                self._schema = ipc.read_schema(pa.py_buffer(data))
            except (pa.ArrowInvalid, OSError) as e:
                raise self._corrupt(0, f"schema message cannot be read: {e}") from e
        return self._schema

    # -- walking -----------------------------------------------------------------------------

    def _start(self, offset: int | None) -> tuple[int, int]:
        """(position, base offset) of the batch to start from: from the offset index, or the
        first batch (after the schema message)."""
        if offset is not None:
            index = self._store.read_object(segment_key(self._segment, INDEX_SUFFIX))
            found = locate(parse_offset_index(self._segment, index), self._segment, offset)
            if found is not None:
                return found
        return PREFIX_SIZE + self._metadata_size(0, self._range(0, PREFIX_SIZE)), \
            self._segment.base_offset

    def _message_at(self, position: int, expected: int, exact: bool) -> _Message:
        head = self._range(position, PREFIX_SIZE + self._guess)
        size = self._metadata_size(position, head)
        if len(head) < PREFIX_SIZE + size:
            head += self._range(position + len(head), PREFIX_SIZE + size - len(head))
        self._guess = size
        metadata = head[PREFIX_SIZE: PREFIX_SIZE + size]
        try:
            layout = parse_record_batch(metadata)
        except UnsupportedLayoutError:
            layout = RecordBatchLayout(0, (), (), None, -1)
        except MessageFormatError as e:
            raise self._corrupt(position, str(e)) from e
        header, deltas = self._header(position, metadata)
        message = _Message(position, size, header, layout, deltas,
                           crc32c.crc32c(head[: PREFIX_SIZE + size]))
        self._check_place(message, expected, exact)
        return message

    def _header(self, position: int, metadata: bytes) -> tuple[BatchHeader, np.ndarray | None]:
        header = _batch_header(metadata)
        if header is None:
            raise self._corrupt(position, "batch message carries no logstore header")
        if not header.flags & FLAG_HAS_OFFSET_DELTAS:
            return header, None
        start = metadata.find(DELTAS_MAGIC)
        if start < 0:
            raise self._corrupt(position, "batch flags offset deltas but carries none")
        start += len(DELTAS_MAGIC)
        text = metadata[start: metadata.find(b"\x00", start)]
        return header, np.frombuffer(base64.b64decode(text), dtype="<i4")

    def _check_place(self, m: _Message, expected: int, exact: bool) -> None:
        header, body = m.header, m.layout.body_length
        misplaced = header.base_offset != expected if exact else header.base_offset < expected
        wrong_size = body >= 0 and header.batch_size != PREFIX_SIZE + m.metadata_size + body
        if (misplaced or wrong_size or header.last_offset > self._segment.end_offset
                or m.position + header.batch_size > self._segment.size_bytes):
            raise self._corrupt(m.position, f"batch {header} does not fit its place (offset "
                                            f"{expected} expected)")

    # -- assembling --------------------------------------------------------------------------

    def _project(self, m: _Message, schema: pa.Schema, fields: list[pa.Field],
                 verify: bool) -> ProjectedBatch:
        crcs = None if verify or m.layout.body_length < 0 else self._column_crcs(schema)
        entry = None if crcs is None else crcs.get(m.position)
        if entry is None:  # no sidecar (an older copy), or no entry for the batch
            return self._read_whole(m, schema, fields)
        metadata_crc, column_crcs = entry
        if metadata_crc != m.metadata_crc:
            raise self._corrupt(m.position, "the batch's metadata does not match its CRC32C "
                                            "in the .colcrc sidecar")
        try:
            plan = _plan(schema, m.layout)
        except UnsupportedLayoutError:
            return self._read_whole(m, schema, fields)
        except MessageFormatError as e:
            raise self._corrupt(m.position, str(e)) from e
        specs = [s for f in fields for s in plan[f.name][1]]
        fetched = self._fetch(m, specs)
        arrays = []
        for f in fields:
            nodes, buffer_specs = plan[f.name]
            crc = 0
            for spec in buffer_specs:
                crc = crc32c.crc32c(fetched[spec], crc)
            if crc != column_crcs[schema.get_field_index(f.name)]:
                raise self._corrupt(m.position, f"column {f.name!r} does not match its CRC32C "
                                                "in the .colcrc sidecar")
            buffers = iter([self._decompress(m, fetched[s]) for s in buffer_specs])
            arrays.append(self._build(m, f.type, iter(nodes), buffers))
        batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        return ProjectedBatch(m.header, batch, m.offset_deltas)

    def _column_crcs(self, schema: pa.Schema) -> ColumnCrcs | None:
        """The segment's ``.colcrc`` sidecar (None: the copy uploaded none), read once."""
        if not self._crcs_read:
            key = segment_key(self._segment, COLUMN_CRC_SUFFIX)
            try:
                data = self._store.read_object(key)
            except RemoteObjectNotFoundError:
                data = None
            if data is not None:
                try:
                    self._crcs = parse_column_checksums(data, len(schema))
                except ValueError as e:
                    raise CorruptRecordError(f"{self._segment.describe()}, object {key}: "
                                             f"{e}") from e
            self._crcs_read = True
        return self._crcs

    def _fetch(self, m: _Message, specs: list[BufferSpec]) -> dict[BufferSpec, bytes]:
        """The content of each buffer as stored, reading nearby ones in one request."""
        body = m.layout.body_length
        if any(s.offset < 0 or s.length < 0 or s.offset + s.length > body for s in specs):
            raise self._corrupt(m.position, f"a buffer lies outside the {body}-byte body")
        out = {s: b"" for s in specs if s.length == 0}
        for lo, hi, members in _coalesce(specs, self._gap):
            data = self._range(m.body_start + lo, hi - lo)
            if len(data) < hi - lo:
                raise self._corrupt(m.position, "the object ends inside a batch body")
            for s in members:
                out[s] = data[s.offset - lo: s.offset - lo + s.length]
        return out

    def _decompress(self, m: _Message, raw: bytes) -> pa.Buffer:
        codec = m.layout.codec
        if codec is None or not raw:
            return pa.py_buffer(raw)
        size = int.from_bytes(raw[:8], "little", signed=True)
        if size == -1:
            return pa.py_buffer(raw[8:])
        try:
            return pa.Codec(codec).decompress(raw[8:], decompressed_size=size)
        except (pa.ArrowInvalid, OSError) as e:
            raise self._corrupt(m.position, f"a {codec} buffer does not decompress: {e}") from e

    def _build(self, m: _Message, type_: pa.DataType, nodes: Iterator[FieldNode],
               buffers: Iterator[pa.Buffer]) -> pa.Array:
        node = next(nodes)
        own: list[pa.Buffer | None] = [next(buffers) for _ in range(buffer_count(type_))]
        children = [self._build(m, child, nodes, buffers) for child in child_types(type_)]
        if pa.types.is_null(type_):
            return pa.nulls(node.length)
        if own and own[0] is not None and own[0].size == 0:
            own[0] = None  # no validity bitmap: nothing is null
        try:
            array = pa.Array.from_buffers(type_, node.length, own, node.null_count,
                                          children=children or None)
            array.validate()
        except (pa.ArrowInvalid, ValueError, TypeError) as e:
            raise self._corrupt(m.position, f"column of type {type_} cannot be built: {e}") from e
        return array

    def _read_whole(self, m: _Message, schema: pa.Schema,
                    fields: list[pa.Field]) -> ProjectedBatch:
        data = self._range(m.position, m.header.batch_size)
        try:
            stored = decode_message(ipc.read_message(pa.py_buffer(data)), verify=True)
            batch = stored.record_batch(schema).select([f.name for f in fields])
        except CorruptRecordError as e:
            raise self._corrupt(m.position, e.message) from e
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            raise self._corrupt(m.position, f"batch cannot be decoded: {e}") from e
        return ProjectedBatch(stored.header, batch, stored.offset_deltas)

    # -- bytes -------------------------------------------------------------------------------

    def _range(self, start: int, length: int) -> bytes:
        return self._store.read_range(self._key, start, min(length,
                                                            self._segment.size_bytes - start))

    def _metadata_size(self, position: int, head: bytes) -> int:
        try:
            return message_prefix(head)
        except MessageFormatError as e:
            raise self._corrupt(position, str(e)) from e

    def _corrupt(self, position: int, why: str) -> ApiError:
        return CorruptRecordError(f"{self._segment.describe()}, object {self._key}, position "
                                  f"{position}: {why}")


def _batch_header(metadata: bytes) -> BatchHeader | None:
    """The logstore header a batch message's metadata carries (None: none)."""
    at = metadata.find(MAGIC)
    if at < 0 or at + HEADER_SIZE > len(metadata):
        return None
    return BatchHeader.unpack(metadata[at: at + HEADER_SIZE])


def column_checksums(path: Path) -> bytes:
    """The ``.colcrc`` sidecar of a sealed local segment file (see the module docstring):
    an entry per batch this reader lays out. It never fails a copy over a batch it cannot
    read: that batch, and any after it, gets no entry (they are then read whole, with their
    batch CRCs checked)."""
    entries: list[bytes] = []
    columns = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            schema_size = message_prefix(f.read(PREFIX_SIZE))
            f.seek(0)
            schema = ipc.read_schema(pa.py_buffer(f.read(PREFIX_SIZE + schema_size)))
            columns = len(schema)
            position = PREFIX_SIZE + schema_size
            while position < size:
                f.seek(position)
                head = f.read(PREFIX_SIZE)
                metadata = f.read(message_prefix(head))
                header = _batch_header(metadata)
                if header is None or header.batch_size <= 0:
                    break
                entry = _batch_checksums(f, schema, head + metadata, position)
                if entry is not None:
                    entries.append(entry)
                position += header.batch_size
        except (MessageFormatError, pa.ArrowInvalid, OSError, ValueError, struct.error):
            pass  # the batches from here on are read whole
    data = _CRC_HEAD.pack(COLUMN_CRC_MAGIC, COLUMN_CRC_VERSION, columns) + b"".join(entries)
    return data + _CRC_TRAILER.pack(crc32c.crc32c(data))


def _batch_checksums(f: BinaryIO, schema: pa.Schema, message_head: bytes, position: int
                     ) -> bytes | None:
    """One sidecar entry, reading the batch body at the file's position (None: a layout this
    reader does not lay out)."""
    try:
        layout = parse_record_batch(message_head[PREFIX_SIZE:])
        plan = _plan(schema, layout)
    except UnsupportedLayoutError:
        return None
    if layout.body_length < 0:
        return None
    body = f.read(layout.body_length)
    if len(body) < layout.body_length:
        raise ValueError("the file ends inside a batch body")
    crcs = []
    for field in schema:
        crc = 0
        for spec in plan[field.name][1]:
            if spec.offset < 0 or spec.offset + spec.length > len(body):
                raise ValueError("a buffer lies outside the body")
            crc = crc32c.crc32c(body[spec.offset: spec.offset + spec.length], crc)
        crcs.append(crc)
    return _CRC_ENTRY.pack(position, crc32c.crc32c(message_head)) + \
        struct.pack(f"<{len(crcs)}I", *crcs)


def parse_column_checksums(data: bytes, columns: int) -> ColumnCrcs:
    """A ``.colcrc`` sidecar's entries by batch position; ValueError if it is damaged or
    does not fit a schema of ``columns`` top-level columns."""
    if len(data) < _CRC_HEAD.size + _CRC_TRAILER.size:
        raise ValueError(f"column checksums cut short at {len(data)} bytes")
    body, (trailer,) = data[:-_CRC_TRAILER.size], _CRC_TRAILER.unpack(data[-_CRC_TRAILER.size:])
    if crc32c.crc32c(body) != trailer:
        raise ValueError("column checksums do not match their own CRC32C")
    magic, version, count = _CRC_HEAD.unpack_from(body)
    if magic != COLUMN_CRC_MAGIC or version != COLUMN_CRC_VERSION:
        raise ValueError(f"not column checksums of version {COLUMN_CRC_VERSION}")
    entry_size = _CRC_ENTRY.size + 4 * count
    rest = len(body) - _CRC_HEAD.size
    if count != columns or rest % entry_size:
        raise ValueError(f"column checksums for {count} column(s) in {rest} bytes do not fit "
                         f"the segment's {columns} column(s)")
    out: ColumnCrcs = {}
    column_crcs = struct.Struct(f"<{count}I")
    for at in range(_CRC_HEAD.size, len(body), entry_size):
        position, metadata_crc = _CRC_ENTRY.unpack_from(body, at)
        out[position] = (metadata_crc, column_crcs.unpack_from(body, at + _CRC_ENTRY.size))
    return out


def _plan(schema: pa.Schema, layout: RecordBatchLayout
          ) -> dict[str, tuple[list[FieldNode], list[BufferSpec]]]:
    """Each top-level column's field nodes and buffers, by walking the schema in IPC order."""
    out: dict[str, tuple[list[FieldNode], list[BufferSpec]]] = {}
    node_at = buffer_at = 0
    for f in schema:
        nodes, buffers = layout_size(f.type)
        out[f.name] = (list(layout.nodes[node_at: node_at + nodes]),
                       list(layout.buffers[buffer_at: buffer_at + buffers]))
        node_at, buffer_at = node_at + nodes, buffer_at + buffers
    if (node_at, buffer_at) != (len(layout.nodes), len(layout.buffers)):
        raise MessageFormatError(f"the message has {len(layout.nodes)} field nodes and "
                                 f"{len(layout.buffers)} buffers; the schema needs {node_at} "
                                 f"and {buffer_at}")
    return out


def _coalesce(specs: list[BufferSpec], gap: int
              ) -> list[tuple[int, int, list[BufferSpec]]]:
    """Non-empty buffers grouped into (start, end, members) ranges no closer than ``gap``."""
    ranges: list[tuple[int, int, list[BufferSpec]]] = []
    for s in sorted({s for s in specs if s.length > 0}, key=lambda s: s.offset):
        if ranges and s.offset - ranges[-1][1] <= gap:
            lo, hi, members = ranges[-1]
            ranges[-1] = (lo, max(hi, s.offset + s.length), members + [s])
        else:
            ranges.append((s.offset, s.offset + s.length, [s]))
    return ranges
