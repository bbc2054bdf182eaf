"""What ``Consumer.poll`` returns per partition (logstore/client/records_view.py): ConsumerRecords
built from the Arrow columns when read, equal, field by field, to what the eager conversion
built (the reference kept here), with list-like indexing, slicing, equality and repr."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from logstore.client.records_view import RecordsView
from logstore.model import CREATE_TIME, LOG_APPEND_TIME, ConsumerRecord, TopicPartition
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE, topic_schema

TP = TopicPartition("t", 2)


def _drained(schema: pa.Schema, columns: dict[str, Any], offsets: list[int]) -> pa.Table:
    """A table as the fetcher drains it: the topic's columns, then offset and partition."""
    n = len(offsets)
    columns = {"headers": pa.nulls(n, DEFAULT_SCHEMA.field("headers").type), **columns,
               "timestamp": pa.array([1_000 + i for i in range(n)]).cast(TIMESTAMP_TYPE)}
    batch = pa.RecordBatch.from_pydict(columns, schema=schema)
    table = pa.Table.from_batches([batch])
    table = table.append_column("offset", pa.array(offsets, pa.int64()))
    return table.append_column("partition", pa.array(np.full(n, TP.partition, np.int32)))


def _reference(table: pa.Table, timestamp_type: int = CREATE_TIME) -> list[ConsumerRecord]:
    """The records one by one, from Python values (the meaning the view must keep)."""
    rows = table.to_pylist()
    out = []
    for r in rows:
        value = r["value"] if "value" in r else {k: v for k, v in r.items() if k not in (
            "key", "timestamp", "headers", "offset", "partition")}
        headers = () if r["headers"] is None else [(h["key"], h["value"])
                                                    for h in r["headers"]]
        out.append(ConsumerRecord(TP.topic, TP.partition, r["offset"],
                                  round(r["timestamp"].timestamp() * 1000), r["key"], value,
                                  headers, timestamp_type))
    return out


@pytest.mark.parametrize("offsets", [[5, 6, 7, 8], [5, 9, 10, 40]],
                         ids=["contiguous", "compacted-gaps"])
def test_records_equal_the_eager_conversion_field_by_field(offsets: list[int]) -> None:
    """Goal: the view's records are the same ConsumerRecords (values, equality, repr) as
    building them one by one, with keys, null values, headers (none is the empty tuple,
    whatever the neighbours; an empty list stays one) and offset gaps. Method: a drained table
    of four records compared with the reference conversion, whole, by index and sliced."""
    table = _drained(DEFAULT_SCHEMA, {
        "key": pa.array([b"a", None, b"c", b"d"]), "value": pa.array([b"1", b"2", None, b"4"]),
        "headers": pa.array([[("h", b"x")], None, [], [("a", b"1"), ("b", b"2")]],
                            DEFAULT_SCHEMA.field("headers").type)}, offsets)
    view, expected = RecordsView(TP, table), _reference(table)
    assert list(view) == expected and view == expected and len(view) == 4
    assert repr(view) == repr(expected)
    assert [view[i] for i in range(4)] == expected and view[-1] == expected[-1]
    assert view[1:3] == expected[1:3] and view[::2] == expected[::2]
    assert view[-1].offset == offsets[-1] and type(view[0]) is ConsumerRecord
    with pytest.raises(IndexError):
        view[4]


def test_all_null_keys_and_headers_and_typed_values() -> None:
    """Goal: the shared forms stay as before: null keys None, all-null headers an empty tuple,
    a typed topic's value a dict of its columns. Method: one untyped and one typed table."""
    table = _drained(DEFAULT_SCHEMA, {"key": pa.nulls(3, pa.binary()),
                                      "value": pa.array([b"x", b"y", b"z"])}, [0, 1, 2])
    view = RecordsView(TP, table)
    assert [(r.key, r.value, r.headers) for r in view] == [(None, b"x", ()), (None, b"y", ()),
                                                           (None, b"z", ())]
    assert view == _reference(table)
    schema = topic_schema(pa.schema([("n", pa.int32()), ("s", pa.string())]))
    typed = _drained(schema, {"key": pa.array([b"k", b"l"]), "n": pa.array([1, None], pa.int32()),
                              "s": pa.array(["a", "b"])}, [3, 4])
    assert list(RecordsView(TP, typed)) == _reference(typed)
    assert RecordsView(TP, typed)[0].value == {"n": 1, "s": "a"}


def test_an_empty_poll_is_an_empty_sequence() -> None:
    """Goal: no records is an empty, falsy sequence equal to []. Method: a zero-row table."""
    view = RecordsView(TP, _drained(DEFAULT_SCHEMA, {"key": pa.nulls(0, pa.binary()),
                                                     "value": pa.array([], pa.binary())}, []))
    assert not view and list(view) == [] and view == [] and repr(view) == "[]"


@pytest.mark.parametrize("timestamp_type", [CREATE_TIME, LOG_APPEND_TIME])
def test_every_record_carries_the_views_timestamp_type(timestamp_type: int) -> None:
    """Goal: each record has ``timestamp_type`` as Kafka numbers it (0 CreateTime, 1
    LogAppendTime), the one the view was given for its topic, whether iterated, indexed or
    sliced; a view given none says CreateTime. Method: one drained table viewed with each
    type, compared field by field with the reference conversion."""
    table = _drained(DEFAULT_SCHEMA, {"key": pa.array([b"a", None, b"c"]),
                                      "value": pa.array([b"1", b"2", b"3"])}, [7, 8, 9])
    view, expected = RecordsView(TP, table, timestamp_type), _reference(table, timestamp_type)
    assert list(view) == expected
    assert [r.timestamp_type for r in view] == [timestamp_type] * 3
    assert view[1].timestamp_type == timestamp_type and view[-1] == expected[-1]
    assert [r.timestamp_type for r in view[1:]] == [timestamp_type] * 2
    assert view[::2] == expected[::2]
    assert {r.timestamp_type for r in RecordsView(TP, table)} == {CREATE_TIME}


def test_records_of_batches_that_differ_carry_each_their_own_timestamp_type() -> None:
    """Goal: a view over batches written before and after an alter of the topic's
    ``message_timestamp_type`` gives each record its batch's type, iterated, indexed or
    sliced. Method: a view with one type per record."""
    table = _drained(DEFAULT_SCHEMA, {"key": pa.array([b"a", b"b", None, b"d"]),
                                      "value": pa.array([b"1", b"2", b"3", b"4"])}, [5, 6, 7, 8])
    kinds = np.array([CREATE_TIME, CREATE_TIME, LOG_APPEND_TIME, LOG_APPEND_TIME])
    view = RecordsView(TP, table, kinds)
    assert [r.timestamp_type for r in view] == kinds.tolist()
    assert view[2].timestamp_type == LOG_APPEND_TIME and view[-3].timestamp_type == CREATE_TIME
    assert [r.timestamp_type for r in view[1:3]] == [CREATE_TIME, LOG_APPEND_TIME]
    assert list(view) == [r._replace(timestamp_type=int(k)) for r, k in zip(
        _reference(table), kinds, strict=True)]
