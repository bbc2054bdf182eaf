"""The offsets of a deleted topic, told from those of a topic recreated under its name by the
topic id recorded with each commit.

Goal: a topic's deletion (name -> the deleted incarnation's id) tombstones the committed
offsets recorded for that id or for none (records from before ids were recorded), never one
recorded under another id (a commit for the recreated topic), and drops what open
transactions staged likewise, so a later COMMIT marker does not bring them back; a replay of
the log rebuilds exactly the running state (offsets, their ids and positions, what is staged,
the index by topic); offset fetch hides an offset recorded under another id than the topic's
current one (a coordinator that never wrote the tombstones) and shows it when the topic is
unknown. Method: the pure shard (``groups/``), its handlers' results run against a list of
logged batches by a small harness (appended, then applied, as the runtime does), and a replay
of that list; hypothesis over interleavings of commits, transactional commits, markers and
deletions; then the service (``GroupCoordinatorService``) on the in-memory log, for the
runtime's part: the deletion runs on a thread of its own, on every led partition.
"""

from __future__ import annotations

import threading
from typing import TypeVar

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.lag import GroupLag
from logstore.clock import FakeClock
from logstore.coordinator import CoordinatorResult, LoggedBatch, encode_rows
from logstore.errors import ErrorCode
from logstore.groups import commits, membership, txn_offsets
from logstore.groups.coordinator import (
    GroupConfig,
    GroupCoordinatorShard,
    GroupShardLoader,
    tick,
)
from logstore.groups.deleted_topics import delete_topics_offsets
from logstore.groups.offsets import StoredOffset, encode_batch, offset_key, offset_value
from logstore.messages.groups import (
    GroupProtocol,
    JoinGroupRequest,
    OffsetCommitEntry,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from logstore.messages.transactions import TxnOffsetCommitEntry, TxnOffsetCommitRequest
from logstore.model import TopicPartition
from logstore.records import ControlType
from tests.unit.group_helpers import WAIT_S, MemoryOffsetsLog, group_on

R = TypeVar("R")
OLD, NEW = "id-old", "id-new"
T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
PID = 7
NOW = 1_000
CONFIG = GroupConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)


class Harness:
    """One offsets partition: the shard, and its log as a list of batches. A handler's
    result is appended, then applied (with its position), as the runtime does."""

    def __init__(self, ids: dict[str, str] | None = None) -> None:
        self.ids = {} if ids is None else ids  # topic -> current id (``topic_id_of``)
        self.logged: list[LoggedBatch] = []
        self.shard = self.replay()

    def replay(self) -> GroupCoordinatorShard:
        return GroupShardLoader(CONFIG, self.ids.get).load(0, 0, list(self.logged), NOW)

    def run(self, result: CoordinatorResult[R]) -> R:
        if not result.records:
            result.apply()
            return result.response
        offset = len(self.logged)
        batch = result.records[0] if len(result.records) == 1 else \
            pa.concat_batches(result.records)
        producer = result.producer
        self.logged.append(LoggedBatch(batch, -1 if producer is None else producer.producer_id,
                                       producer is not None, offset=offset))
        if result.apply_at is not None:
            result.apply_at(offset)
        else:
            result.apply()
        return result.response

    def commit(self, offsets: dict[TopicPartition, int], topic_id: str | None,
               group: str = "g") -> None:
        """An admin's commit (the group has no members), recorded for ``topic_id`` (None:
        a client that sends none)."""
        response = self.run(commits.offset_commit(self.shard, OffsetCommitRequest(
            group_id=group, offsets=[OffsetCommitEntry(
                topic=tp.topic, partition=tp.partition, offset=o, topic_id=topic_id)
                for tp, o in offsets.items()]), NOW))
        assert not any(e.error_code for e in response.offsets), response

    def txn_commit(self, offsets: dict[TopicPartition, int], topic_id: str | None,
                   group: str = "g") -> None:
        response = self.run(txn_offsets.txn_offset_commit(self.shard, TxnOffsetCommitRequest(
            transactional_id="tx", group_id=group, producer_id=PID, producer_epoch=0,
            offsets=[TxnOffsetCommitEntry(topic=tp.topic, partition=tp.partition, offset=o,
                                          topic_id=topic_id)
                     for tp, o in offsets.items()]), NOW))
        assert not any(e.error_code for e in response.results), response

    def marker(self, commit: bool) -> None:
        """The producer's marker, as a partition leader appends it, then its completion."""
        offset = len(self.logged)
        self.logged.append(LoggedBatch(encode_rows([], 0), PID, True,
                                       ControlType.COMMIT if commit else ControlType.ABORT,
                                       offset))
        self.run(txn_offsets.complete_txn(self.shard, PID, commit, offset, NOW))

    def delete(self, topic: str, topic_id: str) -> int:
        return self.run(delete_topics_offsets(self.shard, {topic: topic_id}, NOW))

    def fetch(self, group: str = "g") -> dict[TopicPartition, int]:
        response = commits.offset_fetch(self.shard, OffsetFetchRequest(group_id=group))
        return {TopicPartition(e.topic, e.partition): e.offset for e in response.offsets}

    def tombstoned(self) -> set[tuple[str, str, int]]:
        """(group, topic, partition) of every offset tombstone in the log."""
        keys = [orjson.loads(k) for b in self.logged if b.marker is None
                for k, v in zip(b.records.column("key").to_pylist(),
                                b.records.column("value").to_pylist(), strict=True)
                if v is None]
        return {(k[1], k[2], k[3]) for k in keys if k[0] == "offset"}


