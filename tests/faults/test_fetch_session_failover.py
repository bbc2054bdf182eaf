"""Fetch sessions across a leader change: three real brokers and a real ZooKeeper.

Goal: a consumer reading on a push session continues from the new leader after kill -9 of the
old one, without losing or repeating a record, while a producer keeps writing with acks=all;
a leader that stays up but loses the partition ends it in its sessions with
NOT_LEADER_OR_FOLLOWER, and the new leader ends a session naming an old epoch with
FENCED_LEADER_EPOCH (a future one: UNKNOWN_LEADER_EPOCH). Method (kill -9): the producer
thread sends numbered records; once the consumer has read some, the leader is killed; the
consumer then reads to the high watermark the producer's last acknowledgement left. Every
offset is read exactly once and every acknowledged value is among them; the new leader served
the consumer on a session of its own. Method (a live leader): as its test says.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

from logstore import Consumer, Producer, TopicPartition
from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError, ErrorCode
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import FetchSessionPartitionEnd, FetchSessionRequest
from logstore.messages.log import BrokerStatsRequest
from logstore.rpc.client import BrokerConnection
from logstore.rpc.session_client import FetchSessionStream, PartitionNews, SessionFrame
from tests.brokers import BrokerFactory
from tests.faults.cluster import FAILOVER_ERRORS, Cluster
from tests.helpers import WAIT_S, wait_for

RECORDS = 3000


def test_a_session_consumer_continues_from_the_new_leader_after_kill_9(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: no record lost or repeated across a leader change under a session. Method: as
    the module says (3,000 records in acks=all chunks of 100, kill -9 after 600 are read)."""
    cluster = Cluster(broker_factory, zk_connect)
    topic = cluster.create_topic(rf=3, min_insync_replicas=2)
    tp = TopicPartition(topic, 0)
    acked: list[bytes] = []
    read: list[tuple[int, bytes]] = []
    done = threading.Event()

    def produce() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=1, delivery_timeout_ms=60_000,
                      request_timeout_ms=5000) as producer:
            for start in range(0, RECORDS, 100):  # chunk by chunk: the kill lands mid-way
                chunk = [(b"%d" % i, producer.send(topic, b"%d" % i, partition=0))
                         for i in range(start, start + 100)]
                for value, future in chunk:
                    try:
                        future.result(60)
                        acked.append(value)
                    except ApiError:
                        pass
        done.set()

    victim = cluster.leader(topic)
    thread = threading.Thread(target=produce)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        thread.start()
        while len(read) < RECORDS // 5:
            for table in consumer.poll_arrow(timeout_ms=300).values():
                read.extend(zip(table.column("offset").to_pylist(),
                                table.column("value").to_pylist(), strict=True))
        victim.kill(signal.SIGKILL)
        done.wait(WAIT_S * 4)
        thread.join(10)
        new_leader = cluster.wait_for_new_leader(topic, victim.broker_id)
        end = wait_for(lambda: consumer.end_offsets([tp])[tp], "the high watermark",
                       tolerate=FAILOVER_ERRORS)
        deadline = time.monotonic() + WAIT_S
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read to {consumer.position(tp)} of {end}"
            for table in consumer.poll_arrow(timeout_ms=300).values():
                read.extend(zip(table.column("offset").to_pylist(),
                                table.column("value").to_pylist(), strict=True))
        conn = BrokerConnection(cluster.brokers[new_leader].bootstrap)
        try:
            sessions = conn.call(BrokerStatsRequest()).fetch_sessions
        finally:
            conn.close()
    assert [o for o, _ in read] == list(range(end)), "an offset lost or read twice"
    assert set(acked) <= {v for _, v in read}, "an acknowledged record was not read"
    assert len(acked) > RECORDS // 5
    assert sessions >= 1, "the new leader never served the consumer on a session"


def _read_until(stream: FetchSessionStream, wanted: Callable[[SessionFrame], bool]
                ) -> SessionFrame:
    """Frames of ``stream`` until one is ``wanted`` (bounded: the stream is cancelled after
    WAIT_S, which ends the read)."""
    timer = threading.Timer(WAIT_S, stream.close)
    timer.start()
    try:
        while (frame := stream.read()) is not None:
            if wanted(frame):
                return frame
        raise AssertionError(f"{stream.where}: nothing wanted within {WAIT_S} s")
    finally:
        timer.cancel()


def _partition_end(stream: FetchSessionStream) -> FetchSessionPartitionEnd:
    frame = _read_until(stream, lambda f: isinstance(f, FetchSessionPartitionEnd))
    assert isinstance(frame, FetchSessionPartitionEnd)
    return frame


