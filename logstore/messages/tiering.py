"""Messages of tiered storage: each partition's two tiers as ``topics describe`` shows them,
and the FINISHED remote segments of offset ranges, which Spark's driver hands to executors so
that they read object storage themselves.

Owns: the declaration of these requests and responses. Must not: do I/O.

``list_remote_segments`` answers with the store's URL and its fsspec options as the leader
knows them (the options never hold credentials: the broker refuses such keys), and per
partition the readable segments overlapping the asked range, each with what an executor needs
to read it (``tiering.metadata.RemoteLogSegmentMetadata``'s fields and the segment object's
key).
"""

from __future__ import annotations

from typing import Any, ClassVar

from logstore.messages.base import ErrorFields, Int64, Message, PartitionId, Request

# -- describe_log_tiers ----------------------------------------------------------------------


class LogTierPartition(ErrorFields, frozen=True, kw_only=True):
    """One partition's offsets over both tiers and its remote tier's state (the remote fields
    are 0 for a partition that is not tiered)."""

    partition: PartitionId
    remote_storage_enable: bool = False
    log_start_offset: int = -1  # over both tiers
    local_log_start_offset: int = -1
    high_watermark: int = -1
    log_end_offset: int = -1
    last_stable_offset: int = -1
    remote_segments: int = 0
    remote_bytes: int = 0
    copy_lag_segments: int = 0  # sealed local segments not yet copied
    copy_lag_bytes: int = 0


class DescribeLogTiersResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[LogTierPartition]


class DescribeLogTiersRequest(Request[DescribeLogTiersResponse], frozen=True, kw_only=True,
                              tag=0):
    """Per led partition: log start offsets (both tiers, local), remote bytes and segments,
    copy lag."""

    ACTION: ClassVar[str] = "describe_log_tiers"
    RESPONSE: ClassVar[type[Message]] = DescribeLogTiersResponse
    topic: str
    partitions: list[PartitionId]


# -- list_remote_segments --------------------------------------------------------------------


class RemoteSegmentEntry(Message, frozen=True, kw_only=True):
    """A FINISHED remote segment: offsets ``[base_offset, end_offset]`` (Kafka's inclusive
    end), the size of its segment object, and that object's key under the store's URL."""

    topic_id: str
    segment_id: str
    base_offset: Int64
    end_offset: Int64
    max_timestamp: int
    size_bytes: Int64
    leader_epoch: int
    epochs: list[list[int]]  # [[epoch, start offset], ...]
    key: str
    # Whether a .txnindex object was copied with it (None: not known, an older entry).
    txn_index: bool | None = None


class RemoteSegmentsPartition(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    log_start_offset: int = -1
    local_log_start_offset: int = -1
    segments: list[RemoteSegmentEntry] = []


class ListRemoteSegmentsResponse(Message, frozen=True, kw_only=True):
    topic: str
    remote_storage_uri: str | None = None
    remote_storage_options: dict[str, Any] = {}
    partitions: list[RemoteSegmentsPartition]


class RemoteSegmentsRange(Message, frozen=True, kw_only=True):
    partition: PartitionId
    start_offset: Int64
    end_offset: Int64  # exclusive


class ListRemoteSegmentsRequest(Request[ListRemoteSegmentsResponse], frozen=True,
                                kw_only=True, tag=0):
    """The readable remote segments holding offsets of ``[start_offset, end_offset)`` per
    partition, by base offset (copies may overlap after a leader change)."""

    ACTION: ClassVar[str] = "list_remote_segments"
    RESPONSE: ClassVar[type[Message]] = ListRemoteSegmentsResponse
    topic: str
    partitions: list[RemoteSegmentsRange]
