"""Bad options, lost offsets and dead brokers: each a clear error, never partial data.

Spark wraps errors raised in a Python data source (AnalysisException at planning, a failed job
at read time); the tests match the LogStore message inside.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from datasource.reader import BrokerUnavailableError, ReadSettings, ReadTask, read_range
from datasource.schema import source_arrow_schema
from logstore import Admin
from logstore.model import EARLIEST, TopicPartition
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer, new_topic
from tests.spark.helpers import read

WAIT_S = 60.0


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    with Admin(broker.bootstrap) as admin:
        name = new_topic(admin, 2, prefix="bad")
    with bounded_producer(broker.bootstrap) as producer:
        for i in range(100):
            producer.send(name, value=b"%d" % i, partition=i % 2)
        producer.flush(30)
    return name


def _fails(df_or_thunk: Any, message: str) -> None:
    with pytest.raises(Exception, match=message):
        df_or_thunk().collect() if callable(df_or_thunk) else df_or_thunk.collect()


B = {"bootstrap.servers": "B"}  # placeholders: the broker's address and the topic's name


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "T"}, "'bootstrap.servers' is required"),
    ({**B, "subscribe": "T", "assign": '{"T":[0]}'}, "exactly one of 'subscribe', "
     "'subscribePattern' or 'assign'"),
    ({**B}, "exactly one of .* got none"),
    ({**B, "subscribe": "T", "startingOffsets": '{"T":{"0":1'}, "startingOffsets: .* is not JSON"),
    ({**B, "subscribe": "T", "endingOffsets": '["T"]'}, "endingOffsets: expected a JSON object"),
    ({**B, "assign": '{"T":["a"]}'}, "assign: topic .* needs a list of partition numbers"),
    ({**B, "subscribe": "T", "startingOffsets": "latest"}, "not allowed for a batch read"),
    ({**B, "subscribe": "T", "minPartitions": "0"}, "minPartitions must be a positive integer"),
    ({**B, "subscribe": "T", "failOnDataLoss": "maybe"}, "failOnDataLoss must be 'true' or"),
    ({**B, "subscribe": "T", "startingOffset": "earliest"}, r"unknown option\(s\) "
     r"\['startingoffset'\] .*known options: .*'startingOffsets'"),
    ({**B, "subscribe": "T", "maxOffsetsPerTrigger": "5"},
     r"unknown option\(s\) \['maxoffsetspertrigger'\] for a batch read"),
])
def test_bad_options_name_the_option(spark: Any, broker: BrokerProcess, topic: str,
                                     options: dict[str, str], message: str) -> None:
    """Each malformed or conflicting option fails the read with a message naming it."""
    def load() -> Any:
        reader = spark.read.format("logstore")
        for key, value in options.items():
            reader = reader.option(key, broker.bootstrap if value == "B" else
                                   value.replace("T", topic))
        return reader.load()

    _fails(load, message)


def test_unknown_topic_and_partition_are_named(spark: Any, broker: BrokerProcess,
                                               topic: str) -> None:
    _fails(lambda: read(spark, broker.bootstrap, subscribe="no-such-topic"),
           "topic 'no-such-topic' does not exist")
    _fails(lambda: read(spark, broker.bootstrap, assign=json.dumps({topic: [7]})),
           f"topic '{topic}' has no partition 7")


def test_start_after_end_and_end_past_high_watermark(spark: Any, broker: BrokerProcess,
                                                     topic: str) -> None:
    both = {"0": -2, "1": -2}
    _fails(lambda: read(spark, broker.bootstrap, subscribe=topic,
                        startingOffsets=json.dumps({topic: {"0": 30, "1": 0}}),
                        endingOffsets=json.dumps({topic: {"0": 20, "1": -1}})),
           f"{topic}-0: starting offset 30 is after the ending offset 20")
    _fails(lambda: read(spark, broker.bootstrap, subscribe=topic,
                        startingOffsets=json.dumps({topic: both}),
                        endingOffsets=json.dumps({topic: {"0": 500, "1": -1}})),
           f"{topic}-0: ending offset 500 is past the high watermark 50")
    _fails(lambda: read(spark, broker.bootstrap, subscribe=topic,
                        startingOffsets=json.dumps({topic: {"0": -2}})),
           rf"startingOffsets does not name partitions \['{topic}-1'\]")


def test_offsets_below_log_start(spark: Any, broker_factory: BrokerFactory) -> None:
    """Once retention deleted the oldest segments, reading from offset 0 fails naming the
    partition and the range the log still holds (failOnDataLoss=true), or reads from the log
    start (failOnDataLoss=false)."""
    broker = broker_factory(log_retention_check_interval_ms=100)
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="lost", segment_bytes=4096, retention_bytes=8192)
    with bounded_producer(broker.bootstrap, linger_ms=0) as producer:
        for i in range(400):
            producer.send(topic, value=b"x" * 100 + b"%d" % i)
            if i % 10 == 9:
                producer.flush(30)  # batches of 10 records, so that segments roll
    tp = TopicPartition(topic, 0)
    start = _wait_for_log_start(broker.bootstrap, tp)  # retention may move it further yet
    zero = json.dumps({topic: {"0": 0}})
    _fails(lambda: read(spark, broker.bootstrap, subscribe=topic, startingOffsets=zero),
           rf"{topic}-0: offsets \[0, (\d+)\) are no longer in the log \(it holds "
           r"\[\1, 400\)\); set failOnDataLoss=false")
    df = read(spark, broker.bootstrap, subscribe=topic, startingOffsets=zero,
              failOnDataLoss="false")
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets[0] >= start and offsets[-1] == 399 and offsets == list(
        range(offsets[0], 400))


def _wait_for_log_start(bootstrap: str, tp: TopicPartition) -> int:
    deadline = time.monotonic() + WAIT_S
    with Admin(bootstrap) as admin:
        while time.monotonic() < deadline:
            start = admin.list_offsets({tp: EARLIEST})[tp]
            if start > 0:
                return start
            time.sleep(0.1)  # the retention thread runs every 100 ms; polling its effect
    pytest.fail(f"retention did not delete a segment of {tp} within {WAIT_S} s")


def test_broker_down_fails_the_read(spark: Any, broker_factory: BrokerFactory) -> None:
    """A broker that is down when the query runs fails it with the broker named; an executor
    whose leader dies mid-read raises after bounded retries instead of returning part of its
    range."""
    broker = broker_factory()
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="down")
    with bounded_producer(broker.bootstrap) as producer:
        for i in range(50):
            producer.send(topic, value=b"%d" % i)
        producer.flush(30)
    df = read(spark, broker.bootstrap, subscribe=topic, readMode="fetch")
    task = ReadTask(TopicPartition(topic, 0), 0, 50, broker.bootstrap)
    settings = ReadSettings(broker.bootstrap, source_arrow_schema(None, False), "fetch")
    broker.kill(signal.SIGKILL)
    _fails(df, f"127.0.0.1:{broker.port}")
    with pytest.raises(BrokerUnavailableError, match=rf"{topic}-0: could not read offsets "
                                                     r"\[0, 50\) from the leader"):
        list(read_range(task, settings))
