"""Consumer groups against a real broker process.

Goal: members of one group split the partitions and together consume every record, with no
partition owned by two members in one generation; committed offsets (with metadata) start the
next member; two groups are independent; cooperative-sticky revokes only what moves; a pattern
subscription picks up a new topic; the admin calls and ``logstore groups`` commands work; bad
input gets Kafka's codes and loses nothing committed; compaction of ``__consumer_offsets``
keeps the latest offset per key, and a restarted broker replays it. And what a review found
wanting: a cooperative member's revoked partitions keep their progress; a member the group
removed rejoins owning nothing; a member busy past ``session_timeout_ms`` (within
``max_poll_interval_ms``) keeps its membership while another joins; a replaced static member
is fenced; eager ``sticky`` keeps owners; ``assign()`` with a ``group_id`` starts at the
committed offsets and commits at ``close()``. Method: one broker with
short group timings (no initial rebalance delay, 100 ms minimum session) shared by the module;
consumers run on threads and every wait is a bounded poll for a condition.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest

from logstore import Admin, Consumer, TopicPartition
from logstore.client.consumer import ConsumerRebalanceListener
from logstore.errors import ErrorCode, FencedInstanceIdError, NonEmptyGroupError
from logstore.messages.groups import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitEntry,
    OffsetCommitRequest,
    SyncGroupRequest,
)
from logstore.model import OFFSETS_TOPIC, OffsetAndMetadata
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer, new_topic
from tests.helpers import WAIT_S, wait_for

GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100,
                  "offsets_topic_segment_bytes": 32 * 1024, "log_cleaner_interval_ms": 300}
FAST = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 100,
        "auto_offset_reset": "earliest", "fetch_max_wait_ms": 100}


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("groups"))
    yield factory(**GROUP_SETTINGS)
    factory.stop_all()


@pytest.fixture(scope="module")
def admin(gbroker: BrokerProcess) -> Iterator[Admin]:
    with Admin(gbroker.bootstrap) as a:
        yield a


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, partitions: int, n: int) -> None:
    with bounded_producer(bootstrap) as producer:
        for i in range(n):
            producer.send(topic, value=b"%d" % i, partition=i % partitions)
        producer.flush()


def consume(consumer: Consumer, n: int) -> list:
    """Poll until ``n`` records arrived (bounded by WAIT_S)."""
    got: list = []
    wait_for(lambda: got.extend(r for rs in consumer.poll(100).values() for r in rs) or
             len(got) >= n, f"{n} records")
    return got


def test_members_split_partitions_and_consume_every_record(gbroker: BrokerProcess,
                                                           admin: Admin) -> None:
    topic = new_topic(admin, 6)
    produce(gbroker.bootstrap, topic, 6, 600)
    group, seen, snapshots = group_name(), set(), []
    lock, done = threading.Lock(), threading.Event()

    def member() -> None:
        with Consumer(gbroker.bootstrap, group_id=group, auto_commit_interval_ms=200,
                      **FAST) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + WAIT_S
            while not done.is_set() and time.monotonic() < deadline:
                records = c.poll(100)
                with lock:
                    snapshots.append((c._group.generation_id, c._group.member_id,
                                      frozenset(c.assignment())))
                    seen.update((tp.partition, r.offset) for tp, rs in records.items()
                                for r in rs)
                    if len(seen) == 600:
                        done.set()

    threads = [threading.Thread(target=member) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S + 10)
    assert len(seen) == 600
    owners: dict[tuple[int, TopicPartition], str] = {}
    for generation, member_id, assignment in snapshots:
        for tp in assignment:
            assert owners.setdefault((generation, tp), member_id) == member_id, \
                f"{tp} owned by two members in generation {generation}"


def test_committed_offsets_with_metadata_start_the_next_member(gbroker: BrokerProcess,
                                                               admin: Admin) -> None:
    topic, group = new_topic(admin, 1), group_name()
    tp = TopicPartition(topic, 0)
    produce(gbroker.bootstrap, topic, 1, 100)
    with Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False, **FAST) as c:
        c.subscribe([topic])
        got: list = []
        wait_for(lambda: got.extend(c.poll(100, max_records=40).get(tp, [])) or got, "records")
        c.commit({tp: OffsetAndMetadata(got[-1].offset + 1, "stopped here")})
        assert c.committed(tp) == OffsetAndMetadata(got[-1].offset + 1, "stopped here",
                                                    c.committed(tp).commit_timestamp)
    stopped = got[-1].offset + 1
    with Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False, **FAST) as c:
        c.subscribe([topic])
        first: list = []
        wait_for(lambda: first.extend(c.poll(100).get(tp, [])) or first, "records")
        assert first[0].offset == stopped


def test_two_groups_consume_independently(gbroker: BrokerProcess, admin: Admin) -> None:
    topic = new_topic(admin, 2)
    produce(gbroker.bootstrap, topic, 2, 100)
    groups = [group_name(), group_name()]
    for group in groups:
        with Consumer(gbroker.bootstrap, group_id=group, **FAST) as c:
            c.subscribe([topic])
            consume(c, 100)
            c.commit()
    ends = {TopicPartition(topic, p): 50 for p in range(2)}
    for group in groups:
        assert {tp: om.offset for tp, om in admin.list_group_offsets(group).items()} == ends
    admin.alter_group_offsets(groups[0], {TopicPartition(topic, 0): 0})
    assert admin.list_group_offsets(groups[0])[TopicPartition(topic, 0)].offset == 0
    assert admin.list_group_offsets(groups[1])[TopicPartition(topic, 0)].offset == 50


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.revoked: list[set[TopicPartition]] = []
        self.assigned: list[set[TopicPartition]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.revoked.append(set(revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assigned.append(set(assigned))


class Polling:
    """A consumer polling on its own thread (a join blocks until every member rejoins, so
    members of one group cannot share a thread)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 2 * WAIT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.consumer.poll(50)

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer._assignment)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        self.consumer.close()


