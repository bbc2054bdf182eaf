"""A producer's batch as the encoded message it sent, checked and then stored as it came.

Owns: encoding a producer batch as the message it sends (``encode_produced``), reading a
received one (``read_produced``): its framing, its custom metadata, its codec and its records
(decoded zero-copy, for checking), and sealing it as the stored message (``seal``). Must not:
do I/O, or decide what the header says (the log does: offsets, producer fields, timestamps).

On a produce stream that declares ``messages`` each batch is one row of
``records.STORED_MESSAGE_SCHEMA`` holding one encapsulated IPC record-batch message of the
topic's schema, compressed with the codec the producer chose:

| part          | bytes                 | what the broker checks                                  |
|---------------|-----------------------|---------------------------------------------------------|
| continuation  | 4                     | 0xFFFFFFFF                                              |
| metadata size | 4                     | > 0; prefix = 8 + metadata size                         |
| metadata      | metadata size         | a RecordBatch Message whose custom metadata is exactly  |
|               |                       | one entry: ``logstore.batch`` -> a blank 66-byte header |
|               |                       | (magic first, the magic nowhere else, no offset deltas) |
| body          | Message.bodyLength    | prefix + body length = the row's bytes, exactly; the    |
|               |                       | records decode under the topic's schema and pass full   |
|               |                       | validation (offsets, UTF-8), compressed or not; a       |
|               |                       | compressed body declares at most                        |
|               |                       | ``max_decompressed_bytes`` before it is decompressed    |

The header's fields are the broker's to write: ``seal`` copies the prefix (a few hundred
bytes), writes the header into the copy and computes the CRC32C over its fields and the body
as received; the log writes the prefix and the body back to back. The body is read twice (the
zero-copy decode's checks, the CRC) and copied once, into the segment file.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.arrow_message import (
    MessageFormatError,
    custom_metadata,
    message_prefix,
    message_summary,
    parse_record_batch,
)
from logstore.errors import CorruptRecordError
from logstore.records import (
    DELTAS_MAGIC,
    HEADER_KEY,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    EncodedBatch,
    ipc_message,
    seal_batch,
)

BLANK_HEADER = BatchHeader(0, 0, 0, 0, 0).pack()
_PREFIX_SIZE = 8
# A compressed batch decompresses to at most this many times the topic's max_message_bytes
# (64 MiB at the default 8 MiB). Brokers decompress each produced batch whole to check it,
# and consumers and Spark tasks each batch they read: without a bound, a small batch of
# repetitive values could make any of them allocate gigabytes. Producers cut their pieces
# to fit it (``client/pieces.py``).
DECOMPRESSED_FACTOR = 8


def max_decompressed_bytes(max_message_bytes: int) -> int:
    """The most a compressed batch's body may declare, decompressed."""
    return DECOMPRESSED_FACTOR * max_message_bytes


def encode_produced(batch: pa.RecordBatch, options: ipc.IpcWriteOptions | None = None
                    ) -> pa.Buffer:
    """What a producer sends for ``batch`` (already in the topic's schema): its IPC message
    with a blank batch header, compressed as ``options`` say. One copy of the data."""
    return pa.py_buffer(ipc_message(batch, {HEADER_KEY: BLANK_HEADER}, options))