def state(shard: GroupCoordinatorShard) -> tuple[object, ...]:
    """Everything a replay must rebuild (the index included)."""
    c = shard.committed
    return c.offsets, c.positions, c.pending, c.by_topic, set(shard.groups)


def index_of(shard: GroupCoordinatorShard) -> dict[str, dict[str, set[int]]]:
    """The index by topic as the committed offsets imply it."""
    index: dict[str, dict[str, set[int]]] = {}
    for group, by_tp in shard.offsets.items():
        for tp in by_tp:
            index.setdefault(tp.topic, {}).setdefault(group, set()).add(tp.partition)
    return index


# -- the shard -------------------------------------------------------------------------------


def test_a_deletion_tombstones_only_the_offsets_committed_for_the_deleted_id() -> None:
    """Goal: the deletion of t (OLD) tombstones the offsets recorded for OLD, in every group,
    and nothing of another topic or of t recorded for NEW. Method: g commits t-0 and t-1 for
    OLD and u-0; h commits t-0 for NEW; t (OLD) is deleted: only g's t offsets go, and the
    log holds exactly their tombstones."""
    h = Harness()
    h.commit({T0: 5, T1: 6}, OLD)
    h.commit({U0: 7}, "id-u")
    h.commit({T0: 8}, NEW, group="h")
    assert h.delete("t", OLD) == 2
    assert h.fetch() == {U0: 7}
    assert h.fetch("h") == {T0: 8}
    assert h.tombstoned() == {("g", "t", 0), ("g", "t", 1)}
    assert state(h.replay()) == state(h.shard)


def test_a_commit_under_the_new_id_survives_the_late_deletion_of_the_old_id() -> None:
    """Goal: a group's first commit on the recreated topic is never tombstoned by the
    deletion of the old one, however late that deletion comes. Method: g commits t-0 for
    OLD, then (the topic recreated) t-0 and t-1 for NEW; the deletion of OLD arrives only
    now: it tombstones nothing, and both offsets stay, live and replayed."""
    h = Harness()
    h.commit({T0: 5}, OLD)
    h.commit({T0: 1, T1: 2}, NEW)
    assert h.delete("t", OLD) == 0
    assert h.tombstoned() == set()
    assert h.fetch() == {T0: 1, T1: 2}
    assert h.replay().offsets == h.shard.offsets