def test_cooperative_sticky_revokes_only_moved_partitions(gbroker: BrokerProcess,
                                                          admin: Admin) -> None:
    topic, group = new_topic(admin, 4), group_name()
    settings = {**FAST, "group_id": group,
                "partition_assignment_strategy": ["cooperative-sticky"]}
    rec_a = Recorder()
    a_consumer = Consumer(gbroker.bootstrap, **settings)
    a_consumer.subscribe([topic], listener=rec_a)
    a = Polling(a_consumer)
    try:
        wait_for(lambda: len(a.assignment()) == 4, "a owns all")
        b_consumer = Consumer(gbroker.bootstrap, **settings)
        b_consumer.subscribe([topic])
        b = Polling(b_consumer)
        try:
            wait_for(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2,
                     "two partitions each")
            assert rec_a.revoked == [b.assignment()]  # only what moved, once
            assert not a.assignment() & b.assignment()
        finally:
            b.stop()
    finally:
        a.stop()


def test_pattern_subscription_picks_up_new_topics(gbroker: BrokerProcess, admin: Admin) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    first = new_topic(admin, 1, prefix=prefix)
    with Consumer(gbroker.bootstrap, group_id=group_name(), metadata_max_age_ms=200,
                  **FAST) as c:
        c.subscribe(pattern=f"{prefix}-.*")
        wait_for(lambda: c.poll(50) is not None and c.assignment() == {
            TopicPartition(first, 0)}, "the first topic")
        second = new_topic(admin, 2, prefix=prefix)
        wait_for(lambda: c.poll(50) is not None and len(c.assignment()) == 3,
                 f"{second}'s partitions")


