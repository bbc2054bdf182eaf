"""The ``zk_security.ZNodes`` seam on the ZooKeeper store's kazoo session.

Owns: the watched listings and reads (many at once, pipelined) and the conditional creates,
writes and deletes that ``zk_security.py`` does its compare-and-set with, creating sensitive
znodes with the session's sensitive ACL. Must not: know what the znodes hold, or let kazoo
exceptions out (a missing znode or a lost race is an answer, not an error).
"""

from __future__ import annotations

import contextlib

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from logstore.controller.zk_session import ZkSession


class KazooZNodes:
    """``zk_security.ZNodes`` on the store's session: its waits, watches and ACLs."""

    def __init__(self, zk: ZkSession) -> None:
        self._zk = zk

    def children(self, path: str) -> list[str]:
        try:
            return self._zk.children(path, watch=True)
        except NoNodeError:
            return []

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        client, watch = self._zk.client, self._zk.on_watch
        pending = [(p, client.get_async(p, watch)) for p in paths]
        out = {}
        for path, result in pending:
            with contextlib.suppress(NoNodeError):
                out[path] = self._zk.wait(result, f"read {path}", self._zk.timeout_s)[0]
        return out

    def read(self, path: str) -> tuple[bytes, int] | None:
        found = self._zk.get_or_none(path)
        return None if found is None else (found[0], found[1].version)

    def create(self, path: str, data: bytes, sensitive: bool) -> bool:
        acl = self._zk.sensitive_acl() if sensitive else None
        try:
            self._zk.op(f"create {path}", self._zk.client.create_async, path, data,
                        acl=acl, makepath=True)
            return True
        except NodeExistsError:
            return False

    def write(self, path: str, data: bytes, version: int) -> bool:
        try:
            self._zk.op(f"update {path}", self._zk.client.set_async, path, data, version)
            return True
        except (BadVersionError, NoNodeError):
            return False

    def delete(self, path: str, version: int) -> bool:
        try:
            self._zk.op(f"delete {path}", self._zk.client.delete_async, path, version)
            return True
        except (BadVersionError, NoNodeError):
            return False
