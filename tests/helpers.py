"""Helpers shared by every kind of test.

Owns: the one bounded wait on a condition (``wait_for``), how many rounds a randomised fault
test runs (``fault_rounds``: fewer in the suite, more with LOGSTORE_DEEP_FAULTS=1), and the
peak resident size of this process over a block (``PeakRss``, for tests and benchmarks of
bounded memory). The replayable seed of randomised
tests is the ``seed`` fixture in tests/conftest.py. Must not: start processes or servers
(tests/brokers.py, tests/zookeeper.py do) or know about clusters (tests/faults/cluster.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 30.0
POLL_S = 0.05
DEEP_FAULTS_VARIABLE = "LOGSTORE_DEEP_FAULTS"


def fault_rounds(quick: int, deep: int) -> int:
    """How many kills or failover rounds a randomised fault test runs: ``quick`` in the
    suite (each run draws a fresh seed, so the runs add up to the coverage, and the suite
    stays inside its time budget), ``deep`` with LOGSTORE_DEEP_FAULTS=1."""
    return deep if os.environ.get(DEEP_FAULTS_VARIABLE, "").strip() not in ("", "0") else quick


def wait_for(condition: Callable[[], T], what: str, timeout_s: float = WAIT_S,
             tolerate: tuple[type[Exception], ...] = ()) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; AssertionError
    naming ``what`` after ``timeout_s``. An exception of a ``tolerate`` type counts as "not
    yet" (the last one is named in the timeout message); any other propagates at once."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except tolerate as e:
            last_error = e
        # The condition is on another process's state: there is nothing to block on.
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}"
                         + (f" (last error: {last_error})" if last_error else ""))


def rss_bytes() -> int:
    """This process's resident size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakRss:
    """The largest resident size seen while the block runs (sampled every 20 ms)."""

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
