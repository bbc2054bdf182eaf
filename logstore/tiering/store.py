"""The object-store seam of tiered storage.

Owns: the ``ObjectStore`` protocol (what tiering needs from S3, a local directory or memory),
the ``ObjectInfo`` listing entry, and the errors an object store raises. Must not: import
fsspec, s3fs or boto (``fsspec_store.py`` implements the protocol), or know about segments.

Keys are relative to the store's URL prefix and use '/' (``orders-<id>/0/000…-<id>.arrow``).

Errors: every failure of the store becomes ``RemoteStorageError``, a ``KafkaStorageError``
(code 56, retriable): a consumer whose fetch hit an unavailable object store retries, and the
copy task retries with backoff. It is a subclass rather than a new code so that clients need
no change. A key that does not exist is ``RemoteObjectNotFoundError`` (not retriable): the reader turns it into CorruptRecordError
naming topic, partition and offset, since a FINISHED segment whose object is gone is data loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from logstore.errors import KafkaStorageError, LogstoreError


class RemoteStorageError(KafkaStorageError):
    """The object store failed (unreachable, refused, timed out); the message names the key.
    On the wire it is KAFKA_STORAGE_ERROR, retriable."""


class RemoteObjectNotFoundError(LogstoreError):
    """The key does not exist in the object store. Not retriable, and not a wire error: the
    reader reports it as CorruptRecordError naming topic, partition and offset."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a listing: its key (relative to the store's prefix), size and last
    modification time (ms since the epoch)."""

    key: str
    size: int
    mtime_ms: int


class ObjectStore(Protocol):
    """Objects under one URL prefix. Every method raises RemoteStorageError on failure."""

    @property
    def url(self) -> str:
        """The store's URL with its prefix (for messages and ``topics describe``)."""
        ...

    def put_file(self, key: str, path: Path) -> int:
        """Upload the local file ``path`` under ``key``, streaming from the file (bounded
        memory; multipart for large files); returns its size. A failed upload leaves no
        complete object under ``key``."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store a small object."""
        ...

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from ``start`` (fewer only at the object's end)."""
        ...

    def read_object(self, key: str) -> bytes:
        """The whole (small) object."""
        ...

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""
        ...

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with the directory ``prefix`` (recursive), fresh from
        the store (no listing cache)."""
        ...

    def exists(self, key: str) -> bool: ...