def test_bad_input_gets_kafka_codes(gbroker: BrokerProcess, admin: Admin) -> None:
    topic, group = new_topic(admin, 2), group_name()
    conn = BrokerConnection(gbroker.bootstrap)
    protocols = [GroupProtocol(name="range", metadata={"topics": [topic]})]
    join = JoinGroupRequest(group_id=group, session_timeout_ms=5000, protocols=protocols)
    assert conn.call(DescribeGroupsRequest(group_ids=[group])).groups[0].error_code == \
        ErrorCode.GROUP_ID_NOT_FOUND
    assert conn.call(msgspec.structs.replace(join, session_timeout_ms=1)).error_code == \
        ErrorCode.INVALID_SESSION_TIMEOUT
    joined = conn.call(join)
    member, generation = joined.member_id, joined.generation_id
    conn.call(SyncGroupRequest(group_id=group, member_id=member, generation_id=generation,
                               assignments={member: {"partitions": [[topic, 0]]}}))
    assert conn.call(HeartbeatRequest(group_id=group, member_id=member,
                                      generation_id=generation - 1)).error_code == \
        ErrorCode.ILLEGAL_GENERATION
    assert conn.call(HeartbeatRequest(group_id=group, member_id="nobody",
                                      generation_id=generation)).error_code == \
        ErrorCode.UNKNOWN_MEMBER_ID
    commit = conn.call(OffsetCommitRequest(
        group_id=group, member_id=member, generation_id=generation, offsets=[
            OffsetCommitEntry(topic=topic, partition=0, offset=7),
            OffsetCommitEntry(topic=topic, partition=1, offset=3),
            OffsetCommitEntry(topic=topic, partition=0, offset=-5)]))
    codes = [e.error_code for e in commit.offsets]
    assert codes == [ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.ILLEGAL_GENERATION] or \
        codes == [ErrorCode.ILLEGAL_GENERATION, ErrorCode.OFFSET_OUT_OF_RANGE], codes
    with pytest.raises(NonEmptyGroupError):
        admin.alter_group_offsets(group, {TopicPartition(topic, 0): 0})
    assert conn.call(DeleteGroupsRequest(group_ids=[group])).groups[0].error_code == \
        ErrorCode.NON_EMPTY_GROUP
    cli = subprocess.run([sys.executable, "-m", "logstore", "groups", "reset-offsets", group,
                          "--topic", topic, "--to-earliest", "--bootstrap-server",
                          gbroker.bootstrap], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and "NON_EMPTY_GROUP" in cli.stderr
    conn.call(OffsetCommitRequest(group_id=group, member_id=member, generation_id=generation,
                                  offsets=[OffsetCommitEntry(topic=topic, partition=0, offset=7)]))
    assert conn.call(LeaveGroupRequest(group_id=group, member_id=member)).error_code == 0
    assert admin.list_group_offsets(group)[TopicPartition(topic, 0)].offset == 7  # kept
    conn.close()


def run_cli(bootstrap: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "logstore", "groups", *args,
                           "--bootstrap-server", bootstrap], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cli_lists_describes_resets_and_deletes(gbroker: BrokerProcess, admin: Admin) -> None:
    topic, group = new_topic(admin, 2), group_name()
    produce(gbroker.bootstrap, topic, 2, 20)
    admin.alter_group_offsets(group, {TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 6})
    assert group in run_cli(gbroker.bootstrap, "list")
    described = run_cli(gbroker.bootstrap, "describe", group)
    assert "state Empty" in described and "total lag 10" in described
    run_cli(gbroker.bootstrap, "reset-offsets", group, "--topic", topic, "--to-latest")
    assert {om.offset for om in admin.list_group_offsets(group).values()} == {10}
    run_cli(gbroker.bootstrap, "reset-offsets", group, "--topic", topic, "--to-datetime",
            "2000-01-01T00:00:00")
    assert {om.offset for om in admin.list_group_offsets(group).values()} == {0}
    run_cli(gbroker.bootstrap, "delete", group)
    assert group not in [g.group_id for g in admin.list_groups()]


def test_cli_reset_to_an_offset_outside_a_partition_clamps_it_with_a_warning(
        broker_factory: BrokerFactory) -> None:
    """Goal: ``reset-offsets --to-offset N`` commits N only where the partition holds it:
    below the log start it commits the earliest offset, above the log end the latest, each
    with a warning naming the partition (kafka-consumer-groups' checkOffsetsRange); in range
    it commits N and warns of nothing. Method: a broker checking retention every 100 ms; a
    two-partition topic of 16 KiB segments, 200 records of ~500 bytes in partition 0 and 20
    in partition 1, in batches of ten; retention_bytes 1 deletes partition 0's sealed segments (its log start
    moves past 100) and leaves partition 1's only, active one; then --to-offset 5, 1000
    and 15."""
    broker = broker_factory(log_retention_check_interval_ms=100, **GROUP_SETTINGS)
    with Admin(broker.bootstrap) as admin:
        topic, group = new_topic(admin, 2, segment_bytes=16 * 1024), group_name()
        tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        with bounded_producer(broker.bootstrap, linger_ms=0) as producer:
            for i in range(220):  # batches of ten records: 5 KB each, 16 KiB segments
                producer.send(topic, b"%04d" % i + b"x" * 500, partition=0 if i < 200 else 1)
                if i % 10 == 9:
                    producer.flush()
        admin.alter_configs({topic: {"retention_bytes": "1"}})
        start = wait_for(lambda: (o := admin.list_offsets({tp0: -2})[tp0]) > 100 and o,
                         "retention to delete partition 0's sealed segments")

        def reset(offset: int) -> tuple[dict[TopicPartition, int], list[str]]:
            done = subprocess.run([
                sys.executable, "-m", "logstore", "groups", "reset-offsets", group, "--topic",
                topic, "--to-offset", str(offset), "--bootstrap-server", broker.bootstrap],
                capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            committed = {tp: om.offset for tp, om in admin.list_group_offsets(group).items()}
            return committed, [w for w in done.stderr.splitlines() if w.startswith("warning")]

        committed, warnings = reset(5)
        assert committed == {tp0: start, tp1: 5}
        assert warnings == [f"warning: new offset 5 is lower than the earliest offset of "
                            f"{tp0}; it is set to {start}"]
        committed, warnings = reset(1000)
        assert committed == {tp0: 200, tp1: 20}
        assert warnings == [f"warning: new offset 1000 is higher than the latest offset of "
                            f"{tp}; it is set to {end}" for tp, end in ((tp0, 200), (tp1, 20))]
        assert reset(15) == ({tp0: start, tp1: 15}, [f"warning: new offset 15 is lower than "
                                                     f"the earliest offset of {tp0}; it is "
                                                     f"set to {start}"])


def test_offsets_compaction_keeps_the_latest_per_key(tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    factory = BrokerFactory(tmp_path_factory.mktemp("compaction"))
    broker = factory(offsets_topic_num_partitions=1, **GROUP_SETTINGS)
    try:
        with Admin(broker.bootstrap) as admin:
            topic, group = new_topic(admin, 2), group_name()
            for i in range(400):
                admin.alter_group_offsets(group, {TopicPartition(topic, 0): i,
                                                  TopicPartition(topic, 1): 1000 + i})
            offsets_tp = TopicPartition(OFFSETS_TOPIC, 0)
            with Consumer(broker.bootstrap, auto_offset_reset="earliest") as reader:
                reader.assign([offsets_tp])

                def records() -> int:
                    reader.seek_to_beginning()
                    total = 0
                    for _ in range(1000):  # bounded: the partition is finite
                        got = reader.poll(200).get(offsets_tp, [])
                        if not got:
                            return total
                        total += len(got)
                    return total

                wait_for(lambda: records() < 200, "compaction of __consumer_offsets")
        broker.restart()  # the new coordinator replays the compacted partition
        with Admin(broker.bootstrap) as admin:
            assert {tp.partition: om.offset for tp, om in admin.list_group_offsets(
                group).items()} == {0: 399, 1: 1399}
    finally:
        factory.stop_all()


def test_static_member_restart_keeps_assignment_without_rebalance(gbroker: BrokerProcess,
                                                                  admin: Admin) -> None:
    topic, group = new_topic(admin, 4), group_name()

    def static(instance: str) -> Polling:
        c = Consumer(gbroker.bootstrap, group_id=group, group_instance_id=instance, **FAST)
        c.subscribe([topic])
        return Polling(c)

    a, b = static("i-a"), static("i-b")
    try:
        wait_for(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, "2 each")
        before = admin.describe_groups([group])[0]
        owned_a = a.assignment()
        a.stop()  # a static member does not leave on close
        a = static("i-a")
        wait_for(lambda: a.assignment() == owned_a, "the same partitions back")
        after = admin.describe_groups([group])[0]
        assert after.generation_id == before.generation_id
        assert b.assignment() == set().union(*(m.assignment for m in before.members)) - owned_a
    finally:
        a.stop()
        b.stop()


def test_rebalance_resumes_from_the_committed_offsets(gbroker: BrokerProcess,
                                                     admin: Admin) -> None:
    """A member that polled past its committed offsets starts again from them after a
    rebalance (as Kafka's consumer does), though its fetch session already pushed everything:
    the partition it keeps through the rebalance is positioned anew in the session, and the
    uncommitted records come again. Two partitions, so that a member keeps one of them; the
    eager range assignor (a cooperative member keeps its position in a partition it keeps)."""
    topic, group = new_topic(admin, 2), group_name()
    tps = [TopicPartition(topic, p) for p in range(2)]
    produce(gbroker.bootstrap, topic, 2, 200)
    again: set[tuple[int, int]] = set()
    failed: list[BaseException] = []
    stop = threading.Event()
    eager = {"partition_assignment_strategy": ("range",), "enable_auto_commit": False, **FAST}
    with Consumer(gbroker.bootstrap, group_id=group, **eager) as a:
        a.subscribe([topic])
        assert len(consume(a, 200)) == 200
        a.commit(dict.fromkeys(tps, 40))
        generation = a._group.generation_id

        def poll_a() -> None:  # a rejoins from its poll loop while b joins and leaves
            try:
                while not stop.is_set():
                    again.update((tp.partition, r.offset) for tp, rs in a.poll(50).items()
                                 for r in rs)
            except BaseException as e:  # reported by the test, not lost with the thread
                failed.append(e)

        poller = threading.Thread(target=poll_a)
        poller.start()
        try:
            with Consumer(gbroker.bootstrap, group_id=group, **eager) as b:
                b.subscribe([topic])
                wait_for(lambda: b.poll(50) is not None and
                         b._group.generation_id > generation, "b in the group")
            wait_for(lambda: failed or
                     again >= {(p, o) for p in range(2) for o in range(40, 100)},
                     "offsets 40-99 of both partitions consumed again after the rebalances")
        finally:
            stop.set()
            poller.join(WAIT_S)
        assert not poller.is_alive() and not failed, failed
    assert min(o for _, o in again) == 40


def test_member_that_stops_polling_leaves_and_rejoins(gbroker: BrokerProcess,
                                                      admin: Admin) -> None:
    topic, group = new_topic(admin, 2), group_name()
    with Consumer(gbroker.bootstrap, group_id=group, max_poll_interval_ms=500, **FAST) as c:
        c.subscribe([topic])
        wait_for(lambda: c.poll(50) is not None and len(c.assignment()) == 2, "assignment")
        wait_for(lambda: admin.describe_groups([group])[0].state == "Empty",
                 "the idle member to leave")
        wait_for(lambda: c.poll(50) is not None and
                 admin.describe_groups([group])[0].state == "Stable", "a rejoin")


def test_more_partitions_trigger_a_rebalance_and_commit_async_calls_back(
        gbroker: BrokerProcess, admin: Admin) -> None:
    topic = new_topic(admin, 1)
    produce(gbroker.bootstrap, topic, 1, 10)
    with Consumer(gbroker.bootstrap, group_id=group_name(), metadata_max_age_ms=200,
                  enable_auto_commit=False, **FAST) as c:
        c.subscribe([topic])
        consume(c, 10)
        admin.create_partitions({topic: 3})
        wait_for(lambda: c.poll(50) is not None and len(c.assignment()) == 3,
                 "the new partitions")
        calls: list = []
        c.commit_async({TopicPartition(topic, 0): 10},
                       callback=lambda offsets, error: calls.append((offsets, error))
                       ).result(WAIT_S)
        ((offsets, error),) = calls
        assert error is None and offsets[TopicPartition(topic, 0)].offset == 10
        assert c.committed(TopicPartition(topic, 0)).offset == 10


# -- found wanting by a review: cooperative commits, removal, busy members, sticky, assign()

def _offsets_polled(consumer: Consumer, n: int) -> list[tuple[int, int]]:
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
    topic, group = new_topic(admin, 4), group_name()
    produce(gbroker.bootstrap, topic, 4, 100)
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
        assert len(_offsets_polled(a, 100)) == 100
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
    topic, group = new_topic(admin, 1), group_name()
    produce(gbroker.bootstrap, topic, 1, 50)
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
    topic, group = new_topic(admin, 2), group_name()
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
    topic, group = new_topic(admin, 6), group_name()
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
    topic, group = new_topic(admin, 1), group_name()
    tp = TopicPartition(topic, 0)
    produce(gbroker.bootstrap, topic, 1, 20)
    with Consumer(gbroker.bootstrap, group_id=group, enable_auto_commit=False, **FAST) as c:
        c.assign([tp])
        c.commit({tp: 7})
    with Consumer(gbroker.bootstrap, group_id=group, auto_commit_interval_ms=600_000,
                  **FAST) as c:
        c.assign([tp])
        assert c.position(tp) == 7
        assert [o for _, o in _offsets_polled(c, 5)][:1] == [7]
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
    topic, group = new_topic(admin, 2), group_name()
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
