"""jobs/ingest.py: JSON-lines files in a directory -> a typed topic, bad lines -> the
dead-letter topic with the reason in a header; a restarted query ingests no file twice.

At least once: files already in the checkpoint are never ingested again, so a stop and restart
adds no duplicate. Exactly once (--delivery exactly-once): no duplicate either when Spark
replays a micro-batch whose writes were published (the job died before its checkpoint
commit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.ingest import IngestError, parser, start
from logstore import Admin, NewTopic
from logstore.cli.schema_spec import value_schema_arg
from tests.brokers import BrokerProcess
from tests.spark.helpers import consumer_rows

QUERY_TIMEOUT_S = 120


def _ingest(spark: Any, *argv: str) -> None:
    query = start(spark, parser().parse_args([*argv, "--once"]))
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the ingest query did not finish"
    assert query.exception() is None


def _typed_values(bootstrap: str, topic: str) -> list[tuple[Any, ...]]:
    from logstore import Consumer
    from logstore.model import TopicPartition

    rows: list[tuple[Any, ...]] = []
    with Consumer(bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        for _ in range(20):
            for table in consumer.poll_arrow(timeout_ms=200).values():
                rows += zip(table.column("key").to_pylist(), table.column("id").to_pylist(),
                            table.column("name").to_pylist(), strict=True)
    return sorted(rows, key=lambda r: r[1])


def test_good_lines_to_topic_bad_to_dead_letter_and_restart_adds_no_duplicate(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: good lines become typed records (key from "key"), each bad line (not JSON, an
    unknown column, a value of the wrong type) goes to the dead-letter topic with its reason
    in the ``error`` header; a second run over the same checkpoint ingests only the new file.
    Method: two files, two --once runs, both topics read back with a Consumer."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("orders-in", 1,
                                      value_schema=value_schema_arg("id:int64,name:string")),
                             NewTopic("orders-in.dlq", 1)])
    source = tmp_path / "landing"
    source.mkdir()
    (source / "a.jsonl").write_text(
        '{"key": "k1", "id": 1, "name": "one"}\n'
        'not json\n'
        '{"id": 2, "name": "two"}\n'
        '{"id": "three", "name": "x"}\n'
        '{"id": 4, "colour": "red"}\n')
    argv = ["--source-dir", str(source), "--topic", "orders-in",
            "--checkpoint", str(tmp_path / "cp"), "--bootstrap-server", broker.bootstrap]
    _ingest(spark, *argv)
    assert _typed_values(broker.bootstrap, "orders-in") == [(b"k1", 1, "one"), (None, 2, "two")]
    dead = consumer_rows(broker.bootstrap, "orders-in.dlq")
    reasons = {r[3]: dict(r[5])["error"].decode() for r in dead}
    assert sorted(reasons) == sorted([b'{"id": "three", "name": "x"}',
                                      b'{"id": 4, "colour": "red"}', b"not json"])
    assert reasons[b"not json"].startswith("not JSON")
    assert "'id'" in reasons[b'{"id": "three", "name": "x"}']
    assert "unknown column(s) ['colour']" in reasons[b'{"id": 4, "colour": "red"}']
    assert all(dict(r[5])["source.file"].decode().endswith("a.jsonl") for r in dead)
    (source / "b.jsonl").write_text('{"id": 5, "name": "five"}\n')
    _ingest(spark, *argv)  # the restart: a.jsonl is in the checkpoint, only b.jsonl is new
    assert [r[1] for r in _typed_values(broker.bootstrap, "orders-in")] == [1, 2, 5]
    assert len(consumer_rows(broker.bootstrap, "orders-in.dlq")) == 3


def test_exactly_once_delivery_publishes_a_replayed_batch_once(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: --delivery exactly-once writes good lines and dead letters in the batch's
    transaction (read_committed sees them), and a micro-batch Spark replays after a crash
    (same batch id, same files) adds nothing to either topic. Method: one --once run; then
    the query's foreachBatch function called again with batch 0's lines, as a replay would."""
    from jobs.ingest import sink_id_of, write_batch
    from tests.txn_reading import read_values

    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("eo-in", 1, value_schema=value_schema_arg("n:int64")),
                             NewTopic("eo-in.dlq", 1)])
    source = tmp_path / "landing"
    source.mkdir()
    (source / "a.jsonl").write_text('{"n": 1}\nnot json\n{"n": 2}\n')
    argv = ["--source-dir", str(source), "--topic", "eo-in", "--checkpoint",
            str(tmp_path / "cp"), "--bootstrap-server", broker.bootstrap, "--delivery",
            "exactly-once"]
    _ingest(spark, *argv)
    expected = {"eo-in": [1, 2], "eo-in.dlq": [b"not json"]}

    def topics() -> dict[str, list[Any]]:
        return {t: read_values(broker.bootstrap, t, [0], column=c)[0]
                for t, c in (("eo-in", "n"), ("eo-in.dlq", "value"))}
    assert topics() == expected
    args = parser().parse_args(argv)
    replay = write_batch(broker.bootstrap, "eo-in", "eo-in.dlq", sink_id_of(args))
    replay(spark.read.text(str(source)), 0)
    assert topics() == expected
    replay(spark.read.text(str(source)), 1)  # a new batch id is published
    assert [len(v) for v in topics().values()] == [4, 2]


def test_an_s3_source_is_refused(spark: Any, tmp_path: Path) -> None:
    """Goal: an s3:// source is refused naming the reason. Method: start() with one."""
    base = ["--topic", "t", "--checkpoint", str(tmp_path / "cp")]
    with pytest.raises(IngestError, match="no S3 connector"):
        start(spark, parser().parse_args(["--source-dir", "s3://b/landing", *base]))
