"""A topic deleted and created again under its name is a new topic: no broker may serve, or
replicate, the old topic's records as the new one's (Kafka's KIP-516 topic ids; see
``partition.metadata`` in logstore/segments/format.py and the broker's docstring).

Method: real brokers in this process (``build_broker``: the test reaches the sync lock and the
logs), embedded or on a real ZooKeeper, with real clients. The metadata sync is made to miss the
deletion by holding its lock while the topic is deleted and created again, so that one sync pass
sees the old and the new topic under one name, whatever the timing of the watches.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.broker.broker import Broker
from logstore.config import BrokerConfig
from logstore.controller.local import LocalMetadataStore, metadata_path
from logstore.controller.store import MetadataStore, PartitionState, TopicRecord, new_topic_id
from logstore.errors import ErrorCode, InconsistentTopicIdError, UnknownTopicIdError
from logstore.main import build_broker, build_metadata_store
from logstore.messages import Route, decode_response, encode
from logstore.messages.cluster import (
    LeaderAndIsrPartition,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
)
from logstore.model import LATEST
from logstore.records import topic_schema
from logstore.segments import log as segment_log
from logstore.segments.format import parse_partition_dir
from logstore.segments.log import Log
from tests.brokers import BrokerFactory, bounded_producer, free_port
from tests.helpers import wait_for

RECORDS = 20
TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)
TYPED = pa.schema([pa.field("amount", pa.float64())])
SYNC_WAIT_S = 30.0


class Brokers:
    """In-process brokers on tmp_path directories (ZooKeeper mode when ``zk_connect``)."""

    def __init__(self, root: Path, zk_connect: str | None) -> None:
        self.root = root
        self.zk_connect = zk_connect
        self.running: dict[int, Broker] = {}

    def config(self, broker_id: int) -> BrokerConfig:
        return BrokerConfig(broker_id=broker_id, listener=f"127.0.0.1:{free_port()}",
                            log_dirs=(str(self.log_dir(broker_id)),), zk_connect=self.zk_connect,
                            zk_session_timeout_ms=4000, replica_lag_time_max_ms=10_000)

    def log_dir(self, broker_id: int) -> Path:
        return self.root / f"broker-{broker_id}"

    def start(self, broker_id: int) -> Broker:
        broker = build_broker(self.config(broker_id))
        broker.start()
        self.running[broker_id] = broker
        return broker

    def stop(self, broker_id: int) -> None:
        self.running.pop(broker_id).stop()

    def offline_store(self, broker_id: int) -> MetadataStore:
        """The metadata as an operator's tool sees it while ``broker_id`` is down."""
        if self.zk_connect is None:
            return LocalMetadataStore(metadata_path([self.log_dir(broker_id)]), broker_id)
        return build_metadata_store(BrokerConfig(broker_id=99, zk_connect=self.zk_connect))


@pytest.fixture(params=["embedded", "zookeeper"])
def brokers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Brokers]:
    zk = request.getfixturevalue("zk_connect") if request.param == "zookeeper" else None
    made = Brokers(tmp_path, zk)
    yield made
    for broker_id in sorted(made.running, reverse=True):
        made.stop(broker_id)


@pytest.fixture
def cluster(tmp_path: Path, zk_connect: str) -> Iterator[Brokers]:
    made = Brokers(tmp_path, zk_connect)
    yield made
    for broker_id in sorted(made.running, reverse=True):
        made.stop(broker_id)


def bootstrap(broker: Broker) -> str:
    return f"127.0.0.1:{broker.port}"


def produce(broker: Broker, values: list[bytes]) -> None:
    with bounded_producer(bootstrap(broker), acks="all") as producer:
        futures = [producer.send(TOPIC, value=v, partition=0) for v in values]
        producer.flush(30)
        assert all(f.result(10) for f in futures)


def latest(address: str) -> int:
    with Admin(address) as admin:
        return wait_for(lambda: admin.list_offsets({TP: LATEST}), "list_offsets",
                        tolerate=(UnknownTopicIdError,))[TP]


def consumed(address: str) -> list[bytes]:
    """Every value of orders-0 up to its high watermark, as a consumer reads them."""
    end = latest(address)
    values: list[bytes] = []
    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])

        def all_read() -> bool:
            for table in consumer.poll_arrow(timeout_ms=200).values():
                values.extend(table.column("value").to_pylist())
            return len(values) >= end
        wait_for(all_read, f"{end} records of {TP}")
    return values


