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
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo, MetadataStore, PartitionState, TopicRecord
from logstore.errors import (
    FencedLeaderEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, new_credential
from logstore.tiering.metadata import (
    InvalidRemoteSegmentStateError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
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


def test_create_topics_creates_the_new_ones_and_reports_each_existing_one(
        open_store: OpenStore) -> None:
    """Goal: a batch creates every topic that does not exist yet, with one state per
    partition, and answers TopicAlreadyExists for one that does without failing the others;
    listeners hear of it; it survives a restart. Method: create one topic, then a batch of
    twelve 100-partition topics holding it in the middle (over one ZooKeeper transaction's
    worth, so the ZooKeeper store splits it and redoes the failing part one by one)."""
    store = open_store()
    store.create_topic(_record("bulk-05", 3), _states(3))
    probe = ListenerProbe(store)
    batch = [(_record(f"bulk-{i:02d}", 100), _states(100)) for i in range(12)]
    outcomes = store.create_topics(batch)
    assert [type(o) for o in outcomes] == [type(None)] * 5 + [TopicAlreadyExistsError] + \
        [type(None)] * 6
    probe.wait_until(lambda: probe.calls > 0 and len(store.topics()) == 12, "the batch")
    assert store.topics()["bulk-05"].num_partitions == 3
    for record, states in batch:
        if record.name != "bulk-05":
            assert store.topics()[record.name] == record
            assert store.partition_states(record.name) == states
    store.close()
    again = open_store()
    assert sorted(again.topics()) == [f"bulk-{i:02d}" for i in range(12)]
    assert len(again.partition_states("bulk-11")) == 100


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


# -- remote log segment metadata (tiered storage) ---------------------------------------------


def _segment(record: TopicRecord, segment_id: str = "a" * 32, base: int = 0, end: int = 99,
             state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED,
             partition: int = 0) -> RemoteLogSegmentMetadata:
    tp = TopicIdPartition(record.name, record.topic_id, partition)
    return RemoteLogSegmentMetadata(tp, segment_id, base, end, 1_000, 4096, 0, ((0, base),),
                                    state, 5_000, broker_id=1)


def _advance(segment: RemoteLogSegmentMetadata,
             *states: RemoteLogSegmentState) -> list[RemoteLogSegmentMetadata]:
    return [segment.with_state(s, segment.state_timestamp_ms + i)
            for i, s in enumerate(states, 1)]


def test_remote_segment_entries_are_created_listed_transitioned_and_kept(
        open_store: OpenStore) -> None:
    """Goal: the partition leader's remote segment entries are stored and read back whole.
    Method: write COPY_SEGMENT_STARTED then FINISHED for one segment and STARTED for another at
    the current leader epoch, list them (ordered by base offset), restart the store and list
    again."""
    store = open_store()
    record = _record()
    store.create_topic(record, _states())
    first, second = _segment(record), _segment(record, "b" * 32, 100, 199)
    store.put_remote_log_segment(first, 0)
    (finished,) = _advance(first, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    store.put_remote_log_segment(finished, 0)
    store.put_remote_log_segment(finished, 0)  # a retried write is harmless
    store.put_remote_log_segment(second, 0)
    tp = first.partition
    assert store.remote_log_segments(tp) == [finished, second]
    assert store.remote_log_partitions() == [tp]
    assert store.remote_log_segments(TopicIdPartition("orders", record.topic_id, 1)) == []
    store.close()
    assert open_store().remote_log_segments(tp) == [finished, second]


def test_remote_segment_write_by_a_stale_leader_is_fenced(open_store: OpenStore) -> None:
    """Goal: only the leader of the current leader epoch writes remote segment metadata.
    Method: move the partition to leader epoch 1, then write at epoch 0 (refused), with another
    topic id (refused) and at epoch 1 (accepted)."""
    store = open_store()
    record = _record()
    store.create_topic(record, _states())
    assert store.set_partition_state("orders", 0, PartitionState(1, 1, (1,)))
    segment = _segment(record)
    with pytest.raises(FencedLeaderEpochError, match="orders-0.*epoch 0.*leader epoch is 1"):
        store.put_remote_log_segment(segment, 0)
    impostor = replace(segment, partition=TopicIdPartition("orders", "f" * 32, 0))
    with pytest.raises(FencedLeaderEpochError, match="no longer exists"):
        store.put_remote_log_segment(impostor, 1)
    assert store.remote_log_segments(segment.partition) == []
    store.put_remote_log_segment(segment, 1)
    assert store.remote_log_segments(segment.partition) == [segment]


def test_remote_segment_transitions_outside_the_rules_are_refused(open_store: OpenStore) -> None:
    """Goal: the store applies the state rules atomically with the write. Method: try a first
    state other than COPY_SEGMENT_STARTED, a step backwards and a change of offsets; each is
    refused and the stored entry stays as it was."""
    store = open_store()
    record = _record()
    store.create_topic(record, _states())
    segment = _segment(record)
    with pytest.raises(InvalidRemoteSegmentStateError, match="absent -> COPY_SEGMENT_FINISHED"):
        store.put_remote_log_segment(
            _advance(segment, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)[0], 0)
    store.put_remote_log_segment(segment, 0)
    (finished,) = _advance(segment, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    store.put_remote_log_segment(finished, 0)
    with pytest.raises(InvalidRemoteSegmentStateError, match="FINISHED -> COPY_SEGMENT_STARTED"):
        store.put_remote_log_segment(segment, 0)
    with pytest.raises(InvalidRemoteSegmentStateError, match="description"):
        store.put_remote_log_segment(replace(finished, end_offset=150), 0)
    assert store.remote_log_segments(segment.partition) == [finished]


def test_delete_segment_finished_removes_the_entry(open_store: OpenStore) -> None:
    """Goal: the metadata never grows with deleted segments. Method: take a segment through all
    four states; after DELETE_SEGMENT_FINISHED neither the entry nor its partition is listed,
    and repeating the last write is a no-op."""
    store = open_store()
    record = _record()
    store.create_topic(record, _states())
    segment = _segment(record)
    store.put_remote_log_segment(segment, 0)
    states = _advance(segment, RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                      RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                      RemoteLogSegmentState.DELETE_SEGMENT_FINISHED)
    for step in states:
        store.put_remote_log_segment(step, 0)
    store.put_remote_log_segment(states[-1], 0)
    assert store.remote_log_segments(segment.partition) == []
    assert store.remote_log_partitions() == []


def test_deleted_topics_remote_entries_remain_for_cleanup(open_store: OpenStore) -> None:
    """Goal: deleting a topic leaves its remote entries findable until its remote objects are
    deleted, and a new topic of the same name never sees them. Method: delete a topic with a
    FINISHED entry, recreate the name with a new id, then clean up: the old leader's epoch is
    fenced, the cleanup write (no epoch) goes through, and cleanup of a live id is refused."""
    store = open_store()
    old = _record()
    store.create_topic(old, _states())
    segment = _segment(old)
    store.put_remote_log_segment(segment, 0)
    (finished,) = _advance(segment, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    store.put_remote_log_segment(finished, 0)
    store.delete_topic("orders")
    new = replace(_record(), topic_id="0" * 31 + "1")
    store.create_topic(new, _states())
    assert store.remote_log_partitions() == [segment.partition]
    assert store.remote_log_segments(TopicIdPartition("orders", new.topic_id, 0)) == []
    deleting, deleted = _advance(finished, RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                                 RemoteLogSegmentState.DELETE_SEGMENT_FINISHED)
    with pytest.raises(FencedLeaderEpochError):
        store.put_remote_log_segment(deleting, 0)
    with pytest.raises(FencedLeaderEpochError, match="still exists"):
        store.put_remote_log_segment(_segment(new), None)
    store.put_remote_log_segment(deleting, None)
    store.put_remote_log_segment(deleted, None)
    assert store.remote_log_partitions() == []


# -- security metadata: users' SCRAM credentials and ACL bindings ------------------------------


class _SecurityProbe(ListenerProbe):
    def __init__(self, store: Any) -> None:
        self._cond = threading.Condition()
        self.calls = 0
        store.add_security_listener(self)


def _acl(name: str, principal: str = "User:alice", op: Operation = Operation.READ,
         pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(ResourcePattern(ResourceType.TOPIC, name, pattern),
                      AccessControlEntry(principal, "*", op, Permission.ALLOW))


def test_scram_credentials_are_stored_replaced_deleted_and_survive_a_restart(
        open_store: OpenStore) -> None:
    """Goal: a user's credential per mechanism is kept as its salted keys, replaced by a new
    one, deleted alone, and read back after a restart. Method: both stores, one script."""
    store = open_store()
    probe = _SecurityProbe(store)
    first = new_credential(SCRAM_SHA_256, "one", 4096)
    store.put_scram_credential("alice", first)
    store.put_scram_credential("alice", new_credential(SCRAM_SHA_512, "two", 4096))
    replaced = new_credential(SCRAM_SHA_256, "three", 4096)
    store.put_scram_credential("alice", replaced)
    store.put_scram_credential("a/b,c", first)  # a name with path and separator characters
    assert probe.calls >= 4
    assert store.scram_credentials()["alice"][SCRAM_SHA_256] == replaced
    assert store.delete_scram_credential("alice", SCRAM_SHA_512)
    assert not store.delete_scram_credential("alice", SCRAM_SHA_512)
    assert not store.delete_scram_credential("nobody", SCRAM_SHA_256)
    store.close()
    assert open_store().scram_credentials() == {"alice": {SCRAM_SHA_256: replaced},
                                                "a/b,c": {SCRAM_SHA_256: first}}


def test_acls_are_added_removed_and_seen_by_another_store(open_store: OpenStore) -> None:
    """Goal: bindings of one store reach every other within a second (ZooKeeper: through a
    watch), and removing one leaves the others of its resource. Method: two stores of one
    cluster (the embedded store: two opens of one file, the second reopened)."""
    writer = open_store(1)
    bindings = [_acl("orders"), _acl("orders", "User:bob"), _acl("ord", pattern=PatternType.PREFIXED),
                _acl("*", op=Operation.DESCRIBE)]
    writer.add_acls(bindings)
    writer.remove_acls([bindings[1]])
    expected = frozenset(bindings) - {bindings[1]}
    assert writer.acls() == expected
    if isinstance(writer, LocalMetadataStore):
        writer.close()
        assert open_store(1).acls() == expected
        return
    reader = open_store(2)
    probe = _SecurityProbe(reader)
    writer.add_acls([_acl("late")])
    probe.wait_until(lambda: reader.acls() == expected | {_acl("late")}, "the new binding",
                     timeout_s=1.0)


def test_the_embedded_store_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Goal: the embedded store's file, which holds every SCRAM user's salted keys, is not
    readable by other users of the machine (cluster mode guards them with znode ACLs), even
    when a stale temporary file was left with a wider mode. Method: a local store with a
    user, the file's mode; again over a .tmp made 0644."""
    path = tmp_path / METADATA_FILE
    path.with_suffix(".tmp").touch(mode=0o644)
    store = LocalMetadataStore(path, 1)
    store.put_scram_credential("alice", new_credential(SCRAM_SHA_256, "pencil-Zeta-93"))
    assert path.stat().st_mode & 0o777 == 0o600
