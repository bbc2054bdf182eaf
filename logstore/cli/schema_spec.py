"""The ``--value-schema`` syntax: a typed topic's value columns as text, parsed to Arrow, and
Arrow types printed back in the same syntax.

Owns: the grammar (``VALUE_SCHEMA_HELP``), its recursive-descent parser, the ``@FILE.json``
form, and the messages for a spec that does not parse, each naming the column and the text at
fault (an ``argparse.ArgumentTypeError``, so a bad spec is a usage error, exit 2). Must not:
talk to brokers; pyarrow is imported lazily, so the ``logstore`` parser can be built without it.
"""

from __future__ import annotations

import argparse
import json
import re
import zoneinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

VALUE_SCHEMA_HELP = (
    "the value's Arrow columns, as NAME:TYPE[,NAME:TYPE...] or @FILE.json holding a JSON list "
    'of {"name": NAME, "type": TYPE}. NAME is [A-Za-z_][A-Za-z0-9_]* (any text in a file) and '
    "not key, timestamp or headers. TYPE is int8|int16|int32|int64, uint8..uint64, float32 "
    "(float), float64 (double), bool, string (utf8), binary, date32, timestamp[UNIT] or "
    "timestamp[UNIT,TZ] (UNIT s|ms|us|ns, TZ like UTC or +01:00), decimal128(P,S), list<TYPE>, "
    "struct<NAME:TYPE,...>. Example: id:int64,tags:list<string>,at:timestamp[ms,UTC]")



_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\d+")
_TIME_ZONE = re.compile(r"[^\]]+")
_UTC_OFFSET = re.compile(r"[+-]\d\d:\d\d")
_SIMPLE_TYPES = {  # spec name -> pyarrow factory
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float32": "float32",
    "float": "float32", "float64": "float64", "double": "float64", "bool": "bool_",
    "string": "string", "utf8": "string", "binary": "binary", "date32": "date32"}
_TYPE_LIST = ("int8..int64, uint8..uint64, float32, float64, double, bool, string, binary, "
              "date32, timestamp[unit,tz], decimal128(p,s), list<T>, struct<name:T,...>")


class SchemaSpecError(ValueError):
    """A --value-schema that does not parse; the message names the column and the text."""


class _SpecParser:
    """Recursive descent over ``VALUE_SCHEMA_HELP``'s grammar; spaces between tokens are fine.
    Names are case-sensitive, type names and units are not."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        fields = self.fields("")
        self.end(f"after column {fields[-1].name!r}")
        return pa.schema(fields)

    def whole_type(self, column: str) -> pa.DataType:
        data_type = self.type(column)
        self.end(f"after the type of {column!r}")
        return data_type

    def fields(self, where: str) -> list[pa.Field]:
        """NAME:TYPE (',' NAME:TYPE)*: the columns, or a struct's fields when ``where`` names
        the struct's column."""
        fields = [self.field(where)]
        while self.take(","):
            fields.append(self.field(where))
        _check_unique([f.name for f in fields], where)
        return fields

    def field(self, where: str) -> pa.Field:
        import pyarrow as pa

        name = self.match(_NAME)
        if name is None:
            raise self.error(f"column {where!r}: expected a field name" if where else
                             "expected a column name")
        path = f"{where}.{name}" if where else name
        if not self.take(":"):
            raise self.error(f"column {path!r} needs ':' and a type, as in '{name}:int64'")
        return pa.field(name, self.type(path))

    def type(self, column: str) -> pa.DataType:
        import pyarrow as pa

        start = self.pos
        word = (self.match(_NAME) or "").lower()
        if word in _SIMPLE_TYPES:
            return getattr(pa, _SIMPLE_TYPES[word])()
        if word == "timestamp":
            return self.timestamp(column)
        if word == "decimal128":
            return self.decimal128(column)
        if word == "list":
            self.expect("<", column)
            item = self.type(column)
            self.expect(">", column)
            return pa.list_(item)
        if word == "struct":
            self.expect("<", column)
            fields = self.fields(column)
            self.expect(">", column)
            return pa.struct(fields)
        self.pos = start
        if not word:
            raise self.error(f"column {column!r}: expected a type")
        raise SchemaSpecError(f"column {column!r}: unknown type {word!r}; the types are "
                              f"{_TYPE_LIST}")

    def timestamp(self, column: str) -> pa.DataType:
        import pyarrow as pa

        self.expect("[", column)
        start = self.pos
        unit = (self.match(_NAME) or "").lower()
        if unit not in ("s", "ms", "us", "ns"):
            self.pos = start
            raise self.error(f"column {column!r}: the timestamp unit must be s, ms, us or ns")
        tz = None
        if self.take(","):
            start = self.pos
            tz = (self.match(_TIME_ZONE) or "").strip()
            if not _known_time_zone(tz):
                self.pos = start
                raise self.error(f"column {column!r}: unknown time zone {tz!r}")
        self.expect("]", column)
        return pa.timestamp(unit, tz=tz)

    def decimal128(self, column: str) -> pa.DataType:
        import pyarrow as pa

        self.expect("(", column)
        precision = self.number(column)
        self.expect(",", column)
        scale = self.number(column)
        self.expect(")", column)
        try:
            return pa.decimal128(precision, scale)
        except ValueError as e:
            raise SchemaSpecError(f"column {column!r}: decimal128({precision},{scale}): "
                                  f"{e}") from None

    def number(self, column: str) -> int:
        digits = self.match(_NUMBER)
        if digits is None:
            raise self.error(f"column {column!r}: expected a number")
        return int(digits)

    def expect(self, token: str, column: str) -> None:
        if not self.take(token):
            raise self.error(f"column {column!r}: expected {token!r}")

    def end(self, where: str) -> None:
        self.skip_spaces()
        if self.pos < len(self.text):
            raise self.error(f"unexpected text {where} (columns are separated by ',')")

    def take(self, token: str) -> bool:
        self.skip_spaces()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def match(self, pattern: re.Pattern[str]) -> str | None:
        self.skip_spaces()
        found = pattern.match(self.text, self.pos)
        if found is None:
            return None
        self.pos = found.end()
        return found.group()

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def error(self, message: str) -> SchemaSpecError:
        rest = self.text[self.pos:].strip()
        found = f"found {rest[:40]!r}" if rest else "found the end of the text"
        return SchemaSpecError(f"{message}; {found}")


