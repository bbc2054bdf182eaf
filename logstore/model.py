"""Small value types shared by every layer. Must not: do I/O."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from logstore.errors import InvalidPartitionsError, InvalidTopicError

if TYPE_CHECKING:
    import pyarrow as pa

TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)
# Not a topic: the pseudo-partition (partition 0) on which a Spark sink's group records the
# last batch it published (datasource/sink_commit.py). Offsets expiry leaves it alone.
SINK_PROGRESS_TOPIC = "__logstore_sink_progress"

# Special offsets in list-offsets requests and Spark's offset JSON, as in Kafka.
EARLIEST = -2
LATEST = -1

# A record's timestamp type, as Kafka numbers it (kafka-python's ConsumerRecord.timestamp_type):
# the producer's create time, or the leader's append time (a topic whose
# ``message_timestamp_type`` is LogAppendTime: its batches carry FLAG_LOG_APPEND_TIME).
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create: what ``Admin.create_topics`` sends and ``TopicController`` decides on.
    ``value_schema`` makes the topic typed (an Arrow schema of the value's columns)."""

    name: str
    num_partitions: int
    replication_factor: int = 1
    config: dict[str, Any] = field(default_factory=dict)
    value_schema: pa.Schema | None = None


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class RecordMetadata(NamedTuple):
    """What a producer learns about an acknowledged record (offset -1 with acks=0)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """One record as ``Consumer.poll`` returns it; ``headers`` is ``()`` when it has none.
    ``timestamp_type`` says what ``timestamp`` is: CREATE_TIME (0) or LOG_APPEND_TIME (1), as
    in Kafka (last, so that records built from seven fields keep their meaning)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    timestamp_type: int = CREATE_TIME


def validate_topic_name(name: object) -> str:
    """Kafka's rules: ``[a-zA-Z0-9._-]``, 1..249 characters, not ``.`` or ``..``."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"topic name must be a non-empty string, got {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name {name[:40]!r}... is {len(name)} characters; "
                                f"the limit is {MAX_TOPIC_NAME_LENGTH}")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not TOPIC_NAME_RE.match(name):
        bad = sorted({c for c in name if not TOPIC_NAME_RE.match(c)})
        raise InvalidTopicError(f"topic name {name!r} has illegal character(s) {bad}; "
                                "allowed are ASCII letters, digits, '.', '_' and '-'")
    return name


def validate_partition_count(topic: str, count: object) -> int:
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise InvalidPartitionsError(
            f"topic {topic!r}: partition count must be a positive integer, got {count!r}")
    if count > 100_000:
        raise InvalidPartitionsError(f"topic {topic!r}: {count} partitions is over 100000")
    return count


class OffsetAndMetadata(NamedTuple):
    """A committed offset: the next offset to consume, the committer's note, and when."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
