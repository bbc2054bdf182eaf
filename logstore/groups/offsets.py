"""The records of the ``__consumer_offsets`` topic and the stable group -> partition hash.

Owns: the key and value encoding of committed offsets and of group metadata, building the
Arrow batch the coordinator appends, and replaying read batches into a ``LoadedGroups``
snapshot. Records (default topic schema, JSON bytes):

| key                                   | value                                                 |
|---------------------------------------|-------------------------------------------------------|
| ``["offset", group, topic, partition]`` | ``{"offset", "metadata", "commit_timestamp"}``, null = deleted |
| ``["group", group]``                    | ``{"protocol_type", "generation", "protocol", "leader"}``, null = deleted |

Keys are compact JSON arrays, so equal (group, topic, partition) give equal bytes and
compaction keeps the latest record per key; a null value is a tombstone. Must not: do I/O
(the coordinator reads and appends the partition) or know the group protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE

OFFSET_KEY = "offset"
GROUP_KEY = "group"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (as Kafka hashes group ids), as a signed 32-bit int."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group: Kafka's ``abs(hashCode) % n``."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % num_partitions


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
    n = len(rows)
    return pa.record_batch([
        pa.array([k for k, _ in rows], pa.binary()),
        pa.array([v for _, v in rows], pa.binary()),
        pa.array([now_ms] * n, pa.int64()).cast(TIMESTAMP_TYPE),
        pa.nulls(n, DEFAULT_SCHEMA.field("headers").type),
    ], schema=DEFAULT_SCHEMA)


@dataclass
class LoadedGroups:
    """The state of one offsets partition after replay: latest record per key wins."""

    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    groups: dict[str, GroupRecord] = field(default_factory=dict)

    def apply_batch(self, batch: pa.RecordBatch) -> None:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            if key is not None:
                self.apply(key, value)

    def apply(self, key: bytes, value: bytes | None) -> None:
        parsed: list[Any] = orjson.loads(key)
        if parsed[0] == OFFSET_KEY:
            group_id, tp = parsed[1], TopicPartition(parsed[2], parsed[3])
            if value is None:
                self.offsets.get(group_id, {}).pop(tp, None)
            else:
                v = orjson.loads(value)
                self.offsets.setdefault(group_id, {})[tp] = OffsetAndMetadata(
                    v["offset"], v.get("metadata", ""), v.get("commit_timestamp", -1))
        elif parsed[0] == GROUP_KEY:
            if value is None:
                self.groups.pop(parsed[1], None)
                return
            v = orjson.loads(value)
            self.groups[parsed[1]] = GroupRecord(v["protocol_type"], v["generation"],
                                                 v.get("protocol"), v.get("leader"))
