"""The consumer's fetch sessions (``client/fetch_session.py``) without a broker.

Goal: a session that could not be opened is retried after the backoff while its target is
wanted, and forgotten once it is not (its partitions' leader moved), so that waiting for
frames blocks for the whole timeout again instead of spinning on a retry that never comes;
credit goes back to the broker in grants of at least a quarter of the window, except that
everything owed is granted when the consumer is about to wait while it holds half of the
window or more; every frame that arrived together is handled before an error one of them
raised reaches the caller. Method: metadata stand-ins
whose connections all fail with a retriable error, or open a session stream that records
the frames sent on it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from logstore.client import fetch_session
from logstore.client.fetch_session import FetchSessions, FetchTarget, SessionSettings
from logstore.client.fetcher import FetchConfig, Fetcher
from logstore.errors import ApiError, NetworkError, OffsetOutOfRangeError
from logstore.messages import error_kw
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionPartitionEnd,
    FetchSessionUpdated,
)
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


class RecordingStream:
    """A session stream that pushes nothing until closed and keeps the frames sent on it."""

    where = "broker 1"

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self._closed = threading.Event()

    def send(self, frame: Any) -> None:
        self.sent.append(frame)

    def read(self) -> None:
        self._closed.wait(30)
        return None

    def close(self) -> None:
        self._closed.set()


class OneBroker:
    """Every session opens on a ``RecordingStream``."""

    def __init__(self) -> None:
        self.stream = RecordingStream()

    def broker_connection(self, broker_id: int) -> Any:
        return self

    def open_fetch_session(self, request: Any) -> RecordingStream:
        return self.stream


def test_credit_goes_back_a_quarter_window_at_a_time_or_before_a_wait_on_half_a_window(
        ) -> None:
    """Goal: a drain owes its bytes without a stream write until a quarter of the window is
    owed; a consumer about to wait grants what it owes only while it holds half of the window
    or more (below that the broker can still push); nothing owed, no grant. Method: one
    session on a stream that records its frames; bytes received, owed and granted by hand."""
    metadata = OneBroker()
    window = 1000
    sessions = FetchSessions(metadata,  # type: ignore[arg-type]
                             SessionSettings(window, window, window, 0))
    target = FetchTarget(1, "t")
    sessions.sync({target: {TopicPartition("t", 0): 0}})
    session = sessions._sessions[target]
    try:
        def credits() -> list[int]:
            return [f.credit_bytes for f in metadata.stream.sent
                    if isinstance(f, FetchSessionCredit)]

        session.received(300)
        for _ in range(3):  # drained batches of 80 bytes: owed, not yet worth a grant
            session.owe(80)
            sessions.grant_owed()
        assert credits() == []
        session.owe(10)  # 250 owed: a quarter of the window
        sessions.grant_owed()
        assert credits() == [250]
        session.owe(30)  # 50 held: the broker has 950 to push, no need to grant to wait
        sessions.grant_owed(waiting=True)
        assert credits() == [250]
        session.received(600)  # 650 held, 30 of them owed: about to wait, so grant them
        sessions.grant_owed()
        assert credits() == [250]
        sessions.grant_owed(waiting=True)
        assert credits() == [250, 30]
        sessions.grant_owed(waiting=True)  # nothing owed: no empty grant
        assert credits() == [250, 30]
    finally:
        sessions.close()


class FramesAtOnce:
    """A FetchSessions stand-in whose one wait() hands back the frames given."""

    def __init__(self, frames: list[tuple[Any, Any]]) -> None:
        self.frames = frames
        self.grants = 0

    def wait(self, timeout_s: float) -> list[tuple[Any, Any]]:
        frames, self.frames = self.frames, []
        return frames

    def accepts(self, session: Any, tp: TopicPartition) -> bool:
        return True

    def left(self, tp: TopicPartition) -> None:
        pass

    def grant_owed(self, waiting: bool = False) -> None:
        self.grants += 1


class UpdatesSeen:
    """A session stand-in that records the updates the broker said it applied."""

    target = FetchTarget(1, "t")

    def __init__(self) -> None:
        self.applied: list[int] = []

    def applied_update(self, frame: FetchSessionUpdated) -> None:
        self.applied.append(frame.seq)


def test_frames_after_one_that_raises_are_still_handled() -> None:
    """Goal: when a partition's end (OFFSET_OUT_OF_RANGE, no reset policy) raises in the
    consumer, the frames that came with it are handled first (they hold other partitions'
    records, which the broker will not push again; dropping them lost records), and the
    credit is still granted. Method: one wait() returns the end frame, then an update frame
    standing for the rest; the out-of-range answer raises."""
    def no_reset(tp: TopicPartition, error: ApiError) -> None:
        raise error

    fetcher = Fetcher(None, FetchConfig(fetch_session=False), no_reset)  # type: ignore[arg-type]
    session = UpdatesSeen()
    sessions = FramesAtOnce([
        (session, FetchSessionPartitionEnd(partition=0, **error_kw(
            OffsetOutOfRangeError("offset 99 is past the end of t-0")))),
        (session, FetchSessionUpdated(seq=7))])
    try:
        with pytest.raises(OffsetOutOfRangeError, match="past the end"):
            fetcher._take_frames(sessions, 0.0)  # type: ignore[arg-type]
        assert session.applied == [7]
        assert sessions.grants == 1
    finally:
        fetcher.close()
