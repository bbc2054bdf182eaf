"""Projected reads of remote segments (tiering/projection.py, logstore/arrow_message.py): only the
projected columns' buffers are fetched, and the batches built from them equal the full
decode's columns, for nested types, nulls and compressed bodies."""

from __future__ import annotations

import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from logstore.arrow_message import MessageFormatError, message_prefix, parse_record_batch
from logstore.errors import CorruptRecordError
from logstore.records import TIMESTAMP_TYPE, topic_schema
from logstore.tiering.naming import segment_key
from logstore.tiering.projection import ProjectedSegmentReader
from tests.unit.tiering_helpers import TP, CountingStore, Tiered, tiered

WIDE = pa.schema([(f"c{i}", pa.float64()) for i in range(20)])
NESTED = pa.schema([
    ("i", pa.int32()), ("s", pa.string()), ("flag", pa.bool_()),
    ("l", pa.list_(pa.int64())), ("st", pa.struct([("a", pa.int64()), ("b", pa.string())])),
    ("m", pa.map_(pa.string(), pa.int32())), ("fl", pa.list_(pa.float32(), 2)),
    ("ll", pa.large_list(pa.large_string())), ("n", pa.null()), ("d", pa.decimal128(12, 3)),
])


def _rows(schema: pa.Schema, n: int, seed: int) -> dict[str, pa.Array]:
    rng = np.random.default_rng(seed)
    if schema is WIDE:
        return {f.name: pa.array(rng.random(n)) for f in schema}
    nulls = rng.random(n) < 0.2
    return {
        "i": pa.array(rng.integers(-100, 100, n).astype(np.int32), mask=nulls),
        "s": pa.array([None if x else f"s{i}" * (i % 4) for i, x in enumerate(nulls)]),
        "flag": pa.array(rng.random(n) < 0.5),
        "l": pa.array([None if x else list(range(i % 5)) for i, x in enumerate(nulls)],
                      pa.list_(pa.int64())),
        "st": pa.array([None if x else {"a": i, "b": str(i)} for i, x in enumerate(nulls)],
                       NESTED.field("st").type),
        "m": pa.array([[("k", i)] if i % 3 else None for i in range(n)], NESTED.field("m").type),
        "fl": pa.array([[1.0, float(i)] for i in range(n)], NESTED.field("fl").type),
        "ll": pa.array([["x"] * (i % 3) for i in range(n)], NESTED.field("ll").type),
        "n": pa.nulls(n),
        "d": pa.array([None if x else Decimal(i) / 8 for i, x in enumerate(nulls)],
                      pa.decimal128(12, 3)),
    }


def _typed(tmp_path: Path, value_schema: pa.Schema, batches: int = 3, rows: int = 2000,
           **config: Any) -> Tiered:
    schema = topic_schema(value_schema)
    t = tiered(tmp_path, store=CountingStore, schema=schema, **config)
    for segment in range(2):
        for b in range(batches):
            n = rows + b
            columns = {"key": pa.nulls(n, pa.binary()), **_rows(value_schema, n, segment * 10 + b),
                       "timestamp": pa.array(np.full(n, t.clock.time_ms())).cast(TIMESTAMP_TYPE),
                       "headers": pa.nulls(n, schema.field("headers").type)}
            t.log.append_as_leader(pa.record_batch([columns[f.name] for f in schema],
                                                   schema=schema))
        t.log.roll()
    t.log.update_high_watermark(t.log.log_end_offset)
    t.lead()
    t.rlm.run_task(TP)
    return t


def _read(t: Tiered, columns: list[str], **kwargs: Any) -> tuple[list[Any], int]:
    """Projected batches of every remote segment, and the bytes fetched for them."""
    before = t.store.bytes_read
    out = []
    for segment in t.rlm.remote_segments(TP):
        out += list(ProjectedSegmentReader(t.store, segment).read(columns, **kwargs))
    return out, t.store.bytes_read - before


