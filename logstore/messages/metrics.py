"""Messages for operability: consumer lag, the timestamps behind it, and a broker's metrics
snapshot (what ``logstore top`` shows).

| action                  | asked of                    | answers                                      |
|-------------------------|-----------------------------|----------------------------------------------|
| describe_group_lag      | the group's coordinator     | per (topic, partition): committed offset,    |
|                         |                             | log end offset, lag, lag in seconds          |
| offset_timestamps       | a partition's leader (by    | per partition: high watermark, and the       |
|                         | the coordinators)           | timestamp of the record at an offset         |
| describe_broker_metrics | any broker, about itself    | counters per topic, partition and controller |
|                         |                             | figures, and the groups it coordinates       |

Owns: the declaration of these requests and responses. Must not: do I/O.
"""

from __future__ import annotations

from typing import ClassVar

from logstore.messages.base import (
    BrokerId,
    ErrorFields,
    Message,
    Offset,
    PartitionId,
    Request,
)

# -- consumer lag ----------------------------------------------------------------------------


class PartitionLagEntry(ErrorFields, frozen=True, kw_only=True):
    """One partition of a group's lag. ``log_end_offset`` is the high watermark (what a
    consumer can read, as Kafka's tools report it); ``lag_seconds`` is how old the first
    record not yet committed is (0 with no lag; None when its timestamp is unknown)."""

    topic: str
    partition: PartitionId
    committed_offset: int
    log_end_offset: int = -1
    lag: int = -1
    lag_seconds: float | None = None


class DescribeGroupLagResponse(ErrorFields, frozen=True, kw_only=True):
    group_id: str
    partitions: list[PartitionLagEntry] = []


class DescribeGroupLagRequest(Request[DescribeGroupLagResponse], frozen=True, kw_only=True,
                              tag=0):
    """A group's lag per committed partition, computed by its coordinator."""

    ACTION: ClassVar[str] = "describe_group_lag"
    RESPONSE: ClassVar[type[Message]] = DescribeGroupLagResponse
    group_id: str


class OffsetTimestampEntry(ErrorFields, frozen=True, kw_only=True):
    """``timestamp`` is the one of the first record at or after the offset asked about
    (-1 when there is none below the high watermark, or it is not in the local log)."""

    partition: PartitionId
    high_watermark: int = -1
    timestamp: int = -1


class OffsetTimestampsResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[OffsetTimestampEntry]


class OffsetPosition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    offset: Offset


class OffsetTimestampsRequest(Request[OffsetTimestampsResponse], frozen=True, kw_only=True,
                              tag=0):
    """Per led partition: its high watermark and the timestamp of the record at an offset
    (the group coordinators' lag in seconds)."""

    ACTION: ClassVar[str] = "offset_timestamps"
    RESPONSE: ClassVar[type[Message]] = OffsetTimestampsResponse
    topic: str
    partitions: list[OffsetPosition]


# -- a broker's snapshot ---------------------------------------------------------------------


class TopicCounters(Message, frozen=True, kw_only=True):
    """Counters since the broker started (or since the topic appeared)."""

    topic: str
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0


class GroupLagSummary(Message, frozen=True, kw_only=True):
    group_id: str
    state: str
    lag: int
    lag_seconds: float | None = None


class DescribeBrokerMetricsResponse(Message, frozen=True, kw_only=True):
    broker_id: BrokerId
    active_controller: bool
    controller_epoch: int
    partitions: int
    leaders: int
    under_replicated: int
    offline: int
    topics: list[TopicCounters]
    groups: list[GroupLagSummary]
    metrics_listener: str | None = None  # where its Prometheus endpoint is, if it has one


class DescribeBrokerMetricsRequest(Request[DescribeBrokerMetricsResponse], frozen=True,
                                   kw_only=True, tag=0):
    """This broker's figures now (what ``logstore top`` shows of it)."""

    ACTION: ClassVar[str] = "describe_broker_metrics"
    RESPONSE: ClassVar[type[Message]] = DescribeBrokerMetricsResponse
    max_groups: int = 10  # the groups it coordinates with the largest lag, at most this many