def log_values(log: Log) -> list[Any]:
    """Every value in ``log``, read from its files."""
    values: list[Any] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        for batch in log.read(offset, 1 << 24, max_offset=log.log_end_offset).batches:
            values += batch.record_batch(log.schema).column("value").to_pylist()
            offset = batch.header.next_offset
    return values


def recorded_topic_id(partition_dir: Path) -> str:
    """The id in a partition directory's ``partition.metadata`` (Kafka's format)."""
    lines = (partition_dir / "partition.metadata").read_text().splitlines()
    assert lines[0] == "version: 0", lines
    return lines[1].removeprefix("topic_id: ")


def refuses(broker: Broker) -> bool:
    """Whether ``broker``'s replica of orders-0 answers UNKNOWN_TOPIC_ID."""
    try:
        broker.replicas.partition(TP)
    except UnknownTopicIdError:
        return True
    return False


def recreate_unsynced(brokers: list[Broker], value_schema: pa.Schema | None = None) -> str:
    """Delete and create ``TOPIC`` again (same replicas) while no sync pass runs on
    ``brokers``: each one's sync lock is held until its old replica of orders-0 refuses
    requests (it knows the new id; the sync has not replaced the replica yet). The new id."""
    for broker in brokers:
        broker._sync_lock.acquire()
    try:
        old = brokers[0].store.topics()[TOPIC]
        brokers[0].controller.delete_topic(TOPIC)
        brokers[0].controller.create_topic(NewTopic(
            TOPIC, 1, len(old.replicas[0]), value_schema=value_schema))
        new_id = brokers[0].store.topics()[TOPIC].topic_id
        assert new_id != old.topic_id
        for broker in brokers:
            wait_for(lambda b=broker: refuses(b),  # type: ignore[misc]
                     f"broker {broker.config.broker_id}'s old replica to refuse requests")
    finally:
        for broker in brokers:
            broker._sync_lock.release()
    return new_id


