"""The bound on open segment file descriptors of one log manager (``max_open_segment_files``).

Owns: which segment files hold a descriptor, in least-recently-used order, and closing the
least recently used ones whenever more than ``capacity`` are open. Must not: open files or know
what a segment is; each entry closes its own descriptor (``evict_fd``) and reopens it on its
next use.

Kafka keeps a descriptor per segment and asks operators for a large ``ulimit -n``; a broker
with 10,000 partitions would need more than 10,000. Here a segment whose descriptor was
evicted reopens it by path on its next read, append or fsync, so eviction is invisible to
readers: only a segment that was deleted or replaced refuses (SegmentClosedError, and the read
starts over as it always did).

Rules that keep eviction safe under concurrent reads and appends:
- an entry pinned by an I/O in flight is never closed: its ``evict_fd`` keeps it open and puts
  it back (``keep``) as the most recently used; the bound may be passed while many I/Os are in
  flight at once, and is restored when the last of them lets go (``released``);
- lock order is entry, then cache: this cache's lock is never held while an entry's lock is
  taken (``_make_room`` pops the victim, lets go, then asks it), while an entry may call
  ``keep`` and ``forget`` holding its own lock, so a close never races a put-back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol


class CachedFile(Protocol):
    def evict_fd(self) -> bool:
        """Close the descriptor unless an I/O holds it (then ``keep`` it); True if closed."""
        ...


class OpenFileCache:
    """Open segment descriptors in LRU order, at most ``capacity`` (None: no bound)."""

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"max_open_segment_files must be positive, got {capacity}")
        self.capacity = capacity
        self._open: OrderedDict[CachedFile, None] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def used(self, entry: CachedFile) -> None:
        """``entry`` holds an open descriptor and was just used: make it the most recently
        used one, then close the least recently used ones beyond the bound."""
        if self.capacity is None:
            return
        self.keep(entry)
        if len(self._open) > self.capacity:
            self._make_room()

    def keep(self, entry: CachedFile) -> None:
        """Count ``entry`` as open and most recently used (no eviction)."""
        if self.capacity is None:
            return
        with self._lock:
            self._open[entry] = None
            self._open.move_to_end(entry)

    def released(self) -> None:
        """An I/O let go of its descriptor: evict what pinned descriptors kept over the bound."""
        if self.capacity is not None and len(self._open) > self.capacity:
            self._make_room()

    def forget(self, entry: CachedFile) -> None:
        """``entry`` closed its descriptor for good (or for now)."""
        if self.capacity is None:
            return
        with self._lock:
            self._open.pop(entry, None)

    def _make_room(self) -> None:
        assert self.capacity is not None
        attempts = len(self._open)
        while attempts > 0:
            attempts -= 1
            with self._lock:
                if len(self._open) <= self.capacity:
                    return
                victim, _ = self._open.popitem(last=False)
            if victim.evict_fd():
                with self._lock:
                    self.evictions += 1
