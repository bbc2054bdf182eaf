"""The ObjectStore on fsspec: any fsspec URL (``s3://bucket/prefix`` through s3fs,
``file:///dir``, ``memory://name``, ``gcs://``...).

Owns: the one fsspec filesystem of a remote store, streaming uploads, range reads, listings
without fsspec's listing cache, and turning every fsspec/s3fs/botocore failure into
RemoteStorageError naming the key. Must not: be bypassed: this is the only module that imports
fsspec, and s3fs is only ever reached through it. Credentials are never passed here from
configuration: s3fs finds them in the environment or the provider's chain.

Uploads: a file of at most ``part_bytes`` goes in one PUT (the buffer is one part). A larger
one is streamed through ``fs.open(..., "wb", autocommit=False)`` in ``part_bytes`` writes: s3fs
sends each filled block as a multipart part (at most one block in memory) and completes the
upload only at ``commit()``; a failure calls ``discard()``, which aborts it, so no partial
object appears (the local filesystem writes to a temporary file and renames it on commit;
memory:// shows the file from the start, so a failure removes it).

The store pickles as its URL and options (for Spark executors); the filesystem is reopened on
the other side.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import fsspec

from logstore.tiering.store import ObjectInfo, RemoteObjectNotFoundError, RemoteStorageError

logger = logging.getLogger(__name__)

T = TypeVar("T")
# s3 refuses multipart parts under 5 MiB (but the last); 8 MiB is also s3fs's sweet spot for
# moto and MinIO alike.
DEFAULT_PART_BYTES = 8 * 1024 * 1024


class FsspecObjectStore:
    """Objects under ``url`` (an fsspec URL with a prefix); ``options`` go to the filesystem
    (for s3fs: ``endpoint_url``, ``client_kwargs={"region_name": ...}``, ``config_kwargs``)."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None,
                 part_bytes: int = DEFAULT_PART_BYTES) -> None:
        self._url = url.rstrip("/")
        self._options = dict(options or {})
        self._part_bytes = part_bytes
        self._fs, self._root = self._open()

    def _open(self) -> tuple[Any, str]:
        options = dict(self._options)
        if self._url.startswith("file://"):
            options.setdefault("auto_mkdir", True)
        fs, root = fsspec.core.url_to_fs(self._url, **options)
        return fs, str(root).rstrip("/")

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self._url, "options": self._options, "part_bytes": self._part_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._url, self._options = state["url"], state["options"]
        self._part_bytes = state["part_bytes"]
        self._fs, self._root = self._open()

    def __repr__(self) -> str:
        return f"FsspecObjectStore({self._url!r})"

    @property
    def url(self) -> str:
        return self._url

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}"

    def _call(self, what: str, key: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one filesystem call; its failures become RemoteStorageError naming the key."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as e:
            raise RemoteObjectNotFoundError(f"{self._url}/{key}: no such object") from e
        except RemoteStorageError:
            raise
        except Exception as e:  # boundary: whatever fsspec/s3fs/botocore raise is the store's
            raise RemoteStorageError(f"{self._url}/{key}: {what} failed: "
                                     f"{type(e).__name__}: {e}") from e

    # -- writing ---------------------------------------------------------------------------

    def put_file(self, key: str, path: Path) -> int:
        with open(path, "rb") as source:  # local trouble is OSError, not the store's
            size = Path(path).stat().st_size
            if size <= self._part_bytes:
                self._call("upload", key, self._fs.pipe_file, self._path(key), source.read())
            else:
                self._call("upload", key, self._stream, source, self._path(key))
        return size

    def _stream(self, source: BinaryIO, remote_path: str) -> None:
        target = self._fs.open(remote_path, "wb", block_size=self._part_bytes,
                               autocommit=False)
        try:
            while chunk := source.read(self._part_bytes):
                target.write(chunk)
            target.close()
            target.commit()
        except BaseException:
            with suppress(Exception):
                target.discard()
            if self._commits_on_open:
                with suppress(Exception):
                    self._fs.rm_file(remote_path)
            raise

    @property
    def _commits_on_open(self) -> bool:
        # memory:// registers a file as soon as it is opened (outside fsspec transactions).
        return "memory" in self._fs.protocol

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("upload", key, self._fs.pipe_file, self._path(key), data)

    def delete(self, key: str) -> None:
        with suppress(RemoteObjectNotFoundError):
            self._call("delete", key, self._fs.rm_file, self._path(key))

    # -- reading ---------------------------------------------------------------------------

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data = self._call(f"read of bytes [{start}, {start + length})", key, self._fs.cat_file,
                          self._path(key), start=start, end=start + length)
        return bytes(data)

    def read_object(self, key: str) -> bytes:
        return bytes(self._call("read", key, self._fs.cat_file, self._path(key)))

    def exists(self, key: str) -> bool:
        path = self._path(key)
        self._fs.invalidate_cache(path)
        return bool(self._call("existence check", key, self._fs.exists, path))

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix.rstrip("/"))
        self._fs.invalidate_cache(base)
        try:
            found = self._call("listing", prefix, self._fs.find, base, detail=True)
        except RemoteObjectNotFoundError:
            return []
        strip = len(self._fs._strip_protocol(self._root).rstrip("/")) + 1
        infos = [ObjectInfo(self._fs._strip_protocol(name)[strip:], int(info.get("size") or 0),
                            _mtime_ms(info)) for name, info in found.items()
                 if info.get("type", "file") == "file"]
        return sorted(infos, key=lambda i: i.key)


def _mtime_ms(info: Mapping[str, Any]) -> int:
    """The modification time an fsspec listing reports, whatever the backend calls it."""
    for name in ("LastModified", "mtime", "modified", "created", "updated"):
        value = info.get(name)
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            return int(value.timestamp() * 1000)
        if isinstance(value, int | float):
            return int(value * 1000)
        if isinstance(value, str):
            with suppress(ValueError):
                return int(dt.datetime.fromisoformat(value).timestamp() * 1000)
    return 0
