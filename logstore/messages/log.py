"""Messages about partitions' logs: list offsets, log directories, high-watermark long polls,
and the broker's own counters.

Owns: the declaration of these requests and responses. Must not: do I/O.
"""

from __future__ import annotations

from typing import ClassVar

from logstore.messages.base import (
    BrokerId,
    ErrorFields,
    Int64,
    Message,
    Offset,
    PartitionId,
    Request,
    TimeoutMs,
)
from logstore.messages.fetch import IsolationLevelField

# -- list offsets ----------------------------------------------------------------------------


class ListOffsetsPartition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    timestamp: Int64  # EARLIEST (-2), LATEST (-1) or a timestamp in ms


class ListOffsetsPartitionResult(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    offset: int = -1
    timestamp: int = -1


class ListOffsetsResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[ListOffsetsPartitionResult]


class ListOffsetsRequest(Request[ListOffsetsResponse], frozen=True, kw_only=True, tag=0):
    """Per partition: the earliest offset, the latest (the high watermark, or with
    ``isolation_level`` READ_COMMITTED (1) the last stable offset), or the first offset whose
    record is at or after a timestamp."""

    ACTION: ClassVar[str] = "list_offsets"
    RESPONSE: ClassVar[type[Message]] = ListOffsetsResponse
    topic: str
    partitions: list[ListOffsetsPartition]
    isolation_level: IsolationLevelField = 0


# -- log directories -------------------------------------------------------------------------


class LogDirPartition(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    path: str | None = None  # the partition's directory on the leader's disk
    incarnation: str | None = None  # proves a reader sees this broker's disk (file_reader.py)
    log_start_offset: int = -1  # over both tiers of a tiered partition
    high_watermark: int = -1
    local_log_start_offset: int = -1  # the first offset the directory's files hold
    last_stable_offset: int = -1
    # The topic id of the leader's replica, which these offsets are of (None: a broker that
    # predates the field): a stream tells a topic recreated under its name by it.
    topic_id: str | None = None


class DescribeLogDirsResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[LogDirPartition]


class DescribeLogDirsRequest(Request[DescribeLogDirsResponse], frozen=True, kw_only=True,
                             tag=0):
    """Where a led partition's files are, so a reader on this machine can map them."""

    ACTION: ClassVar[str] = "describe_log_dirs"
    RESPONSE: ClassVar[type[Message]] = DescribeLogDirsResponse
    topic: str
    partitions: list[PartitionId]


# -- high-watermark long poll ----------------------------------------------------------------


class PartitionPosition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    offset: Offset


class PartitionHighWatermark(Message, frozen=True, kw_only=True):
    partition: PartitionId
    high_watermark: int


class AwaitHighWatermarksResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[PartitionHighWatermark]


class AwaitHighWatermarksRequest(Request[AwaitHighWatermarksResponse], frozen=True,
                                 kw_only=True, tag=0):
    """Answer once a partition's high watermark passes its given offset, or after
    ``max_wait_ms``, with the high watermarks of the partitions this broker leads."""

    ACTION: ClassVar[str] = "await_high_watermarks"
    RESPONSE: ClassVar[type[Message]] = AwaitHighWatermarksResponse
    topic: str
    partitions: list[PartitionPosition]
    max_wait_ms: TimeoutMs = 0


# -- broker counters -------------------------------------------------------------------------


class BrokerStatsResponse(Message, frozen=True, kw_only=True):
    broker_id: BrokerId
    fetch_requests: int
    fetch_batches: int
    fetch_bytes: int
    actions: dict[str, int]
    fetch_sessions: int = 0  # open now
    fetch_sessions_opened: int = 0  # since the broker started
    fetch_session_pushed_bytes: int = 0  # by every session since the broker started
    # Pushed and not yet granted back by the clients of the open sessions: what their
    # credit bounds (a client that stops granting stops the pushes).
    fetch_session_unacknowledged_bytes: int = 0


class BrokerStatsRequest(Request[BrokerStatsResponse], frozen=True, kw_only=True, tag=0):
    """Counters of this broker's fetches and actions since it started (tests and tools)."""

    ACTION: ClassVar[str] = "broker_stats"
    RESPONSE: ClassVar[type[Message]] = BrokerStatsResponse
