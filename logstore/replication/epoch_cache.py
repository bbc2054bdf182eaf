"""The leader-epoch cache of one partition replica: which leader epoch began at which offset.

Owns: the ordered (epoch, start offset) entries, Kafka's ``OffsetsForLeaderEpoch`` answer
(``end_offset_for``), truncating the entries with the log, and the checkpoint file
``leader-epoch-checkpoint`` in the partition directory, written whole to a temporary file and
renamed, so a crash leaves the old or the new file and never half of one. A new partition's
first epoch is not written at once (``assign(durable=False)`` on an empty cache: bringing
thousands of partitions online must not wait for a file and an fsync each; Kafka likewise
stopped fsyncing it there, KAFKA-15046) but by ``make_durable`` before the leader's first
append: until then no batch carries the epoch, and after a restart the leader assigns it
again. Format (Kafka's):

| line      | content                                          |
|-----------|--------------------------------------------------|
| 1         | format version (0)                               |
| 2         | number of entries                                |
| 3..       | ``<epoch> <start_offset>``, epochs ascending     |

Must not: read or write segments, or know about the network; the log's owner calls it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
FORMAT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Epoch -> start offset, kept in step with one log and checkpointed to ``dir``."""

    def __init__(self, dir: Path | None) -> None:
        self._path = None if dir is None else dir / CHECKPOINT_FILE
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = self._read() if self._path else []
        self._unwritten = False  # entries not yet in the file (assign(durable=False))

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, durable: bool = True) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op if it is already known or
        older than the latest). Entries at or after ``start_offset`` with older epochs were a
        divergent tail the caller has truncated; they go too. ``durable`` False leaves the
        write to ``make_durable`` when the cache was empty (the file then holds nothing)."""
        with self._lock:
            if self._entries and epoch <= self._entries[-1].epoch:
                return
            durable = durable or bool(self._entries)
            self._entries = [e for e in self._entries if e.start_offset < start_offset]
            self._entries.append(EpochEntry(epoch, start_offset))
            self._write(durable)

    def make_durable(self) -> None:
        """Write what ``assign(durable=False)`` left in memory, if anything."""
        if not self._unwritten:
            return
        with self._lock:
            if self._unwritten:
                self._write()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, the offset where it ended): the log end offset
        for the latest epoch, else the start offset of the next epoch. (UNDEFINED, UNDEFINED)
        when ``epoch`` is older than every entry."""
        with self._lock:
            entries = self._entries
            if not entries or epoch < entries[0].epoch:
                return UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if epoch >= entries[-1].epoch:
                return entries[-1].epoch, log_end_offset
            i = max(i for i, e in enumerate(entries) if e.epoch <= epoch)
            return entries[i].epoch, entries[i + 1].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """The log now ends at ``end_offset``: forget epochs that start at or after it."""
        with self._lock:
            kept = [e for e in self._entries if e.start_offset < end_offset]
            if len(kept) != len(self._entries):
                self._entries = kept
                self._write()

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry: (epoch, start offset), ascending (a follower that restarts at a
        tiered leader's local log start offset takes the leader's entries up to it)."""
        with self._lock:
            self._entries = [EpochEntry(e, s) for e, s in entries]
            self._write()

    def clear_and_start_at(self, epoch: int, offset: int) -> None:
        """The log was emptied and restarts at ``offset``."""
        with self._lock:
            self._entries = [EpochEntry(epoch, offset)] if epoch >= 0 else []
            self._write()

    # -- the checkpoint file -------------------------------------------------------------------

    def _read(self) -> list[EpochEntry]:
        assert self._path is not None
        try:
            lines = self._path.read_text(encoding="utf-8").split("\n")
        except FileNotFoundError:
            return []
        except UnicodeDecodeError as e:  # a flipped high bit: bad content, like a bad digit
            log.warning("%s is unreadable (%s); starting an empty leader-epoch cache",
                        self._path, e)
            return []
        try:
            if int(lines[0]) != FORMAT_VERSION:
                raise ValueError(f"unknown version {lines[0]!r}")
            count = int(lines[1])
            entries = [EpochEntry(*map(int, line.split())) for line in lines[2: 2 + count]]
            if len(entries) != count:
                raise ValueError(f"{count} entries announced, {len(entries)} found")
            return entries
        except (ValueError, IndexError, TypeError) as e:
            log.warning("%s is unreadable (%s); starting an empty leader-epoch cache",
                        self._path, e)
            return []

    def _write(self, durable: bool = True) -> None:
        self._unwritten = not durable
        if self._unwritten or self._path is None or not self._path.parent.exists():
            return
        body = f"{FORMAT_VERSION}\n{len(self._entries)}\n" + "".join(
            f"{e.epoch} {e.start_offset}\n" for e in self._entries)
        tmp = self._path.with_name(self._path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
