"""``Producer.send_batch`` of tables of any size (issue 14 §1): cut into pieces the leader
accepts whatever the row width, key distribution and compression, streamed with the producer's
memory bounded by ``buffer_memory``, every record arriving exactly once; a single record over
the limit is the only error. Real broker processes; records are read back to check.

The 1 GiB case runs as ``benchmarks/large_table.py`` (too slow for the suite on two cores).
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from logstore import Admin, Consumer, TopicPartition
from logstore.client.partitioner import partitions_for_keys
from logstore.errors import MessageTooLargeError, RequestTimedOutError
from tests.brokers import bounded_producer, new_topic
from tests.helpers import PeakRss

MiB = 1024 * 1024


def _ids(count: int, start: int = 0) -> pa.Array:
    """8-byte big-endian row numbers, as binary: what identifies each record."""
    data = np.arange(start, start + count, dtype=">i8").tobytes()
    offsets = np.arange(0, 8 * count + 1, 8, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(data)])


def _numbered_values(rows: int, width: int, seed: int = 0) -> pa.Array:
    """``width``-byte random values whose first 8 bytes are the row number."""
    data = np.random.default_rng(seed).integers(0, 256, (rows, width), dtype=np.uint8)
    data[:, :8] = np.arange(rows, dtype=">i8").view(np.uint8).reshape(rows, 8)
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets),
                                                     pa.py_buffer(data)])


def _read_ids(bootstrap: str, topic: str, partitions: int, expected: int, column: str,
              timeout_s: float = 120) -> dict[int, np.ndarray]:
    """Per partition, the first 8 bytes of ``column`` of every record as int64, read from
    offset 0 until ``expected`` records arrived (or the deadline: the caller's assertions
    then say what is missing)."""
    out: dict[int, list[np.ndarray]] = {p: [] for p in range(partitions)}
    got, deadline = 0, time.monotonic() + timeout_s
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        while got < expected and time.monotonic() < deadline:
            for tp, table in consumer.poll_arrow(timeout_ms=500).items():
                heads = pc.binary_slice(table.column(column), 0, 8).to_pylist()
                out[tp.partition].append(np.frombuffer(b"".join(heads), dtype=">i8"))
                got += table.num_rows
    return {p: np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
            for p, chunks in out.items()}


def _assert_exactly_once(ids: np.ndarray, expected: int) -> None:
    assert len(ids) == expected, f"{len(ids)} records read, {expected} sent"
    assert np.array_equal(np.sort(ids), np.arange(expected)), "records lost or duplicated"


def test_send_batch_of_300k_small_rows_to_one_partition_arrives_whole(broker) -> None:
    """Goal: the reported bug: 300,000 rows of 100-byte values (about 33 MB) to one partition
    go through instead of failing every piece with MESSAGE_TOO_LARGE.

    Method: send_batch to a 1-partition topic (default max_message_bytes 8 MiB); every piece
    must be acknowledged, the pieces' counts sum to 300k, and reading the partition back gives
    each row number once, in order."""
    rows = 300_000
    table = pa.table({"key": pa.nulls(rows, pa.binary()), "value": _numbered_values(rows, 100)})
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1)
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        pieces = producer.send_batch(topic, table).result(120)
    assert len(pieces) >= 4 and sum(p.record_count for p in pieces) == rows
    ids = _read_ids(broker.bootstrap, topic, 1, rows, "value")[0]
    assert np.array_equal(ids, np.arange(rows))


@pytest.mark.parametrize("compression, topic_codec", [
    ("zstd", "none"), ("lz4", "none"), (None, "zstd"), ("zstd", "lz4"), ("lz4", "zstd"),
], ids=["zstd-to-none", "lz4-to-none", "none-to-zstd", "zstd-to-lz4", "lz4-to-zstd"])
def test_compressed_tables_are_cut_for_what_the_leader_stores(
        broker, compression: str | None, topic_codec: str) -> None:
    """Goal: whatever the producer's and the topic's codecs, every piece is accepted: a topic
    that stores uncompressed gets pieces that fit uncompressed, a compressed topic gets its own
    codec. Method: a small max_message_bytes (256 KiB) so 40k rows of 200 random bytes make
    many pieces; send_batch, then read every row number back exactly once."""
    rows = 40_000
    table = pa.table({"key": pa.nulls(rows, pa.binary()), "value": _numbered_values(rows, 200)})
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1, max_message_bytes=256 * 1024,
                          compression_type=topic_codec)
    with bounded_producer(broker.bootstrap, acks=1, compression_type=compression) as producer:
        pieces = producer.send_batch(topic, table).result(120)
    assert len(pieces) >= 30
    _assert_exactly_once(_read_ids(broker.bootstrap, topic, 1, rows, "value")[0], rows)


def test_wide_rows_go_a_few_to_a_piece_and_one_over_the_limit_is_refused_first(broker) -> None:
    """Goal: 1 MiB values are cut a few to a piece under max_message_bytes (4 MiB here); a table
    holding one value over the limit is refused with MESSAGE_TOO_LARGE naming the topic, the
    row and its size, before anything of it is sent.

    Method: 24 rows of 1 MiB through send_batch, read back; then the same table with row 17
    grown to 5 MiB: the error, and the log end offset unchanged."""
    rows = 24
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1, max_message_bytes=4 * MiB)
        tp = TopicPartition(topic, 0)
        table = pa.table({"key": pa.nulls(rows, pa.binary()),
                          "value": _numbered_values(rows, MiB)})
        with bounded_producer(broker.bootstrap, acks=1) as producer:
            pieces = producer.send_batch(topic, table).result(120)
            assert len(pieces) >= 8 and all(p.record_count <= 3 for p in pieces)
            widths = [MiB] * rows
            widths[17] = 5 * MiB
            values = pa.array([b"v" * w for w in widths], pa.binary())
            with pytest.raises(MessageTooLargeError, match=rf"{topic}.*row 17.*{5 * MiB} bytes"):
                producer.send_batch(topic, pa.table({"key": pa.nulls(rows, pa.binary()),
                                                     "value": values}))
        end = admin.list_offsets({tp: -1})[tp]
    assert end == rows
    _assert_exactly_once(_read_ids(broker.bootstrap, topic, 1, rows, "value")[0], rows)


@pytest.mark.parametrize("compression", [None, "zstd"], ids=["plain", "zstd"])
def test_one_oversized_record_among_sends_fails_alone(broker, compression: str | None) -> None:
    """Goal: per-record send() gathers records into chunks cut the same way; a record over the
    limit in the middle of a chunk is the only error: its future fails with MESSAGE_TOO_LARGE
    naming the topic-partition and the limit, every other record (before and after it, in the
    same chunk) arrives once, in order.

    Method: a 1-partition topic with max_message_bytes 1 MiB; 3000 records of 300 random bytes
    with record 1500 of 2 MiB of random bytes (incompressible, so zstd cannot save it), sent
    with a long linger so they share chunks; then each future's outcome and a read-back."""
    rows, bad = 3000, 1500
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1, max_message_bytes=MiB)
    values = _numbered_values(rows, 300, 3).to_pylist()
    values[bad] = np.random.default_rng(4).integers(0, 256, 2 * MiB, dtype=np.uint8).tobytes()
    with bounded_producer(broker.bootstrap, acks=1, linger_ms=200, batch_size=4 * MiB,
                          compression_type=compression) as producer:
        futures = [producer.send(topic, v) for v in values]
        producer.flush(60)
    for i, f in enumerate(futures):
        if i == bad:
            with pytest.raises(MessageTooLargeError, match=rf"{topic}-0.*limit {MiB}"):
                f.result(0)
        else:
            f.result(0)
    ids = _read_ids(broker.bootstrap, topic, 1, rows - 1, "value")[0]
    assert np.array_equal(ids, np.delete(np.arange(rows), bad))


