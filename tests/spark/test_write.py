"""df.write.format("logstore"): what Spark writes, Spark (and a Consumer) read back."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, NewTopic
from tests.brokers import BrokerProcess, new_topic
from tests.spark.helpers import consumer_rows, read


def _write(df: Any, bootstrap: str, **options: Any) -> None:
    writer = df.write.format("logstore").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.mode("append").save()


def test_write_then_read_round_trip(spark: Any, broker: BrokerProcess) -> None:
    """String keys and values written from 4 Spark partitions read back as the same bytes,
    by Spark and by a Consumer; keys partition records as the producer does (same key, same
    partition)."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 3, prefix="w")
    df = spark.range(2000).selectExpr("CAST(id % 37 AS STRING) AS key",
                                      "CONCAT('value-', CAST(id AS STRING)) AS value")
    _write(df.repartition(4), broker.bootstrap, topic=topic)
    back = read(spark, broker.bootstrap, subscribe=topic).selectExpr(
        "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition").collect()
    assert sorted((r.key, r.value) for r in back) == sorted(
        (str(i % 37), f"value-{i}") for i in range(2000))
    assert all(len({r.partition for r in back if r.key == k}) == 1 for k in {r.key for r in back})
    assert len(consumer_rows(broker.bootstrap, topic)) == 2000


def test_topic_and_partition_columns_route_rows(spark: Any, broker: BrokerProcess) -> None:
    """Without a topic option, each row goes to its ``topic`` column; a ``partition`` column
    picks the partition; ``headers`` are written as given."""
    with Admin(broker.bootstrap) as admin:
        t1, t2 = new_topic(admin, 2, prefix="wa"), new_topic(admin, 2, prefix="wb")
    df = spark.range(100).selectExpr(
        f"IF(id % 2 = 0, '{t1}', '{t2}') AS topic", "CAST(id % 2 AS INT) AS partition",
        "CAST(CAST(id AS STRING) AS BINARY) AS value",
        "array(named_struct('key', 'id', 'value', CAST(CAST(id AS STRING) AS BINARY))) "
        "AS headers")
    _write(df, broker.bootstrap)
    for topic, parity in ((t1, 0), (t2, 1)):
        back = read(spark, broker.bootstrap, subscribe=topic, includeHeaders="true").collect()
        assert sorted(int(r.value) for r in back) == list(range(parity, 100, 2))
        assert {r.partition for r in back} == {parity}
        assert all(r.headers[0].key == "id" and r.headers[0].value == r.value for r in back)


def test_typed_topic_write_reads_back_typed(spark: Any, broker: BrokerProcess) -> None:
    """A typed topic takes its value columns (Spark's int widened to the topic's int64)."""
    name = f"wtyped{id(spark) % 100000}"
    schema = pa.schema([("n", pa.int64()), ("label", pa.string())])
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 2, value_schema=schema)])
    df = spark.range(300).selectExpr("CAST(id AS INT) AS n", "CONCAT('l', id) AS label")
    _write(df, broker.bootstrap, topic=name)
    back = read(spark, broker.bootstrap, subscribe=name).select("n", "label").collect()
    assert sorted((r.n, r.label) for r in back) == [(i, f"l{i}") for i in range(300)]


@pytest.mark.parametrize(("select", "options", "message"), [
    (["CAST(id AS STRING) AS key"], {"topic": "T"}, r"missing column\(s\) \['value'\]"),
    (["id AS value"], {"topic": "T"}, "column 'value' is int64"),
    (["CAST(id AS STRING) AS value"], {}, "no 'topic' column and no 'topic' option"),
    (["CAST(id AS STRING) AS value", "id AS extra"], {"topic": "T"},
     r"unexpected column\(s\) \['extra'\]"),
    (["CAST(id AS STRING) AS value"], {"topic": "T", "acks": "2"}, "acks must be"),
    (["CAST(id AS STRING) AS value"], {"topic": "T", "lingerMs": "x"}, "lingerMs must be"),
    (["CAST(id AS STRING) AS value"], {"topic": "T", "colour": "red"}, "unknown write option"),
])
def test_bad_writes_are_refused_before_any_record(spark: Any, broker: BrokerProcess,
                                                  select: list[str], options: dict[str, str],
                                                  message: str) -> None:
    """Missing, wrongly typed or unexpected columns and bad options fail the write with a
    message naming them, and nothing reaches the topic."""
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="wbad")
    options = {k: (topic if v == "T" else v) for k, v in options.items()}
    with pytest.raises(Exception, match=message):
        _write(spark.range(10).selectExpr(*select), broker.bootstrap, **options)
    assert consumer_rows(broker.bootstrap, topic) == []


def test_typed_column_of_another_kind_is_refused_before_any_record(
        spark: Any, broker: BrokerProcess) -> None:
    """A typed topic's column given as another kind of value (string for int64) is refused on
    the driver, naming the column, the topic and both types. It used to go to the tasks,
    where Arrow parsed the strings: tasks holding '1' and '2' wrote them and the one holding
    'x' failed, so the failed job left records behind. Casts within a kind (Spark's int to
    int64, in test_typed_topic_write_reads_back_typed) stay accepted."""
    name = f"wkind{id(spark) % 100000}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, value_schema=pa.schema([("n", pa.int64())]))])
    df = spark.createDataFrame([("1",), ("2",), ("x",)], "n string").repartition(3)
    with pytest.raises(Exception, match=f"column 'n' is string, but topic '{name}' stores int64"):
        _write(df, broker.bootstrap, topic=name)
    assert consumer_rows(broker.bootstrap, name) == []


def test_write_to_unknown_topic_names_it(spark: Any, broker: BrokerProcess) -> None:
    """A topic option naming no topic fails with the topic's name."""
    with pytest.raises(Exception, match="no-such-topic"):
        _write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), broker.bootstrap,
               topic="no-such-topic")