def test_two_of_twenty_float_columns_fetch_at_most_a_fifth_of_the_bytes(tmp_path: Path) -> None:
    """Goal: executors fetch only what the query needs. Method: six batches of 2000 rows of 20
    float64 columns in the remote tier; count bytes at the ObjectStore seam for a projection of
    2 columns and of all 20; the first is <= 0.2 of the second, and the values equal the full
    decode's."""
    t = _typed(tmp_path, WIDE)
    two, two_bytes = _read(t, ["c3", "c17"])
    everything, all_bytes = _read(t, WIDE.names)
    assert two_bytes <= 0.2 * all_bytes, (two_bytes, all_bytes)
    full = t.log.read(0, 1 << 30).batches
    assert [p.header for p in two] == [b.header for b in full]
    for projected, stored in zip(two, full, strict=True):
        assert projected.batch.equals(stored.record_batch(t.log.schema).select(["c3", "c17"]))
        np.testing.assert_array_equal(projected.offsets(), stored.offsets())
    assert everything[0].batch.equals(full[0].record_batch(t.log.schema).select(WIDE.names))


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_nested_and_compressed_columns_project_exactly(tmp_path: Path, compression: str) -> None:
    """Goal: projection builds every column type a topic can hold, with nulls, from compressed
    bodies too. Method: a schema of primitives, strings, lists, structs, maps, fixed-size and
    large lists, null and decimal; project each column alone and a mixed set; compare with the
    full decode."""
    t = _typed(tmp_path, NESTED, batches=2, rows=300, compression_type=compression)
    full = t.log.read(0, 1 << 30).batches
    whole = sum(m.size_bytes for m in t.rlm.remote_segments(TP))
    for columns in [[name] for name in NESTED.names] + [["st", "key", "m", "timestamp"]]:
        projected, fetched = _read(t, columns)
        assert len(columns) > 1 or fetched < 0.9 * whole, columns  # laid out, not read whole
        assert len(projected) == len(full)
        for p, stored in zip(projected, full, strict=True):
            assert p.batch.equals(stored.record_batch(t.log.schema).select(columns)), columns


def test_an_offset_range_selects_the_batches_holding_it(tmp_path: Path) -> None:
    """Goal: an input partition's offset range maps to exactly its batches. Method: a range
    starting inside the second batch and ending inside the third of the first segment."""
    t = _typed(tmp_path, WIDE, rows=100)
    segment = t.rlm.remote_segments(TP)[0]
    got = list(ProjectedSegmentReader(t.store, segment).read(["c0"], 150, 205))
    assert [b.header.base_offset for b in got] == [100, 201]


def test_a_view_column_falls_back_to_reading_the_batch_whole(tmp_path: Path) -> None:
    """Goal: a type this reader does not lay out is still read right. Method: a string_view
    column (variadic buffers); projection of it and of another column equals the full decode."""
    value = pa.schema([("v", pa.string_view()), ("x", pa.int64())])
    t = tiered(tmp_path, store=CountingStore, schema=topic_schema(value))
    schema = t.log.schema
    n = 50
    t.log.append_as_leader(pa.record_batch([
        pa.nulls(n, pa.binary()), pa.array([f"v{i}" for i in range(n)], pa.string_view()),
        pa.array(range(n), pa.int64()), pa.array(np.zeros(n, dtype=np.int64)).cast(
            TIMESTAMP_TYPE), pa.nulls(n, schema.field("headers").type)], schema=schema))
    t.log.roll()
    t.log.update_high_watermark(n)
    t.lead()
    t.rlm.run_task(TP)
    (got,) = _read(t, ["x", "v"])[0]
    assert got.batch.equals(t.log.read(0, 1 << 20).batches[0].record_batch(schema).select(
        ["x", "v"]))


def test_corruption_is_reported_with_the_segment_and_position(tmp_path: Path) -> None:
    """Goal: a projected read never returns garbage silently. Method: verify=True reads whole
    batches and catches a flipped body bit by CRC; a truncated object fails the walk."""
    t = _typed(tmp_path, WIDE, rows=100)
    segment = t.rlm.remote_segments(TP)[0]
    path = t.root / "remote" / segment_key(segment, ".arrow")
    data = bytearray(path.read_bytes())
    data[-30] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"orders-0 remote segment .*position \d+: "
                                                 r"CRC32C mismatch in batch at offset 201"):
        list(ProjectedSegmentReader(t.store, segment).read(["c0"], verify=True))
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CorruptRecordError, match="orders-0 remote segment"):
        list(ProjectedSegmentReader(t.store, segment).read(["c0"]))


def test_the_message_reader_refuses_what_is_not_a_record_batch() -> None:
    """Goal: the hand-written flatbuffer reader fails cleanly on foreign bytes. Method: a schema
    message, a bad prefix and truncated metadata."""
    schema_message = pa.schema([("a", pa.int32())]).serialize().to_pybytes()
    size = message_prefix(schema_message)
    with pytest.raises(MessageFormatError, match="not a record batch"):
        parse_record_batch(schema_message[8: 8 + size])
    with pytest.raises(MessageFormatError, match="prefix"):
        message_prefix(b"\x00" * 8)
    with pytest.raises(MessageFormatError):
        parse_record_batch(schema_message[8:20])


def test_the_reader_pickles_for_spark_executors(tmp_path: Path) -> None:
    t = _typed(tmp_path, WIDE, rows=10)
    reader = ProjectedSegmentReader(t.store.inner, t.rlm.remote_segments(TP)[0])
    copy = pickle.loads(pickle.dumps(reader))
    assert [b.batch.num_rows for b in copy.read(["c1"])] == [10, 11, 12]
