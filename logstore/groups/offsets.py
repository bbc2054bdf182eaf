"""The records of the ``__consumer_offsets`` topic and the stable group -> partition hash.

Owns: the key and value encoding of committed offsets and of group metadata, building the
Arrow batch the coordinator appends, and replaying read batches into a ``LoadedGroups``
snapshot. Records (default topic schema, JSON bytes):

| key                                   | value                                                 |
|---------------------------------------|-------------------------------------------------------|
| ``["offset", group, topic, partition]`` | ``{"offset", "metadata", "commit_timestamp", "topic_id"?}``, null = deleted |
| ``["group", group]``                    | ``{"protocol_type", "generation", "protocol", "leader"}``, null = deleted |

Keys are compact JSON arrays, so equal (group, topic, partition) give equal bytes and
compaction keeps the latest record per key; a null value is a tombstone. ``topic_id`` is the
id of the topic the offset was committed for (absent in records written before ids were
recorded, or when no one knew it): a topic deleted and recreated under the same name has
another id, so its old offsets can be told from the new ones (``StoredOffset``). Offsets
committed inside a transaction are the producer's transactional batch of offset records: they
count once the producer's COMMIT marker follows, and never after an ABORT; and, as in Kafka
(``completePendingTxnOffsetCommit``), a committed transaction's offset for a partition
replaces the committed one only if its record lies after that one's in the log: a plain commit
appended between the transaction's offset batch and its marker wins; a tombstone drops what
open transactions staged for its key too (as Kafka's coordinator replays one), so a later
COMMIT never brings back a deleted offset. So every committed offset keeps its position
(``CommitPositions``: the offset of the batch that holds its record), both in a replay and in
the running coordinator, and both apply the same rules (``CommittedOffsets``). Must not: do
I/O (the coordinator reads and appends the partition) or know the group protocol.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
import pyarrow as pa

from logstore.coordinator import LoggedBatch, encode_rows, key_partition
from logstore.coordinator import java_string_hash as java_string_hash  # re-exported
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.records import ControlType

OFFSET_KEY = "offset"
GROUP_KEY = "group"


def partition_for(group_id: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group: Kafka's ``abs(hashCode) % n``."""
    return key_partition(group_id, num_partitions)


def offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return orjson.dumps([OFFSET_KEY, group_id, tp.topic, tp.partition])


def group_key(group_id: str) -> bytes:
    return orjson.dumps([GROUP_KEY, group_id])


