"""The two bounded caches of remote reads: offset indexes of remote segments on local disk, and
fixed-size chunks of remote segment files in memory.

Owns: ``RemoteIndexCache`` (each segment's ``.index`` object downloaded once into a directory,
least recently used evicted past ``remote_log_index_cache_bytes``, parsed and checked) and
``ChunkCache`` (ranges of segment objects read in aligned chunks of ``chunk_bytes``, least
recently used evicted past ``remote_fetch_cache_bytes``). Must not: decode batches or decide
which segment to read (``remote_reader.py`` does), or import fsspec.

Why chunks in memory: a fetch reads a few consecutive batches, usually inside one chunk, and a
consumer's next fetch continues in the same chunk, so aligned chunks turn many small reads into
one range request (Redpanda's and Aiven's approach); memory rather than disk because the broker
already keeps its hot local data in the page cache and chunks are short-lived. Two readers
missing the same chunk at once may both fetch it (no single-flight): rare, and harmless.

Offset index file (``segments/format.py``'s layout, entries of 8 bytes):

| field           | type  | meaning                                         |
|-----------------|-------|-------------------------------------------------|
| relative_offset | int32 | batch base offset minus the segment base offset |
| position        | int32 | byte position of the batch in the segment file  |
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from logstore.errors import CorruptRecordError
from logstore.segments.format import INDEX_SUFFIX, OFFSET_ENTRY
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import segment_key
from logstore.tiering.store import ObjectStore

logger = logging.getLogger(__name__)

_INDEX_DTYPE = np.dtype([("relative_offset", "<i4"), ("position", "<i4")])
_PARSED_KEPT = 64
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


class RemoteIndexCache:
    """Offset indexes of remote segments, cached in ``dir`` up to ``capacity_bytes``."""

    def __init__(self, dir: Path, capacity_bytes: int, store: ObjectStore) -> None:
        self._dir = dir
        self._capacity = capacity_bytes
        self._store = store
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # segment id -> bytes, LRU first
        self._parsed: OrderedDict[str, np.ndarray] = OrderedDict()
        dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(dir.glob("*" + INDEX_SUFFIX), key=lambda p: p.stat().st_mtime):
            self._files[path.stem] = path.stat().st_size
        self._evict()

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(self._files.values())

    def locate(self, segment: RemoteLogSegmentMetadata, offset: int) -> tuple[int, int] | None:
        """(byte position, base offset) of the last indexed batch at or before ``offset`` (the
        first indexed batch when ``offset`` is before it); None when the index is empty."""
        return locate(self._entries(segment), segment, offset)

    def _entries(self, segment: RemoteLogSegmentMetadata) -> np.ndarray:
        sid = segment.segment_id
        with self._lock:
            if sid in self._files:
                self._files.move_to_end(sid)
            if sid in self._parsed:
                self._parsed.move_to_end(sid)
                return self._parsed[sid]
        path = self._dir / (sid + INDEX_SUFFIX)
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # never downloaded, or evicted meanwhile
            data = self._download(segment, path)
        entries = parse_offset_index(segment, data)
        with self._lock:
            self._parsed[sid] = entries
            if len(self._parsed) > _PARSED_KEPT:
                self._parsed.popitem(last=False)
        return entries

    def _download(self, segment: RemoteLogSegmentMetadata, path: Path) -> bytes:
        data = self._store.read_object(segment_key(segment, INDEX_SUFFIX))
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        with self._lock:
            self._files[segment.segment_id] = len(data)
            self._evict(keep=segment.segment_id)
        return data

    def _evict(self, keep: str | None = None) -> None:
        """Under the lock: drop least recently used files (but ``keep``) while over capacity."""
        total = sum(self._files.values())
        for sid in list(self._files):
            if total <= self._capacity:
                return
            if sid != keep:
                total -= self._files.pop(sid)
                self._parsed.pop(sid, None)
                (self._dir / (sid + INDEX_SUFFIX)).unlink(missing_ok=True)

def parse_offset_index(segment: RemoteLogSegmentMetadata, data: bytes) -> np.ndarray:
    """The entries of a remote segment's offset index, checked: CorruptRecordError naming the
    segment when they are not increasing or point past the segment."""
    where = f"{segment.describe()}: remote offset index {segment_key(segment, INDEX_SUFFIX)}"
    if len(data) % OFFSET_ENTRY.size:
        raise CorruptRecordError(f"{where}: size {len(data)} is not a multiple of "
                                 f"{OFFSET_ENTRY.size}")
    entries = np.frombuffer(data, dtype=_INDEX_DTYPE)
    offsets, positions = entries["relative_offset"], entries["position"]
    if len(entries) and (np.any(np.diff(offsets) <= 0) or np.any(np.diff(positions) <= 0)
                         or offsets[0] < 0 or int(positions[-1]) >= segment.size_bytes):
        raise CorruptRecordError(f"{where}: entries are not increasing or point past the "
                                 f"segment's {segment.size_bytes} bytes")
    return entries


def locate(entries: np.ndarray, segment: RemoteLogSegmentMetadata,
           offset: int) -> tuple[int, int] | None:
    """(position, base offset) of the last entry at or before ``offset`` (the first entry when
    ``offset`` is before it); None for an empty index."""
    if len(entries) == 0:
        return None
    relative = offset - segment.base_offset
    at = max(int(np.searchsorted(entries["relative_offset"], relative, side="right")) - 1, 0)
    return int(entries["position"][at]), segment.base_offset + int(
        entries["relative_offset"][at])


class ChunkCache:
    """Aligned chunks of remote objects in memory, up to ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self._capacity = capacity_bytes
        self._chunk = chunk_bytes
        self._lock = threading.Lock()
        self._chunks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def read(self, store: ObjectStore, key: str, object_size: int, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object ``key`` of ``object_size`` bytes; fewer only
        when the object is shorter than ``object_size`` says."""
        end = min(end, object_size)
        parts = []
        for index in range(start // self._chunk, (max(end, start + 1) - 1) // self._chunk + 1):
            chunk = self._get(store, key, object_size, index)
            base = index * self._chunk
            parts.append(chunk[max(start - base, 0): max(end - base, 0)])
            if len(chunk) < min(self._chunk, object_size - base):
                break  # the object is short: the caller reports it
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _get(self, store: ObjectStore, key: str, object_size: int, index: int) -> bytes:
        with self._lock:
            chunk = self._chunks.get((key, index))
            if chunk is not None:
                self._chunks.move_to_end((key, index))
                return chunk
        base = index * self._chunk
        chunk = store.read_range(key, base, min(self._chunk, object_size - base))
        with self._lock:
            if (key, index) not in self._chunks and len(chunk) <= self._capacity:
                self._chunks[(key, index)] = chunk
                self._size += len(chunk)
                while self._size > self._capacity:
                    _, old = self._chunks.popitem(last=False)
                    self._size -= len(old)
        return chunk

    def forget(self, key: str) -> None:
        """Drop every chunk of ``key`` (after it was found corrupt or missing)."""
        with self._lock:
            for entry in [k for k in self._chunks if k[0] == key]:
                self._size -= len(self._chunks.pop(entry))