def test_skewed_keys_land_on_their_partitions_exactly_once(broker, seed: int) -> None:
    """Goal: a table whose keys are heavily skewed (90% one key, the rest spread) is cut per
    partition and each record lands on its key's partition, once. Method: 200k rows over 6
    partitions with a 64 KiB max_message_bytes; per partition, the row numbers read back must
    be exactly those whose key hashes there, in row order."""
    rng = np.random.default_rng(seed)
    rows, partitions = 200_000, 6
    hot = rng.random(rows) < 0.9
    keys = pa.array([b"hot" if h else b"k%d" % k for h, k in
                     zip(hot.tolist(), rng.integers(0, 5000, rows).tolist(), strict=True)],
                    pa.binary())
    table = pa.table({"key": keys, "value": _numbered_values(rows, 40, seed)})
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=partitions, max_message_bytes=64 * 1024)
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        producer.send_batch(topic, table).result(120)
    read = _read_ids(broker.bootstrap, topic, partitions, rows, "value")
    expected = partitions_for_keys(keys, partitions)
    for p in range(partitions):
        assert np.array_equal(read[p], np.flatnonzero(expected == p)), f"seed {seed}: {p}"


def _reused_table(total_bytes: int, width: int, chunk_rows: int) -> pa.Table:
    """A table of ``total_bytes`` of ``width``-byte values whose value chunks all share one
    buffer (so the test itself holds a few MB); each row's key is its row number."""
    data = pa.py_buffer(np.full(width * chunk_rows, 7, dtype=np.uint8))
    offsets = pa.py_buffer(np.arange(0, width * chunk_rows + 1, width, dtype=np.int32))
    value = pa.Array.from_buffers(pa.binary(), chunk_rows, [None, offsets, data])
    chunks = total_bytes // (width * chunk_rows)
    return pa.Table.from_batches([pa.record_batch({"key": _ids(chunk_rows, i * chunk_rows),
                                                   "value": value}) for i in range(chunks)])


