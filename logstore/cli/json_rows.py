"""JSON lines to Arrow and back, for topics with typed values.

Owns: reading stdin as lines, chunking JSON-object lines into Arrow tables of a topic's schema
(each value checked against its column's type more strictly than Arrow's casts: no silent
truncation, no numbers as text; a bad line or value is named by line number and column), and
printing value columns as JSON text (timestamps, dates and decimals as text that reads back).
Must not: talk to brokers or write to the terminal; pyarrow is imported lazily.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from logstore.cli.schema_spec import brief, struct_fields, type_spec

if TYPE_CHECKING:
    import pyarrow as pa


# -- JSON lines to Arrow ----------------------------------------------------------------------


def lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Each line of ``stream`` without its line ending."""
    for line in stream:
        yield line.rstrip(b"\r\n") if line.endswith(b"\n") else line


class BadLine(ValueError):
    """A line of stdin that cannot become a record; the message names it."""


class _Mismatch(ValueError):
    """JSON values that cannot become an Arrow type; the message says why."""


def json_chunks(stream: IO[bytes], columns: list[str], chunk_rows: int
                ) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    """(line numbers, objects) per ``chunk_rows`` non-blank lines. A line that is not an
    object of known columns ends the last chunk early, then raises BadLine."""
    allowed = set(columns)
    numbers: list[int] = []
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines(stream), start=1):
        if not line.strip():
            continue
        problem = None
        try:
            row = json.loads(line)
        except ValueError as e:
            problem = f"line {number} is not JSON ({e})"
        else:
            problem = _object_problem(row, number, allowed, columns)
        if problem is not None:
            yield numbers, rows
            raise BadLine(problem)
        numbers.append(number)
        rows.append(row)
        if len(rows) >= chunk_rows:
            yield numbers, rows
            numbers, rows = [], []
    yield numbers, rows


def _object_problem(row: Any, number: int, allowed: set[str], columns: list[str]
                    ) -> str | None:
    if not isinstance(row, dict):
        return f"line {number}: expected a JSON object of columns, got {brief(row)}"
    unknown = row.keys() - allowed
    if unknown:
        return (f"line {number}: unknown column(s) {sorted(unknown)}; the topic's are "
                f"{columns}")
    return None


def rows_to_table(rows: list[dict[str, Any]], numbers: list[int], schema: pa.Schema
                  ) -> tuple[pa.Table, str | None]:
    """``rows`` as a table of ``schema``, built column by column; on a bad value, the table of
    the rows before it and a message naming its line and column."""
    import pyarrow as pa

    columns = []
    first_bad: tuple[int, str] | None = None
    for field in schema:
        values = [row.get(field.name) for row in rows]
        try:
            columns.append(_json_column(values, field.type))
        except _BadValue as e:
            if first_bad is None or e.index < first_bad[0]:
                first_bad = (e.index, f"line {numbers[e.index]}: column {field.name!r}: {e}")
    if first_bad is None:
        return pa.Table.from_arrays(columns, schema=schema), None
    table, _ = rows_to_table(rows[:first_bad[0]], numbers, schema)
    return table, first_bad[1]


