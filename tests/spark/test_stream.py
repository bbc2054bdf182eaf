"""spark.readStream.format("logstore"): micro-batches, AvailableNow, checkpoint restarts.

Each query writes to a Parquet file sink (exactly-once with its checkpoint), and the test
compares the (partition, offset) pairs it holds with what was produced: none missing, none twice.
Waits are on query progress (processAllAvailable, awaitTermination) with bounds, not sleeps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datasource.options import OptionError
from datasource.source import LogStoreDataSource
from logstore import Admin, NewTopic
from logstore.messages.log import BrokerStatsRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerProcess, bounded_producer, new_topic

QUERY_TIMEOUT_S = 120


def _produce(bootstrap: str, topic: str, start: int, count: int,
             partition: int | None = None) -> None:
    with bounded_producer(bootstrap, linger_ms=0) as producer:
        for i in range(start, start + count):
            producer.send(topic, value=b"v%d" % i, key=b"k%d" % i, partition=partition)
        producer.flush(30)


def _stream(spark: Any, bootstrap: str, **options: Any) -> Any:
    reader = spark.readStream.format("logstore").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _start(df: Any, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    return (df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


def _written(spark: Any, out: Path) -> list[tuple[str, int, int, str]]:
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r.topic, r.partition, r.offset, r.value) for r in rows)


def _values(rows: list[tuple[str, int, int, str]]) -> list[str]:
    return sorted(r[3] for r in rows)


def _expected(count: int, start: int = 0) -> list[str]:
    return sorted(f"v{i}" for i in range(start, start + count))


def test_available_now_reads_all_then_resumes_from_checkpoint(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Trigger.AvailableNow reads what is there in several batches (maxOffsetsPerTrigger) and
    stops; a second run on the same checkpoint reads only what came since: every record once."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="avn")
    _produce(broker.bootstrap, topic, 0, 300)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = _stream(spark, broker.bootstrap, subscribe=topic, startingOffsets="earliest",
                 maxOffsetsPerTrigger=100)
    query = _start(df, out, ckpt, availableNow=True)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 3 and all(p["numInputRows"] <= 100 for p in batches)
    assert _values(_written(spark, out)) == _expected(300)

    _produce(broker.bootstrap, topic, 300, 120)
    query = _start(_stream(spark, broker.bootstrap, subscribe=topic, startingOffsets="earliest",
                           maxOffsetsPerTrigger=100), out, ckpt, availableNow=True)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    rows = _written(spark, out)
    assert len(rows) == len(set(rows)) == 420
    assert _values(rows) == _expected(420)


def test_a_stream_commits_its_progress_to_a_group_that_lag_monitoring_reads(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """Goal: with groupId, a query's progress is visible as a group's committed
    offsets, so ``Admin.list_consumer_group_lag`` (and the metrics endpoint, which computes
    the same figures) shows its lag. Method: 2 partitions of 100 records; an AvailableNow run
    reads them all: the group's lag is 0 at offset 100 on each; 30 more records in partition
    0 make its lag 30 until a second run commits them."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="lag")
    for p in (0, 1):
        _produce(broker.bootstrap, topic, p * 100, 100, partition=p)
    group, out, ckpt = f"spark-{topic}", tmp_path / "out", tmp_path / "ckpt"

    def run() -> None:
        query = _start(_stream(spark, broker.bootstrap, subscribe=topic,
                               startingOffsets="earliest", groupId=group),
                       out, ckpt, availableNow=True)
        assert query.awaitTermination(QUERY_TIMEOUT_S)

    def lag() -> dict[int, tuple[int, int]]:
        with Admin(broker.bootstrap) as admin:
            return {tp.partition: (p.committed_offset, p.lag)
                    for tp, p in admin.list_consumer_group_lag(group).items()}

    run()
    assert lag() == {0: (100, 0), 1: (100, 0)}
    _produce(broker.bootstrap, topic, 200, 30, partition=0)
    assert lag() == {0: (100, 30), 1: (100, 0)}
    run()
    assert lag() == {0: (130, 0), 1: (100, 0)}
    assert len(_written(spark, out)) == 230