def test_a_topic_recreated_between_two_sync_passes_starts_from_an_empty_log(
        brokers: Brokers) -> None:
    """Goal: a broker whose metadata sync sees a topic deleted and created again in one pass
    (ZooKeeper watches may coalesce; an embedded admin request's wait for the sync is bounded)
    does not go on serving the old log under the new topic, whose value schema differs.
    Method: fill orders-0, then delete it and create it typed while the sync waits on its
    lock; in that window the old replica answers UNKNOWN_TOPIC_ID; after the next pass the
    partition is empty, has the typed schema, records the new id, and no old record is read."""
    broker = brokers.start(1)
    with Admin(bootstrap(broker)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
    produce(broker, [b"old-%d" % i for i in range(RECORDS)])

    new_id = recreate_unsynced([broker], TYPED)
    assert broker.await_metadata_sync(SYNC_WAIT_S)

    log = broker.replicas.partition(TP).log
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert log.schema.equals(topic_schema(TYPED))
    assert recorded_topic_id(log.dir) == new_id
    assert latest(bootstrap(broker)) == 0


def test_a_topic_recreated_while_the_broker_was_down_sets_the_old_directory_aside(
        brokers: Brokers) -> None:
    """Goal: a broker that was down while its topic was deleted and created again (with it
    among the new replicas) does not take its old directory for the new topic's log; the old
    data is kept aside, never deleted at start. Method: fill orders-0, stop the broker,
    delete and create the topic in the metadata as a tool would, start the broker again:
    ``orders-0.<uuid>-stray`` holds the old files and id, the new orders-0 is empty."""
    broker = brokers.start(1)
    with Admin(bootstrap(broker)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
    produce(broker, [b"old-%d" % i for i in range(RECORDS)])
    old_id = broker.store.topics()[TOPIC].topic_id
    brokers.stop(1)

    store = brokers.offline_store(1)
    store.start()
    try:
        store.delete_topic(TOPIC)
        new_id = new_topic_id()
        store.create_topic(TopicRecord(TOPIC, {0: (1,)}, topic_id=new_id),
                           {0: PartitionState(1, 0, (1,))})
    finally:
        store.close()

    broker = brokers.start(1)
    log_dir = brokers.log_dir(1)
    aside = [p for p in log_dir.iterdir() if p.name.startswith(f"{TOPIC}-0.")]
    assert [p.name.endswith("-stray") for p in aside] == [True]
    assert recorded_topic_id(aside[0]) == old_id
    assert any(p.suffix == ".arrow" and p.stat().st_size > 0 for p in aside[0].iterdir())
    assert latest(bootstrap(broker)) == 0
    assert recorded_topic_id(log_dir / f"{TOPIC}-0") == new_id
    produce(broker, [b"new"])
    assert consumed(bootstrap(broker)) == [b"new"]


def test_a_partition_directory_without_a_topic_id_adopts_its_topics(
        tmp_path: Path) -> None:
    """Goal: logs written before directories recorded topic ids stay online after the
    upgrade, with every record, and record their topic's id from then on. Method: fill
    orders-0, stop, remove its partition.metadata (what an earlier version left), start:
    nothing is set aside, every record is read, and the file records the topic's id."""
    brokers = Brokers(tmp_path, None)
    broker = brokers.start(0)
    try:
        with Admin(bootstrap(broker)) as admin:
            admin.create_topics([NewTopic(TOPIC, 1)])
        values = [b"v-%d" % i for i in range(RECORDS)]
        produce(broker, values)
        topic_id = broker.store.topics()[TOPIC].topic_id
        brokers.stop(0)
        partition_dir = brokers.log_dir(0) / f"{TOPIC}-0"
        (partition_dir / "partition.metadata").unlink(missing_ok=True)
        broker = brokers.start(0)
        assert consumed(bootstrap(broker)) == values
        assert not [p for p in brokers.log_dir(0).iterdir() if p.name.endswith("-stray")]
        assert recorded_topic_id(partition_dir) == topic_id
        # written without an fsync at start (one per partition of an upgraded broker): the
        # log manager's next checkpoint makes it durable
        assert broker.log_manager._unsynced_metadata == [partition_dir / "partition.metadata"]
        broker.log_manager.checkpoint()
        assert broker.log_manager._unsynced_metadata == []
    finally:
        for broker_id in list(brokers.running):
            brokers.stop(broker_id)


def test_an_unreadable_partition_metadata_file_is_refused_naming_it(
        broker_factory: BrokerFactory) -> None:
    """Goal: a partition.metadata that cannot be read neither costs the partition's records
    nor is guessed: the start is refused naming the file (as a bad meta.properties is), and
    once an operator removes it the log adopts its topic's id with every record. Method: a
    broker process; fill orders-0, stop, overwrite the file, start (refused), remove it,
    start: every record is read and the file records the topic's id."""
    broker = broker_factory(broker_id=0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
    values = [b"v-%d" % i for i in range(RECORDS)]
    with bounded_producer(broker.bootstrap, acks="all") as producer:
        assert all(f.result(10) for f in [producer.send(TOPIC, value=v) for v in values])
    assert broker.stop() == 0
    record = broker.log_dir / f"{TOPIC}-0" / "partition.metadata"
    topic_id = recorded_topic_id(record.parent)
    record.write_bytes(b"version: 0\n")
    with pytest.raises(RuntimeError, match=rf"{record}.*malformed.*remove it"):
        broker.start()
    record.unlink()
    broker.start()
    assert consumed(broker.bootstrap) == values
    assert recorded_topic_id(record.parent) == topic_id


def replicated_old_records(cluster: Brokers) -> tuple[Broker, Broker]:
    """Brokers 1 and 2 started, orders-0 on both (an ISR of 2) holding RECORDS old records:
    (its leader, its follower)."""
    first, second = cluster.start(1), cluster.start(2)
    with Admin(bootstrap(first)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 2)])
    wait_for(lambda: len(first.store.partition_states(TOPIC)[0].isr) == 2, "an ISR of 2")
    produce(first, [b"old-%d" % i for i in range(RECORDS)])
    leader_id = first.store.partition_states(TOPIC)[0].leader
    leader, follower = (first, second) if leader_id == 1 else (second, first)
    wait_for(lambda: (p := follower.replicas.get(TP)) is not None
             and p.log.log_end_offset == RECORDS, "the follower's copy of the old records")
    return leader, follower


def assert_only_new_records(leader: Broker, follower: Broker, new_id: str) -> None:
    """New records produced (acks=all) through ``leader`` are the only ones in either
    replica's log of orders-0, which records ``new_id``."""
    new = [b"new-%d" % i for i in range(RECORDS // 2)]
    produce(leader, new)
    for broker in (leader, follower):
        log = broker.replicas.get(TP).log  # type: ignore[union-attr]
        wait_for(lambda log=log: log.log_end_offset == len(new),  # type: ignore[misc]
                 f"broker {broker.config.broker_id}'s log end at {len(new)}")
        assert log_values(log) == new
        assert recorded_topic_id(log.dir) == new_id


def count_raised(broker: Broker, method: str, error: type[Exception],
                 monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the ``error``s ``broker``'s replica manager's ``method`` raises (the count,
    read)."""
    answer = getattr(broker.replicas, method)
    raised: list[object] = []
    lock = threading.Lock()

    def counted(*args: Any) -> Any:
        try:
            return answer(*args)
        except error:
            with lock:
                raised.append(args)
            raise
    monkeypatch.setattr(broker.replicas, method, counted)
    return lambda: len(raised)


def count_refusals(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """The UNKNOWN_TOPIC_ID answers ``broker``'s replicas give."""
    return count_raised(broker, "partition", UnknownTopicIdError, monkeypatch)


def test_a_follower_of_a_recreated_topic_replicates_only_the_new_log(
        cluster: Brokers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: a follower never keeps or fetches the old topic's records as the new topic's,
    even when it brings the new topic up before the leader has (the new topic's leader
    epoch, 0, is the old one's too, so truncation by epoch cannot tell them apart). Method:
    two ZooKeeper brokers, orders-0 replicated on both and filled; delete and create it with
    neither syncing; let the follower sync first: it gets the new, empty log, and the leader,
    still holding the old replica, refuses it (UNKNOWN_TOPIC_ID) instead of serving old
    records; then the leader syncs; new records produced with acks=all are the only ones in
    either replica's log."""
    leader, follower = replicated_old_records(cluster)

    leader._sync_lock.acquire()  # held past recreate_unsynced: the follower syncs first
    try:
        new_id = recreate_unsynced([follower, leader])
        refusals = count_refusals(leader, monkeypatch)
        assert follower.await_metadata_sync(SYNC_WAIT_S)
        assert follower.replicas.get(TP) is not None
        assert recorded_topic_id(follower.replicas.get(TP).log.dir) == new_id  # type: ignore[union-attr]
        wait_for(lambda: refusals() > 0, "the leader's refusal of the new topic's follower")
        assert log_values(follower.replicas.get(TP).log) == []  # type: ignore[union-attr]
    finally:
        leader._sync_lock.release()
    assert leader.await_metadata_sync(SYNC_WAIT_S)
    assert leader.store.partition_states(TOPIC)[0].leader == leader.config.broker_id
    assert_only_new_records(leader, follower, new_id)


def count_inconsistent(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """The INCONSISTENT_TOPIC_ID answers of ``broker``'s offsets_for_leader_epoch (a
    follower's first request for a partition it positions)."""
    return count_raised(broker, "offsets_for_leader_epoch", InconsistentTopicIdError,
                        monkeypatch)


def test_a_follower_ahead_of_its_leader_on_a_recreated_topic_replicates_nothing_old(
        cluster: Brokers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: when the follower brings a recreated topic up while the leader's metadata has
    not heard of the deletion yet (its ZooKeeper watch has not fired), the leader's old
    replica still answers as the topic's, at leader epoch 0 as the new topic's; no old
    record may go into the follower's new log. The follower's requests carry its replica's
    topic id, and the leader answers INCONSISTENT_TOPIC_ID (KIP-516). Method: two ZooKeeper
    brokers, orders-0 on both, filled; the leader's metadata listener (its map of topic ids)
    and its sync are held on their locks while orders-0 is deleted and created again with the
    same leader and replicas; the follower syncs its new, empty log, and the leader, still
    taking its old replica for the topic's, refuses it, so the follower's log stays empty
    (before, it held the 20 old records at once); then the leader catches up, and new records
    produced with acks=all are the only ones on either broker."""
    leader, follower = replicated_old_records(cluster)
    old_id = leader.current_topic_id(TOPIC)
    replicas = leader.store.topics()[TOPIC].replicas[0]
    refused = count_inconsistent(leader, monkeypatch)

    new_id = new_topic_id()
    with leader._sync_lock, leader._topic_ids_lock:  # the leader hears of nothing meanwhile
        follower.controller.delete_topic(TOPIC)
        follower.store.create_topic(TopicRecord(TOPIC, {0: replicas}, topic_id=new_id),
                                    {0: PartitionState(leader.config.broker_id, 0, replicas)})
        wait_for(lambda: (p := follower.replicas.get(TP)) is not None and p.topic_id == new_id,
                 "the follower's replica of the new topic")
        new_log = follower.replicas.get(TP).log  # type: ignore[union-attr]
        wait_for(lambda: refused() > 0 or new_log.log_end_offset > 0,
                 "the leader's answer to the new topic's follower")
        assert leader.current_topic_id(TOPIC) == old_id
        assert log_values(new_log) == []
    assert leader.await_metadata_sync(SYNC_WAIT_S)
    assert_only_new_records(leader, follower, new_id)


def record_leader_and_isr(broker: Broker, monkeypatch: pytest.MonkeyPatch
                          ) -> list[LeaderAndIsrRequest]:
    """Record the leader_and_isr requests ``broker`` is sent (as they are sent; the list)."""
    route = broker.handlers.routes[LeaderAndIsrRequest.ACTION]
    received: list[LeaderAndIsrRequest] = []

    def handle(req: LeaderAndIsrRequest) -> Any:
        received.append(req)
        return route.handle(req)
    monkeypatch.setitem(broker.handlers.routes, LeaderAndIsrRequest.ACTION,
                        Route(route.request_type, handle, route.access))
    return received


def told(received: list[LeaderAndIsrRequest], topic_id: str) -> bool:
    return any(p.topic == TOPIC and p.topic_id == topic_id
               for req in received for p in req.partitions)


def test_a_late_leader_and_isr_of_a_deleted_topic_is_not_applied_to_its_successor(
        cluster: Brokers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: the controller's leader_and_isr states carry the topic id they were decided for
    (a recreated topic's first state is sent even where it equals the old one's), and a
    broker refuses (INCONSISTENT_TOPIC_ID, logged) a state of another incarnation than its
    metadata's: a late notice for a deleted topic must not move the leadership or the epoch
    of the topic created again under its name. Method: one ZooKeeper broker (its own
    controller), the leader_and_isr requests it is sent recorded; orders-0 created (told with
    its id), deleted and created again while the controller waits on its lock (so that one
    pass sees both, and the new state equals the old one's), and told with the new id; then
    the old incarnation's
    state with broker 2 leading at epoch 3, as a late notice would carry it, is refused:
    the broker still leads the new orders-0 at epoch 0, and takes records."""
    broker = cluster.start(1)
    received = record_leader_and_isr(broker, monkeypatch)
    controller = broker.cluster_controller
    assert controller is not None
    with Admin(bootstrap(broker)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
    old_id = broker.store.topics()[TOPIC].topic_id
    wait_for(lambda: told(received, old_id), "the controller's notice of orders-0")
    with controller._lock:
        broker.controller.delete_topic(TOPIC)
        new_id = broker.controller.create_topic(NewTopic(TOPIC, 1)).topic_id
    wait_for(lambda: told(received, new_id), "the controller's notice of the new orders-0")
    assert broker.await_metadata_sync(SYNC_WAIT_S)
    late = LeaderAndIsrRequest(
        controller_id=1, controller_epoch=controller.epoch, partitions=[
            LeaderAndIsrPartition(topic=TOPIC, partition=0, leader=2, leader_epoch=3,
                                  isr=[2], replicas=[1, 2], topic_id=old_id)])
    answer = broker.handlers.routes[late.ACTION](encode(late))
    response = decode_response(LeaderAndIsrResponse, answer, late.ACTION)
    assert [r.error_code for r in response.partitions] == [ErrorCode.INCONSISTENT_TOPIC_ID]
    p = broker.replicas.partition(TP)
    assert (p.topic_id, p.is_leader, p.leader_epoch) == (new_id, True, 0)
    produce(broker, [b"new"])
    assert consumed(bootstrap(broker)) == [b"new"]


def test_the_group_coordinator_hears_of_every_topic_id_gone(
        brokers: Brokers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: the group coordinator learns, once, of each topic incarnation deleted, whether
    plainly, or recreated between two sync passes, and whether or not this broker hosts a
    replica of it (its committed offsets live in any coordinator). Method: record what the
    sync passes hand ``on_topics_deleted``; create three topics (one with its only replica on
    another broker): nothing; recreate one unsynced, delete the other two: each old id."""
    broker = brokers.start(1)
    gone: list[dict[str, str]] = []
    monkeypatch.setattr(broker.groups.coordinator, "on_topics_deleted",
                        lambda topics: gone.append(dict(topics)))
    with Admin(bootstrap(broker)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1), NewTopic("plain", 1)])
    broker.store.create_topic(TopicRecord("elsewhere", {0: (7,)}, topic_id=new_topic_id()),
                              {0: PartitionState(-1, 0, ())})
    assert broker.await_metadata_sync(SYNC_WAIT_S)
    old = {name: r.topic_id for name, r in broker.store.topics().items()}
    assert gone == []

    recreate_unsynced([broker])
    broker.controller.delete_topic("plain")
    broker.store.delete_topic("elsewhere")
    assert broker.await_metadata_sync(SYNC_WAIT_S)
    reported = [(name, topic_id) for topics in gone for name, topic_id in topics.items()]
    assert sorted(reported) == sorted((name, old[name]) for name in (TOPIC, "plain", "elsewhere"))


def test_partition_metadata_is_written_with_the_log(tmp_path: Path) -> None:
    """Goal: every log a broker creates records its topic's id from the start (a crash right
    after may not leave a directory that a recreated topic would adopt). Method: create two
    topics, one of them twice under one name through the admin API: each directory records
    its topic's current id."""
    brokers = Brokers(tmp_path, None)
    broker = brokers.start(0)
    try:
        name = f"t-{uuid.uuid4().hex[:6]}"
        with Admin(bootstrap(broker)) as admin:
            admin.create_topics([NewTopic(TOPIC, 1), NewTopic(name, 2)])
            admin.delete_topics([name])
            admin.create_topics([NewTopic(name, 2)])
        topics = broker.store.topics()
        for tp in (TP, TopicPartition(name, 0), TopicPartition(name, 1)):
            assert recorded_topic_id(brokers.log_dir(0) / str(tp)) == topics[tp.topic].topic_id
    finally:
        for broker_id in list(brokers.running):
            brokers.stop(broker_id)


def test_an_old_incarnation_that_cannot_be_deleted_stops_no_other_partition(
        brokers: Brokers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: a recreated topic's old log that cannot be deleted (a disk error) is that
    partition's trouble only: the sync pass goes on for the others (before, the error ended
    the pass), the old replica serves nothing, and a pass once the disk is back deletes it.
    Method: renaming the old partition directory aside fails (the log manager must keep
    knowing the log, or the next pass would adopt its directory for the new topic); another
    topic is created in the same pass."""
    broker = brokers.start(1)
    with Admin(bootstrap(broker)) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
    produce(broker, [b"old-%d" % i for i in range(RECORDS)])
    real, failures, disk_ok = segment_log.remove_partition_dir, [], threading.Event()

    def failing(partition_dir: Path) -> None:
        if not disk_ok.is_set():
            failures.append(parse_partition_dir(partition_dir.name))
            raise OSError(5, "Input/output error")
        real(partition_dir)
    monkeypatch.setattr(segment_log, "remove_partition_dir", failing)
    with broker._sync_lock:  # one pass sees the recreate and the other topic together
        recreate_unsynced([broker], TYPED)
        broker.controller.create_topic(NewTopic("bystander", 1, 1))
    wait_for(lambda: broker.replicas.get(TopicPartition("bystander", 0)) is not None,
             "the other topic's partition online")
    assert set(failures) == {TP} and broker.replicas.get(TP) is None  # serving nothing
    disk_ok.set()
    broker.sync_partitions()  # the next pass
    assert broker.replicas.partition(TP).log.log_end_offset == 0
