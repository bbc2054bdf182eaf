"""Requests to the coordinator of one key: a group's or a transactional id's.

Owns: finding the coordinator (find_coordinator with Kafka's key types), sending a typed
request to it, and retrying what the error flags say may pass (NOT_COORDINATOR and
COORDINATOR_NOT_AVAILABLE after finding it again, COORDINATOR_LOAD_IN_PROGRESS and
CONCURRENT_TRANSACTIONS after a backoff) until a deadline. Must not: know what the requests
mean (``group.py``, ``transactions.py`` do) or reach into broker internals.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TypeVar

from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError
from logstore.messages import ErrorFields, Message, Request
from logstore.messages.groups import FindCoordinatorRequest
from logstore.rpc.client import BrokerConnection

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
BACKOFF_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


class CoordinatorClient:
    """Thread-safe."""

    def __init__(self, metadata: ClusterMetadata, key: str, key_type: int,
                 timeout_s: float = 60.0) -> None:
        self._metadata = metadata
        self.key = key
        self._key_type = key_type
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._coordinator: BrokerConnection | None = None

    def connection(self) -> BrokerConnection:
        with self._lock:
            if self._coordinator is None:
                found = self._metadata.call(FindCoordinatorRequest(
                    group_id=self.key, key_type=self._key_type))
                found.raise_error()
                self._coordinator = self._metadata.connection(f"{found.host}:{found.port}")
            return self._coordinator

    def forget(self) -> None:
        with self._lock:
            self._coordinator = None

    def call(self, request: Request[R], timeout_s: float | None = None) -> R:
        """``request`` on the coordinator; its top-level error raised once it is not
        retriable or the time (``timeout_s``, else the client's) is up."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        attempt = 0
        while True:
            try:
                response = self.connection().call(request)
                if isinstance(response, ErrorFields):
                    response.raise_error()
                return response
            except ApiError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    raise
                if e.refresh_metadata:
                    self.forget()
                log.debug("%s for %r: retrying after %s", request.ACTION, self.key, e)
                time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                attempt += 1
