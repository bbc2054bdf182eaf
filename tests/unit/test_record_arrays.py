"""How ``send()``'s records become one Arrow batch (client/record_arrays.py).

Goal: whatever mix of keys, named partitions, timestamps and headers a chunk holds, its batch
holds exactly those records (the shortcuts for chunks without headers or where every record
named its partition change nothing but the cost), and a chunk's columns never share state with
another chunk's. Method: hypothesis over chunks, against the batch built record by record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.client.batches import RecordChunk
from logstore.client.metadata import PartitionInfo, TopicInfo
from logstore.client.partitioner import StickyPartitioner, assign_partitions
from logstore.client.record_arrays import chunk_arrays
from logstore.records import DEFAULT_SCHEMA, HEADERS_TYPE, TIMESTAMP_TYPE, null_column, topic_schema

NOW_MS = 1_700_000_000_000
PARTITIONS = 3
INFO = TopicInfo("t", {p: PartitionInfo(p, 0, 0, (0,), (0,)) for p in range(PARTITIONS)},
                 DEFAULT_SCHEMA, None)

_headers = st.none() | st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=3)),
                                max_size=2)
_record = st.tuples(st.binary(max_size=8) | st.none(), st.binary(max_size=8),
                    st.none() | st.integers(0, PARTITIONS - 1),
                    st.none() | st.integers(0, 2**40), _headers)


def _chunk(records: list[tuple[Any, ...]]) -> RecordChunk:
    chunk = RecordChunk("t")
    for i, (key, value, partition, timestamp, headers) in enumerate(records):
        chunk.keys.append(key)
        chunk.values.append(value)
        if (partition, timestamp, headers) != (None, None, None):
            chunk.extras[i] = (partition, timestamp, headers)
    return chunk


@settings(max_examples=200)
@given(records=st.lists(_record, min_size=1, max_size=12))
def test_a_chunk_becomes_exactly_its_records(records: list[tuple[Any, ...]]) -> None:
    """Keys (some null), values, named partitions, timestamps and headers (null, empty or
    not) in any mix: the batch, its timestamps and its named partitions are the records'."""
    arrays = chunk_arrays(_chunk(records), INFO, NOW_MS)
    expected = pa.RecordBatch.from_pydict({
        "key": pa.array([r[0] for r in records], pa.binary()),
        "value": pa.array([r[1] for r in records], pa.binary()),
        "timestamp": pa.array([NOW_MS if r[3] is None else r[3] for r in records],
                              pa.int64()).cast(TIMESTAMP_TYPE),
        "headers": pa.array([r[4] for r in records], HEADERS_TYPE)}, schema=DEFAULT_SCHEMA)
    assert arrays.batch.equals(expected)
    assert arrays.timestamps.tolist() == [NOW_MS if r[3] is None else r[3] for r in records]
    named = [-1 if r[2] is None else r[2] for r in records]
    if all(p < 0 for p in named):
        assert arrays.partitions is None
    else:
        assert arrays.partitions is not None and arrays.partitions.tolist() == named


def test_chunks_of_the_same_length_share_no_timestamps() -> None:
    """The timestamp column lies over the chunk's own array: a second chunk of the same length
    (whose all-null headers column is the cached one) leaves the first one's batch as it was."""
    first = chunk_arrays(_chunk([(None, b"a", None, 5, None)] * 4), INFO, NOW_MS)
    second = chunk_arrays(_chunk([(None, b"b", None, None, None)] * 4), INFO, NOW_MS + 1)
    assert first.batch.column("timestamp").cast(pa.int64()).to_pylist() == [5] * 4
    assert second.batch.column("timestamp").cast(pa.int64()).to_pylist() == [NOW_MS + 1] * 4
    assert first.batch.column("headers").null_count == 4


@given(named=st.lists(st.integers(-1, PARTITIONS - 1), min_size=1, max_size=20),
       keyed=st.booleans())
def test_named_partitions_win_and_the_rest_are_placed(named: list[int], keyed: bool) -> None:
    """Records that named a partition keep it; the others get one from their key or the sticky
    partitioner (the shortcut when every record named one returns them as they are)."""
    keys = pa.array([b"k%d" % i if keyed else None for i in range(len(named))], pa.binary())
    explicit = np.array(named, dtype=np.int32)
    parts = assign_partitions(keys, explicit, "t", PARTITIONS, StickyPartitioner(), 4)
    assert [p for p, n in zip(parts.tolist(), named, strict=True) if n >= 0] == \
        [n for n in named if n >= 0]
    assert all(0 <= p < PARTITIONS for p in parts.tolist())