class StoredOffset(NamedTuple):
    """A committed offset as the log holds it: ``OffsetAndMetadata``'s fields and the id of
    the topic it was committed for (None: a record from before ids were recorded, or a commit
    whose topic neither the client nor the coordinator knew an id of)."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    topic_id: str | None = None

    def as_committed(self) -> OffsetAndMetadata:
        return OffsetAndMetadata(self.offset, self.metadata, self.commit_timestamp)


def offset_value(om: OffsetAndMetadata | StoredOffset) -> bytes:
    value: dict[str, Any] = {"offset": om.offset, "metadata": om.metadata,
                             "commit_timestamp": om.commit_timestamp}
    if isinstance(om, StoredOffset) and om.topic_id is not None:
        value["topic_id"] = om.topic_id
    return orjson.dumps(value)


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """What survives a coordinator move besides offsets: the generation to continue from."""

    protocol_type: str
    generation_id: int
    protocol: str | None
    leader: str | None

    def encode(self) -> bytes:
        return orjson.dumps({"protocol_type": self.protocol_type,
                             "generation": self.generation_id, "protocol": self.protocol,
                             "leader": self.leader})


def encode_batch(rows: list[tuple[bytes, bytes | None]], now_ms: int) -> pa.RecordBatch:
    return encode_rows(rows, now_ms)


# Offsets committed inside a producer's transaction and not decided yet:
# producer id -> offset of the batch that staged them -> group -> partition -> offset.
GroupOffsets = dict[str, dict[TopicPartition, StoredOffset]]
PendingTxnOffsets = dict[int, dict[int, GroupOffsets]]
# Where each committed offset's record is: group -> partition -> log offset of its batch.
CommitPositions = dict[str, dict[TopicPartition, int]]
# Which groups hold committed offsets of a topic: topic -> group -> partitions.
TopicIndex = dict[str, dict[str, set[int]]]


@dataclass
class CommittedOffsets:
    """The committed offsets of one offsets partition's groups (with where each record is,
    and an index by topic, so a topic's deletion reads only the groups that committed it),
    and the offsets open transactions staged. Every change goes through these methods, live
    and in a replay alike, so both keep the same state and the index never drifts."""

    offsets: GroupOffsets = field(default_factory=dict)
    positions: CommitPositions = field(default_factory=dict)
    pending: PendingTxnOffsets = field(default_factory=dict)
    by_topic: TopicIndex = field(default_factory=dict)

    def commit(self, group_id: str, committed: dict[TopicPartition, StoredOffset],
            position: int) -> None:
        """A plain commit whose batch is at ``position``: its offsets replace the group's
        (plain commits are applied in log order, so the latest record always wins)."""
        if not committed:
            return
        self.offsets.setdefault(group_id, {}).update(committed)
        self.positions.setdefault(group_id, {}).update(dict.fromkeys(committed, position))
        for tp in committed:
            self.by_topic.setdefault(tp.topic, {}).setdefault(group_id, set()).add(tp.partition)

    def stage(self, producer_id: int, batch_offset: int, offsets: GroupOffsets) -> None:
        """Record the offsets a producer's transactional batch at ``batch_offset`` staged."""
        staged = self.pending.setdefault(producer_id, {}).setdefault(batch_offset, {})
        for group_id, by_tp in offsets.items():
            staged.setdefault(group_id, {}).update(by_tp)

    def take_decided(self, producer_id: int, marker_offset: int
                     ) -> list[tuple[int, GroupOffsets]]:
        """Remove and return, in log order, the offsets the producer's marker at
        ``marker_offset`` decides, each with the offset of the batch that staged it: those
        its batches staged before the marker (Kafka's rule; a batch after it belongs to the
        producer's next transaction)."""
        batches = self.pending.get(producer_id, {})
        decided = sorted(o for o in batches if o < marker_offset)
        taken = [(o, batches.pop(o)) for o in decided]
        if not batches:
            self.pending.pop(producer_id, None)
        return taken

    def commit_txn(self, decided: list[tuple[int, GroupOffsets]]) -> None:
        """A transaction's COMMIT: each offset it staged (``decided``, as ``take_decided``
        returns them) replaces the group's committed offset only if its record is later in
        the log than the committed one's (or there is none): a plain commit appended after
        the transaction's offsets, before its marker, is newer and stays. Kafka's rule, live
        and on replay."""
        for position, staged in decided:
            for group_id, by_tp in staged.items():
                at = self.positions.get(group_id, {})
                newer = {tp: so for tp, so in by_tp.items() if at.get(tp, -1) < position}
                self.commit(group_id, newer, position)

    def drop(self, group_id: str, tps: Iterable[TopicPartition]) -> None:
        """Tombstones for ``tps``: their committed offsets are gone, and so is what open
        transactions staged for them (staged before the tombstone, which is later in the
        log: as Kafka's coordinator replays a tombstone), so no later COMMIT brings them
        back."""
        committed = self.offsets.get(group_id, {})
        at = self.positions.get(group_id, {})
        gone = set(tps)
        for tp in gone:
            committed.pop(tp, None)
            at.pop(tp, None)
            self._unindex(group_id, tp)
        if not committed:
            self.offsets.pop(group_id, None)
            self.positions.pop(group_id, None)
        self._drop_staged(group_id, gone)

    def of_topic(self, topic: str) -> list[tuple[str, TopicPartition, StoredOffset]]:
        """Every committed offset of ``topic`` (through the index)."""
        return [(group_id, TopicPartition(topic, p), self.offsets[group_id][
                    TopicPartition(topic, p)])
                for group_id, partitions in self.by_topic.get(topic, {}).items()
                for p in sorted(partitions)]

    def staged_of_topic(self, topic: str) -> list[tuple[str, TopicPartition, StoredOffset]]:
        """Every offset of ``topic`` open transactions staged (a scan: only open
        transactions' offsets are pending)."""
        return [(group_id, tp, so) for batches in self.pending.values()
                for groups in batches.values() for group_id, by_tp in groups.items()
                for tp, so in by_tp.items() if tp.topic == topic]

    def staged_keys(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions open transactions staged offsets for."""
        return {tp for batches in self.pending.values() for groups in batches.values()
                for tp in groups.get(group_id, {})}

    def _unindex(self, group_id: str, tp: TopicPartition) -> None:
        groups = self.by_topic.get(tp.topic, {})
        partitions = groups.get(group_id, set())
        partitions.discard(tp.partition)
        if not partitions:
            groups.pop(group_id, None)
        if not groups:
            self.by_topic.pop(tp.topic, None)

    def _drop_staged(self, group_id: str, tps: set[TopicPartition]) -> None:
        for producer_id, batches in list(self.pending.items()):
            for batch_offset, groups in list(batches.items()):
                by_tp = groups.get(group_id)
                if by_tp is None:
                    continue
                for tp in tps & by_tp.keys():
                    del by_tp[tp]
                if not by_tp:
                    del groups[group_id]
                if not groups:
                    del batches[batch_offset]
            if not batches:
                del self.pending[producer_id]


@dataclass
class LoadedGroups:
    """The state of one offsets partition after replay: latest record per key wins; offsets a
    transaction committed wait in ``committed.pending`` until its marker (COMMIT applies
    those whose record is newer than the committed one's, ABORT drops them); a tombstone
    drops a key's committed offset and what open transactions staged for it."""

    committed: CommittedOffsets = field(default_factory=CommittedOffsets)
    groups: dict[str, GroupRecord] = field(default_factory=dict)

    def apply_logged(self, logged: LoggedBatch) -> None:
        if logged.marker is not None:
            decided = self.committed.take_decided(logged.producer_id, logged.offset)
            if logged.marker is ControlType.COMMIT:
                self.committed.commit_txn(decided)
        elif logged.transactional:
            into: GroupOffsets = {}
            for key, value in _rows(logged.records):
                group_id, tp, so = _offset_entry(key, value)
                if so is not None:
                    into.setdefault(group_id, {})[tp] = so
            self.committed.stage(logged.producer_id, logged.offset, into)
        else:
            self.apply_batch(logged.records, logged.offset)

    def apply_batch(self, batch: pa.RecordBatch, position: int) -> None:
        """A plain batch at ``position`` in the log."""
        for key, value in _rows(batch):
            self.apply(key, value, position)

    def apply(self, key: bytes, value: bytes | None, position: int) -> None:
        parsed: list[Any] = orjson.loads(key)
        if parsed[0] == OFFSET_KEY:
            group_id, tp, so = _offset_entry(key, value)
            if so is None:
                self.committed.drop(group_id, [tp])
            else:
                self.committed.commit(group_id, {tp: so}, position)
        elif parsed[0] == GROUP_KEY:
            if value is None:
                self.groups.pop(parsed[1], None)
                return
            v = orjson.loads(value)
            self.groups[parsed[1]] = GroupRecord(v["protocol_type"], v["generation"],
                                                 v.get("protocol"), v.get("leader"))


def _rows(batch: pa.RecordBatch) -> list[tuple[bytes, bytes | None]]:
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    return [(k, v) for k, v in zip(keys, values, strict=True) if k is not None]


def _offset_entry(key: bytes, value: bytes | None
                  ) -> tuple[str, TopicPartition, StoredOffset | None]:
    """(group, partition, offset or None for a tombstone) of an offset record (one written
    before topic ids were recorded has none)."""
    parsed: list[Any] = orjson.loads(key)
    tp = TopicPartition(parsed[2], parsed[3])
    if value is None:
        return parsed[1], tp, None
    v = orjson.loads(value)
    return parsed[1], tp, StoredOffset(v["offset"], v.get("metadata", ""),
                                       v.get("commit_timestamp", -1), v.get("topic_id"))
