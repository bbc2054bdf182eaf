"""Record placement, vectorised: Kafka's murmur2 key hashing and sticky placement of null keys.

Keyed records go to ``(murmur2(key) & 0x7fffffff) % num_partitions``, bit for bit as Kafka's
Java client computes it, so the same key lands on the same partition in both systems. The hash
runs over whole Arrow key columns in NumPy (one pass per distinct key length, four bytes per
step), never a Python loop per record. Must not: do I/O.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of one key, as a signed 32-bit int (the reference for the vector form)."""
    return int(murmur2_array(pa.array([data], pa.binary()))[0])


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """murmur2 of every non-null key of a binary array, as int32 (nulls give 0)."""
    keys = keys.cast(pa.binary()) if not pa.types.is_binary(keys.type) else keys
    n = len(keys)
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out.view(np.int32)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1, offset=keys.offset * 4)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(
        0, np.uint8)
    lengths = np.diff(offsets)
    valid = ~np.asarray(keys.is_null()).astype(bool) if keys.null_count else np.ones(n, bool)
    for length in np.unique(lengths[valid]):
        rows = np.nonzero(valid & (lengths == length))[0]
        out[rows] = _murmur2_fixed(data, offsets[rows], int(length))
    return out.view(np.int32)


def _murmur2_fixed(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of len(starts) keys that all have ``length`` bytes."""
    with np.errstate(over="ignore"):
        mat = data[starts[:, None] + np.arange(length)].astype(np.uint32) if length else \
            np.zeros((len(starts), 0), np.uint32)
        h = np.full(len(starts), _SEED ^ np.uint32(length), dtype=np.uint32)
        for i in range(length // 4):
            c = mat[:, 4 * i: 4 * i + 4]
            k = c[:, 0] | (c[:, 1] << 8) | (c[:, 2] << 16) | (c[:, 3] << 24)
            k = k * _M
            k ^= k >> np.uint32(24)
            k = k * _M
            h = h * _M
            h ^= k
        tail = length & 3
        base = length & ~3
        if tail == 3:
            h ^= mat[:, base + 2] << 16
        if tail >= 2:
            h ^= mat[:, base + 1] << 8
        if tail >= 1:
            h ^= mat[:, base]
            h = h * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return h


def partitions_for_keys(keys: pa.Array, num_partitions: int) -> np.ndarray:
    """Kafka's partition of every key (``-1`` where the key is null)."""
    hashed = murmur2_array(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)
    parts = (hashed % np.uint32(num_partitions)).astype(np.int32)
    if keys.null_count:
        parts[np.asarray(pc.is_null(keys))] = -1
    return parts


class StickyPartitioner:
    """Null-key records stick to one partition for a block of rows, then move to the next, so
    batches fill up (Kafka's KIP-480) while load still spreads over every partition."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)
        self._current: dict[str, int] = {}

    def assign(self, topic: str, num_partitions: int, count: int, block_rows: int
               ) -> np.ndarray:
        start = self._current.get(topic)
        if start is None or start >= num_partitions:
            start = int(self._rng.integers(num_partitions))
        blocks = np.arange(count, dtype=np.int64) // max(block_rows, 1)
        parts = ((start + blocks) % num_partitions).astype(np.int32)
        self._current[topic] = int((start + (count + block_rows - 1) // max(block_rows, 1))
                                   % num_partitions) if count else start
        return parts


def assign_partitions(keys: pa.Array, explicit: np.ndarray | None, topic: str,
                      num_partitions: int, sticky: StickyPartitioner, block_rows: int
                      ) -> np.ndarray:
    """The partition of every record: the explicit one where given (>= 0), else the key's hash,
    else the sticky partition."""
    if explicit is not None and bool((explicit >= 0).all()):
        return explicit  # every record named its partition (no hashing to do)
    parts = partitions_for_keys(keys, num_partitions) if keys.null_count < len(keys) else \
        np.full(len(keys), -1, np.int32)
    if explicit is not None:
        given = explicit >= 0
        parts[given] = explicit[given]
    unplaced = parts < 0
    n_unplaced = int(unplaced.sum())
    if n_unplaced:
        parts[unplaced] = sticky.assign(topic, num_partitions, n_unplaced, block_rows)
    return parts
