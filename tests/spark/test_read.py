"""spark.read.format("logstore") against a real broker: Spark reads what a Consumer reads.

One broker process for the module (topics get unique names); the session-wide local[2] Spark.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from logstore import Admin, NewTopic
from logstore.messages.log import BrokerStatsRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerProcess, bounded_producer, new_topic
from tests.spark.helpers import consumer_rows, read, spark_rows

PARTITIONS = 4
RECORDS = 3_000
BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    """4 partitions, 3000 records in many small batches: keys, values, every third record
    with headers, timestamps BASE_TS + index (ms)."""
    with Admin(broker.bootstrap) as admin:
        name = new_topic(admin, PARTITIONS, prefix="read")
    with bounded_producer(broker.bootstrap, linger_ms=0, batch_size=4096) as producer:
        for i in range(RECORDS):
            headers = [("n", str(i).encode()), ("h", b"x")] if i % 3 == 0 else None
            producer.send(name, value=b"value-%d" % i, key=b"key-%d" % (i % 50),
                          timestamp_ms=BASE_TS + i, headers=headers)
        producer.flush(30)
    return name


@pytest.fixture(scope="module")
def expected(broker: BrokerProcess, topic: str) -> list[tuple[Any, ...]]:
    rows = consumer_rows(broker.bootstrap, topic)
    assert len(rows) == RECORDS
    return rows


def _ends(expected: list[tuple[Any, ...]]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for p, offset, *_ in expected:
        ends[p] = max(ends.get(p, 0), offset + 1)
    return ends


def test_full_read_equals_consumer_with_headers(spark: Any, broker: BrokerProcess, topic: str,
                                                 expected: list[tuple[Any, ...]]) -> None:
    """The default read (earliest to latest, headers included) returns exactly the records a
    Consumer reads: same partitions, offsets, keys, values, timestamps and headers."""
    df = read(spark, broker.bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    assert spark_rows(df) == expected
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic}
    assert {r.timestampType for r in df.select("timestampType").distinct().collect()} == {0}


def test_schema_matches_spark_kafka_source(spark: Any, broker: BrokerProcess,
                                           topic: str) -> None:
    """Column names, types and order are those of Spark's Kafka source."""
    df = read(spark, broker.bootstrap, subscribe=topic)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int")]


# No shrinking: every example costs a Spark job; the failing example is printed as drawn.
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_offset_ranges_equal_consumer_reads(spark: Any, broker: BrokerProcess, topic: str,
                                            expected: list[tuple[Any, ...]],
                                            data: st.DataObject) -> None:
    """For hypothesis-chosen per-partition [start, end) (JSON, -2/-1 included), split options
    and read modes, Spark returns exactly the consumer's records in those ranges."""
    ends = _ends(expected)
    starting, ending, bounds = {}, {}, {}
    for p in range(PARTITIONS):
        s = data.draw(st.one_of(st.just(-2), st.integers(0, ends[p])), label=f"start{p}")
        e = data.draw(st.one_of(st.just(-1), st.integers(max(s, 0), ends[p])), label=f"end{p}")
        starting[str(p)], ending[str(p)] = s, e
        bounds[p] = (0 if s == -2 else s, ends[p] if e == -1 else e)
    options = {"subscribe": topic, "includeHeaders": "true",
               "startingOffsets": json.dumps({topic: starting}),
               "endingOffsets": json.dumps({topic: ending}),
               "readMode": data.draw(st.sampled_from(["auto", "fetch"]), label="readMode")}
    if data.draw(st.booleans(), label="split"):
        options["maxRecordsPerPartition"] = data.draw(st.integers(1, 900), label="maxRecords")
        options["minPartitions"] = data.draw(st.integers(1, 12), label="minPartitions")
    want = [r for r in expected if bounds[r[0]][0] <= r[1] < bounds[r[0]][1]]
    got = spark_rows(read(spark, broker.bootstrap, **options))
    assert len(got) == len(want), options
    assert got == want, options


