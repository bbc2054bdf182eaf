"""The sink's options and sink id, without a broker or a Spark session (datasource/writer.py's
``parse_sink_options``, datasource/sink.py's ``resolve_sink_id``, sink_commit.py's task ids).

Importing pyspark classes is fine here; nothing starts a JVM.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from datasource.options import OptionError
from datasource.sink import resolve_sink_id
from datasource.sink_commit import task_id_pattern
from datasource.writer import DEFAULT_TRANSACTION_TIMEOUT_MS, SinkSettings, parse_sink_options

BASE = {"bootstrap.servers": "127.0.0.1:9092", "topic": "out"}


def sink(streaming: bool, **options: str) -> SinkSettings:
    return parse_sink_options({**BASE, **options}, streaming)


def error(streaming: bool, **options: str) -> str:
    with pytest.raises(OptionError) as e:
        resolve_sink_id(sink(streaming, **options)) if streaming else sink(False, **options)
    return str(e.value)


def test_streams_are_exactly_once_and_batch_writes_are_not_transactional_by_default() -> None:
    """Goal: writeStream defaults to exactly once, df.write to at least once, both with
    acks=all and the documented transaction timeout. Method: parse the minimal options."""
    stream, batch = sink(True), sink(False)
    assert stream.transactional and not batch.transactional
    assert stream.acks == batch.acks == "all"
    assert stream.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS
    assert not sink(True, exactlyOnce="FALSE").transactional
    assert sink(False, transactional="true").transactional
    assert sink(True, transactionTimeoutMs="5000").transaction_timeout_ms == 5000


@pytest.mark.parametrize(("streaming", "options", "needles"), [
    (False, {"exactlyOnce": "true"}, ["exactlyonce", "['exactlyOnce'] belong to writeStream"]),
    (True, {"transactional": "true"}, ["transactional", "['transactional'] belong to df.write"]),
    (True, {"exactlyOnce": "yes"}, ["exactlyOnce must be 'true' or 'false'", "'yes'"]),
    (False, {"transactional": "true", "acks": "1"}, ["acks='1' with transactional=true"]),
    (True, {"sinkId": "a b"}, ["sinkId: sink id 'a b' must be"]),
    (True, {"sinkId": "x" * 201}, ["must be 1 to 200"]),
    (True, {"transactionTimeoutMs": "0"}, ["transactionTimeoutMs must be a positive integer"]),
    (True, {"transactionTimeoutMs": "1m"}, ["transactionTimeoutMs must be an integer"]),
])
def test_bad_sink_options_name_the_option(streaming: bool, options: dict[str, str],
                                          needles: list[str]) -> None:
    """Goal: each misplaced or malformed sink option fails before anything is written, with a
    message naming it. Method: parse bad options for the write they do not fit."""
    with pytest.raises(OptionError) as e:
        sink(streaming, **options)
    for needle in needles:
        assert needle in str(e.value)


def test_the_sink_id_is_the_option_else_the_checkpoints_query_id(tmp_path: Path) -> None:
    """Goal: sinkId wins; without it the query id Spark writes to <checkpoint>/metadata is
    the sink's id, for plain and file: checkpoint paths. Method: a metadata file as Spark
    writes it, and checkpoint locations in three spellings."""
    (tmp_path / "metadata").write_text('{"id":"0f1e2d3c-aaaa-bbbb-cccc-001122334455"}')
    query_id = "0f1e2d3c-aaaa-bbbb-cccc-001122334455"
    for location in (str(tmp_path), f"file:{tmp_path}", f"file://{tmp_path}"):
        assert resolve_sink_id(sink(True, checkpointLocation=location)) == query_id
    assert resolve_sink_id(sink(True, checkpointLocation=str(tmp_path), sinkId="mine")) == "mine"


def test_exactly_once_without_a_resolvable_sink_id_names_the_sink_id_option(
        tmp_path: Path) -> None:
    """Goal: exactly once needs a stable sink id; when neither sinkId nor a readable local
    checkpoint gives one, the error says to set sinkId (and why). Method: no checkpoint
    option, an s3a:// checkpoint, a checkpoint without metadata."""
    assert "no checkpointLocation option" in error(True)
    assert "set the sinkId option" in error(True)
    remote = error(True, checkpointLocation="s3a://bucket/ckpt")
    assert "'s3a://bucket/ckpt' is not a local path" in remote and "sinkId" in remote
    missing = error(True, checkpointLocation=str(tmp_path))
    assert str(tmp_path / "metadata") in missing and "sinkId" in missing
    assert resolve_sink_id(sink(True, exactlyOnce="false", sinkId="s")) == "s"


def test_task_ids_of_a_sink_never_match_another_sinks() -> None:
    """Goal: leftovers of sink S are found among ids ``S-<p>-<a>-<k>`` only: a sink whose id
    starts with S's (``S-1``, ``S0``) has ids the pattern refuses. Method: the pattern of S
    against S's and its neighbours' task ids."""
    pattern = task_id_pattern("q1")
    assert pattern.fullmatch("q1-0-0-3") and pattern.fullmatch("q1-12-1-0")
    for other in ("q1-1-0-0-3", "q10-0-0-3", "q1-0-0", "q1", "q1-a-0-3"):
        assert not pattern.fullmatch(other), other
    assert task_id_pattern("a.b").fullmatch("a.b-0-0-1")
    assert not task_id_pattern("a.b").fullmatch("axb-0-0-1")
    assert re.escape("a.b") in task_id_pattern("a.b").pattern
