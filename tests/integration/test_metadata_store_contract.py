"""The MetadataStore contract: the same tests against the embedded file store and the
ZooKeeper store (a real ZooKeeper, a chroot per test).

Each test takes ``open_store(broker_id=1)``, which starts a store on this test's backing file or
chroot; opening another one after ``close()`` is a restart that must find the same metadata.
Listeners are waited on with a bounded ``ListenerProbe``: the local store calls them at once,
the ZooKeeper store also after watches fire.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo, MetadataStore, PartitionState, TopicRecord
from logstore.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from tests.zookeeper import ListenerProbe

SESSION_TIMEOUT_MS = 6000
OpenStore = Callable[..., Any]


@pytest.fixture(params=["local", "zookeeper"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    if request.param == "local":
        def make(broker_id: int) -> MetadataStore:
            return LocalMetadataStore(tmp_path / METADATA_FILE, broker_id)
    else:
        from logstore.controller.zookeeper import KazooMetadataStore

        connect = request.getfixturevalue("zk_connect")

        def make(broker_id: int) -> MetadataStore:
            return KazooMetadataStore(connect, broker_id, session_timeout_ms=SESSION_TIMEOUT_MS)
    opened: list[MetadataStore] = []

    def open_(broker_id: int = 1) -> MetadataStore:
        store = make(broker_id)
        store.start()
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def _record(name: str = "orders", partitions: int = 2, **config: Any) -> TopicRecord:
    return TopicRecord(name, {p: (1,) for p in range(partitions)}, dict(config))


def _states(partitions: int = 2, controller_epoch: int = 0) -> dict[int, PartitionState]:
    return {p: PartitionState(1, 0, (1,), controller_epoch) for p in range(partitions)}


def test_registered_broker_is_listed(open_store: OpenStore) -> None:
    """register_broker makes the broker, with its listener and rack, visible in brokers()."""
    store = open_store()
    info = BrokerInfo(1, "127.0.0.1", 9201, "a")
    store.register_broker(info)
    assert store.brokers() == {1: info}


def test_elected_store_is_controller_and_each_election_takes_a_new_epoch(
        open_store: OpenStore) -> None:
    """elect_controller calls back with an epoch above every earlier one, also after a
    restart, and the store then reports itself as controller."""
    store = open_store()
    assert not store.is_controller() and store.controller_epoch == 0
    won: list[int] = []
    store.elect_controller(won.append)
    assert len(won) == 1 and won[0] >= 1
    assert store.is_controller() and store.controller_epoch == won[0]
    assert store.controller_id() == 1
    store.close()
    again = open_store()
    again.elect_controller(won.append)
    assert won[1] > won[0] and again.controller_epoch == won[1]


def test_created_topic_is_listed_with_its_partition_states(open_store: OpenStore) -> None:
    """create_topic stores the replica assignment, config, value schema, internal flag and one
    state per partition; unknown topics have no states."""
    store = open_store()
    schema = pa.schema([("amount", pa.int64()), ("note", pa.string())])
    record = TopicRecord("orders", {0: (1, 2), 1: (2, 1)}, {"retention_ms": 1000}, schema)
    states = {0: PartitionState(1, 0, (1, 2)), 1: PartitionState(2, 0, (2,))}
    store.create_topic(record, states)
    assert store.topics() == {"orders": record}
    assert store.topics()["orders"].value_schema.equals(schema)
    assert store.partition_states("orders") == states
    assert store.partition_states("missing") == {}


def test_creating_an_existing_topic_fails_and_keeps_the_first(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(_record(), _states())
    with pytest.raises(TopicAlreadyExistsError):
        store.create_topic(_record(partitions=5), _states(5))
    assert store.topics()["orders"].num_partitions == 2
    assert len(store.partition_states("orders")) == 2


def test_update_topic_adds_partitions_and_replaces_config(open_store: OpenStore) -> None:
    """update_topic replaces the record and adds the new partitions' states; the states of the
    partitions it does not name stay as they were."""
    store = open_store()
    store.create_topic(_record(), _states())
    assert store.set_partition_state("orders", 0, PartitionState(1, 3, (1,)))
    grown = _record(partitions=4, retention_ms=5)
    added = {2: PartitionState(1, 0, (1,)), 3: PartitionState(1, 0, (1,))}
    store.update_topic(grown, added)
    assert store.topics()["orders"] == grown
    assert store.partition_states("orders") == {0: PartitionState(1, 3, (1,)),
                                                1: PartitionState(1, 0, (1,)), **added}


def test_unknown_topic_or_partition_is_refused(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(_record(), _states())
    with pytest.raises(UnknownTopicOrPartitionError):
        store.update_topic(_record("missing"), {})
    with pytest.raises(UnknownTopicOrPartitionError):
        store.delete_topic("missing")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.set_partition_state("missing", 0, PartitionState(1, 1, (1,)))
    with pytest.raises(UnknownTopicOrPartitionError):
        store.set_partition_state("orders", 7, PartitionState(1, 1, (1,)))


def test_deleted_topic_is_gone_and_its_name_can_be_used_again(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(_record(), _states())
    store.delete_topic("orders")
    assert store.topics() == {} and store.partition_states("orders") == {}
    store.create_topic(_record(partitions=1), _states(1))
    assert store.topics()["orders"].num_partitions == 1
    assert store.partition_states("orders") == _states(1)


def test_set_partition_state_is_conditional_on_the_leader_epoch(open_store: OpenStore) -> None:
    """With expected_epoch the write happens only if the stored leader epoch matches; without
    it, it always happens."""
    store = open_store()
    store.create_topic(_record(), _states())
    assert store.set_partition_state("orders", 0, PartitionState(1, 1, (1,)), expected_epoch=0)
    assert not store.set_partition_state("orders", 0, PartitionState(1, 9, (1,)),
                                         expected_epoch=0)
    assert store.partition_states("orders")[0] == PartitionState(1, 1, (1,))
    assert store.set_partition_state("orders", 0, PartitionState(1, 5, (1,)))
    assert store.partition_states("orders")[0].leader_epoch == 5


def test_set_partition_state_refuses_a_stale_controller_epoch(open_store: OpenStore) -> None:
    """A state stamped with an older controller epoch than the current one is refused, so a
    replaced controller cannot overwrite its successor's decisions."""
    store = open_store()
    store.create_topic(_record(), _states())
    store.elect_controller(lambda epoch: None)
    epoch = store.controller_epoch
    assert not store.set_partition_state("orders", 0, PartitionState(1, 1, (1,), epoch - 1))
    assert store.partition_states("orders")[0].leader_epoch == 0
    assert store.set_partition_state("orders", 0, PartitionState(1, 1, (1,), epoch))


