"""Produced batches whose arrays pass Arrow's cheap validation but not its full one: binary
offsets out of order, a header key that is not UTF-8. The broker acknowledged both and stored
them as they came, after which no consumer could read the partition, not even the good records
written after them. Raw produce streams (rpc BrokerConnection.open_produce) of encoded batches,
as the producer sends them, against a real broker process."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import ErrorCode
from logstore.messages.produce import ProduceAck, ProduceBatchMetadata, ProduceRequest
from logstore.produced import encode_produced
from logstore.records import (
    DEFAULT_SCHEMA,
    HEADERS_TYPE,
    STORED_MESSAGE_SCHEMA,
    TIMESTAMP_TYPE,
    message_batch,
    null_column,
)
from tests.brokers import raw_produce


def _offsets(*offsets: int) -> pa.Buffer:
    return pa.py_buffer(np.array(offsets, dtype="<i4").tobytes())


def _batch(value: pa.Array | None = None, headers: pa.Array | None = None) -> pa.RecordBatch:
    """Two records of the default schema, with ``value`` or ``headers`` swapped in."""
    return pa.RecordBatch.from_arrays([
        pa.array([b"k", b"k2"], pa.binary()),
        value if value is not None else pa.array([b"v", b"v2"], pa.binary()),
        pa.array([int(time.time() * 1000)] * 2, pa.int64()).view(TIMESTAMP_TYPE),
        headers if headers is not None else null_column(2, HEADERS_TYPE)],
        schema=DEFAULT_SCHEMA)


def _unordered_value_offsets() -> pa.RecordBatch:
    return _batch(value=pa.Array.from_buffers(
        pa.binary(), 2, [None, _offsets(0, 5, 2), pa.py_buffer(b"abcdef")]))


def _invalid_utf8_header_key() -> pa.RecordBatch:
    key = pa.Array.from_buffers(pa.string(), 1, [None, _offsets(0, 2), pa.py_buffer(b"\xff\xfe")])
    header = pa.StructArray.from_arrays([key, pa.array([b"x"])],
                                        fields=list(HEADERS_TYPE.value_type))
    return _batch(headers=pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()), header,
                                                   type=HEADERS_TYPE))


def _produce(address: str, topic: str, messages: list[pa.Buffer]) -> list[ProduceAck]:
    """Send each encoded batch on one stream of encoded batches (acks=1), read the acks."""
    return raw_produce(
        address, ProduceRequest(topic=topic, acks=1, timeout_ms=5000, messages=True),
        STORED_MESSAGE_SCHEMA, [(message_batch(message), ProduceBatchMetadata(
            seq=seq, partition=0)) for seq, message in enumerate(messages)])


def test_batches_with_invalid_arrays_are_refused_and_the_partition_stays_readable(
        broker) -> None:
    """Goal: a produced batch whose offsets are out of order or whose strings (a header's key,
    nested in list<struct>) are not UTF-8 is refused with CORRUPT_MESSAGE naming the
    topic-partition and the column, compressed or not, and nothing of it is appended: the
    records written after it are read back by a Consumer, both by poll() and by poll_arrow()
    under Arrow's full validation.
    Method: one raw stream of encoded batches: each hostile batch plain, lz4 and zstd, then a
    good batch (acked at offset 0); a Producer then writes one more record; a Consumer reads
    the partition from the start."""
    topic = f"pv-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    hostile = {"value": _unordered_value_offsets(), "headers": _invalid_utf8_header_key()}
    messages, columns = [], []
    for codec in [None, "lz4", "zstd"]:
        options = None if codec is None else ipc.IpcWriteOptions(compression=codec)
        for column, batch in hostile.items():
            messages.append(encode_produced(batch, options))
            columns.append(column)
    good = _batch(value=pa.array([b"good", b"good2"], pa.binary()))
    acks = _produce(broker.bootstrap, topic, [*messages, encode_produced(good)])

    for ack, column in zip(acks, columns, strict=False):
        assert ack.error_code == ErrorCode.CORRUPT_MESSAGE, ack
        assert f"{topic}-0" in (ack.error_message or "") and repr(column) in ack.error_message
    assert (acks[-1].error_code, acks[-1].base_offset) == (ErrorCode.NONE, 0)
    with Producer(broker.bootstrap) as producer:
        assert producer.send(topic, b"good-after", partition=0).result(10).offset == 2

    tp = TopicPartition(topic, 0)
    values: list[bytes] = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 30
        while len(values) < 3 and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(timeout_ms=300).get(tp, [])]
    assert values == [b"good", b"good2", b"good-after"]
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        rows = 0
        deadline = time.monotonic() + 30
        while rows < 3 and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=300).values():
                table.validate(full=True)
                rows += table.num_rows
    assert rows == 3


def test_plain_batches_with_invalid_arrays_are_refused(broker) -> None:
    """Goal: a client that sends plain record batches (not encoded messages, as a hand-made
    client may) is held to the same check: both hostile batches get CORRUPT_MESSAGE naming
    the topic-partition and nothing is appended. Method: one raw plain produce stream with
    the two hostile batches, then a good one, which lands at offset 0."""
    topic = f"pv-plain-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    acks = raw_produce(broker.bootstrap, ProduceRequest(topic=topic, acks=1, timeout_ms=5000),
                       DEFAULT_SCHEMA, [(batch, ProduceBatchMetadata(seq=seq, partition=0))
                                        for seq, batch in enumerate([
                                            _unordered_value_offsets(),
                                            _invalid_utf8_header_key(), _batch()])])
    for ack in acks[:2]:
        assert ack is not None and ack.error_code == ErrorCode.CORRUPT_MESSAGE, ack
        assert f"{topic}-0" in (ack.error_message or "")
    assert acks[2] is not None and (acks[2].error_code, acks[2].base_offset) == (0, 0)