def test_processing_time_query_restarts_where_it_stopped(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """A running query picks up records as they arrive; stopped and restarted from its
    checkpoint (with records produced while it was down) it goes on exactly where it was.
    The stream starts at latest by default, so records before its start are not read."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2, prefix="restart")
    _produce(broker.bootstrap, topic, 0, 50)  # before the query: not read (startingOffsets latest)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = _start(_stream(spark, broker.bootstrap, subscribe=topic), out, ckpt,
                   processingTime="100 milliseconds")
    try:
        query.processAllAvailable()
        for chunk in range(3):
            _produce(broker.bootstrap, topic, 100 + chunk * 40, 40)
            query.processAllAvailable()
    finally:
        query.stop()
    _produce(broker.bootstrap, topic, 300, 60)  # while the query is down
    query = _start(_stream(spark, broker.bootstrap, subscribe=topic), out, ckpt,
                   processingTime="100 milliseconds")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = _written(spark, out)
    assert len(rows) == len(set(rows))
    assert _values(rows) == sorted(_expected(120, 100) + _expected(60, 300))


def test_new_partitions_and_matching_topics_are_picked_up(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """With subscribePattern, a topic created while the query runs is read from its start, and
    so is a partition added to a subscribed topic."""
    prefix = f"pat{time.monotonic_ns() % 10**9}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(f"{prefix}-a", 2)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = _start(_stream(spark, broker.bootstrap, subscribePattern=f"{prefix}-.*",
                           startingOffsets="earliest"), out, ckpt,
                   processingTime="100 milliseconds")
    try:
        _produce(broker.bootstrap, f"{prefix}-a", 0, 30)
        query.processAllAvailable()
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(f"{prefix}-b", 1)])
            admin.create_partitions({f"{prefix}-a": 3})
        _produce(broker.bootstrap, f"{prefix}-b", 30, 20)
        _produce(broker.bootstrap, f"{prefix}-a", 50, 10, partition=2)
        _wait_for_rows(spark, query, out, 60)
    finally:
        query.stop()
    rows = _written(spark, out)
    assert _values(rows) == _expected(60)
    assert {(r[0], r[1]) for r in rows} >= {(f"{prefix}-b", 0), (f"{prefix}-a", 2)}


def _wait_for_rows(spark: Any, query: Any, out: Path, count: int) -> None:
    """processAllAvailable until the sink holds ``count`` rows (new partitions and topics show
    up at the next metadata look-up, so one call may not be enough); bounded."""
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while time.monotonic() < deadline:
        query.processAllAvailable()
        if out.exists() and len(_written(spark, out)) >= count:
            return
        time.sleep(0.2)  # new metadata is asked for at the next trigger; nothing to wait on
    pytest.fail(f"the sink did not reach {count} rows")


def test_idle_stream_polls_brokers_at_a_bounded_rate(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """With no new data and a zero-delay trigger, the source asks the broker for offsets at
    most about ten times a second (not in a tight loop)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="idle")
    query = _start(_stream(spark, broker.bootstrap, subscribe=topic), tmp_path / "out",
                   tmp_path / "ckpt", processingTime="0 seconds")
    conn = BrokerConnection(broker.bootstrap)
    try:
        query.processAllAvailable()
        before = conn.call(BrokerStatsRequest()).actions.get("describe_log_dirs", 0)
        began = time.monotonic()
        time.sleep(2.0)  # measuring a rate over time: there is no condition to wait on
        after = conn.call(BrokerStatsRequest()).actions.get("describe_log_dirs", 0)
        elapsed = time.monotonic() - began
    finally:
        query.stop()
        conn.close()
    assert (after - before) / elapsed <= 15, (after - before, elapsed)


