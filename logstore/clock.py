"""Time as an injectable object, so that storage and replication can be tested with a fake clock.

Must not: do anything but tell time and sleep.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time_ms(self) -> int: ...

    def monotonic_ms(self) -> float: ...


class SystemClock:
    """The real clock."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0


class FakeClock:
    """A clock that moves only when told to; both readings move together."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def time_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> float:
        return float(self._now)

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms
