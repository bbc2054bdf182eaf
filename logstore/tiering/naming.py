"""Names of remote objects.

Owns: the object key layout of a remote segment and its sidecars, and parsing keys back.
Must not: do I/O.

| part              | example                                  | meaning                              |
|-------------------|------------------------------------------|--------------------------------------|
| topic directory   | ``orders-0f3c…(32 hex)``                 | ``<topic>-<topic id>``               |
| partition         | ``3``                                    | partition number                     |
| object name       | ``00000000000000001234-9ab1…(32 hex)``   | ``<base offset:020d>-<segment id>``  |
| suffix            | see ``SUFFIXES``                         | which file of the segment            |

Full key: ``<topic>-<topic id>/<partition>/<base offset:020d>-<segment id><suffix>``. A fresh
segment id per copy attempt means a retried or duplicated copy never overwrites another; the
base offset first makes a listing sort by offset.

| suffix                     | content                                                     |
|----------------------------|-------------------------------------------------------------|
| ``.arrow``                 | the segment file as on local disk                           |
| ``.index``                 | its offset index (segments/format.py's layout)              |
| ``.timeindex``             | its time index                                              |
| ``.txnindex``              | its aborted-transaction index, when the segment has one      |
| ``.snapshot``              | the producer-state snapshot at the segment's end, if kept   |
| ``.leader-epoch-checkpoint`` | the leader-epoch entries of the segment (epoch_cache.py's text format) |
| ``.colcrc``                | a CRC32C per top-level column per batch (projection.py), so |
|                            | a projected read verifies exactly the bytes it fetched      |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from logstore.segments.format import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
)
from logstore.tiering.metadata import RemoteLogSegmentMetadata, TopicIdPartition

EPOCH_CHECKPOINT_SUFFIX = ".leader-epoch-checkpoint"
COLUMN_CRC_SUFFIX = ".colcrc"
SUFFIXES = (SEGMENT_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, SNAPSHOT_SUFFIX,
            EPOCH_CHECKPOINT_SUFFIX, COLUMN_CRC_SUFFIX)
_OBJECT_RE = re.compile(r"^(\d{20})-([0-9a-f]{32})(\.[a-z-]+)$")


@dataclass(frozen=True, slots=True)
class ObjectName:
    """What a remote object key says about itself."""

    base_offset: int
    segment_id: str
    suffix: str


def partition_prefix(tp: TopicIdPartition) -> str:
    """``<topic>-<topic id>/<partition>/``: every object of the partition is under it."""
    return f"{tp.topic_dir}/{tp.partition}/"


def topic_prefix(tp: TopicIdPartition) -> str:
    return f"{tp.topic_dir}/"


def segment_key(segment: RemoteLogSegmentMetadata, suffix: str) -> str:
    return (f"{partition_prefix(segment.partition)}{segment.base_offset:020d}-"
            f"{segment.segment_id}{suffix}")


def segment_keys(segment: RemoteLogSegmentMetadata) -> list[str]:
    """Every key a copy of ``segment`` may have written (deleting them all is idempotent)."""
    return [segment_key(segment, suffix) for suffix in SUFFIXES]


def parse_object_key(key: str) -> ObjectName | None:
    """The parts of a segment object's key (its last path component), None for other keys."""
    match = _OBJECT_RE.match(key.rsplit("/", 1)[-1])
    if match is None or match.group(3) not in SUFFIXES:
        return None
    return ObjectName(int(match.group(1)), match.group(2), match.group(3))
