"""writeStream.format("logstore") (exactly once by default, at least once with
exactlyOnce=false) and df.write with transactional=true, on a real broker and Spark.

Each query copies a keyed input topic (``v<i>`` values) into an output topic; outputs are read
read_committed (tests/txn_reading.py) and compared record by record. Waits are on query
termination or progress, with bounds. The kill -9 tests of the exactly-once sink, which need a
driver of their own, are in tests/faults/test_spark_exactly_once.py.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datasource.source import from_json_offsets
from logstore import Admin, TopicPartition
from logstore.messages.log import DescribeLogDirsRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerProcess, bounded_producer, new_topic
from tests.spark.sink_helpers import CommitTwiceSource, failing_once_staged
from tests.txn_reading import end_offsets, read_values

QUERY_TIMEOUT_S = 180
PARTITIONS = 4


def produce_input(bootstrap: str, topic: str, start: int, count: int, keys: int = 40) -> None:
    with bounded_producer(bootstrap, linger_ms=5) as producer:
        producer.send_batch(topic, pa.table({
            "key": pa.array([b"k%d" % (i % keys) for i in range(start, start + count)]),
            "value": pa.array([b"v%d" % i for i in range(start, start + count)])}))
        producer.flush(30)


def copy_query(spark: Any, bootstrap: str, source: str, sink: str, checkpoint: Path,
               fmt: str = "logstore", value: str = "upper(CAST(value AS STRING))",
               batch: int = 500, **options: str) -> Any:
    """readStream (read_committed) -> key, transformed value -> writeStream, AvailableNow."""
    writer = (spark.readStream.format("logstore").option("bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", batch)
              .option("kafka.isolation.level", "read_committed").load()
              .selectExpr("key", f"{value} AS value").writeStream.format(fmt)
              .option("bootstrap.servers", bootstrap).option("topic", sink)
              .option("checkpointLocation", str(checkpoint)))
    for key, text in options.items():
        writer = writer.option(key, text)
    return writer.trigger(availableNow=True).start()


def output(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(v for vs in read_values(bootstrap, topic, range(PARTITIONS)).values()
                  for v in vs)


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    with Admin(bootstrap) as admin:
        return [t.transactional_id for t in admin.list_transactions(
            ["Prepared", "Ongoing"], transactional_id_prefix=prefix)]


@pytest.fixture
def topics(broker: BrokerProcess) -> tuple[str, str]:
    with Admin(broker.bootstrap) as admin:
        return new_topic(admin, PARTITIONS, "in"), new_topic(admin, PARTITIONS, "out")


def test_exactly_once_stream_publishes_every_record_once_and_resumes(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: the default writeStream copies every record once, records the last batch as the
    progress of group <query id>, leaves no transaction open, and a restart from the checkpoint
    adds only what came since. Method: 2000 records in 500-record batches, AvailableNow; 700
    more, the query started again on the same checkpoint."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 2000)
    query = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt")
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert output(bootstrap, sink) == sorted(b"V%d" % i for i in range(2000))
    last = max(p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0)
    with Admin(bootstrap) as admin:
        (progress,) = admin.list_group_offsets(query.id).values()
    assert progress.offset == last and open_transactions(bootstrap, query.id) == []
    produce_input(bootstrap, source, 2000, 700)
    again = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt")
    assert again.awaitTermination(QUERY_TIMEOUT_S) and again.id == query.id
    assert output(bootstrap, sink) == sorted(b"V%d" % i for i in range(2700))


def test_commit_called_again_for_a_committed_batch_duplicates_nothing(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: Spark may call commit(messages, batchId) again for a batch the sink committed
    (after a restart); the second call publishes nothing. Method: a writer that calls the
    real commit twice with the same messages for every batch (tests/spark/sink_helpers.py)."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 1500)
    spark.dataSource.register(CommitTwiceSource)
    query = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt",
                       fmt="logstore-commit-twice", sinkId=f"twice-{sink}")
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert output(bootstrap, sink) == sorted(b"V%d" % i for i in range(1500))
    assert open_transactions(bootstrap, f"twice-{sink}") == []


def test_a_deleted_checkpoint_under_the_same_sink_id_fails_the_query_not_the_data(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: a query given a sinkId whose checkpoint is deleted restarts at batch 0; before,
    the sink took its batches for ones it had published and the query ran to its end writing
    nothing. Now it fails naming the sink and the way out, writing nothing twice; after
    `groups delete <sinkId>` it copies everything once more, as asked. Method: 600 records in
    batches of 200 under sinkId S; delete the checkpoint; run again; delete S's group; run."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 600)
    sink_id = f"reset-{sink}"
    query = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt", batch=200,
                       sinkId=sink_id)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    shutil.rmtree(tmp_path / "ckpt")
    again = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt", batch=200,
                       sinkId=sink_id)
    with pytest.raises(Exception, match=rf"sink {sink_id}: batch 0 of query {again.id} is "
                                        rf"not a re-run.*by query {query.id} at batch 2"):
        again.awaitTermination(QUERY_TIMEOUT_S)
    assert output(bootstrap, sink) == sorted(b"V%d" % i for i in range(600))
    assert open_transactions(bootstrap, sink_id) == []
    with Admin(bootstrap) as admin:
        admin.delete_groups([sink_id])
    shutil.rmtree(tmp_path / "ckpt")
    third = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt", batch=200,
                       sinkId=sink_id)
    assert third.awaitTermination(QUERY_TIMEOUT_S)
    assert output(bootstrap, sink) == sorted(b"V%d" % i for i in range(600) for _ in range(2))


def test_at_least_once_stream_sink_writes_every_record(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: exactlyOnce=false writes through the batch writer's path (no transaction, so
    read_uncommitted sees the records as soon as they are acknowledged). Method: a copy
    query; the output read both ways, and no transaction of the query's id."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 1000)
    query = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt", exactlyOnce="false")
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    expected = sorted(b"V%d" % i for i in range(1000))
    assert output(bootstrap, sink) == expected
    uncommitted = read_values(bootstrap, sink, range(PARTITIONS), "read_uncommitted")
    assert sorted(v for vs in uncommitted.values() for v in vs) == expected
    assert open_transactions(bootstrap, query.id) == []


# -- all of a batch at once -----------------------------------------------------------------


class Snapshots:
    """A read_committed reader polling while a query runs: each snapshot is every record
    below the partitions' last stable offsets, taken with one describe_log_dirs request (so
    nearly at one instant), with the time it was taken."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.taken: list[tuple[float, Counter[bytes]]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            conn = BrokerConnection(self.bootstrap)
            try:
                while not self.stop.is_set():
                    self.taken.append(self._snapshot(conn))
            finally:
                conn.close()
        except BaseException as e:  # reported by the test
            self.error = e

    def _snapshot(self, conn: BrokerConnection) -> tuple[float, Counter[bytes]]:
        response = conn.call(DescribeLogDirsRequest(topic=self.topic,
                                                    partitions=list(range(PARTITIONS))))
        at = time.monotonic()
        lsos = {e.partition: e.last_stable_offset for e in response.partitions}
        values = read_values(self.bootstrap, self.topic, range(PARTITIONS),
                             ends=lsos) if any(lsos.values()) else {}
        return at, Counter(v for vs in values.values() for v in vs)


