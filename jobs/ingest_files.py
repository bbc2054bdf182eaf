"""The files of an ingest source directory (a local path or any fsspec URL, ``s3://`` through
s3fs), the persisted log of admitted files that the stream's offsets index, and reading a file's
lines as Arrow batches. No Spark here: ``jobs/ingest_source.py`` puts this behind
``format("logstore-files")``.

Owns: listing the directory (non-recursive; names starting with ``.`` or ``_`` are skipped, so
writers can land a file under a hidden name and rename it), the ``FileLog`` and the offsets
``{"files": n}`` (the first ``n`` files of the log), the options of the source, and errors
naming the URL at fault. Must not: parse lines (``jobs/ingest.py`` does).

The file log (``fileLog``, in the job ``<checkpoint>/ingest-files``) is a directory of entries
``{first index:020d}.json``, each a JSON list of ``{"url", "mtime", "size"}``: the files one
listing found that were not admitted before, ordered by (modification time, URL). An entry is
written (atomically, a hidden temporary renamed) before the offset that covers it is handed
to Spark, so the offsets in Spark's checkpoint always name files the log holds: a replayed
micro-batch reads the same files, and a file is admitted once, however often it is listed.

Credentials never come from options (``storageOptions`` holding one is refused): fsspec finds
them in the environment (``AWS_ACCESS_KEY_ID``, ...) or the provider's chain, on the driver and
on every executor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from logstore.config import credential_keys
from logstore.errors import LogstoreError

LINES_SCHEMA = pa.schema([pa.field("value", pa.binary()), pa.field("file", pa.string())])
SPARK_SCHEMA = "value binary, file string"
BATCH_ROWS = 8192
PARTITION_BYTES = 64 * 1024 * 1024
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oss"})
_ENTRY = re.compile(r"^(\d{20})\.json$")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "modified", "updated", "created")


class IngestError(LogstoreError, ValueError):
    """An ingest option, directory or topic that cannot be used; the message names it."""


@dataclass(frozen=True)
class SourceFile:
    """One admitted file: its full URL (``file:///...``, ``s3://bucket/...``), modification
    time (epoch seconds) and size in bytes when listed."""

    url: str
    mtime: float
    size: int


@dataclass(frozen=True)
class SourceOptions:
    """``format("logstore-files")`` options: ``path`` (the directory), ``storageOptions``
    (JSON object of fsspec options, e.g. ``{"endpoint_url": ...}``), ``fileLog`` (streaming:
    where admitted files are logged), ``maxFilesPerTrigger``."""

    url: str
    storage_options: dict[str, Any]
    file_log: str | None = None
    max_files_per_trigger: int | None = None


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    opts = {k.lower(): v for k, v in options.items()}
    url = (opts.get("path") or "").strip()
    if not url:
        raise IngestError("path (the source directory) is required: .load(DIR)")
    limit = opts.get("maxfilespertrigger")
    if limit is not None and (not limit.strip().isdigit() or int(limit) < 1):
        raise IngestError(f"maxFilesPerTrigger must be a positive integer, got {limit!r}")
    log = (opts.get("filelog") or "").strip() or None
    return SourceOptions(url, storage_options_of(opts.get("storageoptions")), log,
                         None if limit is None else int(limit))


def storage_options_of(text: str | None, name: str = "storageOptions") -> dict[str, Any]:
    """fsspec options from JSON; credentials are refused (options show up in plans and logs)."""
    if text is None or not text.strip():
        return {}
    try:  # the text is not echoed: it might hold what must not be logged
        parsed = json.loads(text)
    except ValueError as e:
        raise IngestError(f"{name} is not JSON ({e}); expected an object such as "
                          '{"endpoint_url": "http://127.0.0.1:9000"}') from None
    if not isinstance(parsed, dict):
        raise IngestError(f"{name} must be a JSON object of fsspec options")
    found = credential_keys(parsed, name)
    if found:
        raise IngestError(f"{', '.join(found)} looks like a credential; credentials come from "
                          "the environment (AWS_ACCESS_KEY_ID, ...) or the provider's chain, "
                          "never from options")
    return parsed


def _filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **storage_options)
    except (ImportError, ValueError, TypeError) as e:
        raise IngestError(f"source directory {url}: no filesystem for it ({e})") from e
    return fs, str(path)


def list_files(url: str, storage_options: Mapping[str, Any]) -> list[SourceFile]:
    """The files directly in directory ``url``, fresh (no cached listing), in no set order;
    an object store's prefix with no object yet is an empty directory, but its bucket must
    exist. Raises ``IngestError`` naming ``url``."""
    fs, path = _filesystem(url, storage_options)
    try:
        fs.invalidate_cache(path)
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        if _protocol(fs) in OBJECT_STORES:
            _check_bucket(fs, url, path)
            return []
        raise IngestError(f"source directory {url}: not found") from None
    except Exception as e:  # the store's own errors (unreachable endpoint, denied, ...)
        raise IngestError(f"source directory {url}: cannot list it "
                          f"({type(e).__name__}: {e})") from e
    if len(entries) == 1 and entries[0].get("type") == "file" and \
            entries[0]["name"].rstrip("/") == path.rstrip("/"):
        raise IngestError(f"source directory {url}: is a file, not a directory")
    return [SourceFile(fs.unstrip_protocol(e["name"]), _mtime(e), int(e.get("size") or 0))
            for e in entries if e.get("type") == "file" and not _hidden(e["name"])]


def _protocol(fs: Any) -> str:
    protocol = fs.protocol
    return str(protocol[0] if isinstance(protocol, (tuple, list)) else protocol)


def _check_bucket(fs: Any, url: str, path: str) -> None:
    bucket = path.split("/", 1)[0]
    try:
        fs.invalidate_cache(bucket)
        fs.ls(bucket, detail=False)
    except FileNotFoundError:
        raise IngestError(f"source directory {url}: bucket {bucket!r} not found") from None
    except Exception as e:
        raise IngestError(f"source directory {url}: cannot list bucket {bucket!r} "
                          f"({type(e).__name__}: {e})") from e


def _hidden(name: str) -> bool:
    return name.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))


def _mtime(entry: Mapping[str, Any]) -> float:
    for key in _MTIME_KEYS:
        value = entry.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return 0.0


def ordered(files: Sequence[SourceFile]) -> list[SourceFile]:
    """Admission order: by modification time, then URL."""
    return sorted(files, key=lambda f: (f.mtime, f.url))


class FileLog:
    """The admitted files in order, persisted at ``location`` (a local path or fsspec URL);
    only one query (Spark's checkpoint lock) appends to it."""

    def __init__(self, location: str, storage_options: Mapping[str, Any] | None = None
                 ) -> None:
        from fsspec.core import url_to_fs

        self.location = location
        self.fs, self.root = url_to_fs(location, **(storage_options or {}))
        self.files: list[SourceFile] = []
        self._seen: set[str] = set()
        self._load()

    def _load(self) -> None:
        if not self.fs.exists(self.root):
            return
        names = sorted(n.rsplit("/", 1)[-1] for n in self.fs.ls(self.root, detail=False))
        for name in names:
            match = _ENTRY.match(name)
            if match is None:
                continue
            if int(match.group(1)) != len(self.files):
                raise IngestError(f"file log {self.location}: entry {name} does not follow "
                                  f"the {len(self.files)} files before it (a missing entry)")
            rows = json.loads(self.fs.cat_file(f"{self.root}/{name}"))
            self.files += [SourceFile(r["url"], float(r["mtime"]), int(r["size"]))
                           for r in rows]
        self._seen = {f.url for f in self.files}

    def __len__(self) -> int:
        return len(self.files)

    def admit(self, listed: Sequence[SourceFile]) -> int:
        """Append the files of ``listed`` never admitted before, in admission order, as one
        entry; the log's length after."""
        new = [f for f in ordered(listed) if f.url not in self._seen]
        if not new:
            return len(self.files)
        name = f"{len(self.files):020d}.json"
        temporary = f"{self.root}/.{name}.tmp"
        self.fs.makedirs(self.root, exist_ok=True)
        self.fs.pipe_file(temporary, json.dumps([asdict(f) for f in new]).encode())
        self.fs.mv(temporary, f"{self.root}/{name}")
        self.files += new
        self._seen.update(f.url for f in new)
        return len(self.files)

    def between(self, start: int, end: int) -> list[SourceFile]:
        """Files ``[start, end)``: the files of the micro-batch between those offsets."""
        if not 0 <= start <= end or end > len(self.files):
            raise IngestError(f"file log {self.location}: holds {len(self.files)} files, not "
                              f"the files [{start}, {end}) of a micro-batch in the checkpoint "
                              "(the file log and the checkpoint do not belong together)")
        return self.files[start:end]


def offset(files: int) -> dict[str, int]:
    return {"files": files}


def files_of(offset_json: Mapping[str, Any]) -> int:
    value = offset_json.get("files")
    if not isinstance(value, int) or value < 0:
        raise IngestError(f"not an offset of format('logstore-files'): {dict(offset_json)}")
    return value


def next_end(start: int, admitted: int, max_files: int | None) -> int:
    """The end offset of the next micro-batch from ``start``: every admitted file, at most
    ``max_files`` of them (``None``: no limit), never before ``start``."""
    end = admitted if max_files is None else min(admitted, start + max_files)
    return max(start, end)


def bins(files: Sequence[SourceFile], target_bytes: int = PARTITION_BYTES
         ) -> list[list[str]]:
    """The URLs of ``files`` in order, cut into partitions of about ``target_bytes`` (a
    larger file is a partition of its own)."""
    out: list[list[str]] = []
    size = 0
    for f in files:
        if not out or size + f.size > target_bytes:
            out.append([])
            size = 0
        out[-1].append(f.url)
        size += f.size
    return out


def read_lines(urls: Sequence[str], storage_options: Mapping[str, Any],
               batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Each file's lines (``\\n`` or ``\\r\\n`` ended) as their bytes, with its URL, as
    batches of ``LINES_SCHEMA``; each file is read whole. Decoding is the parser's: a line
    that is not UTF-8 goes to the dead letters as it was."""
    for url in urls:
        fs, path = _filesystem(url, storage_options)
        try:
            data = fs.cat_file(path)
        except FileNotFoundError:
            raise IngestError(f"source file {url}: gone (it was listed and admitted, then "
                              "deleted before it was read)") from None
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for i in range(0, len(lines), batch_rows):
            chunk = [x[:-1] if x.endswith(b"\r") else x for x in lines[i:i + batch_rows]]
            yield pa.RecordBatch.from_arrays(
                [pa.array(chunk, pa.binary()), pa.array([url] * len(chunk), pa.string())],
                schema=LINES_SCHEMA)