def test_producer_id_blocks_never_overlap(open_store: OpenStore) -> None:
    """Blocks handed out one after another, from racing threads and after a restart are all
    disjoint."""
    store = open_store()
    blocks = [(store.next_producer_id_block(size), size) for size in (1, 10, 1000)]
    lock = threading.Lock()

    def claim() -> None:
        for _ in range(10):
            start = store.next_producer_id_block(7)
            with lock:
                blocks.append((start, 7))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    store.close()
    restarted = open_store()
    blocks.append((restarted.next_producer_id_block(5), 5))
    ids = [i for start, size in blocks for i in range(start, start + size)]
    assert len(blocks) == 64 and len(ids) == len(set(ids))
    assert blocks[-1][0] > max(start for start, _ in blocks[:-1])


def test_listeners_hear_of_every_change(open_store: OpenStore) -> None:
    """A listener is called after each write, when the change is already readable."""
    store = open_store()
    probe = ListenerProbe(store)
    steps: list[tuple[Callable[[], object], Callable[[], bool]]] = [
        (lambda: store.create_topic(_record(), _states()), lambda: "orders" in store.topics()),
        (lambda: store.update_topic(_record(partitions=3), {2: PartitionState(1, 0, (1,))}),
         lambda: len(store.partition_states("orders")) == 3),
        (lambda: store.set_partition_state("orders", 1, PartitionState(1, 4, (1,))),
         lambda: store.partition_states("orders")[1].leader_epoch == 4),
        (lambda: store.delete_topic("orders"), lambda: store.topics() == {}),
    ]
    for write, visible in steps:
        before = probe.calls
        write()
        probe.wait_until(lambda before=before: probe.calls > before, "a listener call")
        assert visible()


def test_metadata_survives_a_restart(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(_record(), _states())
    store.set_partition_state("orders", 1, PartitionState(1, 2, (1,)))
    store.close()
    restarted = open_store()
    assert restarted.topics() == {"orders": _record()}
    assert restarted.partition_states("orders")[1] == PartitionState(1, 2, (1,))


def test_random_operations_match_a_model(open_store: OpenStore, seed: int) -> None:
    """A seeded random run of creates, updates, deletes and conditional state writes gives the
    same answers and the same metadata as a plain dict model, for both stores
    (LOGSTORE_TEST_SEED replays a run)."""
    rng = random.Random(seed)
    store = open_store()
    model: dict[str, dict[int, PartitionState]] = {}
    for step in range(60):
        op, name = rng.choice(["create", "update", "delete", "state"]), rng.choice("abc")
        context = f"seed {seed}, step {step}: {op} {name}"
        _random_step(store, model, rng, op, name, context)
        assert sorted(store.topics()) == sorted(model), context
        for topic, states in model.items():
            assert store.partition_states(topic) == states, context


def _random_step(store: MetadataStore, model: dict[str, dict[int, PartitionState]],
                 rng: random.Random, op: str, name: str, context: str) -> None:
    exists = name in model
    if op == "create":
        n = rng.randint(1, 4)
        with pytest.raises(TopicAlreadyExistsError) if exists else nullcontext():
            store.create_topic(_record(name, n), _states(n))
            model[name] = _states(n)
    elif op == "update" or op == "delete":
        with pytest.raises(UnknownTopicOrPartitionError) if not exists else nullcontext():
            if op == "delete":
                store.delete_topic(name)
                del model[name]
            else:
                have = len(model.get(name, {}))
                n = have + rng.randint(0, 2)
                new = {p: PartitionState(1, 0, (1,)) for p in range(have, n)}
                store.update_topic(_record(name, n), new)
                model[name].update(new)
    elif exists:
        p = rng.randrange(len(model[name]))
        current = model[name][p].leader_epoch
        expected = rng.choice([current, current + 1, None])
        state = PartitionState(1, current + rng.randint(1, 3), (1,))
        written = store.set_partition_state(name, p, state, expected_epoch=expected)
        assert written == (expected in (None, current)), context
        if written:
            model[name][p] = state
