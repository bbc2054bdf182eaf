"""One broker's ZooKeeper session and the kazoo calls made on it.

Owns: the kazoo client (its reconnect backoff, and with ``zk_set_acl`` the digest identity it
authenticates with and the ACL of every znode it creates), connecting it (creating the chroot
first), and running each call once connected, all bounded by the session timeout: connection
trouble becomes the retriable ``RequestTimedOutError``; a transaction's failure is reported as
the error of the operation that failed it. Must not: know the znode layout's meaning, cache,
or act on watches (``zookeeper.py`` does, through the ``on_watch`` it hands in).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl

from logstore.errors import ApiError, RequestTimedOutError, UnknownServerError

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 100
RECONNECT_MAX_DELAY_S = 1.0
_CONNECTION_ERRORS = (KazooTimeoutError, ConnectionLoss, SessionExpiredError,
                      ConnectionClosedError)
_ROLLED_BACK = (RolledBackError, RuntimeInconsistency)


def _failure(results: list[Any]) -> Exception | None:
    """The operation that failed a transaction (the others report that they rolled back)."""
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, _ROLLED_BACK):
            return r
    return None


@dataclass(frozen=True, slots=True)
class ZkDigest:
    """The digest identity brokers authenticate to ZooKeeper with (``zk_set_acl``)."""

    username: str
    password: str = field(repr=False)


class ZkSession:
    """The kazoo client of ``hosts`` + ``chroot``; ``connected`` is set while it is."""

    def __init__(self, hosts: str, chroot: str | None, broker_id: int, timeout_s: float,
                 digest: ZkDigest | None, on_watch: Callable[[WatchedEvent], None]) -> None:
        self.hosts, self.chroot = hosts, chroot
        self.broker_id = broker_id
        self.timeout_s = timeout_s
        self._digest = digest
        self.on_watch = on_watch
        self.client = self._new_client(hosts + (chroot or ""))
        self.connected = threading.Event()

    def _new_client(self, hosts: str) -> KazooClient:
        # Reconnect attempts back off to at most a second, so a restarted ZooKeeper is found
        # again well inside the session timeout (kazoo's default backoff grows to an hour).
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=RECONNECT_MAX_DELAY_S)
        if self._digest is None:
            return KazooClient(hosts=hosts, timeout=self.timeout_s, connection_retry=retry)
        d = self._digest
        return KazooClient(hosts=hosts, timeout=self.timeout_s, connection_retry=retry,
                           auth_data=[("digest", f"{d.username}:{d.password}")],
                           default_acl=[make_digest_acl(d.username, d.password, all=True),
                                        make_acl("world", "anyone", read=True)])

    def sensitive_acl(self) -> list[Any] | None:
        """The ACL of znodes only the brokers may read (None: ZooKeeper's open default)."""
        if self._digest is None:
            return None
        return [make_digest_acl(self._digest.username, self._digest.password, all=True)]

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password) of the current session."""
        return self.client.client_id  # type: ignore[no-any-return]

    def start(self) -> None:
        """Connect (creating the chroot first); raises RequestTimedOutError if that fails."""
        if self.chroot:
            self._create_chroot()
        self._connect(self.client)

    def _create_chroot(self) -> None:
        client = self._new_client(self.hosts)
        self._connect(client)
        try:
            self.wait(client.ensure_path_async(self.chroot), f"create chroot {self.chroot}",
                      self.timeout_s)
        finally:
            client.stop()
            client.close()

    def _connect(self, client: KazooClient) -> None:
        try:
            client.start(timeout=self.timeout_s)
        except KazooTimeoutError:
            raise RequestTimedOutError(
                f"could not connect to ZooKeeper at {self.hosts} within "
                f"{self.timeout_s * 1000:.0f} ms") from None

    def stop(self) -> None:
        self.client.stop()
        self.client.close()

    def op(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an asynchronous kazoo call once connected, all bounded by the session timeout.
        Waiting for the connection first (as Kafka's ZooKeeper client does) keeps kazoo from
        queueing a request that it would send after we have given up on it."""
        start = time.monotonic()
        if not self.connected.wait(self.timeout_s):
            raise RequestTimedOutError(f"ZooKeeper did not {what}: not connected")
        remaining = self.timeout_s - (time.monotonic() - start)
        return self.wait(call(*args, **kwargs), what, max(remaining, 1.0))

    @staticmethod
    def wait(result: Any, what: str, timeout_s: float) -> Any:
        try:
            return result.get(timeout=timeout_s)
        except _CONNECTION_ERRORS as e:
            raise RequestTimedOutError(f"ZooKeeper did not {what}: {type(e).__name__}") from None

    def get(self, path: str, watch: bool = False) -> tuple[bytes, Any]:
        data: tuple[bytes, Any] = self.op(f"read {path}", self.client.get_async, path,
                                          self.on_watch if watch else None)
        return data

    def get_or_none(self, path: str, watch: bool = False) -> tuple[bytes, Any] | None:
        """Data and stat, or None if the znode does not exist (a read after its parent was
        listed may find it gone; the parent's watch reports that)."""
        try:
            return self.get(path, watch)
        except NoNodeError:
            return None

    def children(self, path: str, watch: bool = False) -> list[str]:
        children: list[str] = self.op(f"list {path}", self.client.get_children_async, path,
                                      self.on_watch if watch else None)
        return children

    def transaction(self) -> Any:
        return self.client.transaction()

    def commit(self, tx: Any, what: str) -> Exception | None:
        """Commit a transaction; the error of the operation that failed it, or None."""
        return _failure(self.op(what, tx.commit_async))

    def create_if_missing(self, path: str, data: bytes) -> None:
        with contextlib.suppress(NodeExistsError):
            self.op(f"create {path}", self.client.create_async, path, data)

    def owned_by_us(self, path: str) -> bool:
        """Whether ``path`` is an ephemeral znode of this session."""
        found = self.get_or_none(path)
        return found is not None and found[1].ephemeralOwner == self.client.client_id[0]

    def unexpected(self, error: Exception, what: str) -> ApiError:
        log.error("broker %d: ZooKeeper refused to %s: %r", self.broker_id, what, error)
        return UnknownServerError(f"ZooKeeper refused to {what}: {type(error).__name__}")
