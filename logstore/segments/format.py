"""On-disk layout of one log directory: file names, suffixes, sidecar entry layouts, checkpoint
files, and the small I/O helpers (atomic replace, directory fsync, batch-header peeking) that every
other module in ``logstore/segments`` shares.

Owns: every suffix and file-name rule, and the byte layout of the sidecar files. Must not: know
about Log or LogSegment state, the network, or other partitions.

Directory layout::

    <log_dir>/
      recovery-point-offset-checkpoint      text checkpoint (below)
      log-start-offset-checkpoint           text checkpoint (below)
      .clean_shutdown                       present only between a clean shutdown and startup;
                                            lists the partition directories still to recover
      .incarnation                          random id of the running broker (file_reader.py)
      <topic>-<partition>/                  topic may contain '-' and '.': split on the LAST '-'
        partition.metadata                  the topic id this log belongs to (below)
        00000000000000000000.arrow          segment: Arrow IPC stream, named by base offset
        00000000000000000000.index          sparse offset index of that segment
        00000000000000000000.timeindex      sparse time index of that segment
        00000000000000000000.txnindex       aborted-transaction index (absent: no entries)
        00000000000000001234.snapshot       producer-state snapshot taken at offset 1234
        *.cleaned / *.swap / *.tmp          transient files of compaction and atomic writes
      <topic>-<partition>.<uuid>-delete/    a deleted log whose files are being removed (renamed
                                            first: a crash never leaves part of a log under the
                                            partition's name); removed at the next startup

Segment file (``.arrow``), an Arrow IPC stream without end-of-stream marker:

| part            | bytes                      | meaning                                          |
|-----------------|----------------------------|--------------------------------------------------|
| schema message  | len(schema_message(schema)) | ``records.schema_message(schema)``; batches start right after it |
| batch message * | header.batch_size each     | ``records.encode_batch`` output: 0xFFFFFFFF, int32 metadata length, flatbuffer metadata (with the 74-byte batch header under ``logstore.batch``), body |

Offset index (``.index``), little-endian fixed-width entries, strictly increasing in both fields:

| field           | type  | meaning                                                          |
|-----------------|-------|------------------------------------------------------------------|
| relative_offset | int32 | base offset of an indexed batch minus the segment's base offset  |
| position        | int32 | byte position of that batch's message in the segment file        |

An entry is written for the first batch of a segment and then for each batch appended once at
least ``index_interval_bytes`` have been written since the previous entry.

Time index (``.timeindex``), little-endian, timestamps strictly increasing:

| field           | type  | meaning                                                          |
|-----------------|-------|------------------------------------------------------------------|
| timestamp       | int64 | largest record timestamp in the segment so far (ms)              |
| relative_offset | int32 | base offset of the batch that reached that timestamp, relative   |

An entry is written at the same points as an offset-index entry when the segment's largest
timestamp has risen since the last time entry, and once more when the segment is sealed.
Every record before the batch at ``relative_offset`` has a timestamp <= ``timestamp``.

Aborted-transaction index (``.txnindex``), little-endian fixed-width entries, one per ABORT
marker in the segment that closed a transaction with data, in marker offset order (Kafka's
TransactionIndex without its per-entry version):

| field              | type  | meaning                                                       |
|--------------------|-------|---------------------------------------------------------------|
| producer_id        | int64 | producer of the aborted transaction                           |
| first_offset       | int64 | offset of the transaction's first batch in this partition      |
| last_offset        | int64 | offset of the ABORT marker, which lies in this segment         |
| last_stable_offset | int64 | the LSO right after the abort, ignoring the high watermark: the first offset of the earliest other open transaction, else last_offset + 1 |

An entry is written to the file as soon as its marker is appended (no fsync: the file is fsynced
with the segment's indexes once the segment is sealed), so a reader in another process that
learnt an LSO finds every abort below it. Collecting the aborted transactions that overlap
[start, end) reads the index of the segment holding ``start`` and of the later ones, and stops at
an entry whose last_stable_offset is >= end: any transaction aborted after it began at or after
that LSO.

Producer snapshot (``.snapshot``): UTF-8 JSON ``{"version": 2, "offset": N, "producers":
[...]}``, the producer state after every batch below offset N (see producer_state.py). Each
producer is ``{"producer_id", "epoch", "coordinator_epoch", "txn_first_offset", "last_offset",
"last_seen_ms", "batches"}``; ``txn_first_offset`` is the first offset of its open transaction
or null, ``last_offset`` that of its last batch, ``last_seen_ms`` the broker time its idleness
is counted from (-1: not yet), for expiry. Version 1 (no ``coordinator_epoch``, no
``txn_first_offset``) is still read, as a state with no open transaction; a snapshot without
``last_offset``/``last_seen_ms`` (written before expiry) as offset N - 1 and -1.

Checkpoint files (text, as in Kafka): line 1 the version (0), line 2 the number of entries, then
one ``<topic> <partition> <offset>`` line per partition.

Partition metadata (``partition.metadata``, Kafka's KIP-516 file), UTF-8 text, which incarnation
of its topic a partition directory belongs to (a topic deleted and created again under its name
has a new id, and the old directory is not its log):

| line | content                                  |
|------|------------------------------------------|
| 1    | ``version: 0``                           |
| 2    | ``topic_id: <id>`` (the metadata's topic id, 32 hex digits) |

Written when a log is created for a topic whose id is known (in place when new), without an
fsync (bringing thousands of partitions online must not wait for one each, as for the first
leader epoch): the log manager's next checkpoint fsyncs it, the log's first flush its name; a
crash before may leave it absent or empty, which reads as no record. A directory without one
(written before the file existed) adopts its topic's current id.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import uuid
from pathlib import Path

from logstore.errors import CorruptRecordError
from logstore.model import TopicPartition
from logstore.records import HEADER_SIZE, MAGIC, BatchHeader

SEGMENT_SUFFIX = ".arrow"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
TMP_SUFFIX = ".tmp"

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
# A random id written at each startup: a reader in another process that finds the id a broker
# gave it in this file knows it sees that broker's own files (same machine, same run).
INCARNATION_FILE = ".incarnation"
CHECKPOINT_VERSION = 0
DELETE_SUFFIX = "-delete"
PARTITION_METADATA_FILE = "partition.metadata"
PARTITION_METADATA_VERSION = 0

OFFSET_ENTRY = struct.Struct("<ii")
TIME_ENTRY = struct.Struct("<qi")
TXN_ENTRY = struct.Struct("<qqqq")
MAX_RELATIVE_OFFSET = 2**31 - 1
MAX_POSITION = 2**31 - 1

CONTINUATION = 0xFFFFFFFF
PREFIX = struct.Struct("<Ii")
PREFIX_SIZE = PREFIX.size

_OFFSET_NAME_RE = re.compile(r"^(\d{20})(\.[a-z]+)$")
_PARTITION_DIR_RE = re.compile(r"^(.+)-(\d+)$")
_DELETED_DIR_RE = re.compile(r"^.+-\d+\.[0-9a-f]{32}" + re.escape(DELETE_SUFFIX) + "$")


def file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000001234.arrow`` for base offset 1234 and suffix ``.arrow``."""
    return f"{base_offset:020d}{suffix}"