def test_offsets_recorded_without_an_id_are_tombstoned() -> None:
    """Goal: records from before ids were recorded (no "topic_id" in the value) stay
    readable and count as the deleted topic's. Method: an old-format record is in the log
    (offset_value of a plain offset, no id) and a commit whose id neither the client nor
    the coordinator knows; the replayed shard reads both; the deletion of t (any id)
    tombstones both, and a replay agrees."""
    h = Harness()
    h.logged.append(LoggedBatch(encode_batch([(offset_key("g", T0), offset_value(
        StoredOffset(3, "", NOW)))], NOW), offset=0))
    assert b"topic_id" not in h.logged[0].records.column("value")[0].as_py()
    h.shard = h.replay()
    h.commit({T1: 4}, None)
    assert h.shard.offsets["g"] == {T0: StoredOffset(3, "", NOW), T1: StoredOffset(4, "", NOW)}
    assert h.fetch() == {T0: 3, T1: 4}
    assert h.delete("t", OLD) == 2
    assert h.fetch() == {}
    assert state(h.replay()) == state(h.shard)


def test_a_commit_without_an_id_records_the_coordinators_current_id() -> None:
    """Goal: a client that sends no id gets the coordinator's current id of the topic
    recorded, so the topic's later deletion finds it. Method: the coordinator knows t as
    OLD; a commit without id is recorded for OLD, in memory and in the log's value."""
    h = Harness({"t": OLD})
    h.commit({T0: 5}, None)
    assert h.shard.offsets["g"][T0].topic_id == OLD
    assert h.replay().offsets["g"][T0].topic_id == OLD


def test_fetch_hides_an_offset_recorded_under_another_id_than_the_current_one() -> None:
    """Goal: a coordinator that never wrote the tombstones (it did not lead the partition at
    the deletion) still answers no offset of the deleted topic once it knows the new id;
    legacy offsets (no id) and offsets of a topic it does not know (yet) are shown as before.
    Method: offsets recorded for OLD, NEW and none, fetched with the current id unknown,
    then OLD, then NEW."""
    h = Harness()
    h.commit({T0: 5}, OLD)
    h.commit({T1: 6}, None)
    h.commit({U0: 7}, "id-u")
    assert h.fetch() == {T0: 5, T1: 6, U0: 7}  # t unknown here: as before ids
    h.ids["t"] = OLD
    assert h.fetch() == {T0: 5, T1: 6, U0: 7}
    h.ids["t"] = NEW
    assert h.fetch() == {T1: 6, U0: 7}
    h.commit({T0: 1}, NEW)
    assert h.fetch() == {T0: 1, T1: 6, U0: 7}


def test_a_later_commit_marker_does_not_bring_back_a_deleted_topics_staged_offsets() -> None:
    """Goal: offsets an open transaction staged for the deleted id (or none) are dropped with
    the topic (as Kafka's removeOffsets does): its COMMIT marker leaves the topic without
    offsets, live and replayed, and require_stable no longer waits for them. Method: the
    transaction stages t-0 (OLD, a key also committed) and t-1 (no id, staged only); t (OLD)
    is deleted; the COMMIT marker follows."""
    h = Harness()
    h.commit({T0: 5}, OLD)
    h.txn_commit({T0: 9}, OLD)
    h.txn_commit({T1: 10}, None)
    assert h.delete("t", OLD) == 2
    assert h.shard.pending_txn == {}
    commits.offset_fetch(h.shard, OffsetFetchRequest(group_id="g", require_stable=True))
    h.marker(True)
    assert h.fetch() == {}
    assert state(h.replay()) == state(h.shard)


def test_a_transactions_offsets_for_the_new_id_survive_the_deletion_of_the_old_id() -> None:
    """Goal: a key with an offset staged for the recreated topic is left whole (its
    tombstone would drop the staged offset too): the COMMIT marker makes the new offset the
    group's, live and replayed; meanwhile the old one is hidden once the new id is known.
    Method: g committed t-0 for OLD; a transaction stages t-0 for NEW; t (OLD) is deleted
    late; then the COMMIT marker."""
    h = Harness({"t": OLD})
    h.commit({T0: 5}, OLD)
    h.ids["t"] = NEW  # t deleted and created again; the deletion is reported late
    h.txn_commit({T0: 2}, NEW)
    assert h.delete("t", OLD) == 0
    assert h.fetch() == {}
    h.marker(True)
    assert h.fetch() == {T0: 2}
    assert state(h.replay()) == state(h.shard)


