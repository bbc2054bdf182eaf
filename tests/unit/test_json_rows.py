"""Unit tests of the CLI's JSON rows against a typed topic's value_schema.

Goal: a number too large for a float32 column is refused naming its line and column (a safe
Arrow cast stores it as +-Infinity), while the rows before it are kept and float64 columns,
small numbers and an infinity given as such pass. Method: ``rows_to_table`` directly.
"""

from __future__ import annotations

import pyarrow as pa

from logstore.cli.json_rows import rows_to_table

SCHEMA = pa.schema([("f", pa.float32()), ("d", pa.float64())])


def test_a_number_too_large_for_float32_is_refused_naming_line_and_column() -> None:
    table, error = rows_to_table([{"f": 1.5, "d": 1e300}, {"f": 2}, {"f": -1e300}],
                                 [1, 2, 3], SCHEMA)
    assert error is not None
    assert error.startswith("line 3: column 'f'") and "float32" in error
    assert table.column("f").to_pylist() == [1.5, 2.0]


def test_an_infinity_given_and_large_doubles_pass() -> None:
    table, error = rows_to_table([{"f": float("-inf"), "d": 1e300}], [1], SCHEMA)
    assert error is None and table.to_pylist() == [{"f": float("-inf"), "d": 1e300}]