def test_a_table_larger_than_buffer_memory_streams_with_bounded_memory(broker) -> None:
    """Goal: a 384 MiB table goes through send_batch while the producer holds about
    buffer_memory (32 MiB here) plus a window, never the table: memory stays bounded and every
    record arrives exactly once.

    Method: 384 MiB of 1000-byte values built from one reused 1 MB buffer (the test holds a
    few MB); the resident size of this process is sampled through send_batch and flush; its
    growth must stay under 256 MiB (a producer that materialised the table would pass 384).
    Then every row number is read back from the keys."""
    table = _reused_table(384 * MiB, 1000, 1000)
    rows = table.num_rows
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1)
    with bounded_producer(broker.bootstrap, acks=1, buffer_memory=32 * MiB) as producer:
        with PeakRss() as rss:
            future = producer.send_batch(topic, table, partition=0)
            producer.flush(300)
        assert sum(p.record_count for p in future.result(0)) == rows
    growth = rss.peak - rss.start
    assert growth < 256 * MiB, f"resident size grew by {growth / MiB:.0f} MiB"
    _assert_exactly_once(_read_ids(broker.bootstrap, topic, 1, rows, "key", 300)[0], rows)


def test_full_buffer_memory_blocks_the_caller_then_fails_naming_the_setting(
        broker_factory) -> None:
    """Goal: as in Kafka, a caller whose records outrun the broker blocks while buffer_memory
    is full, for at most max_block_ms, then gets REQUEST_TIMED_OUT naming buffer_memory and
    max_block_ms: send_batch and send() alike; once the broker is back, what was queued
    arrives.

    Method: a broker stopped with SIGSTOP; a producer with buffer_memory 2 MiB and
    max_block_ms 300; send_batch of 16 MiB must raise; then send() of 256 kB records must raise
    within a bounded number of calls. SIGCONT: flush delivers what was queued."""
    broker = broker_factory()
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, partitions=1)
    table = pa.table({"key": pa.nulls(64, pa.binary()),
                      "value": pa.array([b"x" * 256_000] * 64, pa.binary())})
    with bounded_producer(broker.bootstrap, acks=1, buffer_memory=2 * MiB, max_block_ms=300,
                          batch_size=256 * 1024, request_timeout_ms=60_000) as producer:
        producer.send_batch(topic, table.slice(0, 1)).result(30)  # streams open, ids known
        broker.kill(signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimedOutError, match="buffer_memory.*max_block_ms"):
                producer.send_batch(topic, table)
            with pytest.raises(RequestTimedOutError, match="buffer_memory.*max_block_ms"):
                for _ in range(200):
                    producer.send(topic, b"y" * 256_000)
        finally:
            broker.kill(signal.SIGCONT)
        producer.flush(60)
