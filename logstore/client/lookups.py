"""Offset lookups (``list_offsets``) with Kafka's retry rules, for the consumer and the admin.

Owns: asking a partition's leader for an offset (EARLIEST, LATEST or a timestamp) and asking
again while the error is retriable: a leader that moved or cannot be reached (a failover under
way: the metadata is refreshed and the new leader asked), or a new leader that does not know
its end yet (OFFSET_NOT_AVAILABLE: asked again as it is), for up to a deadline, as Kafka's
``endOffsets`` waits out a leader election; a topic or partition the metadata does not know is
asked about LEADER_ATTEMPTS times only (``try_again``, also used by Spark's planner for its
requests to leaders). Must not: raise the entry's own error (callers decide how to name it)
or cache answers.
"""

from __future__ import annotations

import time
from typing import Protocol

from logstore.errors import ApiError, UnknownTopicOrPartitionError
from logstore.messages.fetch import READ_UNCOMMITTED
from logstore.messages.log import (
    ListOffsetsPartition,
    ListOffsetsPartitionResult,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from logstore.model import TopicPartition

LEADER_ATTEMPTS = 5  # lookups of a partition the metadata does not know
LOOKUP_BACKOFF_MAX_S = 0.5  # the longest pause between tries


class _Connection(Protocol):
    def call(self, request: ListOffsetsRequest) -> ListOffsetsResponse: ...


class Leaders(Protocol):
    """What a lookup needs of the cluster metadata."""

    def leader_connection(self, tp: TopicPartition) -> _Connection: ...

    def refresh(self, topics: list[str] | None = None) -> None: ...


def list_offset(metadata: Leaders, tp: TopicPartition, timestamp: int, timeout_s: float,
                isolation_level: int = READ_UNCOMMITTED) -> ListOffsetsPartitionResult:
    """``tp``'s answer for ``timestamp`` from its leader, asked again as the module docstring
    says; the last answer when its error is not retriable or the time is up (an error raised
    on the way, such as an unreachable broker, is raised then)."""
    request = ListOffsetsRequest(topic=tp.topic, partitions=[
        ListOffsetsPartition(partition=tp.partition, timestamp=timestamp)],
        isolation_level=isolation_level)
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        try:
            entry = metadata.leader_connection(tp).call(request).partitions[0]
            error = entry.error()
            if error is None or not try_again(error, attempt, deadline):
                return entry
        except ApiError as e:
            if not try_again(e, attempt, deadline):
                raise
            error = e
        if error.refresh_metadata:
            metadata.refresh([tp.topic])
        attempt += 1
        time.sleep(backoff_s(attempt))


def try_again(error: ApiError, attempt: int, deadline: float) -> bool:
    """Whether a lookup that failed with ``error`` on try ``attempt`` (from 0) is made again
    (the module docstring's rules; ``deadline`` on the monotonic clock)."""
    if not error.retriable:
        return False
    if isinstance(error, UnknownTopicOrPartitionError):
        return attempt < LEADER_ATTEMPTS - 1
    return time.monotonic() < deadline


def backoff_s(attempt: int) -> float:
    """The pause before try ``attempt`` (from 1): 50 ms more each time, up to
    LOOKUP_BACKOFF_MAX_S."""
    return min(0.05 * attempt, LOOKUP_BACKOFF_MAX_S)
