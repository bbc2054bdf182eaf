"""The aborted-transaction index of one segment (``.txnindex``, layout in format.py).

Owns: one segment's entries (in memory, and written through to the file at every append),
loading and sanity-checking the file, truncating it with the log, and collecting the aborted
transactions that overlap an offset range (Kafka's TransactionIndex and
``collectAbortedTransactions``). Must not: decide when an entry is written (the log does, from
producer state) or read segment data.

Readers collect without the log's lock: an append adds to the end of the entry list, truncation
and reset replace the list (copy-on-write), so a reader sees a consistent prefix.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from logstore.segments.format import TXN_ENTRY, atomic_write, unlink_quietly
from logstore.txn_filter import AbortedTxn


class TxnIndexEntry(NamedTuple):
    """One aborted transaction, indexed in the segment that holds its ABORT marker."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def aborted_txn(self) -> AbortedTxn:
        return AbortedTxn(self.producer_id, self.first_offset, self.last_offset)


def parse_entries(data: bytes, tolerate_torn_tail: bool = False) -> list[TxnIndexEntry]:
    """The entries in the bytes of an index file. A size that is not a whole number of entries
    is ValueError, unless ``tolerate_torn_tail`` (a reader racing an append) drops the tail."""
    usable = len(data) - len(data) % TXN_ENTRY.size
    if usable != len(data) and not tolerate_torn_tail:
        raise ValueError(f"size {len(data)} is not a multiple of {TXN_ENTRY.size}")
    rows = np.frombuffer(data[:usable], dtype="<i8").reshape(-1, 4).tolist()
    return [TxnIndexEntry(*row) for row in rows]


def collect_entries(entries: Sequence[TxnIndexEntry], start: int,
                    end: int) -> tuple[list[TxnIndexEntry], bool]:
    """The entries of one segment overlapping [start, end) (last offset >= start, first offset
    < end), and whether the search is complete: an entry whose last_stable_offset is >= end
    proves that no later segment holds a transaction aborted after beginning before end."""
    found: list[TxnIndexEntry] = []
    for entry in entries[bisect_left(entries, start, key=lambda e: e.last_offset):]:
        if entry.first_offset < end:
            found.append(entry)
        if entry.last_stable_offset >= end:
            return found, True
    return found, False


def collect_aborted(indexes: Iterable[Sequence[TxnIndexEntry]], start: int,
                    end: int) -> list[TxnIndexEntry]:
    """The aborted transactions overlapping [start, end) in the entry lists of the segment
    holding ``start`` and the segments after it, in marker order."""
    found: list[TxnIndexEntry] = []
    if start >= end:
        return found
    for entries in indexes:
        more, complete = collect_entries(entries, start, end)
        found += more
        if complete:
            break
    return found


class TxnIndex:
    """The ``.txnindex`` file of the segment based at ``base_offset``."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.stale = False  # emptied by recovery: the log rebuilds it from producer state
        self._entries: list[TxnIndexEntry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[TxnIndexEntry]:
        """The entries now (a list that later appends may extend but never change)."""
        return self._entries

    def append(self, entry: TxnIndexEntry) -> bool:
        """Add ``entry`` and write it to the file at once (no fsync); returns whether that
        created the file (its directory then needs an fsync)."""
        if self._entries and entry.last_offset <= self._entries[-1].last_offset:
            raise ValueError(f"{self.path}: entry {entry} is not after the last entry "
                             f"{self._entries[-1]}")
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:  # not held open: aborts are rare, and descriptors are bounded (file_cache.py)
            os.write(fd, TXN_ENTRY.pack(*entry))
        finally:
            os.close(fd)
        self._entries.append(entry)
        return created

    def fsync(self) -> None:
        """Make the file's content durable (a no-op when there is no file)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Nothing is held open (``append`` opens the file for each entry)."""

    def delete(self) -> None:
        self.close()
        unlink_quietly(self.path)

    def rename_to(self, path: Path) -> None:
        """Move the file over ``path`` (atomically replacing what is there)."""
        self.close()
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def load(self) -> str | None:
        """Read the entries from the file (absent: none); returns why the file is unusable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._entries = []
            return None
        try:
            self._entries = parse_entries(data)
        except ValueError as e:
            return str(e)
        return None

    def sanity_check(self, end_offset: int | None) -> str | None:
        """Why the entries cannot belong to a segment holding offsets [base, ``end_offset``)
        (None: unknown), or None when they look right."""
        previous = self.base_offset - 1
        for entry in self._entries:
            if not (previous < entry.last_offset and entry.first_offset <= entry.last_offset):
                return f"entry {entry} is out of order"
            if end_offset is not None and entry.last_offset >= end_offset:
                return f"entry {entry} lies past the segment's end {end_offset}"
            previous = entry.last_offset
        return None

    def reset(self) -> None:
        """Forget every entry and remove the file."""
        self._entries = []
        self.delete()

    def mark_stale(self) -> None:
        """Empty the index because it cannot be trusted; the log rebuilds it."""
        self.reset()
        self.stale = True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after ``offset``."""
        keep = bisect_left(self._entries, offset, key=lambda e: e.last_offset)
        if keep < len(self._entries):
            self._entries = self._entries[:keep]
            self.rewrite()

    def rewrite(self) -> None:
        """Replace the file with exactly the in-memory entries (an empty file when none)."""
        self.close()
        data = b"".join(TXN_ENTRY.pack(*entry) for entry in self._entries)
        atomic_write(self.path, data, durable=False)