class _BadValue(ValueError):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def _json_column(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """One column of JSON values as Arrow, in one conversion when it can be. Otherwise value
    by value: that finds the bad one, and also converts a column that mixes accepted forms
    (integer and text timestamps), which Arrow cannot infer as one type."""
    import pyarrow as pa

    try:
        return _json_array(values, data_type)
    except _Mismatch:
        pass
    pieces = []
    for index, value in enumerate(values):
        try:
            pieces.append(_json_array([value], data_type))
        except _Mismatch as e:
            raise _BadValue(index, f"{brief(value)} is not a valid {type_spec(data_type)} "
                                   f"({e})") from None
    return pa.concat_arrays(pieces) if pieces else pa.array([], data_type)


def _json_array(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """Arrow infers the values' type, which must be a kind ``data_type`` accepts, and then
    casts safely. Converting straight to ``data_type`` would truncate 1.5 to an integer, split
    a string into a list of characters and drop unknown struct fields without a word."""
    import pyarrow as pa

    try:
        inferred = pa.array(values)
    except OverflowError:
        return _big_integers(values, data_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise _Mismatch(_arrow_reason(e)) from None
    problem = _kind_problem(inferred.type, data_type)
    if problem is not None:
        raise _Mismatch(problem)
    try:
        staging = _staging_type(inferred.type, data_type)
        if staging != inferred.type:
            inferred = inferred.cast(staging)
        out = inferred.cast(data_type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _Mismatch(_arrow_reason(e)) from None
    _check_overflow(inferred, out)
    return out


def _check_overflow(source: pa.Array, narrowed: pa.Array) -> None:
    """A safe cast still turns a number too large for a narrower float (float32) into
    +-Infinity: refused, as any other value the column cannot hold."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as t

    if not t.is_floating(narrowed.type) or not (
            t.is_integer(source.type) or t.is_floating(source.type)):
        return
    was_inf = pc.is_inf(source.cast(pa.float64()))
    if pc.any(pc.and_(pc.is_inf(narrowed), pc.invert(was_inf))).as_py():
        raise _Mismatch(f"too large for {narrowed.type} (it would become Infinity)")


def _big_integers(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """Integers past int64, which Arrow cannot infer; only uint64 holds them."""
    import pyarrow as pa

    if not pa.types.is_uint64(data_type) or any(
            type(v) is not int for v in values if v is not None):
        raise _Mismatch("an integer out of range")
    try:
        return pa.array(values, data_type)
    except (OverflowError, pa.ArrowInvalid) as e:
        raise _Mismatch(str(e)) from None


def _kind_problem(source: pa.DataType, target: pa.DataType) -> str | None:
    """Why JSON values Arrow inferred as ``source`` may not fill a ``target`` column, or None.
    Stricter than Arrow's casts, which also turn numbers into text and text into numbers."""
    import pyarrow.types as t

    if t.is_null(source):
        return None
    if t.is_struct(target):
        return _struct_problem(source, target)
    if t.is_list(target):
        if not t.is_list(source):
            return f"expected a list, got {_json_kind(source)}"
        return _kind_problem(source.value_type, target.value_type)
    number, text = (t.is_integer, t.is_floating), (t.is_string,)
    accepts = ((t.is_integer, number, "an integer"), (t.is_floating, number, "a number"),
               (t.is_boolean, (t.is_boolean,), "true or false"),
               (t.is_string, text, "a string"), (t.is_binary, text, "a string"),
               (t.is_timestamp, (t.is_integer, t.is_string), "ISO-8601 text or an integer"),
               (t.is_date32, text, "YYYY-MM-DD text"),
               (t.is_decimal, (*number, t.is_string), "a number or numeric text"))
    for is_target, sources, wanted in accepts:
        if is_target(target):
            return None if any(ok(source) for ok in sources) else \
                f"expected {wanted}, got {_json_kind(source)}"
    return None  # a type outside the --value-schema syntax: Arrow's cast decides


def _struct_problem(source: pa.DataType, target: pa.DataType) -> str | None:
    import pyarrow.types as t

    if not t.is_struct(source):
        return f"expected an object, got {_json_kind(source)}"
    for field in struct_fields(source):
        index = target.get_field_index(field.name)
        if index < 0:
            return f"unknown field {field.name!r}"
        problem = _kind_problem(field.type, target.field(index).type)
        if problem is not None:
            return f"field {field.name!r}: {problem}"
    return None


def _staging_type(source: pa.DataType, target: pa.DataType) -> pa.DataType:
    """``source`` with numbers bound for decimal columns turned to text: Arrow's number to
    decimal casts round floats silently and need more precision than the column for integers,
    while a cast from text is exact or fails."""
    import pyarrow as pa

    if pa.types.is_struct(source) and pa.types.is_struct(target):
        return pa.struct([f.with_type(_staging_type(f.type, target.field(f.name).type))
                          for f in struct_fields(source)])
    if pa.types.is_list(source) and pa.types.is_list(target):
        return pa.list_(source.value_field.with_type(
            _staging_type(source.value_type, target.value_type)))
    if pa.types.is_decimal(target) and (pa.types.is_integer(source)
                                         or pa.types.is_floating(source)):
        return pa.string()
    return source


def _json_kind(data_type: pa.DataType) -> str:
    import pyarrow.types as t

    kinds = ((t.is_string, "a string"), (t.is_integer, "an integer"),
             (t.is_floating, "a fractional number"), (t.is_boolean, "true/false"),
             (t.is_list, "a list"), (t.is_struct, "an object"))
    return next((kind for test, kind in kinds if test(data_type)), str(data_type))


def _arrow_reason(error: Exception) -> str:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return reason if len(reason) <= 120 else reason[:117] + "..."


# -- Arrow to JSON text -----------------------------------------------------------------------


def json_values(values: pa.Table) -> list[str]:
    """Each row of ``values`` (a typed topic's value columns) as a JSON object's text."""
    import pyarrow as pa

    values = values.cast(pa.schema([f.with_type(_json_type(f.type)) for f in values.schema]))
    return [_json_text(row) for row in values.to_pylist()]


def _json_type(data_type: pa.DataType) -> pa.DataType:
    """The type a column is printed as: timestamps, dates and decimals as Arrow's text, which
    produce reads back (and which needs no time-zone database or pandas, unlike to_pylist)."""
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(_json_type(f.type)) for f in struct_fields(data_type)])
    if pa.types.is_list(data_type):
        return pa.list_(data_type.value_field.with_type(_json_type(data_type.value_type)))
    if (pa.types.is_timestamp(data_type) or pa.types.is_date(data_type)
            or pa.types.is_decimal(data_type)):
        return pa.string()
    return data_type


def _json_text(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> str:
    if isinstance(value, bytes):  # a binary column: UTF-8 text, as untyped values print
        return value.decode("utf-8", errors="replace")
    return str(value)
