"""Messages of the fetch path: the DoGet ticket and the summary that ends the stream.

Owns: the declaration of these bodies. A fetch's ticket is a ``FetchRequest``; the stream's
batches carry binary batch metadata (``rpc/codec.py``), then one empty batch carries the
``FetchSummary`` (per-partition error, high watermark, log start and end offsets, the last stable offset,
for read_committed the aborted transactions overlapping the batches sent, and a
``stream_error`` when the broker could not send everything it read). The same request serves
consumers (``replica_id`` -1), followers (``replica_id`` = their broker id, and per partition
the ``topic_id`` of their replica) and Spark tasks (``end_offset`` bounds a range). Must not: do
I/O.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from logstore.messages.base import (
    BrokerId,
    ErrorFields,
    Int64,
    LeaderEpoch,
    Message,
    PartitionId,
    Request,
    TimeoutMs,
)

DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
IsolationLevelField = Annotated[int, msgspec.Meta(ge=READ_UNCOMMITTED, le=READ_COMMITTED)]


class AbortedTransaction(Message, frozen=True, kw_only=True):
    """An aborted transaction overlapping a read_committed fetch's range: its producer, the
    offset of its first batch and (unlike Kafka's wire form) the offset of its ABORT marker,
    so a reader can filter without seeing the marker."""

    producer_id: int
    first_offset: int
    last_offset: int = -1


class FetchPartitionSummary(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    high_watermark: int = -1
    log_start_offset: int = -1  # over both tiers of a tiered partition
    log_end_offset: int = -1
    local_log_start_offset: int = -1  # the leader's local tier (followers keep to it)
    last_stable_offset: int = -1
    aborted_transactions: list[AbortedTransaction] = []  # read_committed fetches only


class FetchSummary(Message, frozen=True, kw_only=True):
    partitions: list[FetchPartitionSummary]
    stream_error: ErrorFields | None = None


class FetchPartition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    offset: Int64
    max_bytes: int | None = None  # None: the request's max_bytes
    current_leader_epoch: LeaderEpoch = -1  # the epoch the fetcher saw (-1: unchecked)
    end_offset: Int64 | None = None  # a range reader's end: no batch starting at or after it
    # The topic id of the fetcher's copy (a follower's replica; None: unchecked, as from a peer
    # that predates the field). The leader answers INCONSISTENT_TOPIC_ID when its replica's log
    # is of another incarnation of the topic (deleted and created again under its name).
    topic_id: str | None = None


class FetchRequest(Request[FetchSummary], frozen=True, kw_only=True, tag=0):
    """Batches of one topic's partitions from the given offsets."""

    ACTION: ClassVar[str] = "fetch"
    RESPONSE: ClassVar[type[Message]] = FetchSummary
    topic: str
    partitions: list[FetchPartition]
    max_wait_ms: TimeoutMs = 500
    min_bytes: int = 1
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES  # <= 0 is INVALID_FETCH_SIZE
    isolation_level: IsolationLevelField = READ_UNCOMMITTED
    replica_id: BrokerId = -1
