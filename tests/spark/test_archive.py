"""jobs/archive.py and the history read: a topic archived into an Iceberg table holds exactly
the log's records, resumes exactly once, and reads back with the log as one history.

Each test runs the job's driver in the shared local[2] session (``archive_helpers``), against a
real broker and a local or moto ``s3://`` warehouse, and compares record by record with a
Consumer read (``helpers.consumer_rows``).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datasource.archive_offsets import ARCHIVED_KEY, ArchiveDataLossError, decode
from datasource.iceberg import ArchiveOwnerError
from jobs.archive import Archiver, config_from
from jobs.archive_runner import SparkRunner
from logstore import Admin, Consumer, NewTopic
from logstore.cli.schema_spec import value_schema_arg
from logstore.errors import TopicAlreadyExistsError
from logstore.model import EARLIEST, LATEST, TopicPartition
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer, new_topic
from tests.helpers import wait_for
from tests.spark.archive_helpers import (
    load_table,
    parse,
    pylist,
    run_archive,
    table_rows,
    typed_rows,
    warehouse_args,
)
from tests.spark.helpers import consumer_rows, read, spark_rows

TYPED_SPEC = ("id:int64,small:int8,big:uint64,price:decimal128(10,2),ok:bool,name:string,"
              "blob:binary,day:date32,at:timestamp[ms,UTC],local:timestamp[us],"
              "nanos:timestamp[ns,Europe/Paris],tags:list<string>,"
              "point:struct<x:float64,y:float32>")


def _produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    with bounded_producer(bootstrap, linger_ms=0) as producer:
        for i in range(start, start + count):
            producer.send(topic, value=None if i % 11 == 0 else b"v%d" % i,
                          key=None if i % 7 == 0 else b"k%d" % i,
                          headers=[("h", b"%d" % i)] if i % 3 == 0 else [])
        producer.flush(30)


def _ends(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, int]:
    with Admin(bootstrap) as admin:
        return admin.list_offsets({TopicPartition(topic, p): LATEST for p in range(partitions)})


def test_default_topic_round_trip_resumes_exactly_once(spark: Any, broker: BrokerProcess,
                                                       tmp_path: Path) -> None:
    """Goal: the table holds exactly the log's records (null keys and values, headers), and a
    second run archives only what came after the first. Method: produce, archive, produce more,
    archive again, archive a third time with nothing new; compare with a Consumer read each
    time; the summary's coverage and group archive.<table> equal the log end offsets."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="arch")
    where = warehouse_args(tmp_path)
    argv = ["--topic", topic, "--table", "ns.events", *where,
            "--bootstrap-server", broker.bootstrap]
    _produce(broker.bootstrap, topic, 0, 300)
    first = run_archive(spark, *argv)
    assert table_rows(load_table(where, "ns.events")) == consumer_rows(broker.bootstrap, topic)
    _produce(broker.bootstrap, topic, 300, 200)
    second = run_archive(spark, *argv)
    assert (first.totals.records, second.totals.records) == (300, 200)
    assert run_archive(spark, *argv).totals.commits == 0  # nothing new: no data commit
    table = load_table(where, "ns.events")
    assert table_rows(table) == consumer_rows(broker.bootstrap, topic)
    ends = _ends(broker.bootstrap, topic, 3)
    coverage = decode(table.current_snapshot().summary.additional_properties[ARCHIVED_KEY])
    assert {tp: end for tp, (_, end) in coverage.items()} == ends
    with Admin(broker.bootstrap) as admin:
        committed = admin.list_group_offsets("archive.ns.events")
        assert "archive.ns.events" in [g.group_id for g in admin.list_groups()]
    assert {tp: om.offset for tp, om in committed.items()} == ends