def batches_of(query: Any) -> dict[bytes, int]:
    """Output value ("<input partition>:<offset>") -> the micro-batch that read it, from the
    query's progress (each batch's start and end offsets)."""
    out: dict[bytes, int] = {}
    for p in query.recentProgress:
        if not p["numInputRows"]:
            continue
        (source,) = p["sources"]
        start, end = (_offsets(source[k]) for k in ("startOffset", "endOffset"))
        for tp, stop in end.items():
            for offset in range(start.get(tp, 0), stop):
                out[b"%d:%d" % (tp.partition, offset)] = p["batchId"]
    return out


def _offsets(text: Any) -> dict[TopicPartition, int]:
    """A progress's offsets JSON (null for the first batch's start: the log start, 0)."""
    parsed = json.loads(text) if isinstance(text, str) else text
    return from_json_offsets(parsed or {})


def test_a_batch_becomes_visible_whole_on_every_partition_it_wrote(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: a read_committed reader polling while the query runs never sees part of a
    micro-batch: in every snapshot every batch is complete, except at most the newest one
    while its markers are being written (the partitions' last stable offsets are read one
    after another), which is complete in every snapshot taken a second later; nothing is
    ever seen twice or that is not in the final output. Method: 4000 keyed records, 400 per
    batch, written over 4 partitions by 2 tasks; each output value names its input offset,
    which the query's progress maps to its batch; snapshots as ``Snapshots`` takes them."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 4000)
    snapshots = Snapshots(bootstrap, sink)
    snapshots.thread.start()
    query = copy_query(spark, bootstrap, source, sink, tmp_path / "ckpt", batch=400,
                       value="concat(CAST(partition AS STRING), ':', CAST(offset AS STRING))")
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        snapshots.stop.set()
        snapshots.thread.join(60)
    assert snapshots.error is None, snapshots.error
    batch_of = batches_of(query)
    assert len(batch_of) == 4000 and sorted(output(bootstrap, sink)) == sorted(batch_of)
    totals = Counter(batch_of.values())
    partial_at: list[tuple[float, int]] = []
    for at, seen in snapshots.taken:
        assert max(seen.values(), default=1) == 1 and set(seen) <= set(batch_of)
        counts = Counter(batch_of[v] for v in seen)
        partial = sorted(b for b, n in counts.items() if n < totals[b])
        assert partial in ([], [max(counts, default=-1)]), \
            f"partial batches {partial} of {dict(counts)}"
        partial_at += [(at, b) for b in partial]
    for at, b in partial_at:
        later = [Counter(batch_of[v] for v in seen)[b] for t, seen in snapshots.taken
                 if t > at + 1.0]
        assert all(n == totals[b] for n in later), f"batch {b} stayed partial"
    growth = {sum(seen.values()) for _, seen in snapshots.taken}
    assert len(growth) >= 3, f"the reader saw too few states ({sorted(growth)})"


# -- df.write with transactional=true -------------------------------------------------------


def _write(spark: Any, bootstrap: str, df: Any, topic: str, **options: str) -> None:
    writer = (df.write.format("logstore").option("bootstrap.servers", bootstrap)
              .option("topic", topic).option("transactional", "true"))
    for key, text in options.items():
        writer = writer.option(key, text)
    writer.mode("append").save()


def test_transactional_batch_write_is_all_or_nothing(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str]) -> None:
    """Goal: transactional=true makes a job's rows visible together; a job whose second task
    fails once the first staged its rows leaves nothing visible, nothing open, and the LSO at
    the end. Method: a 2-partition DataFrame written once whole, and once through a Python
    UDF (no Arrow: no pandas here) that raises at task 1's last row once task 0's
    transaction is Prepared."""
    bootstrap, (_, sink) = broker.bootstrap, topics
    rows = spark.range(0, 1000, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    _write(spark, bootstrap, rows, sink)
    expected = sorted(str(i).encode() for i in range(1000))
    assert output(bootstrap, sink) == expected
    from pyspark.sql.functions import col, udf

    fail = udf(failing_once_staged(bootstrap, "logstore-write-"), "string", useArrow=False)
    failing = rows.select(fail(col("value")).alias("value"))
    with pytest.raises(Exception, match="task 1 fails"):
        _write(spark, bootstrap, failing, sink)
    assert output(bootstrap, sink) == expected
    assert open_transactions(bootstrap, "logstore-write-") == []
    assert end_offsets(bootstrap, sink, range(PARTITIONS)) == \
        end_offsets(bootstrap, sink, range(PARTITIONS), "read_uncommitted")


def test_transactional_write_to_a_typed_topic_with_wrong_columns_is_refused(
        spark: Any, broker: BrokerProcess) -> None:
    """Goal: a transactional write whose columns do not fit the typed topic fails before any
    task runs, naming the column. Method: a topic of (price double) written with a string
    column and with an unknown one."""
    with Admin(broker.bootstrap) as admin:
        from logstore import NewTopic

        topic = f"typed-{time.monotonic_ns()}"
        admin.create_topics([NewTopic(topic, 1, value_schema=pa.schema([("price",
                                                                          pa.float64())]))])
    wrong = spark.createDataFrame([("9.90",)], "price string")
    with pytest.raises(Exception, match="column 'price' is string"):
        _write(spark, broker.bootstrap, wrong, topic)
    extra = spark.createDataFrame([(1.0, 2)], "price double, qty int")
    with pytest.raises(Exception, match=r"unexpected column\(s\) \['qty'\]"):
        _write(spark, broker.bootstrap, extra, topic)
    assert read_values(broker.bootstrap, topic, [0], "read_uncommitted") == {0: []}


def test_exactly_once_without_a_sink_id_fails_naming_the_option(
        spark: Any, broker: BrokerProcess, topics: tuple[str, str], tmp_path: Path) -> None:
    """Goal: with the checkpoint set by Spark's conf instead of the checkpointLocation option,
    the sink cannot read the query id, and the query fails saying to set sinkId; with sinkId
    it runs. Method: spark.sql.streaming.checkpointLocation set for the test."""
    bootstrap, (source, sink) = broker.bootstrap, topics
    produce_input(bootstrap, source, 0, 100)
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "conf-ckpt"))
    try:
        df = (spark.readStream.format("logstore").option("bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest").load()
              .selectExpr("key", "value"))
        query = (df.writeStream.format("logstore").option("bootstrap.servers", bootstrap)
                 .option("topic", sink).trigger(availableNow=True).start())
        with pytest.raises(Exception, match="set the sinkId option"):
            query.awaitTermination(QUERY_TIMEOUT_S)
        query = (df.writeStream.format("logstore").option("bootstrap.servers", bootstrap)
                 .option("topic", sink).option("sinkId", f"named-{sink}")
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert len(output(bootstrap, sink)) == 100