def _known_time_zone(tz: str) -> bool:
    if _UTC_OFFSET.fullmatch(tz):
        return True
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _check_unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SchemaSpecError(f"column {where!r}: duplicate field {name!r}" if where else
                                  f"duplicate column {name!r}")
        seen.add(name)


def value_schema_arg(text: str) -> pa.Schema:
    """argparse type of --value-schema: a spec, or ``@path`` of a JSON list of columns."""
    from logstore.records import RESERVED_COLUMNS

    try:
        schema = _schema_file(text[1:]) if text.startswith("@") else _SpecParser(text).schema()
    except SchemaSpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    for name in schema.names:
        if name in RESERVED_COLUMNS:
            raise argparse.ArgumentTypeError(
                f"column {name!r} is reserved: every record has {', '.join(RESERVED_COLUMNS)} "
                "(produce takes a typed record's key from its \"key\" field)")
    return schema


def _schema_file(path: str) -> pa.Schema:
    import pyarrow as pa

    try:
        entries = json.loads(Path(path).read_text())
    except OSError as e:
        raise SchemaSpecError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SchemaSpecError(f"{path} is not JSON: {e}") from None
    if not isinstance(entries, list) or not entries:
        raise SchemaSpecError(f'{path}: expected a non-empty list of {{"name": ..., "type": ...}}')
    fields = []
    for number, entry in enumerate(entries, start=1):
        if not (isinstance(entry, dict) and entry.keys() == {"name", "type"}
                and all(isinstance(v, str) and v for v in entry.values())):
            raise SchemaSpecError(f'{path}: entry {number} must be {{"name": NAME, "type": '
                                  f"TYPE}} with two non-empty strings, got {brief(entry)}")
        try:
            fields.append(pa.field(entry["name"], _SpecParser(entry["type"]).whole_type(
                entry["name"])))
        except SchemaSpecError as e:
            raise SchemaSpecError(f"{path}: {e}") from None
    _check_unique([f.name for f in fields], "")
    return pa.schema(fields)


def type_spec(data_type: pa.DataType) -> str:
    """``data_type`` in the --value-schema syntax (Arrow's own text for a type outside it)."""
    import pyarrow as pa

    if pa.types.is_timestamp(data_type):
        return f"timestamp[{data_type.unit}{',' + data_type.tz if data_type.tz else ''}]"
    if pa.types.is_decimal128(data_type):
        return f"decimal128({data_type.precision},{data_type.scale})"
    if pa.types.is_list(data_type):
        return f"list<{type_spec(data_type.value_type)}>"
    if pa.types.is_struct(data_type):
        return "struct<" + ",".join(f"{f.name}:{type_spec(f.type)}"
                                    for f in struct_fields(data_type)) + ">"
    return {"float": "float32", "date32[day]": "date32"}.get(str(data_type), str(data_type))


def struct_fields(data_type: pa.DataType) -> list[pa.Field]:
    """A struct type's fields, in order."""
    return [data_type.field(i) for i in range(data_type.num_fields)]


def brief(value: Any) -> str:
    """``value`` as JSON, cut to 60 characters, for error messages."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
