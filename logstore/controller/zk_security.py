"""Users' SCRAM credentials and ACL bindings in ZooKeeper, in Kafka's layout (``zk_paths.py``).

Owns: reading them all (watched, so another broker's change reaches this one within the
ZooKeeper round trip: well inside a second) into one snapshot that readers share, writing them
with compare-and-set (an ACL znode holds every entry of one resource pattern, so two brokers
adding entries to the same resource both land), and telling the security listeners after each
reload. Credential znodes are sensitive: with ``zk_set_acl`` only the brokers may read them.
Must not: import kazoo (``zk_znodes.py`` implements the ``ZNodes`` seam this uses;
``zookeeper.py`` fires ``reload`` from its watches).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol, TypeVar

from logstore.controller import zk_paths as zp
from logstore.controller.store import Credentials, MetadataListener
from logstore.errors import RequestTimedOutError
from logstore.security.acl import AccessControlEntry, AclBinding, ResourcePattern
from logstore.security.scram import ScramCredential

log = logging.getLogger(__name__)

MAX_CAS_ATTEMPTS = 100
V = TypeVar("V")
Combine = Callable[[set[AccessControlEntry], set[AccessControlEntry]], set[AccessControlEntry]]


class ZNodes(Protocol):
    """The few ZooKeeper operations the security metadata needs (reads leave watches)."""

    def children(self, path: str) -> list[str]:
        """The children of ``path`` (watched); [] if it does not exist."""
        ...

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        """The data of each path (watched, read in one pipelined batch); missing ones are
        left out."""
        ...

    def read(self, path: str) -> tuple[bytes, int] | None:
        """Data and version, unwatched; None if missing."""
        ...

    def create(self, path: str, data: bytes, sensitive: bool) -> bool:
        """False if it exists already."""
        ...

    def write(self, path: str, data: bytes, version: int) -> bool:
        """False if its version moved on, or it is gone."""
        ...

    def delete(self, path: str, version: int) -> bool: ...


class ZkSecurity:
    def __init__(self, nodes: ZNodes) -> None:
        self._nodes = nodes
        self._lock = threading.Lock()
        self._users: Credentials = {}
        self._acls: frozenset[AclBinding] = frozenset()
        self._listeners: list[MetadataListener] = []

    # -- reads -------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read everything again (re-arming the watches), then tell the listeners."""
        users = self._load_users()
        acls = self._load_acls()
        with self._lock:
            self._users, self._acls = users, acls
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # boundary: the change has happened; one listener's trouble
                log.exception("security listener failed")

    def _load_users(self) -> Credentials:
        paths = [f"{zp.USERS}/{child}" for child in self._nodes.children(zp.USERS)]
        return {zp.user_of(path): zp.decode_user(data)
                for path, data in self._nodes.read_many(paths).items()}

    def _load_acls(self) -> frozenset[AclBinding]:
        paths = [f"{parent}/{child}" for parent in zp.ACL_TYPE_PATHS
                 for child in self._nodes.children(parent)]
        return frozenset(b for path, data in self._nodes.read_many(paths).items()
                         for b in zp.decode_acls(zp.acl_pattern_of(path), data))

    def scram_credentials(self) -> Credentials:
        with self._lock:
            return {u: dict(c) for u, c in self._users.items()}

    def acls(self) -> frozenset[AclBinding]:
        with self._lock:
            return self._acls

    def add_listener(self, listener: MetadataListener) -> None:
        self._listeners.append(listener)

    # -- writes ------------------------------------------------------------------------------

    def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        def change(creds: dict[str, ScramCredential]) -> dict[str, ScramCredential]:
            return {**creds, credential.mechanism: credential}
        self._update(zp.user_path(user), zp.decode_user, zp.encode_user, change, True)
        self.reload()

    def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        found: list[bool] = []

        def change(creds: dict[str, ScramCredential]) -> dict[str, ScramCredential]:
            found.append(mechanism in creds)
            return {m: c for m, c in creds.items() if m != mechanism}
        self._update(zp.user_path(user), zp.decode_user, zp.encode_user, change, True)
        self.reload()
        return bool(found and found[-1])

    def add_acls(self, bindings: list[AclBinding]) -> None:
        self._change_acls(bindings, lambda entries, new: entries | new)

    def remove_acls(self, bindings: list[AclBinding]) -> None:
        self._change_acls(bindings, lambda entries, gone: entries - gone)

    def _change_acls(self, bindings: list[AclBinding], combine: Combine) -> None:
        by_pattern: dict[ResourcePattern, set[AccessControlEntry]] = defaultdict(set)
        for b in bindings:
            by_pattern[b.pattern].add(b.entry)
        for pattern, entries in by_pattern.items():
            self._change_pattern(pattern, entries, combine)
        self.reload()

    def _change_pattern(self, pattern: ResourcePattern, entries: set[AccessControlEntry],
                        combine: Combine) -> None:
        def decode(data: bytes) -> set[AccessControlEntry]:
            return {b.entry for b in zp.decode_acls(pattern, data)}

        def encode(current: set[AccessControlEntry]) -> bytes:
            return zp.encode_acls(list(current))
        self._update(zp.acl_path(pattern), decode, encode,
                     lambda current: combine(current, entries), False)

    def _update(self, path: str, decode: Callable[[bytes], V], encode: Callable[[V], bytes],
                change: Callable[[V], V], sensitive: bool) -> None:
        """Compare-and-set ``path`` to ``change(current)``; an empty result deletes it."""
        for _ in range(MAX_CAS_ATTEMPTS):
            found = self._nodes.read(path)
            current = decode(found[0] if found is not None else zp.EMPTY_JSON)
            new = change(current)
            if found is None:
                if not new or self._nodes.create(path, encode(new), sensitive):
                    return
            elif not new:
                if self._nodes.delete(path, found[1]):
                    return
            elif self._nodes.write(path, encode(new), found[1]):
                return
        raise RequestTimedOutError(f"{path}: update lost {MAX_CAS_ATTEMPTS} races")
