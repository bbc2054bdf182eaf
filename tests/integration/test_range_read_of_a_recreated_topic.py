"""A Spark task's range, planned on one incarnation of a topic, is never read from the topic
created again under its name.

Goal: the executor's fetches name the topic id the range was planned on (the leader's
replica's, from the planner's describe_log_dirs), as Kafka's fetches do with topic ids
(KIP-516); a topic deleted and recreated between planning a micro-batch and running its
tasks is data loss naming both ids (failOnDataLoss=true), or the range is skipped (false).
Before, the task read the new topic's records at the planned offsets as if they were the
range's, and only the next micro-batch noticed the recreate. Method: a range reader
(``read_range``, what a Spark task runs, without Spark) in fetch mode on one embedded
broker; t holds 10 records, its id is taken, t is deleted and recreated with 15 records.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from datasource.planning import DataLossError
from datasource.reader import ReadSettings, ReadTask, read_range
from datasource.schema import source_arrow_schema
from logstore import Admin, TopicPartition
from logstore.client.admin import NewTopic
from logstore.messages.log import DescribeLogDirsRequest
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, BrokerProcess
from tests.integration.test_group_offsets_of_deleted_topics import produce


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("recreated-range"))
    yield factory()
    factory.stop_all()


def values(task: ReadTask, settings: ReadSettings) -> list[bytes]:
    return [v for b in read_range(task, settings)
            for v in pa.Table.from_batches([b]).column("value").to_pylist()]


def plan(bootstrap: str, tp: TopicPartition, end: int) -> ReadTask:
    """The task the planner makes of [0, end): the leader's directory, incarnation, topic id."""
    conn = BrokerConnection(bootstrap)
    try:
        entry = conn.call(DescribeLogDirsRequest(topic=tp.topic,
                                                 partitions=[tp.partition])).partitions[0]
    finally:
        conn.close()
    assert entry.topic_id is not None and entry.path is not None
    return ReadTask(tp, 0, end, bootstrap, entry.path, entry.incarnation,
                    topic_id=entry.topic_id)


@pytest.mark.parametrize(("read_mode", "fail_on_data_loss"),
                         [("fetch", True), ("fetch", False), ("auto", True), ("auto", False)])
def test_a_range_planned_before_the_topic_was_recreated_is_data_loss_not_the_new_records(
        broker: BrokerProcess, read_mode: str, fail_on_data_loss: bool) -> None:
    topic = f"range-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    settings = ReadSettings(broker.bootstrap, source_arrow_schema(None, False), read_mode,
                            fail_on_data_loss)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)])
        planned = plan(broker.bootstrap, tp, 10)
        old_id = planned.topic_id
        assert old_id == admin.describe_topics([topic])[0].topic_id
        assert values(planned, settings) == [b"old-%d" % i for i in range(10)]

        admin.delete_topics([topic])
        admin.create_topics([NewTopic(topic, 1)])
        produce(broker.bootstrap, topic, [b"new-%d" % i for i in range(15)])
        new_id = admin.describe_topics([topic])[0].topic_id
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=rf"{topic}-0: offsets \[0, 10\) .*\(topic id "
                                                rf"{old_id}, now {new_id}"):
            values(planned, settings)
    else:
        assert values(planned, settings) == []
    # a range planned on the new topic reads it (auto: from the same directory's files)
    again = plan(broker.bootstrap, tp, 10)
    assert (again.topic_id, again.path) == (new_id, planned.path)
    assert values(again, settings) == [b"new-%d" % i for i in range(10)]


def test_a_range_of_a_partition_the_recreated_topic_lacks_is_data_loss(
        broker: BrokerProcess) -> None:
    """The recreated topic has fewer partitions: the planned partition has no leader now, and
    the range is data loss naming both ids (the id is looked up before the leader)."""
    topic = f"range-{uuid.uuid4().hex[:6]}"
    settings = ReadSettings(broker.bootstrap, source_arrow_schema(None, False), "fetch")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
        produce(broker.bootstrap, topic, [b"old-%d" % i for i in range(10)], partition=1)
        planned = plan(broker.bootstrap, TopicPartition(topic, 1), 10)
        admin.delete_topics([topic])
        admin.create_topics([NewTopic(topic, 1)])
        new_id = admin.describe_topics([topic])[0].topic_id
    with pytest.raises(DataLossError, match=rf"{topic}-1: offsets \[0, 10\) .*\(topic id "
                                            rf"{planned.topic_id}, now {new_id}"):
        values(planned, settings)
