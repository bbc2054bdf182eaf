"""Produced messages (logstore/produced.py): a producer's batch arrives already encoded and the
leader stores it as it came, its header written into a copy of the small metadata prefix; on
real segment files in tmp_path with a FakeClock."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from segment_helpers import keyed, make_batch, open_log, records, reopen, segment_files

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.produced import (
    BLANK_HEADER,
    encode_produced,
    max_decompressed_bytes,
    read_produced,
)
from logstore.records import (
    DEFAULT_SCHEMA,
    HEADER_KEY,
    HEADER_SIZE,
    HEADERS_TYPE,
    MAGIC,
    TIMESTAMP_TYPE,
    EncodedBatch,
    decode_message,
    iter_messages,
    schema_message_size,
    topic_schema,
)
from logstore.segments.batches import LeaderBatches


def _produced(batch: pa.RecordBatch, codec: str | None = None) -> pa.Buffer:
    return encode_produced(batch, None if codec is None else ipc.IpcWriteOptions(
        compression=codec))


def _append_both_ways(tmp_path: Path, codec: str, sent_codec: str | None,
                      batches: list[pa.RecordBatch], **config: object) -> tuple[bytes, bytes]:
    """The segment file of a log fed records, and of a log fed the same as produced
    messages (compressed with ``sent_codec``)."""
    clock = FakeClock()
    plain = open_log(tmp_path / "records", clock, compression_type=codec, **config)
    produced = open_log(tmp_path / "produced", clock, compression_type=codec, **config)
    for i, batch in enumerate(batches):
        fields = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 10 * i}
        plain.append_as_leader(batch, **fields)
        message = read_produced(_produced(batch, sent_codec), "topic-0")
        produced.append_as_leader(message, **fields)
    plain.close()
    produced.close()
    return segment_files(plain)[0].read_bytes(), segment_files(produced)[0].read_bytes()


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_produced_message_is_stored_byte_for_byte_as_the_leaders_own_encoding(
        tmp_path: Path, codec: str) -> None:
    """Goal: storing a received message as it came changes nothing a reader sees: the CRC
    covers the header the leader wrote, offsets are assigned, recovery validates it.
    Method: the same batches appended as records to one log and as produced messages (in the
    topic's codec) to another; the two segment files must be identical byte for byte, and the
    produced log reopened after an unclean stop must keep every record."""
    clock = FakeClock()
    batches = [keyed(10 * i, 10, clock) for i in range(3)]
    sent = None if codec == "none" else codec
    plain, produced = _append_both_ways(tmp_path, codec, sent, batches)
    assert plain == produced
    log = reopen(open_log(tmp_path / "produced", clock, compression_type=codec), clock,
                 clean=False)
    assert [o for o, _, _ in records(log)] == list(range(30))


@pytest.mark.parametrize("codec, sent, config", [
    ("none", "zstd", {}),
    ("zstd", None, {}),
    ("lz4", "zstd", {}),
    ("none", None, {"message_timestamp_type": "LogAppendTime"}),
], ids=["decompressed", "compressed", "other-codec", "log-append-time"])
def test_produced_message_the_topic_would_store_otherwise_is_encoded_again(
        tmp_path: Path, codec: str, sent: str | None, config: dict[str, object]) -> None:
    """Goal: a message in another codec than the topic's, or one whose timestamps the leader
    must rewrite, is stored exactly as the same records sent as records would be.
    Method: segment files of both ways compared byte for byte."""
    batches = [keyed(10 * i, 10, FakeClock()) for i in range(2)]
    plain, produced = _append_both_ways(tmp_path, codec, sent, batches, **config)
    assert plain == produced


def test_null_timestamps_in_a_produced_message_become_the_append_time(tmp_path: Path) -> None:
    """Goal: a produced message with null timestamps is not stored as it came (the leader fills
    them). Method: append one with a null timestamp; read back the append time."""
    clock = FakeClock(start_ms=50_000)
    log = open_log(tmp_path, clock)
    log.append_as_leader(read_produced(_produced(make_batch([b"a", b"b"], timestamps=[10, None])),
                                       "topic-0"))
    stamps = log.read(0, 1 << 20).batches[0].record_batch(log.schema).column("timestamp")
    assert stamps.cast(pa.int64()).to_pylist() == [10, 50_000]


def test_sealing_copies_only_the_prefix_and_keeps_the_received_body(tmp_path: Path) -> None:
    """Goal: the one-copy claim: the body the leader writes is the received buffer itself.
    Method: seal a produced message through LeaderBatches and compare buffer addresses; the
    copied prefix must stay under a kilobyte (its size depends on the columns, not the rows)."""
    batch = keyed(0, 1000)
    data = _produced(batch)
    encoder = LeaderBatches("topic-0", DEFAULT_SCHEMA, TopicConfig())
    sealed, _ = encoder.producer_batch(read_produced(data, "topic-0"), 1, 0, -1, -1, -1, 0)
    assert isinstance(sealed, EncodedBatch)
    assert sealed.body.address == data.address + len(sealed.prefix)
    assert len(sealed.prefix) < 1024 and len(sealed) == data.size
    header = decode_message(ipc.read_message(pa.py_buffer(
        bytes(sealed.prefix) + sealed.body.to_pybytes())), verify=True).header
    assert (header.record_count, header.batch_size) == (1000, data.size)


def _with_metadata(batch: pa.RecordBatch, metadata: dict[bytes, bytes]) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    ipc.new_stream(sink, batch.schema).write_batch(batch, custom_metadata=metadata)
    return sink.getvalue().slice(schema_message_size(batch.schema))


def _malformed(kind: str) -> pa.Buffer:
    batch = keyed(0, 3)
    good = _produced(batch)
    return {
        "truncated": good.slice(0, good.size - 8),
        "trailing-bytes": pa.py_buffer(good.to_pybytes() + b"\0" * 8),
        "no-header": _with_metadata(batch, {b"other": b"x"}),
        "second-entry": _with_metadata(batch, {HEADER_KEY: BLANK_HEADER, b"x": MAGIC}),
        "no-magic": _with_metadata(batch, {HEADER_KEY: b"\0" * HEADER_SIZE}),
        "not-a-message": pa.py_buffer(b"\xff" * 40),
        "schema-message": pa.py_buffer(DEFAULT_SCHEMA.serialize().to_pybytes()),
        "other-schema": _produced(pa.record_batch({"x": pa.array([1, 2, 3])})),
        "bad-length": pa.py_buffer(struct.pack("<Ii", 0xFFFFFFFF, -5) + b"\0" * 16),
    }[kind]


@pytest.mark.parametrize("kind", ["truncated", "trailing-bytes", "no-header", "second-entry",
                                  "no-magic", "not-a-message", "schema-message",
                                  "other-schema", "bad-length"])
def test_malformed_produced_messages_are_corrupt_message_naming_the_partition(
        tmp_path: Path, kind: str) -> None:
    """Goal: a received message the leader cannot store as it is gets CORRUPT_MESSAGE naming
    the partition, and nothing is appended. Method: one malformed message of each kind."""
    log = open_log(tmp_path, FakeClock())
    with pytest.raises(errors.CorruptRecordError, match="topic-0"):
        log.append_as_leader(read_produced(_malformed(kind), "topic-0"))
    assert log.log_end_offset == 0
    data = segment_files(log)[0].read_bytes()[schema_message_size(DEFAULT_SCHEMA):]
    assert list(iter_messages(pa.py_buffer(data))) == []


def _with_column(batch: pa.RecordBatch, name: str, column: pa.Array) -> pa.RecordBatch:
    i = batch.schema.get_field_index(name)
    return pa.RecordBatch.from_arrays(
        [column if j == i else c for j, c in enumerate(batch.columns)], schema=batch.schema)


def _invalid_arrays(kind: str) -> tuple[pa.RecordBatch, str]:
    """A two-record batch that passes Arrow's cheap validation and fails its full one, and the
    column at fault."""
    def offsets(*values: int) -> pa.Buffer:
        return pa.py_buffer(struct.pack(f"<{len(values)}i", *values))
    if kind == "unordered-offsets":
        value = pa.Array.from_buffers(pa.binary(), 2, [None, offsets(0, 5, 2),
                                                       pa.py_buffer(b"abcdef")])
        return _with_column(keyed(0, 2), "value", value), "value"
    if kind == "string-not-utf8":
        schema = topic_schema(pa.schema([("s", pa.string())]))
        s = pa.Array.from_buffers(pa.string(), 2, [None, offsets(0, 1, 2), pa.py_buffer(b"a\xff")])
        return pa.RecordBatch.from_arrays([pa.nulls(2, pa.binary()), s, pa.array(
            [1, 2], pa.int64()).cast(TIMESTAMP_TYPE), pa.nulls(2, HEADERS_TYPE)],
            schema=schema), "s"
    assert kind == "header-key-not-utf8"
    key = pa.Array.from_buffers(pa.string(), 1, [None, offsets(0, 2), pa.py_buffer(b"\xff\xfe")])
    header = pa.StructArray.from_arrays([key, pa.array([b"x"])],
                                        fields=list(HEADERS_TYPE.value_type))
    headers = pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()), header,
                                       type=HEADERS_TYPE)
    return _with_column(keyed(0, 2), "headers", headers), "headers"


@pytest.mark.parametrize("codec", [None, "lz4", "zstd"])
@pytest.mark.parametrize("kind", ["unordered-offsets", "string-not-utf8",
                                  "header-key-not-utf8"])
def test_produced_arrays_failing_full_validation_are_corrupt_message(
        tmp_path: Path, kind: str, codec: str | None) -> None:
    """Goal: what Arrow's cheap validation misses (offsets out of order, strings that are not
    UTF-8, nested ones too) is CORRUPT_MESSAGE naming the partition and the column, whether
    the body came compressed or not, and nothing is appended: stored, it would fail every
    reader of the partition. Method: append each hostile batch as a produced message, then a
    good one, which lands at offset 0 and reads back under full validation."""
    batch, column = _invalid_arrays(kind)
    log = open_log(tmp_path, FakeClock(), schema=batch.schema)
    with pytest.raises(errors.CorruptRecordError, match=f"topic-0.*{column!r}"):
        log.append_as_leader(read_produced(_produced(batch, codec), "topic-0"))
    assert log.log_end_offset == 0
    good = _with_column(batch.slice(0, 1), column, pa.nulls(1, batch.schema.field(column).type))
    log.append_as_leader(read_produced(_produced(good, codec), "topic-0"))
    stored = log.read(0, 1 << 20).batches
    assert len(stored) == 1 and stored[0].header.base_offset == 0
    stored[0].record_batch(batch.schema).validate(full=True)


def test_produced_typed_and_oversized_messages_follow_the_topics_rules(tmp_path: Path) -> None:
    """Goal: the usual per-batch rules hold for produced messages: a typed topic's columns,
    MESSAGE_TOO_LARGE against max_message_bytes on the stored size, empty batches refused.
    Method: append each kind to a log."""
    schema = topic_schema(pa.schema([("n", pa.int32())]))
    typed = open_log(tmp_path / "typed", FakeClock(), schema=schema)
    batch = pa.RecordBatch.from_pylist([{"key": b"k", "n": 1, "timestamp": 5, "headers": None}],
                                       schema=schema)
    typed.append_as_leader(read_produced(_produced(batch), "typed-0"))
    assert typed.read(0, 1 << 20).batches[0].record_batch(schema).equals(batch)
    small = open_log(tmp_path / "small", FakeClock(), max_message_bytes=5_000)
    with pytest.raises(errors.MessageTooLargeError, match="topic-0.*bytes.*5000"):
        small.append_as_leader(read_produced(_produced(keyed(0, 100)), "topic-0"))
    with pytest.raises(errors.InvalidRecordError, match="empty"):
        small.append_as_leader(read_produced(_produced(keyed(0, 0)), "topic-0"))


def test_a_compressed_batch_declaring_too_much_decompressed_is_refused_before_decoding(
        ) -> None:
    """Goal: a small compressed batch of repetitive values cannot make the leader allocate
    what it decompresses to: the body's declared decompressed size is read without
    decompressing, and a batch past max_message_bytes (a topic that stores batches
    uncompressed) or past max_decompressed_bytes (a compressed topic) is MESSAGE_TOO_LARGE
    naming the partition; the declared size is the body's real one. Method: 20,000 identical
    1 KB values (20 MB, a few kilobytes in zstd) through LeaderBatches of both topics, and a
    small batch that fits."""
    big = make_batch([b"k"] * 20_000, [b"v" * 1000] * 20_000)
    small = make_batch([b"k"] * 10)
    for codec in ("lz4", "zstd"):
        message = read_produced(_produced(big, codec), "topic-0")
        assert message.size < 1 << 20  # compressed, it fits the limit
        decompressed = message.decompressed_size("topic-0")
        plain = read_produced(_produced(big), "topic-0")
        assert abs(decompressed - plain.decompressed_size("topic-0")) < 256  # padding
        for topic_codec, limit in (("none", 1 << 20), (codec, max_decompressed_bytes(1 << 20))):
            leader = LeaderBatches("topic-0", DEFAULT_SCHEMA, TopicConfig(
                compression_type=topic_codec, max_message_bytes=1 << 20))
            with pytest.raises(errors.MessageTooLargeError,
                               match=f"topic-0: a {codec} batch .* decompresses to "
                                     f"{decompressed} bytes, more than {limit}"):
                leader.producer_batch(message, 1, 0, -1, -1, -1, 0)
            leader.producer_batch(read_produced(_produced(small, codec), "topic-0"),
                                  1, 0, -1, -1, -1, 0)