def test_process_all_available_reads_records_produced_just_before(
        spark: Any, broker: BrokerProcess) -> None:
    """processAllAvailable returns only after the records produced before it was called are in
    the sink, also right after an idle trigger (the idle-poll throttle once answered the old
    offsets, which Spark takes for "no new data", and about every second call returned early)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="paa")
    name = f"paa_{topic.replace('-', '_')}"
    query = (_stream(spark, broker.bootstrap, subscribe=topic, startingOffsets="earliest")
             .selectExpr("offset").writeStream.format("memory").queryName(name)
             .trigger(processingTime="0 seconds").start())
    try:
        query.processAllAvailable()
        for round_ in range(1, 7):
            _produce(broker.bootstrap, topic, 0, 5)
            query.processAllAvailable()
            assert spark.sql(f"SELECT count(*) AS n FROM {name}").collect()[0].n == 5 * round_
    finally:
        query.stop()


def test_pattern_topic_with_another_value_schema_fails_naming_the_topics(
        broker: BrokerProcess) -> None:
    """A topic that starts matching subscribePattern while the stream runs is checked against
    the stream's schema, on the driver: a typed topic joining an untyped stream is an error
    naming the topics, not a KeyError('value') in a Spark task. (Driven without a Spark job:
    the stream reader's own calls, as the engine makes them.)"""
    prefix = f"patschema{time.monotonic_ns() % 10**9}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(f"{prefix}-a", 1)])
    options = {"bootstrap.servers": broker.bootstrap, "subscribePattern": f"{prefix}-.*",
               "startingOffsets": "earliest"}
    source = LogStoreDataSource(options)
    reader = source.streamReader(source.schema())
    try:
        start = reader.initialOffset()
        reader.latestOffset(start, reader.getDefaultReadLimit())
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(f"{prefix}-b", 1,
                                          value_schema=pa.schema([("n", pa.int64())]))])
        with pytest.raises(OptionError, match=f"{prefix}-b"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the pattern sees the topic at a later poll
                reader.latestOffset(start, reader.getDefaultReadLimit())
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_recreated_longer_between_two_runs_is_data_loss_not_a_skip(
        spark: Any, broker: BrokerProcess, tmp_path: Path, fail_on_data_loss: bool) -> None:
    """Goal: a stream restarted on its checkpoint after its topic was deleted and created
    again under its name, the new one longer than the checkpoint's offsets (which the
    high-watermark check alone cannot see), does not read the new topic from the old topic's
    offsets (that skipped its first records without a word): the checkpoint's offsets name the
    topic id they are of, and another id is data loss naming both ids (failOnDataLoss=true),
    or the new topic read from its start (false). Method: an AvailableNow run reads 10
    records of t; t is deleted and recreated with 25; a second run on the same checkpoint."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="again")
        old_id = admin.describe_topics([topic])[0].topic_id
    _produce(broker.bootstrap, topic, 0, 10)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    options = {"subscribe": topic, "startingOffsets": "earliest",
               "failOnDataLoss": str(fail_on_data_loss).lower()}
    query = _start(_stream(spark, broker.bootstrap, **options), out, ckpt, availableNow=True)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    with Admin(broker.bootstrap) as admin:
        admin.delete_topics([topic])
        admin.create_topics([NewTopic(topic, 1)])
        new_id = admin.describe_topics([topic])[0].topic_id
    _produce(broker.bootstrap, topic, 100, 25)
    again = _start(_stream(spark, broker.bootstrap, **options), out, ckpt, availableNow=True)
    if fail_on_data_loss:
        with pytest.raises(Exception, match=rf"topic '{topic}' was deleted and created again "
                                            rf"\(topic id {old_id}, now {new_id}\)"):
            again.awaitTermination(QUERY_TIMEOUT_S)
        assert _values(_written(spark, out)) == _expected(10)
    else:
        assert again.awaitTermination(QUERY_TIMEOUT_S)
        assert _values(_written(spark, out)) == sorted(_expected(10) + _expected(25, 100))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_topic_deleted_under_a_running_stream(spark: Any, broker: BrokerProcess, tmp_path: Path,
                                              fail_on_data_loss: bool) -> None:
    """A subscribed topic deleted while the query runs is data loss: the query fails naming
    the partitions (failOnDataLoss=true) or goes on without them (false)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="gone")
    _produce(broker.bootstrap, topic, 0, 10)
    query = _start(_stream(spark, broker.bootstrap, subscribe=topic, startingOffsets="earliest",
                           failOnDataLoss=str(fail_on_data_loss).lower()),
                   tmp_path / "out", tmp_path / "ckpt", processingTime="100 milliseconds")
    try:
        query.processAllAvailable()
        with Admin(broker.bootstrap) as admin:
            admin.delete_topics([topic])
        if fail_on_data_loss:
            with pytest.raises(Exception, match=rf"\['{topic}-0'\] are gone"):
                query.awaitTermination(QUERY_TIMEOUT_S)
        else:
            query.processAllAvailable()
            assert query.isActive and query.exception() is None
    finally:
        query.stop()
    assert _values(_written(spark, tmp_path / "out")) == _expected(10)
