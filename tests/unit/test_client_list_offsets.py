"""The consumer's and the admin's offset lookups (``Fetcher.list_offsets``: ``end_offsets``,
``beginning_offsets``, ``offsets_for_times``; ``Admin.list_offsets``) across a leader
failover, without a broker.

Goal: a lookup made while its partition's leader is dead waits for the new leader, as Kafka's
``endOffsets`` does, for up to the consumer's request timeout; so does one a new leader answers
with OFFSET_NOT_AVAILABLE (it does not know its end yet), with no metadata refresh; a topic the
cluster does not know still fails after a few tries; an error that is not retriable fails at
once. Method: a metadata stand-in whose leader connection fails a given number of times before
answering.
"""

from __future__ import annotations

from typing import Any

import pytest

from logstore.client import lookups
from logstore.client.admin import Admin
from logstore.client.fetcher import FetchConfig, Fetcher
from logstore.client.lookups import LEADER_ATTEMPTS
from logstore.errors import (
    ApiError,
    InvalidRequestError,
    NetworkError,
    OffsetNotAvailableError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import error_kw
from logstore.messages.log import ListOffsetsPartitionResult, ListOffsetsResponse
from logstore.model import TopicPartition

TP = TopicPartition("t", 0)


class Connection:
    def __init__(self, error: ApiError | None = None) -> None:
        self.error = error

    def call(self, request: Any) -> ListOffsetsResponse:
        if self.error is not None:
            return ListOffsetsResponse(topic=TP.topic, partitions=[
                ListOffsetsPartitionResult(partition=TP.partition, **error_kw(self.error))])
        return ListOffsetsResponse(topic=TP.topic, partitions=[
            ListOffsetsPartitionResult(partition=TP.partition, offset=42, timestamp=-1)])


class FailingLeader:
    """``failures`` lookups fail with ``error`` (the dead leader, then no leader while the
    controller elects one); the next ones reach the new leader."""

    def __init__(self, failures: int, error: ApiError, answered: bool = False) -> None:
        self.failures = failures
        self.error = error
        self.answered = answered  # the error comes in the leader's answer, not raised
        self.tries = 0
        self.refreshes = 0

    def leader_connection(self, tp: TopicPartition) -> Connection:
        self.tries += 1
        if self.tries <= self.failures:
            if self.answered:
                return Connection(self.error)
            raise self.error
        return Connection()

    def refresh(self, topics: list[str] | None = None) -> None:
        self.refreshes += 1


def lookup(metadata: FailingLeader, timeout_s: float = 30.0) -> dict[TopicPartition, int]:
    fetch = Fetcher(metadata, FetchConfig(fetch_session=False,  # type: ignore[arg-type]
                                          lookup_timeout_s=timeout_s), lambda tp, e: None)
    return {tp: o for tp, (o, _) in fetch.list_offsets([TP], -1).items()}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookups, "LOOKUP_BACKOFF_MAX_S", 0.0)


def test_a_lookup_waits_out_a_failover_longer_than_the_leader_attempts() -> None:
    metadata = FailingLeader(3 * LEADER_ATTEMPTS, NetworkError("127.0.0.1:1: connection refused"))
    assert lookup(metadata) == {TP: 42}
    assert metadata.refreshes == 3 * LEADER_ATTEMPTS


def test_a_lookup_gives_up_at_the_request_timeout() -> None:
    metadata = FailingLeader(10**9, NetworkError("127.0.0.1:1: connection refused"))
    with pytest.raises(NetworkError, match="connection refused"):
        lookup(metadata, timeout_s=0.2)


def test_an_unknown_topic_fails_after_the_leader_attempts() -> None:
    metadata = FailingLeader(10**9, UnknownTopicOrPartitionError("t-0 is not known"))
    with pytest.raises(UnknownTopicOrPartitionError):
        lookup(metadata)
    assert metadata.tries == LEADER_ATTEMPTS


def test_an_error_that_is_not_retriable_fails_at_once() -> None:
    metadata = FailingLeader(10**9, InvalidRequestError("bad request"))
    with pytest.raises(InvalidRequestError):
        lookup(metadata)
    assert metadata.tries == 1


def test_a_new_leader_that_does_not_know_its_end_yet_is_asked_again_without_a_refresh(
        ) -> None:
    metadata = FailingLeader(3, OffsetNotAvailableError("t-0: high watermark not yet known"),
                             answered=True)
    assert lookup(metadata) == {TP: 42}
    assert (metadata.tries, metadata.refreshes) == (4, 0)


def test_the_admin_asks_again_across_a_failover_too() -> None:
    admin = Admin.__new__(Admin)
    admin._metadata = FailingLeader(  # type: ignore[assignment]
        3 * LEADER_ATTEMPTS, NetworkError("127.0.0.1:1: connection refused"))
    admin._timeout_s = 30.0
    assert admin.list_offsets({TP: -1}) == {TP: 42}
    admin._metadata = FailingLeader(10**9, OffsetNotAvailableError(  # type: ignore[assignment]
        "t-0: high watermark not yet known"), answered=True)
    admin._timeout_s = 0.2
    with pytest.raises(OffsetNotAvailableError, match="list_offsets of t-0"):
        admin.list_offsets({TP: -1})