@contextlib.contextmanager
def _open(address: str, topic: str, offset: int, epoch: int = -1
          ) -> Iterator[FetchSessionStream]:
    """A raw session on partition 0 of ``topic`` at ``offset``, naming leader ``epoch``."""
    conn = BrokerConnection(address, timeout_s=10)
    try:
        stream = conn.open_fetch_session(FetchSessionRequest(
            topic=topic, credit_bytes=1 << 20, partitions=[
                FetchPartition(partition=0, offset=offset, current_leader_epoch=epoch)]))
        try:
            yield stream
        finally:
            stream.close()
    finally:
        conn.close()


def _end_code(address: str, topic: str, epoch: int) -> ErrorCode:
    with _open(address, topic, 0, epoch) as stream:
        return ErrorCode(_partition_end(stream).error_code)


def _serves(address: str, topic: str, epoch: int) -> bool:
    """Whether a session on partition 0 at ``epoch`` gets batches (not an end)."""
    with _open(address, topic, 0, epoch) as stream:
        frame = _read_until(stream, lambda f: not isinstance(f, PartitionNews) or bool(f.batches))
        return isinstance(frame, PartitionNews)


def _leader_epoch(cluster: Cluster, tp: TopicPartition) -> tuple[int, int]:
    metadata = ClusterMetadata(cluster.live_bootstrap())
    try:
        part = metadata.leader_partition(tp)
        return part.leader, part.leader_epoch
    finally:
        metadata.close()


def test_a_leader_change_ends_the_partition_in_its_session_with_the_right_error(
        broker_factory: BrokerFactory, zk_connect: str) -> None:
    """Goal: when leadership moves away from a broker that stays up, its sessions end the
    partition with NOT_LEADER_OR_FOLLOWER (the session itself lives on); on the new leader a
    session naming the old epoch is ended with FENCED_LEADER_EPOCH and one naming a future
    epoch with UNKNOWN_LEADER_EPOCH; a consumer on a session continues from the new leader
    without losing or repeating a record. Method: RF=3, 50 records read by the consumer and a
    raw session open on the leader at the end; the leader is SIGSTOPped until the controller
    moves the partition (its ZooKeeper session expires), then thawed; 50 more records are
    produced and read."""
    cluster = Cluster(broker_factory, zk_connect)
    topic = cluster.create_topic(rf=3, min_insync_replicas=2)
    tp = TopicPartition(topic, 0)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(50):
            producer.send(topic, b"%d" % i, partition=0)
        producer.flush(30)
    old, old_epoch = _leader_epoch(cluster, tp)
    read: list[tuple[int, bytes]] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        _read_to(consumer, tp, 50, read)
        with _open(cluster.brokers[old].bootstrap, topic, 50) as on_old:
            cluster.freeze(old)
            try:
                new = cluster.wait_for_new_leader(topic, old)
            finally:
                cluster.thaw(old)
            end = _partition_end(on_old)
        assert end.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, end
        # Leadership settles on the preferred replica once it is in the ISR again (the thawed
        # broker, if it is the preferred one, takes the partition back: a second move). Only
        # then are the epochs below checked, so that no move lands between them.
        preferred = cluster.wait_for_isr(topic, 0, 3).replicas[0]
        leader, new_epoch = wait_for(
            lambda: (le := _leader_epoch(cluster, tp))[1] > old_epoch and le[0] == preferred
            and le,
            f"preferred replica {preferred} leading {tp} (after {new} took over) at an epoch "
            f"past {old_epoch}", tolerate=FAILOVER_ERRORS)
        address = cluster.brokers[leader].bootstrap
        # Metadata may name the leader a moment before it has applied its epoch: a session at
        # that epoch is served (batches, once the HW is known there) from when it has.
        wait_for(lambda: _serves(address, topic, new_epoch),
                 f"broker {leader} serving {tp} at epoch {new_epoch}")
        assert _end_code(address, topic, old_epoch) == ErrorCode.FENCED_LEADER_EPOCH
        assert _end_code(address, topic, new_epoch + 1) == ErrorCode.UNKNOWN_LEADER_EPOCH
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(50, 100):
                producer.send(topic, b"%d" % i, partition=0)
            producer.flush(30)
        _read_to(consumer, tp, 100, read)
    assert [o for o, _ in read] == list(range(100))
    assert [v for _, v in read] == [b"%d" % i for i in range(100)]


def _read_to(consumer: Consumer, tp: TopicPartition, end: int,
             read: list[tuple[int, bytes]]) -> None:
    deadline = time.monotonic() + WAIT_S
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"read to {consumer.position(tp)} of {end}"
        for table in consumer.poll_arrow(timeout_ms=300).values():
            read.extend(zip(table.column("offset").to_pylist(),
                            table.column("value").to_pylist(), strict=True))
