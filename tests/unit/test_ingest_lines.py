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
    lines = [b'{"a": 1}', b"not json", b'"text"', b""]
    good, bad = _split(parse_lines(lines, ["f.jsonl"] * len(lines), None))
    assert good.column("value").to_pylist() == [b'{"a": 1}', b'"text"']
    assert good.column("key").null_count == 2
    assert bad.column("_line").to_pylist() == [b"not json"]
    assert bad.column("_error").to_pylist()[0].startswith("not JSON")
    letters = dead_letters(bad)
    assert letters.column("value").to_pylist() == [b"not json"]
    assert [h["key"] for h in letters.column("headers").to_pylist()[0]] == ["error", "source.file"]


def test_a_typed_topic_sends_a_value_that_does_not_fit_to_the_dead_letters() -> None:
    values = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.string())])
    lines = [b'{"n": 1, "s": "a"}', b'{"n": "x", "s": "b"}', b'{"n": 3, "key": "k"}',
             b'{"m": 1}', b"[1]"]
    good, bad = _split(parse_lines(lines, ["f.jsonl"] * len(lines), values))
    assert good.column("n").to_pylist() == [1, 3]
    assert good.column("s").to_pylist() == ["a", None]
    assert sorted(bad.column("_line").to_pylist()) == sorted(lines[1:2] + lines[3:])
    reasons = " ".join(bad.column("_error").to_pylist())
    assert "'n'" in reasons and "unknown column" in reasons and "JSON object" in reasons


def test_a_line_that_is_not_utf8_goes_to_the_dead_letters_as_it_was() -> None:
    """Goal: a Latin-1 line was decoded with replacement characters and ingested as a good
    record (its text silently changed); now it is a dead letter holding the bytes as read,
    its reason naming the first bad byte, on untyped and typed topics alike. Method: a good
    line, then b'{"s": "caf\\xe9"}'."""
    lines = [b'{"s": "ok"}', b'{"s": "caf\xe9"}']
    for values in (None, pa.schema([pa.field("s", pa.string())])):
        good, bad = _split(parse_lines(lines, ["f.jsonl"] * 2, values))
        assert good.num_rows == 1
        assert bad.column("_line").to_pylist() == [lines[1]]
        assert bad.column("_error").to_pylist() == ["not UTF-8: byte 10 of the line is 0xe9"]
        assert dead_letters(bad).column("value").to_pylist() == [lines[1]]
