"""What only the ZooKeeper store does: ephemeral registration that follows the session,
controller election and fencing across brokers, chroot creation, and seeing other brokers'
writes through watches. A real ZooKeeper; each test has its own chroot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from logstore.controller import zk_paths as zp
from logstore.controller.store import BrokerInfo, PartitionState, TopicRecord
from logstore.controller.zookeeper import KazooMetadataStore
from logstore.errors import ConfigError
from tests.zookeeper import ListenerProbe, ZooKeeperServer, expire_session, zk_client

SESSION_TIMEOUT_MS = 4000
OpenStore = Callable[..., KazooMetadataStore]


@pytest.fixture
def open_store(zk_connect: str) -> Iterator[OpenStore]:
    """``open_store(broker_id)``: a started store in this test's chroot; closed at teardown."""
    opened: list[KazooMetadataStore] = []

    def open_(broker_id: int, register: bool = True,
              session_timeout_ms: int = SESSION_TIMEOUT_MS) -> KazooMetadataStore:
        store = KazooMetadataStore(zk_connect, broker_id, session_timeout_ms=session_timeout_ms)
        store.start()
        opened.append(store)
        if register:
            store.register_broker(BrokerInfo(broker_id, "127.0.0.1", 9200 + broker_id))
        return store

    yield open_
    for store in opened:
        store.close()


def _session(store: KazooMetadataStore) -> int:
    assert store.client_id is not None
    return store.client_id[0]


def test_broker_znode_disappears_when_its_session_closes(open_store: OpenStore) -> None:
    """Another broker sees a broker leave as soon as its session is closed (a clean stop)."""
    leaving, observer = open_store(1), open_store(2)
    probe = ListenerProbe(observer)
    probe.wait_until(lambda: set(observer.brokers()) == {1, 2}, "both brokers registered")
    leaving.close()
    probe.wait_until(lambda: set(observer.brokers()) == {2}, "broker 1 to disappear")


def test_broker_registers_again_after_its_session_expires(
        open_store: OpenStore, zookeeper: ZooKeeperServer, zk_connect: str) -> None:
    """When ZooKeeper expires a broker's session (its ephemeral znode goes with it), the store
    opens a new session, registers again with the same data and tells its listeners."""
    store = open_store(1)
    probe = ListenerProbe(store)
    old_session = _session(store)
    assert store.client_id is not None
    expire_session(zookeeper.connect, store.client_id)

    def registered_in_new_session() -> bool:
        with zk_client(zk_connect) as zk:
            node = zk.exists(zp.broker_path(1))
        return node is not None and node.ephemeralOwner not in (0, old_session)

    probe.wait_until(registered_in_new_session, "registration in a new session")
    assert _session(store) != old_session
    assert store.brokers()[1] == BrokerInfo(1, "127.0.0.1", 9201)


