"""Many partitions on one embedded broker process: create_topics in bulk answers per topic and
leaves log creation to the broker's metadata sync; a restart serves them again; the broker's
open segment files stay within max_open_segment_files."""

from __future__ import annotations

import os
import time

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAlreadyExistsError,
)
from logstore.messages.log import ListOffsetsPartition, ListOffsetsRequest
from logstore.model import LATEST
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, bounded_producer
from tests.helpers import wait_for

TOPICS, PER_TOPIC = 20, 200
FILE_CAP = 50
WAIT_S = 120.0


def _wait_usable(bootstrap: str, topics: dict[str, int]) -> None:
    """Until every partition answers list_offsets without an error (a bounded wait)."""
    conn = BrokerConnection(bootstrap)
    pending = dict(topics)

    def all_usable() -> bool:
        for name, count in list(pending.items()):
            response = conn.call(ListOffsetsRequest(topic=name, partitions=[
                ListOffsetsPartition(partition=p, timestamp=LATEST) for p in range(count)]))
            if all(r.error_code == 0 for r in response.partitions):
                del pending[name]
        return not pending

    wait_for(all_usable, "every partition answering list_offsets", timeout_s=WAIT_S)


def _segment_fds(pid: int) -> int:
    fd_dir = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fd_dir):
        try:
            count += os.readlink(f"{fd_dir}/{fd}").endswith(".arrow")
        except FileNotFoundError:
            continue
    return count


def test_create_topics_in_bulk_answers_per_topic_and_every_partition_becomes_usable(
        broker_factory: BrokerFactory) -> None:
    """Goal: one create_topics of 20 topics x 200 partitions answers per topic once the topics
    exist, reports each failing topic of the same request without failing the others, and all
    4,000 partitions then serve produce and fetch.
    Method: a real broker; one request with the 20 topics plus an existing name, an invalid
    name, a zero-partition topic, a name given twice, a bad config and a replication factor
    above the brokers; check each topic's answer (its error names it; a twice-given name is
    created in neither copy), wait (bounded) until
    list_offsets answers for every partition, produce a record to the last partition of each
    topic and read it back."""
    broker = broker_factory()
    names = {f"bulk-{i:02d}": PER_TOPIC for i in range(TOPICS)}
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("bulk-taken", 1)])
        outcomes = admin.create_topics(
            [NewTopic(n, c) for n, c in names.items()] + [
                NewTopic("bulk-taken", 3), NewTopic("bad name!", 1), NewTopic("bulk-none", 0),
                NewTopic("bulk-twice", 1), NewTopic("bulk-twice", 2),
                NewTopic("bulk-config", 1, config={"retention_ms": "abc"}),
                NewTopic("bulk-rf", 1, replication_factor=3)],
            raise_errors=False)
        existing = admin.list_topics()
    assert {n: outcomes[n] for n in names} == {n: None for n in names}
    assert isinstance(outcomes["bulk-taken"], TopicAlreadyExistsError)
    assert isinstance(outcomes["bad name!"], InvalidTopicError)
    assert isinstance(outcomes["bulk-none"], InvalidPartitionsError)
    assert isinstance(outcomes["bulk-twice"], InvalidRequestError)
    assert isinstance(outcomes["bulk-config"], InvalidConfigError)
    assert isinstance(outcomes["bulk-rf"], InvalidReplicationFactorError)
    for name in ("bulk-taken", "bad name!", "bulk-none", "bulk-twice", "bulk-config",
                 "bulk-rf"):  # each error names its topic
        assert repr(name) in str(outcomes[name]), outcomes[name]
    assert not {"bulk-twice", "bulk-config", "bulk-rf"} & set(existing)  # none half-made
    _wait_usable(broker.bootstrap, names)
    last = [TopicPartition(n, PER_TOPIC - 1) for n in names]
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        for f in [producer.send(tp.topic, tp.topic.encode(), partition=tp.partition)
                  for tp in last]:
            f.result(30)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(last)
        got: dict[TopicPartition, bytes] = {}
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(last) and time.monotonic() < deadline:
            for tp, records in consumer.poll(1000).items():
                got[tp] = records[0].value
    assert got == {tp: tp.topic.encode() for tp in last}


def test_broker_with_more_partitions_than_its_file_cap_keeps_within_it_across_a_restart(
        broker_factory: BrokerFactory) -> None:
    """Goal: a broker with max_open_segment_files = 50 and 300 partitions holds at most 50
    segment files open after writing to and reading every partition, serves them all again
    after a clean restart with none open until used, and reads back what was written.
    Method: a real broker; produce to and consume from all 300 partitions; count the
    process's open .arrow files; restart; count again; consume everything again."""
    cap = FILE_CAP
    broker = broker_factory(max_open_segment_files=cap)
    topics = {"capped-a": 150, "capped-b": 150}
    tps = [TopicPartition(n, p) for n, c in topics.items() for p in range(c)]
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(n, c) for n, c in topics.items()])
    _wait_usable(broker.bootstrap, topics)
    with bounded_producer(broker.bootstrap, acks=1) as producer:
        for f in [producer.send(tp.topic, f"{tp}".encode(), partition=tp.partition)
                  for tp in tps]:
            f.result(30)
    assert _read_all(broker.bootstrap, tps) == {tp: f"{tp}".encode() for tp in tps}
    assert broker.process is not None
    assert _segment_fds(broker.process.pid) <= cap
    broker.restart()
    assert broker.process is not None
    assert _segment_fds(broker.process.pid) == 0
    assert _read_all(broker.bootstrap, tps) == {tp: f"{tp}".encode() for tp in tps}
    assert _segment_fds(broker.process.pid) <= cap


def _read_all(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, bytes]:
    got: dict[TopicPartition, bytes] = {}
    with Consumer(bootstrap) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(tps) and time.monotonic() < deadline:
            for tp, records in consumer.poll(1000).items():
                got.setdefault(tp, records[0].value)
    return got