def test_a_run_taken_over_stops_with_an_error_naming_the_table_and_runs(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: one run per table: a run whose table another run took over (after it started)
    stops before writing, naming the table and both runs, and the table still holds each
    record once. Method: run A prepares (takes the table), run B archives everything, then A
    runs its micro-batch; compare the table with a Consumer read."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="owner")
    where = warehouse_args(tmp_path)
    argv = ["--topic", topic, "--table", "ns.owned", *where,
            "--bootstrap-server", broker.bootstrap]
    _produce(broker.bootstrap, topic, 0, 100)
    stale = Archiver(config_from(parse(*argv, "--no-progress")), io.StringIO())
    try:
        stale.prepare()
        fresh = run_archive(spark, *argv)
        stale.runner = SparkRunner(spark, progress=False)
        with pytest.raises(ArchiveOwnerError, match=(
                rf"table 'ns.owned' is now archived by run {fresh.run_id}; this run "
                rf"\({stale.run_id}\) stops without committing")):
            stale.run()
    finally:
        stale.close()
    assert fresh.totals.records == 100
    assert table_rows(load_table(where, "ns.owned")) == consumer_rows(broker.bootstrap, topic)


def _typed_table(rows: int, start: int) -> pa.Table:
    schema = value_schema_arg(TYPED_SPEC)
    n = range(start, start + rows)
    columns = {
        "id": list(n), "small": [i % 100 - 50 for i in n], "big": [2**64 - 1 - i for i in n],
        "price": [Decimal(i) / 100 for i in n], "ok": [i % 2 == 0 for i in n],
        "name": [f"név-{i}" if i % 5 else None for i in n], "blob": [bytes([i % 256]) for i in n],
        "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % 400) for i in n],
        "at": [1_700_000_000_000 + i for i in n], "local": [1_700_000_000_000_001 + i for i in n],
        "nanos": [1_700_000_000_000_000_007 + i for i in n],
        "tags": [[f"t{i}"] * (i % 3) for i in n],
        "point": [{"x": i / 2, "y": float(i)} for i in n]}
    arrays = [pa.array(columns[f.name], f.type) for f in schema]
    keys = pa.array([b"k%d" % (i % 13) for i in n], pa.binary())
    return pa.Table.from_arrays([keys, *arrays], names=["key", *schema.names])


def _consumer_typed(bootstrap: str, topic: str, names: list[str]) -> list[tuple[Any, ...]]:
    with Admin(bootstrap) as admin:
        tps = [TopicPartition(topic, p.partition)
               for p in admin.describe_topics([topic])[0].partitions]
        ends = admin.list_offsets(dict.fromkeys(tps, LATEST))
    rows: list[tuple[Any, ...]] = []
    with Consumer(bootstrap) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline
            for table in consumer.poll_arrow(timeout_ms=200).values():
                rows.extend(zip(*(pylist(table.column(c))
                                  for c in ["partition", "offset", *names]), strict=True))
    return sorted(rows, key=lambda r: (r[0], r[1]))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_typed_topic_round_trip_every_type(spark: Any, broker: BrokerProcess, tmp_path: Path,
                                           where: str, request: pytest.FixtureRequest) -> None:
    """Goal: a typed topic's columns, of every kind the spec accepts (uint64 max, decimals,
    zoned and nanosecond timestamps, lists, structs), archive exactly, to a local or an s3://
    warehouse, partitioned by date; the files are plain Parquet too. Method: produce typed
    batches, archive, compare the table's columns (cast back to the topic's types) with a
    Consumer's poll_arrow; read the data directory with spark.read.parquet (local only: Spark
    has no S3 connector here)."""
    schema = value_schema_arg(TYPED_SPEC)
    topic = f"typed-{where}-{time.monotonic_ns() % 10**8}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, value_schema=schema)])
    with bounded_producer(broker.bootstrap, linger_ms=0) as producer:
        for start in (0, 250):
            producer.send_batch(topic, _typed_table(250, start)).result(30)
    if where == "s3":
        moto = request.getfixturevalue("moto_s3")
        args = warehouse_args(tmp_path, request.getfixturevalue("s3_url"), moto.endpoint_url)
    else:
        args = warehouse_args(tmp_path)
    run_archive(spark, "--topic", topic, "--table", "ns.typed", *args, "--partition-by", "date",
                "--target-file-size", "16k", "--bootstrap-server", broker.bootstrap)
    table = load_table(args, "ns.typed")
    assert typed_rows(table, schema) == _consumer_typed(broker.bootstrap, topic, schema.names)
    assert len(table.current_snapshot().summary.additional_properties) > 0
    if where == "local":
        plain = spark.read.parquet(str(tmp_path / "warehouse" / "ns" / "typed" / "data"))
        assert plain.count() == 500


def test_history_read_spans_the_log_start_after_retention(spark: Any, tmp_path: Path,
                                                          broker_factory: BrokerFactory) -> None:
    """Goal: after retention deleted archived segments, format("logstore") with archiveTable
    reads every produced record once: those below the log start from the table, the rest from
    the log, with startingOffsets, endingOffsets and startingTimestamp honoured. Method: small
    segments; archive, then set retention.bytes and produce more (not archived), wait for the
    log start to pass the first archived offsets; compare history reads with what was produced."""
    broker = broker_factory(log_retention_check_interval_ms=100)
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="hist", segment_bytes=4096)
    where = warehouse_args(tmp_path)
    expected = _produce_rows(broker.bootstrap, topic, 0, 300)
    run_archive(spark, "--topic", topic, "--table", "ns.hist", *where,
                "--bootstrap-server", broker.bootstrap)
    with Admin(broker.bootstrap) as admin:  # retention only once all 300 are archived
        admin.alter_configs({topic: {"retention_bytes": 32768}})
    expected += _produce_rows(broker.bootstrap, topic, 300, 100)  # retention keeps ~200
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        start = wait_for(lambda: (s := admin.list_offsets({tp: EARLIEST})[tp]) > 100 and s,
                         "retention to pass offset 100")
    history = {"subscribe": topic, "archiveTable": "ns.hist", "includeHeaders": "true",
               "archiveWarehouse": str(tmp_path / "warehouse")}
    rows = spark_rows(read(spark, broker.bootstrap, **history))
    assert [(r[1], r[3]) for r in rows] == expected and 100 < start <= 300
    assert rows == sorted(table_rows(load_table(where, "ns.hist")) + [
        r for r in consumer_rows(broker.bootstrap, topic) if r[1] >= 300])
    window = spark_rows(read(spark, broker.bootstrap, **history,
                             startingOffsets=json.dumps({topic: {"0": 50}}),
                             endingOffsets=json.dumps({topic: {"0": 350}})))
    assert [(r[1], r[3]) for r in window] == expected[50:350]
    at = rows[120][4]  # timestamps in ms of an archived record
    since = spark_rows(read(spark, broker.bootstrap, **history, startingTimestamp=at))
    assert since[0][1] <= 120 and since[-1][1] == 399 and since[0][4] >= at
    with pytest.raises(Exception, match="no longer in the log"):
        read(spark, broker.bootstrap, subscribe=topic,  # without the table: data loss
             startingOffsets=json.dumps({topic: {"0": 0}})).count()