def test_exactly_one_racing_store_wins_and_the_next_takes_over(open_store: OpenStore) -> None:
    """Three brokers stand for controller at once: exactly one wins. When its session closes
    another one takes over at a higher epoch, and a state stamped with the old epoch is
    refused."""
    stores = {i: open_store(i) for i in (1, 2, 3)}
    stores[1].create_topic(TopicRecord("t", {0: (1, 2, 3)}), {0: PartitionState(1, 0, (1, 2, 3))})
    elected: list[tuple[int, int]] = []
    barrier = threading.Barrier(3)

    def stand(i: int) -> None:
        barrier.wait(10)
        stores[i].elect_controller(lambda epoch: elected.append((i, epoch)))

    threads = [threading.Thread(target=stand, args=(i,)) for i in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(elected) == 1, elected
    winner, first_epoch = elected[0]
    assert [i for i, s in stores.items() if s.is_controller()] == [winner]
    for store in stores.values():
        ListenerProbe(store).wait_until(lambda s=store: s.controller_id() == winner,
                                        "every broker to see the winner")

    rest = {i: s for i, s in stores.items() if i != winner}
    probe = ListenerProbe(next(iter(rest.values())))
    stores[winner].close()
    probe.wait_until(lambda: len(elected) == 2, "a new controller")
    successor, second_epoch = elected[1]
    assert successor in rest and second_epoch > first_epoch
    assert [i for i, s in rest.items() if s.is_controller()] == [successor]
    stale = PartitionState(successor, 1, (successor,), first_epoch)
    assert not rest[successor].set_partition_state("t", 0, stale)
    fresh = PartitionState(successor, 1, (successor,), second_epoch)
    assert rest[successor].set_partition_state("t", 0, fresh, expected_epoch=0)


def test_controller_whose_session_expired_is_fenced(
        open_store: OpenStore, zookeeper: ZooKeeperServer) -> None:
    """A controller whose session expires resigns; whoever is elected next has a higher epoch,
    and the old controller's writes with its old epoch are refused."""
    old, other = open_store(1), open_store(2)
    old.create_topic(TopicRecord("t", {0: (1, 2)}), {0: PartitionState(1, 0, (1, 2))})
    events: list[str] = []
    old.elect_controller(lambda e: events.append(f"elected {e}"),
                         lambda: events.append("resigned"))
    other.elect_controller(lambda e: events.append(f"other elected {e}"))
    first_epoch = old.controller_epoch
    assert events == [f"elected {first_epoch}"]
    assert old.client_id is not None
    expire_session(zookeeper.connect, old.client_id)
    probe = ListenerProbe(other)
    probe.wait_until(lambda: "resigned" in events and len(events) >= 3, "a new election")
    current = max(old.controller_epoch, other.controller_epoch)
    assert current > first_epoch
    assert old.is_controller() != other.is_controller()
    stale = PartitionState(1, 1, (1, 2), first_epoch)
    assert not old.set_partition_state("t", 0, stale, expected_epoch=0)
    assert old.partition_states("t")[0].leader_epoch == 0


def test_a_second_live_broker_with_the_same_id_is_refused(open_store: OpenStore) -> None:
    """Registration waits for a znode left by an earlier session of the same broker id, and
    fails with a ConfigError naming the id if that session stays alive."""
    open_store(1)
    duplicate = open_store(1, register=False, session_timeout_ms=1000)
    with pytest.raises(ConfigError, match="broker_id 1 is already registered"):
        duplicate.register_broker(BrokerInfo(1, "127.0.0.1", 9999))


def test_registration_waits_for_the_previous_session_to_end(open_store: OpenStore) -> None:
    """A restarted broker whose old session still holds its znode registers once the old
    session ends (here: closed a moment after the new one starts waiting)."""
    previous = open_store(1)
    restarted = open_store(1, register=False)
    threading.Timer(0.5, previous.close).start()
    restarted.register_broker(BrokerInfo(1, "127.0.0.1", 9999))
    assert restarted.brokers()[1].port == 9999


def test_missing_chroot_is_created(zookeeper: ZooKeeperServer) -> None:
    """A chroot several levels deep that does not exist yet is created at start."""
    import uuid

    chroot = f"/deep/er/logstore-{uuid.uuid4().hex[:8]}"
    store = KazooMetadataStore(zookeeper.connect + chroot, 1, SESSION_TIMEOUT_MS)
    store.start()
    try:
        store.register_broker(BrokerInfo(1, "127.0.0.1", 9201))
        with zk_client(zookeeper.connect) as zk:
            assert zk.exists(f"{chroot}/brokers/ids/1") is not None
            assert zk.exists(f"{chroot}/controller_epoch") is not None
    finally:
        store.close()


def test_other_brokers_writes_are_seen_through_watches(open_store: OpenStore) -> None:
    """Topic creation, config changes, state changes and deletion by one broker reach another
    broker's cache and listeners."""
    writer, reader = open_store(1), open_store(2)
    probe = ListenerProbe(reader)
    reader.topics()  # fills the cache, so only a watch can make the change visible
    writer.create_topic(TopicRecord("t", {0: (1,)}), {0: PartitionState(1, 0, (1,))})
    probe.wait_until(lambda: "t" in reader.topics(), "the new topic")
    assert reader.partition_states("t") == {0: PartitionState(1, 0, (1,))}
    writer.update_topic(TopicRecord("t", {0: (1,)}, {"retention_ms": 7}), {})
    probe.wait_until(lambda: reader.topics()["t"].config == {"retention_ms": 7}, "the config")
    writer.set_partition_state("t", 0, PartitionState(1, 1, (1,)))
    probe.wait_until(lambda: reader.partition_states("t")[0].leader_epoch == 1, "the state")
    writer.delete_topic("t")
    probe.wait_until(lambda: reader.topics() == {}, "the deletion")


def test_producer_id_blocks_from_several_brokers_never_overlap(open_store: OpenStore) -> None:
    """Brokers racing for producer-id blocks each get disjoint blocks (compare-and-set)."""
    stores = [open_store(i) for i in (1, 2, 3)]
    starts: list[int] = []
    lock = threading.Lock()

    def claim(store: KazooMetadataStore) -> None:
        for _ in range(20):
            start = store.next_producer_id_block(100)
            with lock:
                starts.append(start)

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(starts) == list(range(0, 60 * 100, 100))
