"""Consumer group behaviour a review found wanting, against a real broker process.

Goal: a cooperative member's revoked partitions keep their progress (auto-commit, or a
listener committing in ``on_partitions_revoked``, as the README recommends when auto-commit is
off); a member the group removed rejoins owning nothing and does not read again what the new
owner committed; a member busy for longer than ``session_timeout_ms`` (but within
``max_poll_interval_ms``) keeps its membership while another joins; the eager ``sticky``
assignor keeps partitions with their owners; ``assign()`` with a ``group_id`` starts at the
group's committed offsets and, with auto-commit, commits its positions at ``close()``.
Method: one broker with short group timings shared by the module; consumers polled in turn
from the test's thread (or one on a thread of its own), every wait bounded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from logstore import Admin, Consumer, TopicPartition
from logstore.client.consumer import ConsumerRebalanceListener
from logstore.errors import FencedInstanceIdError
from logstore.model import OffsetAndMetadata
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer, new_topic
from tests.helpers import wait_for

GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100}
FAST = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 100,
        "auto_offset_reset": "earliest", "fetch_max_wait_ms": 100}


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("groups-review"))
    yield factory(**GROUP_SETTINGS)
    factory.stop_all()


@pytest.fixture(scope="module")
def admin(gbroker: BrokerProcess) -> Iterator[Admin]:
    with Admin(gbroker.bootstrap) as a:
        yield a


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, partitions: int, n: int) -> None:
    with bounded_producer(bootstrap) as producer:
        for i in range(n):
            producer.send(topic, value=b"%d" % i, partition=i % partitions)
        producer.flush(30)


def _consume(consumer: Consumer, n: int) -> list[tuple[int, int]]:
    """(partition, offset) of ``n`` records polled (bounded)."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        for tp, records in consumer.poll(100).items():
            got += [(tp.partition, r.offset) for r in records]
    return got


@contextmanager
def _polling(*consumers: Consumer, commit: bool = False
             ) -> Iterator[dict[Consumer, list[tuple[int, int]]]]:
    """Each consumer polled on a thread of its own (a join blocks until every member has
    rejoined, so members cannot take turns on one thread), the (partition, offset) of its
    records kept; with ``commit``, its positions committed after each poll that got any."""
    stop = threading.Event()
    got: dict[Consumer, list[tuple[int, int]]] = {c: [] for c in consumers}

    def run(consumer: Consumer) -> None:
        while not stop.is_set():
            records = consumer.poll(50)
            for tp, batch in records.items():
                got[consumer] += [(tp.partition, r.offset) for r in batch]
            if commit and records:
                consumer.commit()

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for thread in threads:
        thread.start()
    try:
        yield got
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


class CommitOnRevoke(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.consumer: Consumer | None = None

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        assert self.consumer is not None
        self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})


@pytest.mark.parametrize("auto_commit", [True, False])
def test_a_cooperative_members_revoked_partitions_keep_their_progress(
        gbroker: BrokerProcess, admin: Admin, auto_commit: bool) -> None:
    """A (cooperative-sticky) consumes 100 records of 4 partitions; B joins. Each revoked
    partition's offset is committed: before, the commit went at the new generation, for a
    partition no longer A's, and was refused (ILLEGAL_GENERATION); the listener's refusal
    also left the rebalance half done."""
    topic, group = new_topic(admin, 4), _group()
    _produce(gbroker.bootstrap, topic, 4, 100)
    listener = None if auto_commit else CommitOnRevoke()
    a = Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=auto_commit,
                 auto_commit_interval_ms=600_000,
                 partition_assignment_strategy=["cooperative-sticky"], **FAST)
    b = Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False,
                 partition_assignment_strategy=["cooperative-sticky"], **FAST)
    try:
        if listener is not None:
            listener.consumer = a
        a.subscribe([topic], listener=listener)
        assert len(_consume(a, 100)) == 100
        b.subscribe([topic])
        with _polling(a, b):
            wait_for(lambda: len(a.assignment()) == len(b.assignment()) == 2,
                     "both members holding 2 partitions")
        moved = b.assignment()
        assert {tp: a.committed(tp) for tp in moved} == {
            tp: OffsetAndMetadata(25, "", a.committed(tp).commit_timestamp)  # type: ignore
            for tp in moved}
    finally:
        b.close()
        a.close()


def test_a_member_removed_from_the_group_rejoins_owning_nothing(
        gbroker: BrokerProcess, admin: Admin) -> None:
    """B (cooperative-sticky, 1 s max poll interval) owns the one partition at offset 5 and
    stops polling: the group removes it, and A takes the partition and commits offset 50.
    When B polls again it must not claim the partition back from its stale assignment and
    read offsets 5..49 again."""
    topic, group = new_topic(admin, 1), _group()
    _produce(gbroker.bootstrap, topic, 1, 50)
    settings = dict(FAST, partition_assignment_strategy=["cooperative-sticky"],
                    max_poll_records=5)
    # Member ids begin with the client id, and of two members claiming a partition, the
    # assignor keeps it with the first in member-id order: B's claim would win.
    b = Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False,
                 max_poll_interval_ms=1000, client_id="aa-b", **settings)
    a = Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False,
                 client_id="zz-a", **settings)
    p0 = TopicPartition(topic, 0)
    try:
        b.subscribe([topic])
        wait_for(lambda: b.poll(100) is not None and len(b.assignment()) == 1 and
                 b.position(p0) > 0, "B reading partition 0")
        b.commit()
        a.subscribe([topic])
        with _polling(a, commit=True):  # B, idle, is removed; A takes and reads partition 0
            wait_for(lambda: (a.committed(p0) or OffsetAndMetadata(-1, "", -1)).offset == 50,
                     "A owning partition 0 and committing offset 50")
            again = [offset for partition, offset in _consume_for(b, 3.0) if partition == 0]
        assert again == []
    finally:
        a.close()
        b.close()


