"""jobs/ingest.py: JSON-lines files in a directory (local, or s3:// on moto's server) -> a
typed topic, bad lines -> the dead-letter topic with the reason in a header; a restarted query
ingests no file twice.

At least once: files already in the checkpoint are never ingested again, so a stop and restart
adds no duplicate. Exactly once (--delivery exactly-once): no duplicate either when Spark
replays a micro-batch whose writes were published (the job died before its checkpoint
commit).
"""

from __future__ import annotations

import json
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
    replay(spark.read.format("logstore-files").load(str(source)), 0)
    assert topics() == expected
    replay(spark.read.format("logstore-files").load(str(source)), 1)  # a new batch id is published
    assert [len(v) for v in topics().values()] == [4, 2]


def test_an_s3_source_ingests_each_file_once_across_a_restart_and_a_replayed_batch(
        spark: Any, broker: BrokerProcess, moto_s3: Any, tmp_path: Path) -> None:
    """Goal: an s3:// directory is a streaming source like a local one: good lines to the
    topic, bad ones to the dead-letter topic naming their s3:// file, maxFilesPerTrigger
    honoured, and with --delivery exactly-once neither a restart nor a micro-batch Spark
    replays from its checkpoint (its commit removed: the job died after the writes) adds a
    duplicate. Method: files put with boto3 on moto; three --once runs over one checkpoint,
    the last after deleting the newest commit; both topics read read_committed."""
    import boto3

    from tests.txn_reading import read_values

    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("s3-in", 1, value_schema=value_schema_arg("n:int64")),
                             NewTopic("s3-in.dlq", 1)])
    bucket = moto_s3.create_bucket()
    s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint_url, region_name="us-east-1")
    s3.put_object(Bucket=bucket, Key="landing/a.jsonl", Body=b'{"n": 1}\nnot json\n')
    s3.put_object(Bucket=bucket, Key="landing/b.jsonl", Body=b'{"n": 2}\n{"m": 0}\n')
    s3.put_object(Bucket=bucket, Key="landing/_temporary", Body=b'{"n": 99}\n')
    checkpoint = tmp_path / "cp"
    argv = ["--source-dir", f"s3://{bucket}/landing", "--topic", "s3-in", "--checkpoint",
            str(checkpoint), "--bootstrap-server", broker.bootstrap, "--delivery",
            "exactly-once", "--max-files-per-trigger", "1",
            "--source-options", json.dumps(moto_s3.options())]

    def topics() -> dict[str, list[Any]]:
        return {t: read_values(broker.bootstrap, t, [0], column=c)[0]
                for t, c in (("s3-in", "n"), ("s3-in.dlq", "value"))}
    query = start(spark, parser().parse_args([*argv, "--once"]))
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the ingest query did not finish"
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [2, 2]
    assert topics() == {"s3-in": [1, 2], "s3-in.dlq": [b"not json", b'{"m": 0}']}
    headers = read_values(broker.bootstrap, "s3-in.dlq", [0], column="headers")[0]
    assert [dict((h["key"], h["value"]) for h in hs)["source.file"] for hs in headers] == \
        [f"s3://{bucket}/landing/a.jsonl".encode(), f"s3://{bucket}/landing/b.jsonl".encode()]
    s3.put_object(Bucket=bucket, Key="landing/c.jsonl", Body=b'{"n": 3}\n')
    _ingest(spark, *argv)  # the restart: only c.jsonl is new
    assert topics() == {"s3-in": [1, 2, 3], "s3-in.dlq": [b"not json", b'{"m": 0}']}
    newest = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(newest), f".{newest}.crc"):  # died after publishing, before committing
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    s3.put_object(Bucket=bucket, Key="landing/d.jsonl", Body=b'{"n": 4}\n')
    _ingest(spark, *argv)  # batch `newest` replayed (c.jsonl again, skipped), then d.jsonl
    assert topics() == {"s3-in": [1, 2, 3, 4], "s3-in.dlq": [b"not json", b'{"m": 0}']}


def test_a_missing_directory_or_bucket_is_refused_naming_it(spark: Any, moto_s3: Any,
                                                            tmp_path: Path) -> None:
    """Goal: a source directory that is not there fails at start naming its URL. Method:
    start() with a missing local directory, a missing bucket and credentials in options."""
    base = ["--topic", "t", "--checkpoint", str(tmp_path / "cp")]
    with pytest.raises(IngestError, match=f"source directory {tmp_path}/nope: not found"):
        start(spark, parser().parse_args(["--source-dir", str(tmp_path / "nope"), *base]))
    options = ["--source-options", json.dumps(moto_s3.options())]
    with pytest.raises(IngestError, match="s3://no-such-bucket-y/in: bucket 'no-such-bucket-y' "
                                          "not found"):
        start(spark, parser().parse_args(["--source-dir", "s3://no-such-bucket-y/in",
                                          *options, *base]))
    with pytest.raises(IngestError, match="--source-options.secret looks like a credential"):
        start(spark, parser().parse_args(["--source-dir", str(tmp_path), "--source-options",
                                          '{"secret": "x"}', *base]))


def test_a_running_query_ingests_files_as_they_land_in_s3(
        spark: Any, broker: BrokerProcess, moto_s3: Any, tmp_path: Path) -> None:
    """Goal: with a processing-time trigger the query keeps listing the s3:// directory (no
    stale cached listing) and ingests each file that lands, once. Method: start the query on
    an empty prefix, put two files one after the other, wait for each in the topic."""
    import boto3

    from tests.helpers import wait_for
    from tests.txn_reading import read_values

    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("live-in", 1, value_schema=value_schema_arg("n:int64")),
                             NewTopic("live-in.dlq", 1)])
    bucket = moto_s3.create_bucket()
    s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint_url, region_name="us-east-1")
    query = start(spark, parser().parse_args([
        "--source-dir", f"s3://{bucket}/landing", "--topic", "live-in", "--checkpoint",
        str(tmp_path / "cp"), "--bootstrap-server", broker.bootstrap, "--trigger-interval",
        "0.5", "--source-options", json.dumps(moto_s3.options())]))
    try:
        def ingested() -> list[int]:
            assert query.exception() is None
            return read_values(broker.bootstrap, "live-in", [0], column="n")[0]
        s3.put_object(Bucket=bucket, Key="landing/a.jsonl", Body=b'{"n": 1}\n{"n": 2}\n')
        wait_for(lambda: ingested() == [1, 2], "a.jsonl ingested", QUERY_TIMEOUT_S)
        s3.put_object(Bucket=bucket, Key="landing/b.jsonl", Body=b'{"n": 3}\n')
        wait_for(lambda: ingested() == [1, 2, 3], "b.jsonl ingested", QUERY_TIMEOUT_S)
    finally:
        query.stop()