def parse_file_name(name: str) -> tuple[int, str] | None:
    """(offset, suffix) of a segment, index or snapshot file name; None for anything else."""
    match = _OFFSET_NAME_RE.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    """The partition a directory holds; topic names may contain '-', so split on the last one."""
    match = _PARTITION_DIR_RE.match(name)
    if match is None:
        return None
    return TopicPartition(match.group(1), int(match.group(2)))


def is_deleted_partition_dir(name: str) -> bool:
    """Whether ``name`` is a partition directory's being removed (``remove_partition_dir``)."""
    return _DELETED_DIR_RE.match(name) is not None


def fsync_dir(path: Path) -> None:
    """Make file creations, renames and deletions in ``path`` durable."""
    fsync_file(path)  # the same call: fsync of a descriptor opened read-only


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    """Make what was written to ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partition_dir(dir: Path) -> None:
    """Remove a partition directory and its files (no-op if it is gone): renamed aside
    first, durably, then emptied (see the directory layout above)."""
    doomed = dir.with_name(f"{dir.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
    try:
        os.replace(dir, doomed)
    except FileNotFoundError:
        return
    fsync_dir(dir.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def write_checkpoint(path: Path, offsets: dict[TopicPartition, int]) -> None:
    """Atomically write a Kafka-style offset checkpoint file."""
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items())]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """The entries of a checkpoint file; an absent file is empty. Raises ValueError naming the
    file on a malformed one."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            raise ValueError(f"unsupported version {lines[0]!r}")
        count = int(lines[1])
        entries = [line.split() for line in lines[2: 2 + count]]
        if len(entries) != count or any(len(e) != 3 for e in entries):
            raise ValueError(f"expected {count} entries of 3 fields")
        return {TopicPartition(t, int(p)): int(o) for t, p, o in entries}
    except (IndexError, ValueError) as e:
        raise ValueError(f"malformed checkpoint file {path}: {e}") from e