def _consume_for(consumer: Consumer, seconds: float) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for tp, records in consumer.poll(100).items():
            got += [(tp.partition, r.offset) for r in records]
    return got


def test_a_busy_member_keeps_its_membership_while_another_joins(
        gbroker: BrokerProcess, admin: Admin) -> None:
    """A (1.5 s session, 60 s max poll interval) stops polling for 4 s while B joins: its
    heartbeats must go on during the pending rebalance, so the group waits for it instead of
    expelling it (before, B was given every partition while A still read them); once A polls
    again they split the partitions."""
    topic, group = new_topic(admin, 2), _group()
    a = Consumer(gbroker.bootstrap, group_id=group, max_poll_interval_ms=60_000, **FAST)
    b = Consumer(gbroker.bootstrap, group_id=group, max_poll_interval_ms=60_000, **FAST)
    joined = threading.Event()
    try:
        a.subscribe([topic])
        wait_for(lambda: a.poll(100) is not None and len(a.assignment()) == 2, "A owning both")

        def join_b() -> None:
            b.subscribe([topic])
            deadline = time.monotonic() + 30
            while not b.assignment() and time.monotonic() < deadline:
                b.poll(100)
            joined.set()

        thread = threading.Thread(target=join_b)
        thread.start()
        busy_until = time.monotonic() + 4.0  # A "processes" without polling
        while time.monotonic() < busy_until:
            assert not b.assignment(), "B was given partitions while A still held them"
            time.sleep(0.05)
        wait_for(lambda: a.poll(100) is not None and joined.is_set(), "B's join completing")
        thread.join(30)
        assert len(a.assignment()) == len(b.assignment()) == 1
    finally:
        b.close()
        a.close()


def test_the_eager_sticky_assignor_keeps_partitions_with_their_owners(
        gbroker: BrokerProcess, admin: Admin) -> None:
    """Three members share 6 partitions with ``sticky``; when one leaves, the other two keep
    every partition they had (before, the eager path passed no owned partitions, so the
    assignment started over)."""
    topic, group = new_topic(admin, 6), _group()
    members = [Consumer(gbroker.bootstrap, group_id=group, partition_assignment_strategy=[
        "sticky"], **FAST) for _ in range(3)]
    try:
        for m in members:
            m.subscribe([topic])
        with _polling(*members):
            wait_for(lambda: all(len(m.assignment()) == 2 for m in members),
                     "each of three members holding 2 partitions")
        before = [m.assignment() for m in members[:2]]
        members.pop().close()
        with _polling(*members):
            wait_for(lambda: all(len(m.assignment()) == 3 for m in members),
                     "each of two members holding 3 partitions")
        assert all(old <= m.assignment() for old, m in zip(before, members, strict=True))
    finally:
        for m in members:
            m.close()


def test_assign_with_a_group_starts_at_its_committed_offset_and_commits_at_close(
        gbroker: BrokerProcess, admin: Admin) -> None:
    """With a group_id, ``assign()`` reads from the group's committed offset, not from
    ``auto_offset_reset`` (as kafka-python and Java do), and auto-commit commits the
    positions at ``close()`` (before, only a subscription's were)."""
    topic, group = new_topic(admin, 1), _group()
    tp = TopicPartition(topic, 0)
    _produce(gbroker.bootstrap, topic, 1, 20)
    with Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False, **FAST) as c:
        c.assign([tp])
        c.commit({tp: 7})
    with Consumer(gbroker.bootstrap, group_id=group, auto_commit_interval_ms=600_000,
                  **FAST) as c:
        c.assign([tp])
        assert c.position(tp) == 7
        assert [o for _, o in _consume(c, 5)][:1] == [7]
        position = c.position(tp)
    with Consumer(gbroker.bootstrap, group_id=group, **FAST) as c:
        committed = c.committed(tp)
        assert committed is not None and committed.offset == position


def test_a_static_member_replaced_by_another_instance_is_fenced(
        gbroker: BrokerProcess, admin: Admin) -> None:
    """Two consumers with one group_instance_id (a zombie and its replacement): as in Kafka,
    the older one gets FENCED_INSTANCE_ID from its next heartbeat, commit or join, and
    ``poll()`` raises it for good; the newer keeps the partitions. Before, the older one was
    told UNKNOWN_MEMBER_ID, rejoined under the same instance id and displaced the newer one,
    and so on: both consumed the same partitions. Method: the old instance polls, the new
    one joins on a thread; the old one's polls must raise within the wait."""
    topic, group = new_topic(admin, 2), _group()
    settings = dict(FAST, group_id=group, group_instance_id="instance-1")
    old = Consumer(gbroker.bootstrap, **settings)  # type: ignore[arg-type]
    new = Consumer(gbroker.bootstrap, **settings)  # type: ignore[arg-type]
    try:
        old.subscribe([topic])
        wait_for(lambda: old.poll(100) is not None and len(old.assignment()) == 2,
                 "the old instance owning both partitions")
        new.subscribe([topic])
        with _polling(new):
            def fenced() -> bool:
                try:
                    old.poll(100)
                except FencedInstanceIdError:
                    return True
                return False
            wait_for(fenced, "the old instance fenced")
            with pytest.raises(FencedInstanceIdError, match="instance-1"):
                old.poll(0)
            wait_for(lambda: len(new.assignment()) == 2, "the new instance owning both")
        assert old.assignment() == set()
    finally:
        new.close()
        old.close()
