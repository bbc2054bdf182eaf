"""Cutting a producer's records into pieces the partition leader accepts.

Owns: the split rule, the codec pieces are encoded with, and the record-too-large error. Must
not: do I/O, queue or send pieces (``producer.py`` and ``sender.py`` do).

The split rule. Each piece is one partition's consecutive records, encoded as the exact message
the producer sends (``produced.encode_produced``) and measured, never estimated: the leader
stores that message as it came, so what the producer measured is what the leader checks
against the topic's ``max_message_bytes``. A piece's size is the larger of the message and what
the leader will store in its place:

| topic codec | producer codec | encoded with   | size checked                        | leader stores   |
|-------------|----------------|----------------|-------------------------------------|-----------------|
| none        | none           | none           | the message                         | the message     |
| none        | lz4 / zstd     | the producer's | the message and the uncompressed    | re-encoded,     |
|             |                |                | encoding (``uncompressed_size``)     | uncompressed    |
| lz4 / zstd  | any            | the topic's    | the message + ``RECOMPRESS_MARGIN`` | the message     |

(The margin covers a LogAppendTime topic, whose leader sets every timestamp to the append
time and compresses again: the other buffers compress to the same bytes, and equal timestamps
to no more than the producer's, give or take a frame header.) A compressed piece also holds
at most ``produced.max_decompressed_bytes(limit)`` uncompressed, which the leader checks
before it decompresses anything: repetitive values compress so well that a piece sized by
its compressed bytes alone could hold gigabytes. Pieces aim at ``target`` bytes
(``batch_size`` for records gathered by ``send()``, the limit for ``send_batch``) and never
pass ``limit`` (the smaller of ``max_request_size`` and the topic's ``max_message_bytes``).
Rows per piece start from the uncompressed size (a batch far below the target is first tried
whole) and follow what each encoded piece measured; a piece over the target is cut again
before it is sent, and a single record over the limit is the only error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from logstore.errors import MessageTooLargeError
from logstore.model import TopicPartition
from logstore.produced import encode_produced, max_decompressed_bytes
from logstore.records import null_column

RECOMPRESS_MARGIN = 64
_FILL = 0.9  # rows are guessed for this share of the target, so most guesses fit
_SMALL_SLACK = 4096  # more than the framing of a small batch's message


@dataclass(frozen=True, slots=True)
class PieceLimits:
    target: int
    limit: int
    limit_reason: str  # which setting the limit comes from, for the error
    codec: str | None
    leader_decompresses: bool  # the topic stores uncompressed what arrives compressed

    @property
    def options(self) -> ipc.IpcWriteOptions | None:
        return _write_options(self.codec)

    @property
    def decompressed_limit(self) -> int:
        """The most a compressed piece may hold uncompressed (the leader's check)."""
        return max_decompressed_bytes(self.limit)


@lru_cache(maxsize=4)
def _write_options(codec: str | None) -> ipc.IpcWriteOptions | None:
    return None if codec is None else ipc.IpcWriteOptions(compression=codec)


def piece_limits(target: int, max_request_size: int, max_message_bytes: int,
                 producer_codec: str | None, topic_codec: str) -> PieceLimits:
    """The limits of pieces for one topic (module docstring's table)."""
    if max_message_bytes < max_request_size:
        limit, reason = max_message_bytes, f"the topic's max_message_bytes {max_message_bytes}"
    else:
        limit, reason = max_request_size, f"the producer's max_request_size {max_request_size}"
    stored_codec = None if topic_codec == "none" else topic_codec
    codec = stored_codec or producer_codec
    return PieceLimits(min(target, limit), limit, reason, codec,
                       stored_codec is None and codec is not None)


def uncompressed_size(batch: pa.RecordBatch) -> int:
    """Bytes of ``batch``'s uncompressed message with its header, computed without encoding."""
    return int(ipc.get_record_batch_size(batch)) + _header_metadata_bytes(batch.schema)


@lru_cache(maxsize=64)
def _header_metadata_bytes(schema: pa.Schema) -> int:
    empty = schema.empty_table().to_batches() or [pa.RecordBatch.from_pylist([], schema)]
    return int(encode_produced(empty[0]).size - ipc.get_record_batch_size(empty[0]))


def stored_size(piece: pa.RecordBatch, message: pa.Buffer, limits: PieceLimits) -> int:
    """The size a piece counts for (module docstring's table)."""
    if limits.leader_decompresses:
        return max(int(message.size), uncompressed_size(piece))
    return int(message.size) + (RECOMPRESS_MARGIN if limits.codec else 0)


def cut(tp: TopicPartition, batch: pa.RecordBatch, limits: PieceLimits
        ) -> Iterator[tuple[int, int, pa.Buffer | MessageTooLargeError]]:
    """(first row, end row, message) of each piece of ``batch`` (one partition's records),
    in order; a record over the limit comes alone, with the MessageTooLargeError (naming the
    partition, the row and its size) in place of its message, and the cutting goes on."""
    n, lo = batch.num_rows, 0
    # The first guess: a batch far below the target is taken whole without sizing its
    # encoding first (the message is measured anyway); a larger one from its encoded size.
    small = 2 * batch.nbytes + _SMALL_SLACK
    per_row = (small if small <= limits.target else uncompressed_size(batch)) / max(n, 1)
    while lo < n:
        hi = lo + _rows_for(n - lo, per_row, limits.target)
        piece = _compact(batch.slice(lo, hi - lo))
        raw = uncompressed_size(piece) if limits.codec is not None else 0
        while raw > limits.decompressed_limit and hi - lo > 1:  # fewer rows, in proportion
            hi = lo + max(1, int((hi - lo) * limits.decompressed_limit * _FILL / raw))
            piece = _compact(batch.slice(lo, hi - lo))
            raw = uncompressed_size(piece)
        message = encode_produced(piece, limits.options)
        size = stored_size(piece, message, limits)
        if size > limits.target and hi - lo > 1:
            per_row = max(per_row * 1.25, size / (hi - lo))  # guessed short: cut it again
            continue
        if size > limits.limit:
            yield lo, hi, MessageTooLargeError(
                f"topic-partition {tp}: the record at row {lo} of the batch is {size} bytes "
                f"encoded, more than the limit {limits.limit} ({limits.limit_reason})")
        else:
            yield lo, hi, message
        per_row, lo = size / (hi - lo), hi


def _compact(piece: pa.RecordBatch) -> pa.RecordBatch:
    """``piece`` with its all-null list columns rebuilt with empty children: IPC writes a
    slice of one made by ``pa.nulls`` as large as the whole (``records.null_column``)."""
    for i, column in enumerate(piece.columns):
        if (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) and \
                column.null_count == len(column) and len(column.values):
            piece = piece.set_column(i, piece.schema.field(i), null_column(len(column),
                                                                           column.type))
    return piece


def _rows_for(remaining: int, per_row: float, target: int) -> int:
    """Rows for the next piece: the rest split evenly into as few pieces as fit the target."""
    if remaining * per_row <= target:
        return remaining
    pieces = math.ceil(remaining * per_row / (target * _FILL))
    return max(1, math.ceil(remaining / pieces))


def oversized_row(batch: pa.RecordBatch, limit: int) -> tuple[int, int] | None:
    """(row, bytes) of the first record whose binary and string values alone pass ``limit``
    (a lower bound of its encoded size, found without encoding anything), or None."""
    columns = [offsets for offsets in map(_value_offsets, batch.columns) if offsets is not None]
    if sum(int(offsets[-1] - offsets[0]) for offsets in columns) <= limit:
        return None  # all the values together fit: no record can pass (the common case)
    sizes = np.zeros(batch.num_rows, dtype=np.int64)
    for offsets in columns:
        sizes += np.diff(offsets)
    over = np.flatnonzero(sizes > limit)
    return None if not len(over) else (int(over[0]), int(sizes[over[0]]))


def _value_offsets(column: pa.Array) -> np.ndarray | None:
    """The offsets of a binary or string column's values (one more than its rows), else None."""
    t = column.type
    width: np.dtype[Any]
    if pa.types.is_binary(t) or pa.types.is_string(t):
        width = np.dtype(np.int32)
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        width = np.dtype(np.int64)
    else:
        return None
    if column.buffers()[1] is None:
        return None
    return np.frombuffer(column.buffers()[1], dtype=width, count=len(column) + 1,
                         offset=column.offset * width.itemsize)


def by_partition(parts: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(partition, row indices in record order) for each partition ``parts`` names."""
    if not len(parts):
        return []
    first = parts[0]
    if (parts == first).all():  # the common case (a small chunk, sticky or named partition)
        return [(int(first), np.arange(len(parts)))]
    order = np.argsort(parts, kind="stable")
    bounds = np.flatnonzero(np.diff(parts[order])) + 1
    return [(int(parts[rows[0]]), rows) for rows in np.split(order, bounds)]


def windows(data: pa.Table | pa.RecordBatch, window_bytes: int) -> Iterator[pa.RecordBatch]:
    """``data`` as batches of about ``window_bytes`` each, in order: a large chunk is sliced
    (no copy), small consecutive chunks are combined (one copy of at most a window)."""
    if isinstance(data, pa.RecordBatch) and data.num_rows and data.nbytes <= window_bytes:
        yield data  # the common case: one batch that fits a window
        return
    group: list[pa.RecordBatch] = []
    size = 0
    for chunk in data.to_batches() if isinstance(data, pa.Table) else [data]:
        rows = max(1, int(chunk.num_rows * window_bytes / max(chunk.nbytes, 1)))
        for lo in range(0, chunk.num_rows, rows):
            piece = chunk.slice(lo, rows)
            if group and size + piece.nbytes > window_bytes:
                yield _combined(group)
                group, size = [], 0
            group.append(piece)
            size += piece.nbytes
    if group or data.num_rows == 0:
        yield _combined(group) if group else pa.RecordBatch.from_pylist([], schema=data.schema)


def _combined(group: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(group) == 1:
        return group[0]
    return pa.Table.from_batches(group).combine_chunks().to_batches()[0]


def check_record_sizes(where: str, data: pa.Table | pa.RecordBatch, limits: PieceLimits
                       ) -> None:
    """MESSAGE_TOO_LARGE before anything is sent, for a record whose binary values alone
    pass the limit."""
    start = 0
    for chunk in data.to_batches() if isinstance(data, pa.Table) else [data]:
        over = oversized_row(chunk, limits.limit)
        if over is not None:
            raise MessageTooLargeError(
                f"{where}: the record at row {start + over[0]} holds {over[1]} "
                f"bytes, more than the limit {limits.limit} ({limits.limit_reason}); nothing "
                "was sent")
        start += chunk.num_rows