def test_an_empty_group_left_without_offsets_is_deleted_a_group_with_members_is_not(
        ) -> None:
    """Goal: as Kafka's cleanupGroupMetadata: an empty group whose only offsets were the
    deleted topic's goes with them (a group tombstone); a group with members stays.
    Method: g (empty) and h (one member) commit only t (OLD); t is deleted."""
    h = Harness()
    h.commit({T0: 5}, OLD)
    member = form_group_on(h, "h")
    h.run(commits.offset_commit(h.shard, OffsetCommitRequest(
        group_id="h", member_id=member, generation_id=h.shard.groups["h"].generation_id,
        offsets=[OffsetCommitEntry(topic="t", partition=0, offset=1, topic_id=OLD)]), NOW))
    assert h.delete("t", OLD) == 2
    assert "g" not in h.shard.groups and "h" in h.shard.groups
    assert set(h.replay().groups) == {"h"}


def test_expiry_keeps_an_offset_an_open_transaction_staged_for() -> None:
    """Goal: a tombstone drops what transactions staged for its key, so offset expiry (as
    in Kafka) leaves a key with staged offsets. Method: g (empty) committed t-0 and t-1 long
    ago; a transaction stages t-0; a tick past the retention expires t-1 only, and the
    COMMIT marker then makes t-0 the staged offset."""
    h = Harness()
    h.commit({T0: 5, T1: 6}, OLD)
    h.txn_commit({T0: 9}, OLD)
    later = NOW + CONFIG.offsets_retention_ms + 1
    for result in tick(h.shard, later).values():
        h.run(result)
    assert h.fetch() == {T0: 5}
    h.marker(True)
    assert h.fetch() == {T0: 9}


def test_a_deleted_group_stays_deleted_after_a_later_commit_marker() -> None:
    """Goal: deleting a group tombstones the keys open transactions staged for too (as
    Kafka's deleteAllOffsets does), and a tombstone drops what was staged for its key: the
    COMMIT marker that follows brings back none of the group's offsets, live and replayed.
    Method: g commits t-0; a transaction stages t-0 and t-1 (staged only); g is deleted;
    the marker commits."""
    h = Harness()
    h.commit({T0: 5}, OLD)
    h.txn_commit({T0: 9, T1: 3}, OLD)
    h.run(commits.delete_group(h.shard, "g", NOW))
    assert h.tombstoned() == {("g", "t", 0), ("g", "t", 1)}
    h.marker(True)
    assert h.fetch() == {} and "g" not in h.shard.groups
    assert state(h.replay()) == state(h.shard)


def form_group_on(h: Harness, group: str) -> str:
    """A one-member consumer group on the harness's shard; the member id."""
    joined = h.run(membership.join_group(h.shard, JoinGroupRequest(
        group_id=group, session_timeout_ms=10_000, protocols=[
            GroupProtocol(name="range", metadata={"topics": ["t"]})]), NOW)).result(0)
    h.run(membership.sync_group(h.shard, SyncGroupRequest(
        group_id=group, member_id=joined.member_id, generation_id=joined.generation_id,
        assignments={joined.member_id: {"partitions": [["t", 0]]}}), NOW)).result(0)
    return str(joined.member_id)


# One step: (action, group, partition, recorded id).
STEP = st.tuples(st.sampled_from(["commit", "txn", "commit-marker", "abort-marker",
                                  "delete"]),
                 st.sampled_from(["g", "h"]), st.sampled_from([0, 1]),
                 st.sampled_from([OLD, NEW, None]))


