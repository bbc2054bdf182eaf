"""The consumer's fetch sessions (``client/fetch_session.py``) without a broker.

Goal: a session that could not be opened is retried after the backoff while its target is
wanted, and forgotten once it is not (its partitions' leader moved), so that waiting for
frames blocks for the whole timeout again instead of spinning on a retry that never comes.
Method: a metadata stand-in whose connections all fail with a retriable error.
"""

from __future__ import annotations

from typing import Any

import pytest

from logstore.client import fetch_session
from logstore.client.fetch_session import FetchSessions, FetchTarget, SessionSettings
from logstore.errors import NetworkError
from logstore.model import TopicPartition


class DeadBrokers:
    """Every broker unreachable; a metadata refresh learns nothing."""

    def __init__(self) -> None:
        self.opened: list[int] = []

    def broker_connection(self, broker_id: int) -> Any:
        self.opened.append(broker_id)
        raise NetworkError(f"broker {broker_id} is down")

    def refresh(self, topics: list[str] | None = None) -> None:
        pass


def test_a_target_no_longer_wanted_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_session, "RETRY_BACKOFF_S", 3600.0)  # no retry falls due here
    metadata = DeadBrokers()
    sessions = FetchSessions(metadata,  # type: ignore[arg-type]
                             SessionSettings(1 << 20, 1 << 20, 1 << 20, 0))
    tp = TopicPartition("t", 0)
    sessions.sync({FetchTarget(2, "t"): {tp: 5}})
    assert metadata.opened == [2]
    assert sessions.retry_pending()
    sessions.sync({FetchTarget(2, "t"): {tp: 5}})  # within the backoff: not yet
    assert metadata.opened == [2]

    sessions.sync({})  # the leader moved away: nothing to open again
    assert not sessions.retry_pending()
    assert sessions.wait(0.01) == []