@pytest.mark.parametrize("type_", [HEADERS_TYPE, pa.large_list(pa.int32()), pa.binary()])
@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 1000])
def test_a_null_column_is_all_null_and_its_lists_hold_nothing(type_: pa.DataType,
                                                              length: int) -> None:
    """An all-null column (the headers of records sent without any) is valid, equals
    ``pa.nulls``, and a slice of a list one encodes without a child as long as the whole."""
    column = null_column(length, type_)
    column.validate(full=True)
    assert column.type == type_ and column.null_count == length
    assert column.equals(pa.nulls(length, type_))
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        assert len(column.values) == 0
        piece = pa.RecordBatch.from_arrays([column.slice(length // 2, 1)], ["h"])
        assert ipc.get_record_batch_size(piece) < 1024


def test_a_list_whose_child_carries_metadata_gets_its_own_null_column() -> None:
    """Field metadata is not part of a type's equality: the cache of all-null list columns
    neither serves nor keeps one for a list whose child field carries metadata."""
    plain = pa.list_(pa.int32())
    tagged = pa.list_(pa.field("item", pa.int32(), metadata={b"origin": b"a"}))
    cached = null_column(5, plain)
    assert null_column(5, plain) is cached  # cached by length and type
    column = null_column(5, tagged)
    assert column is not cached and column.type.value_field.metadata == {b"origin": b"a"}
    assert null_column(5, HEADERS_TYPE) is null_column(5, HEADERS_TYPE)


VALUE_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("ok", pa.bool_())])
TYPED_INFO = TopicInfo("typed", INFO.partitions, topic_schema(VALUE_SCHEMA), VALUE_SCHEMA)


def _typed_chunk(values: list[Any]) -> RecordChunk:
    chunk = RecordChunk("typed")
    chunk.values.extend(values)
    chunk.keys.extend([None] * len(values))
    return chunk


def _value_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    return batch.select(VALUE_SCHEMA.names).to_pylist()


def test_a_null_value_on_a_typed_topic_leaves_every_value_column_null() -> None:
    """Goal: ``send(typed_topic, None)`` (a tombstone) stores nulls in the value columns,
    not the zero, empty string and False a struct's children hold under its null slots.

    Method: a chunk mixing None, a full dict, an empty dict and a partial dict; the batch's
    value columns, read back as Python, are exactly the dicts (missing fields null) and all
    nulls for the None."""
    values: list[Any] = [None, {"id": 7, "name": "n", "ok": True}, {}, {"id": 1}, None]
    arrays = chunk_arrays(_typed_chunk(values), TYPED_INFO, NOW_MS)
    nulls = dict.fromkeys(VALUE_SCHEMA.names)
    assert _value_rows(arrays.batch) == [nulls, values[1], nulls, {**nulls, "id": 1}, nulls]
    assert not arrays.rejected


@settings(max_examples=100)
@given(values=st.lists(
    st.none() | st.fixed_dictionaries({"id": st.integers(-2**63, 2**63 - 1)}) |
    st.just({"id": "not-an-int"}) | st.just({"name": 5}) | st.just(b"raw bytes") |
    st.just({"id": 2**70}), min_size=1, max_size=40))
def test_values_that_do_not_fit_the_schema_are_rejected_alone(values: list[Any]) -> None:
    """Goal: a value that does not fit the topic's value_schema (a wrong type, an int too
    large, bytes on a typed topic) is rejected alone, with an error naming the topic and the
    field, while the records around it become the batch as they are.

    Method: hypothesis over chunks mixing good and bad values; the rejected rows are exactly
    the bad ones, each error names the topic (and the field for a dict), and every other
    row's value columns hold its dict (the rejected ones are null)."""
    def fits(v: Any) -> bool:
        return v is None or (isinstance(v, dict) and isinstance(v.get("id", 0), int)
                             and -2**63 <= v.get("id", 0) < 2**63 and "name" not in v)
    arrays = chunk_arrays(_typed_chunk(values), TYPED_INFO, NOW_MS)
    assert sorted(arrays.rejected) == [i for i, v in enumerate(values) if not fits(v)]
    for row, error in arrays.rejected.items():
        assert "'typed'" in str(error)
        if isinstance(values[row], dict):
            assert f"field {next(iter(values[row]))!r}" in str(error)
    nulls = dict.fromkeys(VALUE_SCHEMA.names)
    assert _value_rows(arrays.batch) == [
        {**nulls, **v} if fits(v) and v is not None else nulls for v in values]


FLOAT_SCHEMA = pa.schema([("f", pa.float32()), ("d", pa.float64())])
FLOAT_INFO = TopicInfo("typed", INFO.partitions, topic_schema(FLOAT_SCHEMA), FLOAT_SCHEMA)


def test_a_number_too_large_for_a_float32_column_is_rejected_not_stored_as_infinity() -> None:
    """Goal: ``pa.array`` turns 1e300 into +Infinity in a float32 column without a word; the
    record is rejected alone, naming the field, while a float64 column and an infinity
    given as such are kept. Method: one chunk mixing them (found by a bug hunt)."""
    values: list[Any] = [{"f": 1.5, "d": 1e300}, {"f": -1e300}, {"f": float("inf")}, None]
    arrays = chunk_arrays(_typed_chunk(values), FLOAT_INFO, NOW_MS)
    assert sorted(arrays.rejected) == [1]
    assert "field 'f'" in str(arrays.rejected[1]) and "-1e+300" in str(arrays.rejected[1])
    assert arrays.batch.column("f").to_pylist() == [1.5, None, float("inf"), None]
    assert arrays.batch.column("d").to_pylist() == [1e300, None, None, None]