@settings(max_examples=80, deadline=None)
@given(st.lists(STEP, max_size=30))
def test_deletions_interleaved_with_commits_replay_to_the_same_state(
        steps: list[tuple[str, str, int, str | None]]) -> None:
    """Goal: whatever the interleaving of plain and transactional commits under either id
    (or none), markers and deletions of either id, a replay of the log rebuilds the running
    state, the index by topic matches the committed offsets, and right after the deletion of
    an id no offset (committed or staged) of that id or none is left, except on a key that
    also holds one under another id. Method: hypothesis over step sequences on the pure
    shard; each step commits its own index."""
    h = Harness()
    for i, (action, group, partition, topic_id) in enumerate(steps):
        tp = TopicPartition("t", partition)
        if action == "commit":
            h.commit({tp: i}, topic_id, group)
        elif action == "txn":
            h.txn_commit({tp: i}, topic_id, group)
        elif action.endswith("marker"):
            h.marker(action == "commit-marker")
        elif topic_id is not None:
            h.delete("t", topic_id)
            assert_deleted(h.shard, topic_id)
        assert index_of(h.shard) == h.shard.committed.by_topic
    assert state(h.replay()) == state(h.shard)


def assert_deleted(shard: GroupCoordinatorShard, topic_id: str) -> None:
    """No key of t is left whose offsets were all recorded for ``topic_id`` or none."""
    keys: dict[tuple[str, TopicPartition], set[str | None]] = {}
    for group, tp, so in shard.committed.of_topic("t") + shard.committed.staged_of_topic("t"):
        keys.setdefault((group, tp), set()).add(so.topic_id)
    for key, ids in keys.items():
        assert not ids <= {topic_id, None}, (key, ids)


# -- the service -----------------------------------------------------------------------------


def test_the_service_tombstones_on_every_led_partition_without_waiting_on_the_append(
        ) -> None:
    """Goal: a deletion (on_topics_deleted, called from the broker's metadata sync thread)
    never waits for an append: the runtime writes the tombstones on a thread of its own, on
    every offsets partition this broker leads; a commit without id records the
    coordinator's. Method: two groups on two partitions commit t (no id sent; the
    coordinator knows OLD); one partition's appends are frozen; the deletion returns while
    its write waits there; once released, each partition reports its tombstones and
    neither group has an offset left."""
    log = MemoryOffsetsLog()
    coord = GroupCoordinatorService(log, CONFIG, FakeClock(), topic_id_of={"t": OLD}.get)
    n = log.num_partitions()
    groups = [group_on(0, n, "a-"), group_on(1, n, "b-")]
    for group in groups:
        coord.offset_commit(OffsetCommitRequest(group_id=group, offsets=[
            OffsetCommitEntry(topic="t", partition=0, offset=4)])).raise_error()
    gate = log.freeze(0)
    deleted = coord.delete_topics_offsets({"t": OLD})  # returns: the append waits elsewhere
    assert gate.entered.wait(WAIT_S)
    assert not deleted.done()
    gate.release.set()
    assert deleted.result(WAIT_S) == {0: 1, 1: 1, 2: 0, 3: 0}
    for group in groups:
        assert coord.offset_fetch(OffsetFetchRequest(group_id=group)).offsets == []


def test_lag_reports_the_offsets_the_fetch_shows() -> None:
    """Goal: ``groups describe`` and the metrics endpoint (the lag, from ``GroupLag``) agree
    with offset fetch: no offset recorded for another incarnation of its topic. Method: g
    commits t-0 for OLD and u-0; the coordinator then knows t as NEW; the lag's committed
    offsets, of the group and of all groups, are the fetch's."""
    ids = {"t": OLD}
    coord = GroupCoordinatorService(MemoryOffsetsLog(), CONFIG, FakeClock(),
                                    topic_id_of=ids.get)
    coord.offset_commit(OffsetCommitRequest(group_id="g", offsets=[
        OffsetCommitEntry(topic="t", partition=0, offset=4, topic_id=OLD),
        OffsetCommitEntry(topic="u", partition=0, offset=6)])).raise_error()
    lag = GroupLag(0, coord, None, None)  # type: ignore[arg-type]  # reads no leader here
    assert lag.group_committed("g") == [("g", T0, 4), ("g", U0, 6)]
    ids["t"] = NEW
    fetched = coord.offset_fetch(OffsetFetchRequest(group_id="g")).offsets
    assert [(e.topic, e.partition, e.offset) for e in fetched] == [("u", 0, 6)]
    assert lag.group_committed("g") == lag.committed() == [("g", U0, 6)]


