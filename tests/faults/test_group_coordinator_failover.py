"""Consumer groups survive the loss of their coordinator's broker (issue 5 §7, third bullet).

Goal: on the three-broker cluster (real broker processes, real ZooKeeper), ``kill -9`` of the
broker coordinating a group leaves the group's committed offsets intact on the new coordinator
(the new leader of the group's ``__consumer_offsets`` partition replays it), and the group's
consumers, running through the failover, resume from those offsets: every record is consumed
and nothing committed is skipped. Method: an RF=3 topic and an RF=3 ``__consumer_offsets``
(few partitions, for speed); two consumers of one group, each on its own thread, commit
synchronously after every poll. Once the first half of the records is consumed and committed,
the coordinator's broker (the leader of the group's offsets partition, whose ISR is complete)
is killed with SIGKILL; the offsets are read back from the new coordinator, the second half is
produced, and the consumers must consume it all from the committed offsets on. The partition
the records go to is drawn at random; the seed is in every failure message.
"""

from __future__ import annotations

import random
import signal
import threading
import uuid
from collections import defaultdict

from logstore import Consumer
from logstore.errors import (
    ApiError,
    IllegalGenerationError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from logstore.groups.offsets import partition_for
from logstore.messages.groups import FindCoordinatorRequest
from logstore.model import OFFSETS_TOPIC
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, bounded_producer
from tests.faults.cluster import FAILOVER_ERRORS, SESSION_TIMEOUT_MS, Cluster
from tests.helpers import WAIT_S, wait_for

PARTITIONS = 4
OFFSETS_PARTITIONS = 3
RECORDS_PER_HALF = 200
MEMBERS = 2
GROUP_BROKER_SETTINGS = {"offsets_topic_num_partitions": OFFSETS_PARTITIONS,
                         "offsets_topic_replication_factor": 3,
                         "group_initial_rebalance_delay_ms": 0,
                         "group_min_session_timeout_ms": 500}
COMMIT_FAILURES = (UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError)


class Member(threading.Thread):
    """One consumer of the group: polls, records what it got, commits after every poll.

    ``consumed`` holds (returned after the kill, partition, offset, value); ``errors`` every exception a
    poll or commit raised."""

    def __init__(self, cluster: Cluster, group: str, topic: str, killed: threading.Event
                 ) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest",
                                 enable_auto_commit=False, session_timeout_ms=3000,
                                 heartbeat_interval_ms=100)
        self.topic = topic
        self.killed = killed
        self.stop = threading.Event()
        self.consumed: list[tuple[bool, int, int, bytes]] = []
        self.errors: list[Exception] = []

    def run(self) -> None:
        self.consumer.subscribe([self.topic])
        while not self.stop.is_set():
            try:
                polled = self.consumer.poll(timeout_ms=200)
                # after the poll: one that began before the kill may return records after it
                after_kill = self.killed.is_set()
                for tp, records in polled.items():
                    self.consumed += [(after_kill, tp.partition, r.offset, r.value)
                                      for r in records]
                if polled:
                    self.consumer.commit()
            except (ApiError, OSError) as e:  # reported, and the loop goes on like an app's
                self.errors.append(e)
                self.stop.wait(0.1)


def committed_offsets(cluster: Cluster, group: str, topic: str) -> dict[int, int]:
    with cluster.admin() as admin:
        return {tp.partition: om.offset for tp, om in admin.list_group_offsets(group).items()
                if tp.topic == topic}


def coordinator_of(cluster: Cluster, group: str) -> int | None:
    conn = BrokerConnection(cluster.live_bootstrap()[0], timeout_s=5)
    try:
        found = conn.call(FindCoordinatorRequest(group_id=group))
    finally:
        conn.close()
    return found.node_id if found.error_code == 0 else None


def produce(cluster: Cluster, topic: str, rng: random.Random, first: int, count: int,
            ends: dict[int, int]) -> None:
    """``count`` records numbered from ``first``, each to a random partition; ``ends`` counts
    the records of each partition."""
    with bounded_producer(cluster.live_bootstrap(), acks="all", delivery_timeout_ms=60_000,
                          linger_ms=1) as producer:
        futures = []
        for n in range(first, first + count):
            p = rng.randrange(PARTITIONS)
            futures.append(producer.send(topic, value=b"%d" % n, partition=p))
            ends[p] += 1
        producer.flush(60)
        for f in futures:
            f.result(0)


