"""datasource/iceberg_types.py: every Arrow type a typed topic can have maps to an Iceberg type
as the module's table says, and values go to the Parquet shape and back unchanged. Pure: no
catalog, no files."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from datasource.iceberg_types import (
    ArchiveSchemaError,
    check_table_schema,
    from_stored,
    iceberg_schema,
    stored_schema,
    to_stored,
)
from datasource.schema import source_arrow_schema
from logstore.cli.schema_spec import value_schema_arg

# Every type of the --value-schema grammar (logstore/cli/schema_spec.py), plus what a Python
# client may also declare (maps, large and fixed types), with the Iceberg type of the table.
SPEC_TYPES = {
    "int8": "int", "int16": "int", "int32": "int", "int64": "long", "uint8": "int",
    "uint16": "int", "uint32": "long", "uint64": "decimal(20, 0)", "float32": "float",
    "float64": "double", "bool": "boolean", "string": "string", "binary": "binary",
    "date32": "date", "timestamp[s]": "timestamp", "timestamp[ms]": "timestamp",
    "timestamp[us]": "timestamp", "timestamp[ns]": "long", "timestamp[ms,UTC]": "timestamptz",
    "timestamp[us,Europe/Paris]": "timestamptz", "timestamp[s,+01:00]": "timestamptz",
    "timestamp[ns,UTC]": "long", "decimal128(10,2)": "decimal(10, 2)",
    "decimal128(38,0)": "decimal(38, 0)", "list<int32>": "list<int>",
    "struct<a:int64,b:string>": "struct<a: long, b: string>",
    "list<struct<x:uint64>>": "list<struct<x: decimal(20, 0)>>",
}
PYTHON_TYPES = {
    pa.map_(pa.string(), pa.int64()): "map<string, long>",
    pa.large_string(): "string", pa.large_binary(): "binary",
    pa.large_list(pa.float64()): "list<double>", pa.binary(16): "fixed[16]",
    pa.float16(): "float",
}


def _iceberg_text(t: object) -> str:
    text = str(t)
    for noise in ("optional ", "required "):
        text = text.replace(noise, "")
    import re

    return re.sub(r"\d+: ", "", text)


@pytest.mark.parametrize("spec", sorted(SPEC_TYPES))
def test_every_spec_type_maps_to_the_documented_iceberg_type(spec: str) -> None:
    """Goal: the mapping table holds for every type the typed-topic spec accepts. Method:
    parse ``c:<type>`` with the CLI's parser, map it, compare the Iceberg type's text."""
    arrow = value_schema_arg(f"c:{spec}")
    assert _iceberg_text(iceberg_schema(arrow).find_field("c").field_type) == SPEC_TYPES[spec]


@pytest.mark.parametrize("arrow_type", list(PYTHON_TYPES), ids=str)
def test_client_only_types_map_too(arrow_type: pa.DataType) -> None:
    """Goal: maps, large and fixed types (a Python client may declare them) map as
    documented. Method: as above, from the Arrow type."""
    schema = pa.schema([pa.field("c", arrow_type)])
    assert _iceberg_text(iceberg_schema(schema).find_field("c").field_type) == \
        PYTHON_TYPES[arrow_type]


def test_unsupported_type_is_refused_naming_the_column() -> None:
    """Goal: a type with no Iceberg counterpart fails clearly. Method: a time64 column."""
    with pytest.raises(ArchiveSchemaError, match="'at'.*time64"):
        iceberg_schema(pa.schema([pa.field("at", pa.time64("us"))]))


EXTREMES = {
    "int8": [-128, 127, None], "uint8": [0, 255, None], "uint32": [0, 2**32 - 1, None],
    "uint64": [0, 2**64 - 1, None], "int64": [-(2**63), 2**63 - 1, None],
    "float32": [1.5, -0.0, None], "bool": [True, False, None], "string": ["é", "", None],
    "binary": [b"\x00\xff", b"", None], "date32": [dt.date(1, 1, 1), dt.date(9999, 12, 31), None],
    "timestamp[ns,Europe/Paris]": [1, 1_700_000_000_123_456_789, None],
    "timestamp[ms,+01:00]": [0, 1_700_000_000_123, None], "timestamp[s]": [0, 2**33, None],
    "decimal128(10,2)": [Decimal("-99999999.99"), Decimal("0.01"), None],
    "list<struct<x:uint64>>": [[{"x": 2**64 - 1}], [], None],
    "struct<a:int64,b:string>": [{"a": 1, "b": "x"}, {"a": None, "b": None}, None],
}


@pytest.mark.parametrize("spec", sorted(EXTREMES))
def test_values_round_trip_through_the_parquet_shape(spec: str) -> None:
    """Goal: archiving loses nothing: extremes (uint64 max, nanoseconds, zoned times, year 1)
    come back equal. Method: a column of the type, to_stored then from_stored, compared."""
    arrow = value_schema_arg(f"c:{spec}")
    column = pa.array(EXTREMES[spec], arrow.field("c").type)
    batch = pa.RecordBatch.from_arrays([column], schema=arrow)
    stored = to_stored(batch, stored_schema(arrow, iceberg_schema(arrow)))
    back = from_stored(stored.column(0), arrow.field("c").type)
    assert back.equals(column)


# Types a Python client may declare beyond the spec grammar, and nested ones whose children
# need a cast of their own (the review's round-trip cases).
CLIENT_EXTREMES: list[tuple[pa.DataType, list[object]]] = [
    (pa.float16(), [1.5, -2.0, 0.0]),  # built through numpy (pa.array makes no float16 from Python floats)
    (pa.timestamp("ns"), [1_700_000_000_123_456_789, 1, None]),
    (pa.decimal128(38, 10), [Decimal("1234567890123456789012345678.0123456789"), None,
                             Decimal(0)]),
    (pa.large_list(pa.int64()), [[1, 2], [], None]),
    (pa.list_(pa.uint64()), [[2**64 - 1], None, []]),
    (pa.struct([("a", pa.uint64()), ("b", pa.timestamp("ns"))]),
     [{"a": 2**64 - 1, "b": 5}, None, {"a": None, "b": None}]),
    (pa.map_(pa.string(), pa.uint64()), [[("k", 2**64 - 1)], [], None]),
    (pa.binary(4), [b"abcd", None, b"\x00\x00\x00\x00"]),
    (pa.large_string(), ["x", None, ""]),
    (pa.large_binary(), [b"\xff", None, b""]),
]


@pytest.mark.parametrize(("arrow_type", "values"), CLIENT_EXTREMES,
                         ids=[str(t) for t, _ in CLIENT_EXTREMES])
def test_client_only_values_round_trip_too(arrow_type: pa.DataType, values: list[object]
                                           ) -> None:
    """Goal: as above, for the types only a Python client declares and for nested columns
    whose children are cast (uint64 and nanoseconds inside structs, lists and maps). Method:
    the column inside a full typed-topic batch (every other column null), to_stored then
    from_stored."""
    if pa.types.is_float16(arrow_type):
        import numpy as np

        column = pa.array(np.array(values, dtype=np.float16))
    else:
        column = pa.array(values, arrow_type)
    arrow = source_arrow_schema(pa.schema([pa.field("c", arrow_type)]), True)
    batch = pa.RecordBatch.from_arrays(
        [column if f.name == "c" else pa.nulls(len(column), f.type) for f in arrow],
        schema=arrow)
    stored = to_stored(batch, stored_schema(arrow, iceberg_schema(arrow)))
    back = from_stored(stored.column("c"), arrow_type)
    assert back.cast(arrow_type).equals(column)


def test_stored_schema_carries_every_field_id() -> None:
    """Goal: the Parquet files name each column (nested ones too) by its Iceberg field id, so
    any Iceberg reader resolves them. Method: the default topic's archive columns."""
    arrow = source_arrow_schema(None, include_headers=True)
    table = iceberg_schema(arrow)
    stored = stored_schema(arrow, table)
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in stored] == \
        [table.find_field(n).field_id for n in arrow.names]
    element = stored.field("headers").type.value_field
    assert int(element.metadata[b"PARQUET:field_id"]) == \
        table.find_field("headers").field_type.element_id


def test_a_table_of_other_columns_is_refused_naming_them() -> None:
    """Goal: a table made for another topic shape is not written to. Method: a default
    topic's table checked against a typed topic's columns."""
    default = iceberg_schema(source_arrow_schema(None, True))
    typed = iceberg_schema(source_arrow_schema(value_schema_arg("id:int64"), True))
    with pytest.raises(ArchiveSchemaError, match=r"missing columns \['id'\].*\['value'\]"):
        check_table_schema(default, typed, "ns.t", ["orders"])