def _produce_rows(bootstrap: str, topic: str, start: int, count: int) -> list[tuple[int, bytes]]:
    with bounded_producer(bootstrap, linger_ms=0) as producer:
        for i in range(start, start + count):
            producer.send(topic, value=b"x" * 100 + b"%d" % i, partition=0)
            if i % 10 == 9:
                producer.flush(30)  # batches of 10, so that segments roll
    return [(i, b"x" * 100 + b"%d" % i) for i in range(start, start + count)]


def test_stream_group_id_commits_batches_so_lag_reaches_zero(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: readStream with groupId commits each finished batch's end offsets to that group:
    after the query caught up its lag is 0, and the group is listed. Method: a memory-less
    parquet sink query, processAllAvailable, then Admin.list_group_offsets against the log
    end offsets, and `logstore groups list`'s source (Admin.list_groups)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="gid")
    _produce(broker.bootstrap, topic, 0, 100)
    df = (spark.readStream.format("logstore").option("bootstrap.servers", broker.bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("groupId", f"spark-{topic}").load())
    query = (df.select("offset").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        query.processAllAvailable()
        _produce(broker.bootstrap, topic, 100, 50)
        query.processAllAvailable()
        ends = _ends(broker.bootstrap, topic, 2)
        with Admin(broker.bootstrap) as admin:
            committed = wait_for(lambda: {tp: om.offset for tp, om in
                                          admin.list_group_offsets(f"spark-{topic}").items()}
                                 == ends, "the group's offsets to reach the log end")
            assert committed
            assert f"spark-{topic}" in [g.group_id for g in admin.list_groups()]
    finally:
        query.stop()


def test_bad_input_fails_clearly_without_a_commit(spark: Any, broker: BrokerProcess,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: an unknown catalog type, an unreachable warehouse, a table whose columns do not
    fit the topic and a pattern matching nothing each fail with a message naming it, and
    nothing is committed. Method: each mistake in turn against one good table."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="bad")
        admin.create_topics([NewTopic(f"{topic}-typed", 1,
                                      value_schema=value_schema_arg("id:int64"))])
    _produce(broker.bootstrap, topic, 0, 20)
    where = warehouse_args(tmp_path)
    base = ["--table", "ns.good", *where, "--bootstrap-server", broker.bootstrap]
    run_archive(spark, "--topic", topic, *base)
    table = load_table(where, "ns.good")
    snapshot = table.current_snapshot().snapshot_id
    _produce(broker.bootstrap, topic, 20, 5)

    def fails(pattern: str, *argv: str) -> None:
        with pytest.raises(Exception, match=pattern):
            run_archive(spark, *argv)
        assert table.refresh().current_snapshot().snapshot_id == snapshot

    fails(r"cannot load the nosuch catalog", "--topic", topic, *base, "--catalog", "type=nosuch")
    dead = warehouse_args(tmp_path / "dead", "s3://nowhere/wh", "http://127.0.0.1:9")
    # botocore retries a refused connection for about 25 s by default; one attempt says the same
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    fails(r"--warehouse s3://nowhere/wh: cannot reach it", "--topic", topic, "--table", "ns.t",
          *dead, "--bootstrap-server", broker.bootstrap)
    fails(r"table 'ns.good' does not match topic\(s\) \[.*-typed'\]: missing columns \['id'\]",
          "--topic", f"{topic}-typed", *base)
    fails(r"--topic-pattern 'nothing-.\*' matches no topic", "--topic-pattern", "nothing-.*",
          *base)
    fails(r"partitioned by 'none', not 'date'", "--topic", topic, *base, "--partition-by", "date")
    assert table_rows(table.refresh()) == consumer_rows(broker.bootstrap, topic)[:20]


def test_a_topic_created_again_is_data_loss_even_with_a_longer_log(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: the table records the id of each topic it archives, so a topic deleted and
    created again under its name is an ArchiveDataLossError naming both ids even when the new
    log already reaches past the table's coverage (before, the run archived on from the
    table's end: the new topic's first offsets were never archived, and the table's offsets
    named two topics' records); no records are committed. A history read through the table
    fails likewise, or with failOnDataLoss=false reads the new topic's log alone. Method:
    archive 20 records, delete the topic, create it again, produce 50, archive, read."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="again")
    _produce(broker.bootstrap, topic, 0, 20)
    where = warehouse_args(tmp_path)
    argv = ["--topic", topic, "--table", "ns.again", *where, "--bootstrap-server",
            broker.bootstrap]
    run_archive(spark, *argv)
    table = load_table(where, "ns.again")
    archived = table_rows(table)
    with Admin(broker.bootstrap) as admin:
        admin.delete_topics([topic])
        wait_for(lambda: admin.create_topics([NewTopic(topic, 1)]) or True,
                 f"{topic} created again", tolerate=(TopicAlreadyExistsError,))
    _produce(broker.bootstrap, topic, 0, 50)
    with pytest.raises(ArchiveDataLossError,
                       match=rf"{topic}-0: topic '{topic}' is not the one the table holds"):
        run_archive(spark, *argv)
    assert table_rows(table.refresh()) == archived and len(archived) == 20
    history = {"subscribe": topic, "archiveTable": "ns.again",
               "archiveWarehouse": str(tmp_path / "warehouse")}
    with pytest.raises(Exception, match=rf"topic '{topic}' is not the one the table archived"):
        read(spark, broker.bootstrap, **history).count()
    rows = spark_rows(read(spark, broker.bootstrap, **history, failOnDataLoss="false"))
    assert [r[1] for r in rows] == list(range(50))  # the new topic's log alone


def test_read_committed_archives_committed_records_only(spark: Any, broker: BrokerProcess,
                                                        tmp_path: Path) -> None:
    """Goal: --isolation-level read_committed archives committed records only: an aborted
    transaction's records and every control batch are left out, a run stops at the last
    stable offset (an open transaction's records wait), and the next run picks them up once
    committed. Method: plain records, a committed, an aborted and an open transaction on one
    partition; archive; commit the open one; archive again; compare the values."""
    from logstore import Producer

    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="arch-txn")
    _produce(broker.bootstrap, topic, 1, 5)  # v1..v5 (keys and headers vary)
    with Producer(broker.bootstrap, transactional_id=f"{topic}-t") as txn:
        txn.init_transactions()
        for values, commit in (([b"c1", b"c2"], True), ([b"a1", b"a2"], False)):
            txn.begin_transaction()
            for v in values:
                txn.send(topic, value=v, partition=0)
            (txn.commit_transaction if commit else txn.abort_transaction)()
        txn.begin_transaction()
        txn.send(topic, value=b"open", partition=0).result(30)
        where = warehouse_args(tmp_path)
        argv = ["--topic", topic, "--table", "ns.committed", *where, "--isolation-level",
                "read_committed", "--bootstrap-server", broker.bootstrap]
        run_archive(spark, *argv)
        archived = [r[3] for r in table_rows(load_table(where, "ns.committed"))]
        assert archived == [b"v1", b"v2", b"v3", b"v4", b"v5", b"c1", b"c2"]
        txn.commit_transaction()
    assert run_archive(spark, *argv).totals.records == 1
    archived = [r[3] for r in table_rows(load_table(where, "ns.committed"))]
    assert archived == [b"v1", b"v2", b"v3", b"v4", b"v5", b"c1", b"c2", b"open"]