def test_group_resumes_on_new_coordinator_after_coordinator_kill(
        broker_factory: BrokerFactory, zk_connect: str, seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(broker_factory, zk_connect, **GROUP_BROKER_SETTINGS)
    topic = cluster.create_topic(partitions=PARTITIONS, min_insync_replicas=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ends: dict[int, int] = defaultdict(int)
    produce(cluster, topic, rng, 0, RECORDS_PER_HALF, ends)

    killed = threading.Event()
    members = [Member(cluster, group, topic, killed) for _ in range(MEMBERS)]
    for m in members:
        m.start()
    try:
        first_half = {p: ends[p] for p in range(PARTITIONS) if ends[p]}
        wait_for(lambda: {p: o for p, o in committed_offsets(cluster, group, topic).items()
                          if o} == first_half,
                 f"the first half committed (seed {seed})", tolerate=FAILOVER_ERRORS)
        committed_before = committed_offsets(cluster, group, topic)

        offsets_partition = partition_for(group, OFFSETS_PARTITIONS)
        cluster.wait_for_isr(OFFSETS_TOPIC, offsets_partition, 3)
        victim = int(wait_for(lambda: coordinator_of(cluster, group), "the coordinator",
                              tolerate=FAILOVER_ERRORS))
        assert cluster.describe(OFFSETS_TOPIC, offsets_partition).leader == victim
        killed.set()
        cluster.brokers[victim].kill(signal.SIGKILL)

        failover_s = SESSION_TIMEOUT_MS / 1000 + WAIT_S
        new_leader = cluster.wait_for_new_leader(OFFSETS_TOPIC, victim, offsets_partition,
                                                 timeout_s=failover_s)
        assert wait_for(lambda: (c := coordinator_of(cluster, group)) not in (None, victim)
                        and c, "a new coordinator", failover_s, FAILOVER_ERRORS) == new_leader, \
            f"seed {seed}"
        after_kill = wait_for(lambda: committed_offsets(cluster, group, topic),
                              "the committed offsets from the new coordinator",
                              tolerate=FAILOVER_ERRORS)
        assert after_kill == committed_before, f"seed {seed}"

        for p in range(PARTITIONS):
            wait_for(lambda p=p: cluster.describe(topic, p).leader not in (-1, victim),
                     f"{topic}-{p} led by a live broker", failover_s, FAILOVER_ERRORS)
        produce(cluster, topic, rng, RECORDS_PER_HALF, RECORDS_PER_HALF, ends)
        final = {p: ends[p] for p in range(PARTITIONS) if ends[p]}
        try:
            wait_for(lambda: {p: o for p, o in committed_offsets(cluster, group, topic).items()
                              if o} == final, "the second half committed", failover_s,
                     FAILOVER_ERRORS)
        except AssertionError as e:
            errors = [repr(err) for m in members for err in m.errors]
            raise AssertionError(f"{e}; seed {seed}; member errors: {errors[-10:]}") from e
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(WAIT_S)
        for m in members:
            m.consumer.close()

    # The only errors the application sees are commits refused because the new coordinator
    # does not know the member yet (it rejoins); NOT_COORDINATOR and the coordinator being
    # unavailable or loading are retried inside the client.
    errors = [e for m in members for e in m.errors]
    assert all(isinstance(e, COMMIT_FAILURES) for e in errors), f"seed {seed}: {errors!r}"
    consumed = [c for m in members for c in m.consumed]
    values = {v for _, _, _, v in consumed}
    assert values == {b"%d" % n for n in range(2 * RECORDS_PER_HALF)}, f"seed {seed}"
    for p, end in final.items():
        if end == committed_before.get(p, 0):
            continue  # no record of the second half went to this partition
        resumed = sorted(o for after, q, o, _ in consumed if after and q == p)
        start = committed_before.get(p, 0)
        # nothing committed is skipped: the group goes on from exactly the committed offset
        assert resumed and resumed[0] == start, f"seed {seed}: partition {p} resumed at " \
            f"{resumed[:1]}, committed {start}"
        assert set(resumed) >= set(range(start, end)), f"seed {seed}: partition {p}"
