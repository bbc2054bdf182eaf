"""The producer's split rule (logstore/client/pieces.py): pieces cover a partition's records in
order, each one measured as the message sent and within the limit whatever the row widths and
the codecs; pure logic, checked with hypothesis over real encodings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.client.pieces import (
    by_partition,
    check_record_sizes,
    cut,
    piece_limits,
    stored_size,
    uncompressed_size,
    windows,
)
from logstore.errors import MessageTooLargeError
from logstore.model import TopicPartition
from logstore.produced import encode_produced, read_produced
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE

TP = TopicPartition("t", 3)
CODECS = ["none", "lz4", "zstd"]


def _batch(widths: list[int], seed: int, compressible: bool) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    total = int(sum(widths))
    data = (np.zeros(total, np.uint8) if compressible else
            rng.integers(0, 256, total, dtype=np.uint8))
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    n = len(widths)
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                    pa.py_buffer(data)])
    return pa.record_batch([pa.nulls(n, pa.binary()), values,
                            pa.array(np.arange(n, dtype=np.int64)).cast(TIMESTAMP_TYPE),
                            pa.nulls(n, DEFAULT_SCHEMA.field("headers").type)],
                           schema=DEFAULT_SCHEMA)


@settings(max_examples=60, deadline=None)
@given(widths=st.lists(st.integers(0, 6000), min_size=1, max_size=300), seed=st.integers(0, 9),
       compressible=st.booleans(), topic_codec=st.sampled_from(CODECS),
       producer_codec=st.sampled_from([None, "lz4", "zstd"]),
       target=st.integers(2_000, 40_000))
def test_pieces_cover_the_rows_in_order_and_each_fits_what_the_leader_checks(
        widths: list[int], seed: int, compressible: bool, topic_codec: str,
        producer_codec: str | None, target: int) -> None:
    """Goal: the split rule: pieces are consecutive and cover every row once; every piece is
    the message sent (it decodes to exactly its rows) and its size as the leader will count it
    is within the limit; a piece of more than one record is within the target; only a single
    record over the limit is refused. Method: random row widths (up to 6000 bytes against
    limits from 4000), random or zero bytes, every topic/producer codec pair."""
    batch = _batch(widths, seed, compressible)
    limits = piece_limits(target, 2 * target, target + 2_000, producer_codec, topic_codec)
    expected_codec = producer_codec if topic_codec == "none" else topic_codec
    start = 0
    for lo, hi, message in cut(TP, batch, limits):
        assert lo == start and hi > lo
        start = hi
        piece = batch.slice(lo, hi - lo)
        if isinstance(message, MessageTooLargeError):
            assert hi - lo == 1
            assert stored_size(piece, encode_produced(piece, limits.options), limits) > \
                limits.limit
            assert f"{TP}" in str(message) and f"row {lo}" in str(message)
            continue
        produced = read_produced(message, str(TP))
        assert produced.codec == expected_codec
        assert produced.record_batch(DEFAULT_SCHEMA, str(TP)).equals(piece)
        size = stored_size(piece, message, limits)
        assert size <= limits.limit
        assert hi - lo == 1 or size <= limits.target
    assert start == batch.num_rows


def test_a_topic_that_stores_uncompressed_sizes_pieces_by_their_uncompressed_encoding() -> None:
    """Goal: when the leader will decompress (topic ``none``, producer zstd), a piece fits
    uncompressed though it travels compressed. Method: highly compressible rows; every
    piece's uncompressed encoding is within the target and pieces are many."""
    batch = _batch([1000] * 400, 0, compressible=True)
    limits = piece_limits(50_000, 100_000, 100_000, "zstd", "none")
    pieces = list(cut(TP, batch, limits))
    assert len(pieces) >= 8
    for lo, hi, message in pieces:
        assert isinstance(message, pa.Buffer) and message.size < 10_000
        assert uncompressed_size(batch.slice(lo, hi - lo)) <= 50_000


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_compressed_topics_pieces_hold_at_most_what_the_leader_decompresses(
        codec: str) -> None:
    """Goal: on a compressed topic a piece is sized by its compressed bytes, and repetitive
    rows compress so well that such a piece could hold gigabytes; each piece must also stay
    within ``max_decompressed_bytes`` of the limit uncompressed, which the leader checks
    before decompressing. Method: 4 MB of zeros, a 20 KB limit (so 160 KB decompressed);
    the leader's reading of every piece's declared size."""
    batch = _batch([1000] * 4000, 0, compressible=True)
    limits = piece_limits(20_000, 20_000, 20_000, None, codec)
    pieces = list(cut(TP, batch, limits))
    assert sum(hi - lo for lo, hi, _ in pieces) == batch.num_rows
    for _, _, message in pieces:
        assert isinstance(message, pa.Buffer)
        assert read_produced(message, "t-3").decompressed_size("t-3") <= \
            limits.decompressed_limit


def test_limit_is_the_smaller_of_max_request_size_and_the_topics_max_message_bytes() -> None:
    """Goal: the limit named in the error is the setting that binds. Method: both orders."""
    assert piece_limits(10, 100, 50, None, "none").limit_reason == \
        "the topic's max_message_bytes 50"
    assert piece_limits(10, 40, 50, None, "none").limit_reason == \
        "the producer's max_request_size 40"


def test_oversized_record_is_found_before_encoding_and_named() -> None:
    """Goal: a record whose values alone pass the limit is refused before anything is cut.
    Method: a table whose third chunk holds one 60 kB value against a 50 kB limit."""
    small = _batch([10] * 5, 0, True)
    big = _batch([10, 60_000], 0, True)
    limits = piece_limits(50_000, 50_000, 50_000, None, "none")
    with pytest.raises(MessageTooLargeError, match=r"send_batch to t: the record at row 11 "
                                                   r"holds 60000 bytes.*50000"):
        check_record_sizes("send_batch to t", pa.Table.from_batches([small, small, big]),
                           limits)
    check_record_sizes("send_batch to t", small, limits)


def test_windows_keep_order_and_bound_the_rows_materialised_at_once() -> None:
    """Goal: a table is streamed in windows of about the asked size, in row order: large
    chunks sliced, small ones combined. Method: chunks of 1 row and of 10k rows."""
    chunks = [_batch([100] * n, 0, True) for n in (1, 1, 1, 10_000, 1, 3)]
    table = pa.Table.from_batches(chunks)
    out = list(windows(table, 200_000))
    assert pa.Table.from_batches(out).equals(table.combine_chunks())
    assert all(w.nbytes <= 2 * 200_000 for w in out) and len(out) >= 5
    assert [w.num_rows for w in windows(table.slice(0, 0), 1000)] == [0]


def test_by_partition_keeps_record_order_within_each_partition() -> None:
    """Goal: rows grouped per partition stay in record order. Method: a small example."""
    groups = by_partition(np.array([2, 0, 2, 1, 0], dtype=np.int32))
    assert [(p, rows.tolist()) for p, rows in groups] == [(0, [1, 4]), (1, [3]), (2, [0, 2])]
    assert by_partition(np.array([], dtype=np.int32)) == []


def test_blank_header_message_is_what_encode_produced_sends() -> None:
    """Goal: what the producer sends reads back as a produced message of its rows. Method:
    encode and read one."""
    batch = _batch([5, 6, 7], 1, False)
    produced = read_produced(encode_produced(batch), "t-0")
    assert (produced.rows, produced.codec) == (3, None)
    assert produced.record_batch(DEFAULT_SCHEMA, "t-0").equals(batch)