def test_a_commit_for_a_replaced_topic_id_is_refused_not_acknowledged_and_hidden() -> None:
    """Goal: a client whose cached metadata still has the deleted topic's id commits (plain
    or in a transaction): UNKNOWN_TOPIC_ID for that partition (retriable: refresh the
    metadata), never an acknowledgement of an offset offset fetch would hide at once (a
    commit lost silently); a commit for the current id, or with no id, is stored.
    Method: t is NEW here; commits for OLD, NEW and none."""
    h = Harness({"t": NEW})
    for run, entry in ((lambda e: commits.offset_commit(h.shard, OffsetCommitRequest(
            group_id="g", offsets=[e]), NOW), OffsetCommitEntry),
                       (lambda e: txn_offsets.txn_offset_commit(h.shard, TxnOffsetCommitRequest(
                           transactional_id="tx", group_id="g", producer_id=PID,
                           producer_epoch=0, offsets=[e]), NOW), TxnOffsetCommitEntry)):
        response = h.run(run(entry(topic="t", partition=0, offset=7, topic_id=OLD)))
        results = getattr(response, "offsets", None) or response.results
        assert [r.error_code for r in results] == [ErrorCode.UNKNOWN_TOPIC_ID], results
        assert "topic id" in (results[0].error_message or "")
    assert h.fetch() == {}
    h.commit({T0: 8}, NEW)
    assert h.fetch() == {T0: 8}
    h.commit({T0: 9}, None)
    assert h.fetch() == {T0: 9}


class _HeldReadLog(MemoryOffsetsLog):
    """Reads of partition 0 wait for ``release`` once ``held`` is set (a replay under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.release = threading.Event(), threading.Event()
        self.hold = False

    def read(self, partition: int) -> list[LoggedBatch]:
        if self.hold and partition == 0:
            self.held.set()
            assert self.release.wait(WAIT_S)
        return super().read(partition)


def test_a_deletion_reported_while_a_request_replays_the_partition_waits_for_it() -> None:
    """Goal: a topic deletion reported while a request's thread replays an offsets
    partition (a new leader's first request) is applied once the replay ends, not skipped:
    nothing asks for it again, and an offset recorded with no id (before ids, or by a
    coordinator that knew none) would be served for the topic recreated under its name.
    Method: an offset of t without id; a fresh coordinator whose partition-0 replay a fetch
    holds; the deletion is reported meanwhile; the replay is released; t is recreated."""
    log = _HeldReadLog()
    group = group_on(0, log.num_partitions(), "g-")
    GroupCoordinatorService(log, CONFIG, FakeClock()).offset_commit(OffsetCommitRequest(
        group_id=group, offsets=[OffsetCommitEntry(topic="t", partition=0, offset=4)]))
    ids = {"t": OLD}
    coordinator = GroupCoordinatorService(log, CONFIG, FakeClock(), topic_id_of=ids.get)
    log.hold = True
    replay = threading.Thread(target=coordinator.offset_fetch,
                              args=(OffsetFetchRequest(group_id=group),))
    replay.start()
    assert log.held.wait(WAIT_S)
    del ids["t"]
    deleted = coordinator.delete_topics_offsets({"t": OLD})
    log.release.set()
    replay.join(WAIT_S)
    assert deleted.result(WAIT_S).get(0) == 1
    ids["t"] = NEW
    assert coordinator.offset_fetch(OffsetFetchRequest(group_id=group)).offsets == []