def test_ranges_split_into_spark_partitions(spark: Any, broker: BrokerProcess, topic: str,
                                            expected: list[tuple[Any, ...]]) -> None:
    """maxRecordsPerPartition cuts every range into pieces of at most that many offsets, and
    minPartitions halves the largest ranges until there are enough, with no record lost or
    repeated."""
    ends = _ends(expected)
    df = read(spark, broker.bootstrap, subscribe=topic, maxRecordsPerPartition=200,
              includeHeaders="true")
    assert df.rdd.getNumPartitions() == sum(-(-n // 200) for n in ends.values())
    assert spark_rows(df) == expected
    df = read(spark, broker.bootstrap, subscribe=topic, minPartitions=11, includeHeaders="true")
    assert df.rdd.getNumPartitions() == 11
    assert spark_rows(df) == expected


def test_assign_and_pattern_select_partitions(spark: Any, broker: BrokerProcess, topic: str,
                                              expected: list[tuple[Any, ...]]) -> None:
    """assign reads only the named partitions; subscribePattern matches whole topic names."""
    df = read(spark, broker.bootstrap, assign=json.dumps({topic: [1, 3]}))
    assert sorted(r.partition for r in df.select("partition").distinct().collect()) == [1, 3]
    assert df.count() == sum(1 for r in expected if r[0] in (1, 3))
    assert read(spark, broker.bootstrap, subscribePattern=topic[:-2] + "..").count() >= RECORDS
    assert read(spark, broker.bootstrap, subscribePattern=topic[:-1]).count() == 0


def test_starting_and_ending_timestamps(spark: Any, broker: BrokerProcess, topic: str,
                                        expected: list[tuple[Any, ...]]) -> None:
    """startingTimestamp starts each partition at its first record at or after the time;
    endingTimestamp ends it at the first record at or after that time (timestamps here rise
    with offsets, so the result is a time slice)."""
    lo, hi = BASE_TS + 1000, BASE_TS + 2000
    df = read(spark, broker.bootstrap, subscribe=topic, startingTimestamp=lo,
              endingTimestamp=hi, includeHeaders="true")
    assert spark_rows(df) == [r for r in expected if lo <= r[4] < hi]
    by_partition = json.dumps({topic: {str(p): lo for p in range(PARTITIONS)}})
    df = read(spark, broker.bootstrap, subscribe=topic, startingOffsetsByTimestamp=by_partition)
    assert df.count() == sum(1 for r in expected if r[4] >= lo)


def test_timestamps_are_utc_microseconds(spark: Any, broker: BrokerProcess, topic: str) -> None:
    """A record stamped T ms reads back as the timestamp T ms after the epoch, in UTC."""
    row = read(spark, broker.bootstrap, assign=json.dumps({topic: [0]}),
               endingOffsets=json.dumps({topic: {"0": 1}})).select("timestamp").collect()[0]
    want = datetime.fromtimestamp(BASE_TS / 1000, UTC)
    got = row.timestamp
    got = got.replace(tzinfo=UTC) if got.tzinfo is None and spark.conf.get(
        "spark.sql.session.timeZone") in ("UTC", "Etc/UTC") else got.astimezone(UTC)
    assert abs((got - want).total_seconds()) < 5.0  # the partition's first record


def _fetched_batches(broker: BrokerProcess) -> int:
    conn = BrokerConnection(broker.bootstrap)
    try:
        return int(conn.call(BrokerStatsRequest()).fetch_batches)
    finally:
        conn.close()


def test_pushdown_fetches_fewer_batches(spark: Any, broker: BrokerProcess, topic: str,
                                        expected: list[tuple[Any, ...]]) -> None:
    """With pushFilters=true, filters on partition, offset and timestamp narrow the ranges
    before reading: the broker serves fewer batches than a full scan, and the rows equal the
    filtered full read."""
    full_before = _fetched_batches(broker)
    assert read(spark, broker.bootstrap, subscribe=topic, readMode="fetch").count() == RECORDS
    full = _fetched_batches(broker) - full_before

    df = read(spark, broker.bootstrap, subscribe=topic, readMode="fetch", pushFilters="true",
              includeHeaders="true").where("partition = 2 AND offset >= 100 AND offset < 300")
    before = _fetched_batches(broker)
    got = spark_rows(df)
    narrowed = _fetched_batches(broker) - before
    assert got == [r for r in expected if r[0] == 2 and 100 <= r[1] < 300]
    assert narrowed < full / 8, (narrowed, full)  # only the batches holding [100, 300)

    cutoff = datetime.fromtimestamp((BASE_TS + 2500) / 1000, UTC)
    df = read(spark, broker.bootstrap, subscribe=topic, readMode="fetch", pushFilters="true",
              includeHeaders="true").where(F.col("timestamp") >= F.lit(cutoff))
    before = _fetched_batches(broker)
    got = spark_rows(df)
    narrowed = _fetched_batches(broker) - before
    assert got == [r for r in expected if r[4] >= BASE_TS + 2500]
    assert narrowed < full / 2, (narrowed, full)


def test_a_dataframe_reused_after_a_filtered_query_reads_everything(
        spark: Any, broker: BrokerProcess, topic: str, expected: list[tuple[Any, ...]]) -> None:
    """Goal: pyspark 4.3 keeps the reader of a DataFrame's first query for every later one,
    so a reader that narrowed its ranges by the first query's filter made later queries of
    the same DataFrame silently return that range only (count() 2 of 10 rows after
    where("offset >= 8")). Without pushFilters a reader never narrows: every query of the
    DataFrame is right; reads also work with Spark's default of
    spark.sql.python.filterPushdown.enabled=false (they failed with
    DATA_SOURCE_PUSHDOWN_DISABLED). Method: one DataFrame, a filtered query, then a count and
    an OR filter; then a fresh read with the setting off."""
    df = read(spark, broker.bootstrap, subscribe=topic, includeHeaders="true")
    late = sum(r[1] >= 600 for r in expected)
    assert 0 < late < RECORDS and df.where("offset >= 600").count() == late
    assert df.count() == RECORDS
    got = spark_rows(df.where("offset <= 2 OR offset >= 650"))
    assert got == [r for r in expected if r[1] <= 2 or r[1] >= 650]
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        assert read(spark, broker.bootstrap, subscribe=topic).where(
            "partition = 1").count() == sum(r[0] == 1 for r in expected)
    finally:
        spark.conf.set(key, before)


def test_typed_topic_returns_value_columns_and_projects(spark: Any,
                                                        broker: BrokerProcess) -> None:
    """A topic created with a value schema reads back with its columns in place of ``value``;
    a user schema naming a subset reads just those columns."""
    value_schema = pa.schema([("id", pa.int64()), ("name", pa.string()),
                              ("price", pa.float64()), ("tags", pa.list_(pa.string()))])
    name = f"typed-{random.randrange(1 << 30):x}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 2, value_schema=value_schema)])
    n = 500
    table = pa.table({"key": pa.array([b"k%d" % i for i in range(n)]),
                      "id": pa.array(np.arange(n, dtype=np.int64)),
                      "name": pa.array([f"n{i}" for i in range(n)]),
                      "price": pa.array(np.arange(n) * 0.5),
                      "tags": pa.array([[f"t{i % 3}"] for i in range(n)])})
    with bounded_producer(broker.bootstrap) as producer:
        producer.send_batch(name, table).result(30)

    df = read(spark, broker.bootstrap, subscribe=name)
    assert df.columns == ["key", "id", "name", "price", "tags", "topic", "partition", "offset",
                          "timestamp", "timestampType"]
    got = df.orderBy("id").select("id", "name", "price", "tags").collect()
    assert [(r.id, r.name, r.price, list(r.tags)) for r in got] == [
        (i, f"n{i}", i * 0.5, [f"t{i % 3}"]) for i in range(n)]

    projected = (spark.read.format("logstore").schema("price double, id bigint, offset bigint")
                 .option("bootstrap.servers", broker.bootstrap).option("subscribe", name).load())
    assert projected.columns == ["price", "id", "offset"]
    assert sorted(r.id for r in projected.collect()) == list(range(n))

    with pytest.raises(Exception, match="column 'nope' is not in topic"):
        (spark.read.format("logstore").schema("nope string")
         .option("bootstrap.servers", broker.bootstrap).option("subscribe", name).load()
         .collect())


def test_register_helper_keeps_the_format_working(spark: Any, broker: BrokerProcess,
                                                   topic: str) -> None:
    """``datasource.register(spark)`` registers the same source explicitly (Spark already found
    it through the ``pyspark_logstore`` module); reads go on as before."""
    import datasource

    datasource.register(spark)
    assert read(spark, broker.bootstrap, subscribe=topic).count() == RECORDS
