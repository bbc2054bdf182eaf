"""Remote log segment metadata: what the cluster knows about each segment copy in the remote
tier, and the rules for how that knowledge may change.

Owns: ``TopicIdPartition``, the ``RemoteLogSegmentMetadata`` value type (one per copy attempt,
Kafka's fields), its versioned JSON form, and the pure state-transition rule. Must not: do I/O;
where entries are kept (the cluster ``MetadataStore``, fenced by leader epoch) is
``controller/``'s business.

States and transitions (Kafka's ``RemoteLogSegmentState``; repeating a state is allowed, so a
retried write is harmless):

| from                   | to                                                    |
|------------------------|-------------------------------------------------------|
| (no entry)             | COPY_SEGMENT_STARTED                                  |
| COPY_SEGMENT_STARTED   | COPY_SEGMENT_FINISHED, DELETE_SEGMENT_STARTED         |
| COPY_SEGMENT_FINISHED  | DELETE_SEGMENT_STARTED                                |
| DELETE_SEGMENT_STARTED | DELETE_SEGMENT_FINISHED (the entry is removed)        |
| (no entry)             | DELETE_SEGMENT_FINISHED: nothing to do (a retry)      |

COPY_SEGMENT_STARTED -> DELETE_SEGMENT_STARTED is how a failed or abandoned copy is cleaned up
(Kafka allows it too). Only COPY_SEGMENT_FINISHED segments are read or counted for retention.
A transition may change nothing but the state, its timestamp and the writer's broker id.

JSON of one entry (``version`` 1):

| field          | type            | meaning                                                |
|----------------|-----------------|--------------------------------------------------------|
| topic          | string          | topic name                                             |
| topic_id       | string          | 32 hex digits; tells the topic from an earlier namesake |
| partition      | int             | partition number                                       |
| segment_id     | string          | 32 hex digits, fresh per copy attempt                  |
| base_offset    | int             | first offset in the segment                            |
| end_offset     | int             | last offset in the segment (inclusive, as in Kafka)    |
| max_timestamp  | int             | largest record timestamp, ms                           |
| size_bytes     | int             | bytes of the segment file                              |
| leader_epoch   | int             | epoch of the leader that copied it                     |
| epochs         | [[epoch, start]] | the segment's leader-epoch lineage, epochs ascending   |
| state          | string          | a ``RemoteLogSegmentState`` name                       |
| state_ms       | int             | when the state was entered, ms                         |
| broker_id      | int             | the broker that wrote the state                        |
| txn_index      | bool (optional) | whether a ``.txnindex`` object was copied with it; absent |
|                |                 | in entries written before the field (not known then)   |

``txn_index`` tells a segment that had no aborted transaction from one whose index object is
lost: a read_committed read of the second fails instead of showing its aborted records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from logstore.errors import LogstoreError

JSON_VERSION = 1


class InvalidRemoteSegmentStateError(LogstoreError):
    """A remote segment state change that the transition rules refuse (a bug or a race)."""


class RemoteLogSegmentState(Enum):
    COPY_SEGMENT_STARTED = "COPY_SEGMENT_STARTED"
    COPY_SEGMENT_FINISHED = "COPY_SEGMENT_FINISHED"
    DELETE_SEGMENT_STARTED = "DELETE_SEGMENT_STARTED"
    DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_FINISHED"


_S = RemoteLogSegmentState
_ALLOWED: dict[RemoteLogSegmentState | None, frozenset[RemoteLogSegmentState]] = {
    None: frozenset({_S.COPY_SEGMENT_STARTED, _S.DELETE_SEGMENT_FINISHED}),
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_STARTED, _S.COPY_SEGMENT_FINISHED,
                                        _S.DELETE_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_STARTED,
                                          _S.DELETE_SEGMENT_FINISHED}),
}


@dataclass(frozen=True, slots=True, order=True)
class TopicIdPartition:
    """A partition of one particular topic: the name and the id that tells it from a deleted
    topic of the same name."""

    topic: str
    topic_id: str
    partition: int

    @property
    def topic_dir(self) -> str:
        """``<topic>-<topic id>``: the topic's directory in the object store and the metadata
        store (the id has no '-', so the name is everything before the last one)."""
        return f"{self.topic}-{self.topic_id}"

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def parse_topic_dir(name: str) -> tuple[str, str] | None:
    """(topic, topic id) of a ``<topic>-<topic id>`` directory name, else None."""
    topic, sep, topic_id = name.rpartition("-")
    if not sep or not topic or len(topic_id) != 32 or not _is_hex(topic_id):
        return None
    return topic, topic_id


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """One copy attempt of one local segment to the remote tier (see the module docstring)."""

    partition: TopicIdPartition
    segment_id: str
    base_offset: int
    end_offset: int
    max_timestamp_ms: int
    size_bytes: int
    leader_epoch: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    state: RemoteLogSegmentState
    state_timestamp_ms: int
    broker_id: int = -1
    has_txn_index: bool | None = None  # None: an entry written before the field existed

    @property
    def next_offset(self) -> int:
        return self.end_offset + 1

    @property
    def is_finished(self) -> bool:
        return self.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED

    def with_state(self, state: RemoteLogSegmentState, now_ms: int) -> RemoteLogSegmentMetadata:
        return replace(self, state=state, state_timestamp_ms=now_ms)

    def describe(self) -> str:
        """For messages: partition, segment id and offsets."""
        return (f"{self.partition} remote segment {self.segment_id} "
                f"[{self.base_offset}, {self.end_offset}]")

    def to_json(self) -> dict[str, Any]:
        p = self.partition
        return {"version": JSON_VERSION, "topic": p.topic, "topic_id": p.topic_id,
                "partition": p.partition, "segment_id": self.segment_id,
                "base_offset": self.base_offset, "end_offset": self.end_offset,
                "max_timestamp": self.max_timestamp_ms, "size_bytes": self.size_bytes,
                "leader_epoch": self.leader_epoch,
                "epochs": [list(e) for e in self.segment_leader_epochs],
                "state": self.state.value, "state_ms": self.state_timestamp_ms,
                "broker_id": self.broker_id,
                **({} if self.has_txn_index is None else {"txn_index": self.has_txn_index})}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RemoteLogSegmentMetadata:
        if not isinstance(d.get("version"), int) or d["version"] > JSON_VERSION:
            raise ValueError(f"remote segment entry version {d.get('version')!r} is not one "
                             f"this broker reads (newest {JSON_VERSION})")
        return cls(TopicIdPartition(d["topic"], d["topic_id"], int(d["partition"])),
                   d["segment_id"], int(d["base_offset"]), int(d["end_offset"]),
                   int(d["max_timestamp"]), int(d["size_bytes"]), int(d["leader_epoch"]),
                   tuple((int(e), int(s)) for e, s in d["epochs"]),
                   RemoteLogSegmentState(d["state"]), int(d["state_ms"]),
                   int(d.get("broker_id", -1)),
                   None if d.get("txn_index") is None else bool(d["txn_index"]))


def check_transition(current: RemoteLogSegmentMetadata | None,
                     new: RemoteLogSegmentMetadata) -> bool:
    """Whether ``new`` must be written over ``current`` (the stored entry, None if absent):
    False for DELETE_SEGMENT_FINISHED of an entry already gone. Raises
    InvalidRemoteSegmentStateError for a transition the table refuses, or one that changes
    more than the state."""
    before = None if current is None else current.state
    if new.state not in _ALLOWED.get(before, frozenset()):
        raise InvalidRemoteSegmentStateError(
            f"{new.describe()}: state {before.name if before else 'absent'} -> "
            f"{new.state.name} is not allowed")
    if current is None:
        return new.state is not RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
    unchanged = replace(new, state=current.state, state_timestamp_ms=current.state_timestamp_ms,
                        broker_id=current.broker_id)
    if unchanged != current:
        raise InvalidRemoteSegmentStateError(
            f"{new.describe()}: a state change may not change the segment's description "
            f"(stored {current}, new {new})")
    return True


def epoch_lineage_slice(entries: list[tuple[int, int]], base_offset: int,
                        end_offset: int) -> tuple[tuple[int, int], ...]:
    """The leader epochs of a segment holding offsets ``base_offset..end_offset``, from the
    partition's epoch cache ``entries`` ((epoch, start offset), ascending): each epoch that
    began before the segment ends and ended after it began, with its start clamped to
    ``base_offset``."""
    out: list[tuple[int, int]] = []
    for i, (epoch, start) in enumerate(entries):
        following = entries[i + 1][1] if i + 1 < len(entries) else None
        if start > end_offset or (following is not None and following <= base_offset):
            continue
        out.append((epoch, max(start, base_offset)))
    return tuple(out)
