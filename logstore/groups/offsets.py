"""The records of the ``__consumer_offsets`` topic and the stable group -> partition hash.

Owns: the key and value encoding of committed offsets and of group metadata, building the
Arrow batch the coordinator appends, and replaying read batches into a ``LoadedGroups``
snapshot. Records (default topic schema, JSON bytes):

| key                                   | value                                                 |
|---------------------------------------|-------------------------------------------------------|
| ``["offset", group, topic, partition]`` | ``{"offset", "metadata", "commit_timestamp"}``, null = deleted |
| ``["group", group]``                    | ``{"protocol_type", "generation", "protocol", "leader"}``, null = deleted |

Keys are compact JSON arrays, so equal (group, topic, partition) give equal bytes and
compaction keeps the latest record per key; a null value is a tombstone. Offsets committed
inside a transaction are the producer's transactional batch of offset records: they count
once the producer's COMMIT marker follows, and never after an ABORT; and, as in Kafka
(``completePendingTxnOffsetCommit``), a committed transaction's offset for a partition
replaces the committed one only if its record lies after that one's in the log: a plain commit
appended between the transaction's offset batch and its marker wins. So every committed offset
keeps its position (``CommitPositions``: the offset of the batch that holds its record), both
in a replay and in the running coordinator, and both apply the same rules (``set_committed``,
``commit_txn_offsets``, ``drop_committed``). Must not: do I/O (the coordinator reads and
appends the partition) or know the group protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


def offset_value(om: OffsetAndMetadata) -> bytes:
    return orjson.dumps({"offset": om.offset, "metadata": om.metadata,
                         "commit_timestamp": om.commit_timestamp})


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
GroupOffsets = dict[str, dict[TopicPartition, OffsetAndMetadata]]
PendingTxnOffsets = dict[int, dict[int, GroupOffsets]]
# Where each committed offset's record is: group -> partition -> log offset of its batch.
CommitPositions = dict[str, dict[TopicPartition, int]]


def set_committed(offsets: GroupOffsets, positions: CommitPositions, group_id: str,
                  committed: dict[TopicPartition, OffsetAndMetadata], position: int) -> None:
    """A plain commit whose batch is at ``position``: its offsets replace the group's (plain
    commits are applied in log order, so the latest record always wins)."""
    offsets.setdefault(group_id, {}).update(committed)
    positions.setdefault(group_id, {}).update(dict.fromkeys(committed, position))


def commit_txn_offsets(offsets: GroupOffsets, positions: CommitPositions,
                       decided: list[tuple[int, GroupOffsets]]) -> None:
    """A transaction's COMMIT: each offset it staged (``decided``: the batches' positions
    and offsets, in log order, as ``take_decided`` returns them) replaces the group's
    committed offset only if its record is later in the log than the committed one's (or
    there is none): a plain commit appended after the transaction's offsets, before its
    marker, is newer and stays. Kafka's rule, live and on replay."""
    for position, staged in decided:
        for group_id, by_tp in staged.items():
            committed = offsets.setdefault(group_id, {})
            at = positions.setdefault(group_id, {})
            for tp, om in by_tp.items():
                if at.get(tp, -1) < position:
                    committed[tp], at[tp] = om, position


def drop_committed(offsets: GroupOffsets, positions: CommitPositions, group_id: str,
                   tps: list[TopicPartition]) -> None:
    """Tombstones for ``tps``: their committed offsets (and positions) are gone."""
    for tp in tps:
        offsets.get(group_id, {}).pop(tp, None)
        positions.get(group_id, {}).pop(tp, None)


def stage_txn_offsets(pending: PendingTxnOffsets, producer_id: int, batch_offset: int,
                      offsets: GroupOffsets) -> None:
    """Record the offsets a producer's transactional batch at ``batch_offset`` staged."""
    staged = pending.setdefault(producer_id, {}).setdefault(batch_offset, {})
    for group_id, by_tp in offsets.items():
        staged.setdefault(group_id, {}).update(by_tp)


def take_decided(pending: PendingTxnOffsets, producer_id: int, marker_offset: int
                 ) -> list[tuple[int, GroupOffsets]]:
    """Remove and return, in log order, the offsets the producer's marker at
    ``marker_offset`` decides, each with the offset of the batch that staged it: those its
    batches staged before the marker (Kafka's rule; a batch after it belongs to the
    producer's next transaction)."""
    batches = pending.get(producer_id, {})
    decided = sorted(o for o in batches if o < marker_offset)
    taken = [(o, batches.pop(o)) for o in decided]
    if not batches:
        pending.pop(producer_id, None)
    return taken


@dataclass
class LoadedGroups:
    """The state of one offsets partition after replay: latest record per key wins; offsets a
    transaction committed wait in ``pending`` until its marker (COMMIT applies those whose
    record is newer than the committed one's, ABORT drops them)."""

    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    pending: PendingTxnOffsets = field(default_factory=dict)
    positions: CommitPositions = field(default_factory=dict)

    def apply_logged(self, logged: LoggedBatch) -> None:
        if logged.marker is not None:
            decided = take_decided(self.pending, logged.producer_id, logged.offset)
            if logged.marker is ControlType.COMMIT:
                commit_txn_offsets(self.offsets, self.positions, decided)
        elif logged.transactional:
            into: GroupOffsets = {}
            for key, value in _rows(logged.records):
                group_id, tp, om = _offset_entry(key, value)
                if om is not None:
                    into.setdefault(group_id, {})[tp] = om
            stage_txn_offsets(self.pending, logged.producer_id, logged.offset, into)
        else:
            self.apply_batch(logged.records, logged.offset)

    def apply_batch(self, batch: pa.RecordBatch, position: int) -> None:
        """A plain batch at ``position`` in the log."""
        for key, value in _rows(batch):
            self.apply(key, value, position)

    def apply(self, key: bytes, value: bytes | None, position: int) -> None:
        parsed: list[Any] = orjson.loads(key)
        if parsed[0] == OFFSET_KEY:
            group_id, tp, om = _offset_entry(key, value)
            if om is None:
                drop_committed(self.offsets, self.positions, group_id, [tp])
            else:
                set_committed(self.offsets, self.positions, group_id, {tp: om}, position)
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
                  ) -> tuple[str, TopicPartition, OffsetAndMetadata | None]:
    """(group, partition, offset or None for a tombstone) of an offset record."""
    parsed: list[Any] = orjson.loads(key)
    tp = TopicPartition(parsed[2], parsed[3])
    if value is None:
        return parsed[1], tp, None
    v = orjson.loads(value)
    return parsed[1], tp, OffsetAndMetadata(v["offset"], v.get("metadata", ""),
                                            v.get("commit_timestamp", -1))