def write_partition_metadata(dir: Path, topic_id: str, durable: bool = True) -> None:
    """Record in the partition directory ``dir`` the id of the topic its log belongs to.
    ``durable`` False (a new log's: the caller makes it durable later) writes a file that does
    not exist yet in place, without a temporary file to rename (half the time: one is written
    per partition created)."""
    path = dir / PARTITION_METADATA_FILE
    data = f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id}\n".encode()
    if durable:
        atomic_write(path, data)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        atomic_write(path, data, durable=False)
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_partition_metadata(dir: Path) -> str | None:
    """The topic id recorded in the partition directory ``dir``; None when it records none (a
    log written before the file existed, or an empty file: a crash before a new log's file was
    made durable). Raises ValueError naming the file when it cannot be read or parsed."""
    path = dir / PARTITION_METADATA_FILE
    try:  # os.open: a broker reads one per partition at start
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e}") from None
    try:
        text = os.read(fd, 4096).decode()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} cannot be read: {e}") from None
    finally:
        os.close(fd)
    if not text:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    version = fields.get("version", "").strip()
    topic_id = fields.get("topic_id", "").strip()
    if version != str(PARTITION_METADATA_VERSION) or not topic_id:
        raise ValueError(f"{path} is malformed (version {version or 'missing'}, "
                         f"topic_id {topic_id or 'missing'})")
    return topic_id


def peek_header(data: bytes | memoryview, at: int) -> BatchHeader | int:
    """The batch header of the message starting at ``data[at:]``, or, when ``data`` ends too
    early to tell, the number of bytes from ``at`` that are needed. Raises CorruptRecordError
    (without file context) when the bytes cannot be a batch message."""
    if len(data) - at < PREFIX_SIZE:
        return PREFIX_SIZE
    continuation, metadata_len = (int(v) for v in PREFIX.unpack_from(data, at))
    if continuation != CONTINUATION or metadata_len < HEADER_SIZE:
        raise CorruptRecordError(f"no IPC message prefix (got {continuation:#x}, {metadata_len})")
    end = at + PREFIX_SIZE + metadata_len
    if len(data) < end:
        return PREFIX_SIZE + metadata_len
    found = bytes(data[at + PREFIX_SIZE: end]).find(MAGIC)
    if found < 0:
        raise CorruptRecordError("message metadata carries no logstore batch header")
    start = at + PREFIX_SIZE + found
    if start + HEADER_SIZE > end:
        raise CorruptRecordError("batch header runs past the message metadata")
    header = BatchHeader.unpack(data[start: start + HEADER_SIZE])
    if header.batch_size < PREFIX_SIZE + metadata_len or header.record_count <= 0:
        raise CorruptRecordError(f"implausible batch header {header}")
    return header
