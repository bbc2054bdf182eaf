"""What the ZooKeeper store has read, kept until a watch says it changed.

Owns: the cache keys (all brokers, all topics, the controller, the partition states of one
topic), which key a watched znode path feeds, and the rule that keeps the cache honest: a read
that raced with an invalidation is returned to its caller but not kept. Must not: import kazoo
or do I/O (the loaders it is given do that).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from logstore.controller import zk_paths as zp

T = TypeVar("T")
CacheKey = str | tuple[str, str]
BROKERS_KEY = "brokers"
TOPICS_KEY = "topics"
CONTROLLER_KEY = "controller"
SECURITY_KEY = "security"  # users' credentials and ACLs (zk_security.py keeps its own snapshot)
STATES = "states"  # ("states", topic) keys the partition states of one topic


def states_key(topic: str) -> CacheKey:
    return (STATES, topic)


def key_for(path: str) -> CacheKey | None:
    """Which cache entry a watched znode path feeds (None: none)."""
    if path == zp.BROKER_IDS or path.startswith(zp.BROKER_IDS + "/"):
        return BROKERS_KEY
    if path == zp.CONTROLLER:
        return CONTROLLER_KEY
    if zp.is_security_path(path):
        return SECURITY_KEY
    topic = zp.topic_of(path)
    if path == zp.TOPICS or (topic is not None and path == zp.topic_path(topic)):
        return TOPICS_KEY
    return states_key(topic) if topic is not None else None


class WatchedCache:
    """Values read from ZooKeeper, each dropped when a watch fires for it. Every key has a
    generation that each invalidation moves on; a load that started before it moved is not
    kept, so once a watch has fired the cache never serves what the change replaced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[CacheKey, Any] = {}
        self._generations: dict[CacheKey, int] = {}

    def get(self, key: CacheKey, load: Callable[[], tuple[T, bool]]) -> T:
        """The cached value, else ``load()``'s. ``load`` returns (value, watched); only a
        watched value (one that a watch will invalidate) is kept."""
        with self._lock:
            if key in self._values:
                return self._values[key]  # type: ignore[no-any-return]
            before = self._generations.get(key, 0)
        value, watched = load()
        with self._lock:
            if watched and self._generations.get(key, 0) == before:
                self._values[key] = value
        return value

    def refresh(self, key: CacheKey, load: Callable[[], tuple[T, bool]]) -> T:
        """Load ``key`` again; readers keep getting the old value until the new one is in
        (unless a watch invalidates the key meanwhile, which also drops this load)."""
        with self._lock:
            self._generations[key] = before = self._generations.get(key, 0) + 1
        value, watched = load()
        with self._lock:
            if self._generations.get(key, 0) == before:
                if watched:
                    self._values[key] = value
                else:
                    self._values.pop(key, None)
        return value

    def retain(self, keys: set[CacheKey]) -> None:
        """Drop every key not in ``keys``."""
        with self._lock:
            for key in set(self._values) - keys:
                self._generations[key] = self._generations.get(key, 0) + 1
                del self._values[key]

    def invalidate(self, key: CacheKey) -> None:
        with self._lock:
            self._generations[key] = self._generations.get(key, 0) + 1
            self._values.pop(key, None)