@dataclass(frozen=True, slots=True)
class ProducedMessage:
    """A received producer batch, its framing checked (``read_produced``)."""

    data: pa.Buffer
    prefix_size: int  # continuation, metadata size and the flatbuffer
    header_at: int  # where the blank header lies, from the start of the message
    rows: int
    codec: str | None  # the body's compression: None, "lz4" or "zstd"

    @property
    def size(self) -> int:
        return int(self.data.size)

    def record_batch(self, schema: pa.Schema, where: str) -> pa.RecordBatch:
        """The records under ``schema``: zero-copy unless compressed (then checked as
        decompressed); CorruptRecordError when the body does not hold valid arrays of that
        schema."""
        try:
            batch = ipc.read_record_batch(ipc.read_message(self.data), schema)
            batch.validate()
        except (pa.ArrowException, ValueError, OSError) as e:
            raise CorruptRecordError(f"{where}: produced batch does not decode under the "
                                     f"topic's schema: {str(e).splitlines()[0]}") from None
        check_values(batch, where)
        return batch

    def decompressed_size(self, where: str) -> int:
        """The body's bytes once decompressed, as its buffers declare them (each compressed
        buffer starts with its length decompressed, -1 when stored as it is), read without
        decompressing anything; the body's size when it is not compressed."""
        if self.codec is None:
            return self.size - self.prefix_size
        try:
            layout = parse_record_batch(self.data[_PREFIX_SIZE: self.prefix_size].to_pybytes())
        except MessageFormatError as e:
            raise CorruptRecordError(f"{where}: produced batch is not an encoded batch "
                                     f"message: {e}") from None
        body = memoryview(self.data.slice(self.prefix_size))
        total = 0
        for spec in layout.buffers:
            if spec.length == 0:
                continue
            if spec.length < 8 or spec.offset < 0 or spec.offset + spec.length > len(body):
                raise CorruptRecordError(f"{where}: produced batch has a compressed buffer "
                                         f"of {spec.length} bytes at {spec.offset}, outside "
                                         f"its body of {len(body)}")
            declared = int.from_bytes(body[spec.offset: spec.offset + 8], "little",
                                      signed=True)
            total += spec.length - 8 if declared == -1 else max(declared, 0)
        return total

    def seal(self, header: BatchHeader) -> EncodedBatch:
        """The stored message: the header (size and CRC computed here) in a copy of the
        prefix, beside the body as received."""
        prefix = bytearray(self.data[: self.prefix_size])
        return seal_batch(prefix, self.header_at, self.data.slice(self.prefix_size), header)


def check_values(batch: pa.RecordBatch, where: str) -> None:
    """CorruptRecordError naming ``where`` and the column unless ``batch`` passes Arrow's full
    validation. The cheap check reads only buffer sizes and the first and last offsets;
    offsets out of order or out of bounds, or a string that is not UTF-8 (nested ones too,
    as a header's key), would be stored as they came and fail every reader of the partition.
    It reads each offset and string byte once: 10k rows of the default schema (1.2 MB) in
    some 16 us, under 2% of receiving and appending them; fixed-width columns cost nothing.
    The columns are looked at one by one only to name the bad one."""
    try:
        batch.validate(full=True)
    except pa.ArrowException as e:
        problem = str(e)
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            try:
                column.validate(full=True)
            except pa.ArrowException as c:
                problem = f"column {name!r}: {c}"
                break
        raise CorruptRecordError(f"{where}: produced batch holds invalid data in "
                                 f"{problem.splitlines()[0]}") from None


# What a leader's log appends for a producer: records, or the message they came in.
ProducerData = pa.RecordBatch | ProducedMessage


def read_produced(data: pa.Buffer, where: str) -> ProducedMessage:
    """Check the framing of a received produced batch (module docstring); CorruptRecordError
    naming ``where`` otherwise."""
    try:
        metadata_size = message_prefix(data[:_PREFIX_SIZE].to_pybytes())
        prefix_size = _PREFIX_SIZE + metadata_size
        metadata = data[_PREFIX_SIZE: prefix_size].to_pybytes()
        rows, codec, body_size = message_summary(metadata)
        if prefix_size + body_size != data.size or len(metadata) != metadata_size:
            raise MessageFormatError(f"message of {data.size} bytes, but its metadata says "
                                     f"{prefix_size} + a body of {body_size}")
        header_at = _PREFIX_SIZE + _blank_header_at(metadata)
    except MessageFormatError as e:
        raise CorruptRecordError(f"{where}: produced batch is not an encoded batch message: "
                                 f"{e}") from None
    return ProducedMessage(data, prefix_size, header_at, rows, codec)


def _blank_header_at(metadata: bytes) -> int:
    """Where the header's value lies in ``metadata``: the one custom-metadata entry."""
    entries = custom_metadata(metadata)
    if len(entries) != 1 or entries[0].key != HEADER_KEY or \
            entries[0].value_length != HEADER_SIZE:
        raise MessageFormatError(f"custom metadata must be exactly one {HEADER_KEY!r} entry "
                                 f"of {HEADER_SIZE} bytes, found {[e.key for e in entries]}")
    at = entries[0].value_at
    # Readers find the header by its magic: it must come first there and nowhere else.
    if metadata.find(MAGIC) != at or metadata.find(MAGIC, at + 1) >= 0 or \
            DELTAS_MAGIC in metadata:
        raise MessageFormatError("the batch header's magic is missing or repeated")
    return at
