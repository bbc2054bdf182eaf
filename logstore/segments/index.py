"""The sparse offset index and time index of one segment (layouts in format.py).

Owns: the in-memory entries of an index (two parallel arrays, searched with bisect), appending
entries and writing them out to the sidecar file, loading and sanity-checking an index file, and
forgetting every entry (a truncated segment re-derives its indexes from the file). Must not:
read segment data; deciding *when* to add an entry belongs to segment.py.

Readers look entries up without the log's lock. Appends add the value before the key, so a key
found by bisect always has its value; ``reset`` replaces both arrays at once, so a reader never
sees a half-emptied pair.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np

from logstore.segments.format import OFFSET_ENTRY, TIME_ENTRY, atomic_write, unlink_quietly


class _SparseIndex:
    """Sorted (key, value) entries mirrored to an append-only file of fixed-width entries."""

    _entry: struct.Struct
    _key_code: str
    _key_dtype: str

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_entries)
        self._entries: tuple[array[int], array[int]] = (array(self._key_code), array("i"))
        self._pending = bytearray()

    def __len__(self) -> int:
        return len(self._entries[0])

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_entries

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The (keys, values) as numpy arrays (copies)."""
        keys, values = self._entries
        n = len(keys)
        return (np.frombuffer(keys[:n], dtype=self._key_dtype),
                np.frombuffer(values[:n], dtype=np.int32))

    def _append(self, key: int, value: int) -> None:
        keys, values = self._entries
        values.append(value)
        keys.append(key)
        self._pending += self._entry.pack(key, value)

    def flush(self) -> None:
        """Hand entries appended since the last flush to the operating system. The file is
        opened for each flush, not held: descriptors are bounded per segment file (see
        file_cache.py), and a flush is rare next to the fsync that usually follows it."""
        self._write_pending(sync=False)

    def fsync(self) -> None:
        self._write_pending(sync=True)

    def _write_pending(self, sync: bool) -> None:
        if not self._pending and not sync:
            return
        data, self._pending = bytes(self._pending), bytearray()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if data:
                os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.flush()

    def load(self) -> str | None:
        """Read the entries from the file; returns why the file is unusable, or None."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return "missing"
        if len(data) % self._entry.size:
            return f"size {len(data)} is not a multiple of {self._entry.size}"
        raw = np.frombuffer(data, dtype=[("k", "<" + self._key_dtype[1:]), ("v", "<i4")])
        keys = array(self._key_code, raw["k"].astype(self._key_dtype).tobytes())
        values = array("i", raw["v"].astype(np.int32).tobytes())
        self._entries = (keys, values)
        self._pending = bytearray()
        return None

    def reset(self) -> None:
        """Forget every entry (the file is rewritten by the next ``rewrite``)."""
        self._entries = (array(self._key_code), array("i"))
        self._pending = bytearray()

    def rewrite(self) -> None:
        """Replace the file with exactly the in-memory entries."""
        self.close()
        keys, values = self._entries
        out = np.empty(len(keys), dtype=[("k", "<" + self._key_dtype[1:]), ("v", "<i4")])
        out["k"] = np.frombuffer(keys, dtype=self._key_dtype)
        out["v"] = np.frombuffer(values, dtype=np.int32)
        atomic_write(self.path, out.tobytes(), durable=False)
        self._pending = bytearray()

    def rename_to(self, path: Path) -> None:
        self.close()
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close()
        unlink_quietly(self.path)


class OffsetIndex(_SparseIndex):
    """Relative offset -> file position of some batches of a segment."""

    _entry = OFFSET_ENTRY
    _key_code = "i"
    _key_dtype = "=i4"

    def append(self, offset: int, position: int) -> None:
        self._append(offset - self.base_offset, position)

    def lookup(self, offset: int) -> int | None:
        """Position of the last indexed batch whose base offset is <= ``offset``."""
        keys, values = self._entries
        i = bisect_right(keys, offset - self.base_offset) - 1
        return values[i] if i >= 0 else None

    @property
    def last_position(self) -> int | None:
        values = self._entries[1]
        return values[-1] if values else None

    def sanity_check(self, file_size: int, data_start: int, end_offset: int | None) -> str | None:
        """Why the entries cannot be right for a segment file of ``file_size`` bytes whose offsets
        are below ``end_offset`` (None when unknown), or None when they look right."""
        rel, pos = self.entries()
        if len(rel) == 0:
            return None if file_size <= data_start else "no entry although the segment has data"
        if pos[0] != data_start:
            return f"first entry points at {pos[0]}, not at the first batch ({data_start})"
        if len(rel) > 1 and ((np.diff(rel) <= 0).any() or (np.diff(pos) <= 0).any()):
            return "entries are not strictly increasing"
        if rel[0] < 0 or pos[-1] >= file_size:
            return f"entries point outside the segment (file size {file_size})"
        if end_offset is not None and self.base_offset + int(rel[-1]) >= end_offset:
            return f"entry for offset {self.base_offset + int(rel[-1])} >= next segment"
        return None


class TimeIndex(_SparseIndex):
    """Largest timestamp so far -> relative base offset of the batch that reached it."""

    _entry = TIME_ENTRY
    _key_code = "q"
    _key_dtype = "=i8"

    @property
    def max_timestamp(self) -> int:
        keys = self._entries[0]
        return keys[-1] if keys else -1

    @property
    def last_offset(self) -> int | None:
        values = self._entries[1]
        return self.base_offset + values[-1] if values else None

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add an entry when ``timestamp`` is above every timestamp indexed so far."""
        if timestamp > self.max_timestamp:
            self._append(timestamp, offset - self.base_offset)

    def lookup(self, timestamp: int) -> int:
        """An offset at or before the first record with a timestamp >= ``timestamp``."""
        keys, values = self._entries
        i = bisect_left(keys, timestamp) - 1
        return self.base_offset + values[i] if i >= 0 else self.base_offset

    def sanity_check(self, end_offset: int | None) -> str | None:
        ts, rel = self.entries()
        if len(ts) == 0:
            return None
        if len(ts) > 1 and ((np.diff(ts) <= 0).any() or (np.diff(rel) < 0).any()):
            return "entries are not increasing"
        if rel[0] < 0:
            return "negative relative offset"
        if end_offset is not None and self.base_offset + int(rel[-1]) >= end_offset:
            return f"entry for offset {self.base_offset + int(rel[-1])} >= next segment"
        return None
