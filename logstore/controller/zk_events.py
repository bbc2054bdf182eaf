"""The ZooKeeper store's events thread, which does what kazoo's threads must not (block).

Owns: one daemon thread that takes queued events (cache keys, connection changes) in batches,
so a burst of watches costs one pass, and hands each batch to the store; a batch that failed
with a retriable error is queued again while the store is connected. Must not: import kazoo or
know what an event means.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Hashable

from logstore.errors import RequestTimedOutError

log = logging.getLogger(__name__)

_STOP = object()


class EventsThread:
    def __init__(self, name: str, handle: Callable[[set[Hashable]], None],
                 retry_while: Callable[[], bool]) -> None:
        self._name = name
        self._handle = handle
        self._retry_while = retry_while
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, event: Hashable) -> None:
        self._queue.put(event)

    def stop(self, timeout_s: float) -> None:
        """Ask the thread to end after the batch in hand, and wait up to ``timeout_s``."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if _STOP in batch:
                return
            self._run_batch({e for e in batch if isinstance(e, Hashable)})

    def _run_batch(self, events: set[Hashable]) -> None:
        try:
            self._handle(events)
        except RequestTimedOutError as e:
            log.warning("%s: %s; trying again", self._name, e)
            if self._retry_while():  # else reconnecting queues a full resync anyway
                for event in events:
                    self.put(event)
        except Exception:  # boundary: the next event or reconnection tries again
            log.exception("%s: handling %s failed", self._name, sorted(map(str, events)))
