"""jobs/ingest.py's line parsing, without Spark: good lines become the topic's columns, bad
ones dead letters with the reason, on untyped and typed topics."""

from __future__ import annotations

import pyarrow as pa

from jobs.ingest import META, dead_letters, parse_lines


def _split(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    errors = table.column("_error")
    good = table.filter(errors.is_null()).drop_columns([f.name for f in META])
    return good, table.filter(errors.is_valid())


def test_an_untyped_topic_takes_each_good_line_as_its_value() -> None:
    lines = ['{"a": 1}', "not json", '"text"', ""]
    good, bad = _split(parse_lines(lines, ["f.jsonl"] * len(lines), None))
    assert good.column("value").to_pylist() == [b'{"a": 1}', b'"text"']
    assert good.column("key").null_count == 2
    assert bad.column("_line").to_pylist() == ["not json"]
    assert bad.column("_error").to_pylist()[0].startswith("not JSON")
    letters = dead_letters(bad)
    assert letters.column("value").to_pylist() == [b"not json"]
    assert [h["key"] for h in letters.column("headers").to_pylist()[0]] == ["error", "source.file"]


def test_a_typed_topic_sends_a_value_that_does_not_fit_to_the_dead_letters() -> None:
    values = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.string())])
    lines = ['{"n": 1, "s": "a"}', '{"n": "x", "s": "b"}', '{"n": 3, "key": "k"}',
             '{"m": 1}', "[1]"]
    good, bad = _split(parse_lines(lines, ["f.jsonl"] * len(lines), values))
    assert good.column("n").to_pylist() == [1, 3]
    assert good.column("s").to_pylist() == ["a", None]
    assert sorted(bad.column("_line").to_pylist()) == sorted(lines[1:2] + lines[3:])
    reasons = " ".join(bad.column("_error").to_pylist())
    assert "'n'" in reasons and "unknown column" in reasons and "JSON object" in reasons
