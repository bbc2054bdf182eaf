"""A broker's log directories as a whole: who may use them, and what is checked in them before
any log is loaded.

Owns: ``LogDirs``: creating each ``log_dirs`` entry, the exclusive advisory lock on
``<dir>/.lock`` held while the broker runs (in both modes: a second broker listing a running
broker's directory, in any position, is refused before it can touch it), ``<dir>/meta.properties``
(Kafka's file: ``version`` and ``broker.id``, written at a directory's first start; a start with
another ``broker_id`` is refused, as Kafka does), the partition directories present, and setting
aside, at start, those the metadata (given by the caller) does not give this broker or that
record another topic id (``partition.metadata``) than their topic's now (renamed
``<topic>-<partition>.<uuid>-stray``, Kafka's suffix, never deleted here: an operator deletes them
once sure). Must not: open logs, read the metadata store itself, or know about the network.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from logstore.controller.store import TopicRecord
from logstore.errors import ConfigError
from logstore.model import TopicPartition
from logstore.segments.format import (
    PARTITION_METADATA_FILE,
    atomic_write,
    fsync_dir,
    parse_partition_dir,
    read_partition_metadata,
    write_partition_metadata,
)

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
META_FILE = "meta.properties"
META_VERSION = "0"
STRAY_SUFFIX = "-stray"


class LogDirs:
    """The ``log_dirs`` of one broker: locked by ``lock``, let go by ``release``."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = [Path(d) for d in dirs]
        self._locks: list[IO[bytes]] = []
        # partition.metadata files set_aside_strays wrote for directories that recorded no
        # topic id, not fsynced yet: the log manager's next checkpoint makes them durable
        # (a crash before leaves them empty or absent, so the next start adopts again).
        self.unsynced_metadata: list[Path] = []

    def lock(self) -> None:
        """Create each directory and take its lock; ConfigError naming the directory when it
        cannot be used or another process holds it (every lock taken is let go again)."""
        try:
            for d in self.dirs:
                self._locks.append(_lock_dir(d))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for lock_file in self._locks:
            lock_file.close()
        self._locks.clear()

    def check_broker_id(self, broker_id: int) -> bool:
        """Refuse directories another broker id wrote (ConfigError naming the file and both
        ids); whether every directory already records ``broker_id`` (False: a first start,
        or the first since the file was introduced; ``record_broker_id`` writes it once the
        start's other checks passed)."""
        known = True
        for d in self.dirs:
            recorded = read_broker_id(d / META_FILE)
            if recorded is not None and recorded != broker_id:
                raise ConfigError(
                    f"{d / META_FILE} records broker.id={recorded} but the config says "
                    f"broker_id={broker_id}: this log directory belongs to broker {recorded}; "
                    "fix broker_id (or log_dirs) in the broker config")
            known = known and recorded is not None
        return known

    def record_broker_id(self, broker_id: int) -> None:
        """Write ``broker_id`` into the directories without ``meta.properties``."""
        for d in self.dirs:
            if not (d / META_FILE).exists():
                atomic_write(d / META_FILE, (f"version={META_VERSION}\n"
                                             f"broker.id={broker_id}\n").encode())

    def partition_dirs(self) -> list[Path]:
        """Every ``<topic>-<partition>`` directory in the log directories."""
        found: list[Path] = []
        for d in self.dirs:
            with os.scandir(d) as entries:
                found += [Path(e.path) for e in entries
                          if e.is_dir() and parse_partition_dir(e.name) is not None]
        return sorted(found)

    def set_aside_strays(self, broker_id: int, topics: Mapping[str, TopicRecord],
                         first_start: bool) -> dict[TopicPartition, str]:
        """Partition directories that ``topics`` (the metadata) does not give ``broker_id``,
        or that record another topic id than their topic's (deleted and created again while
        this broker was down), are renamed aside before the log manager sees them, never
        deleted at start: a wrong config or a stale view must not cost data. One that records
        no topic id (an earlier version's) adopts its topic's; one whose record cannot be read
        is refused. On a first start with these directories (no ``meta.properties`` yet: an
        upgrade, or a copied directory), partitions of known topics that the metadata gives
        only to other brokers, and none to this one, mean a wrong ``broker_id``: refused,
        naming the ids, before anything is renamed or written. Returns the topic id of each
        partition kept."""
        strays: list[tuple[Path, str]] = []
        owners: set[int] = set()
        mine: dict[Path, tuple[TopicPartition, TopicRecord]] = {}
        for path in self.partition_dirs():
            tp = parse_partition_dir(path.name)
            assert tp is not None
            record = topics.get(tp.topic)
            if record is None:
                strays.append((path, f"topic {tp.topic!r} is not in the metadata"))
                continue
            replicas = record.replicas.get(tp.partition, ())
            if broker_id in replicas:
                mine[path] = (tp, record)
            else:
                owners.update(replicas)
                strays.append((path, f"the metadata does not assign {tp} to broker {broker_id}"))
        if first_start and owners and not mine:
            raise ConfigError(
                f"broker_id={broker_id}, but the metadata assigns the partitions in log_dirs "
                f"{[str(d) for d in self.dirs]} to broker(s) {sorted(owners)} and none to "
                f"{broker_id}: fix broker_id (nothing was changed), or move those directories "
                "away to start this broker without them")
        kept = _check_topic_ids(mine, strays, self.unsynced_metadata)
        for path, why in strays:
            self.set_aside(path, why)
        return kept

    def set_aside(self, path: Path, reason: str) -> Path:
        """Rename a partition directory out of the broker's sight (its data is kept)."""
        target = path.with_name(f"{path.name}.{uuid.uuid4().hex}{STRAY_SUFFIX}")
        os.replace(path, target)
        fsync_dir(path.parent)
        log.warning("stray log %s: %s; renamed to %s (delete it once sure it is not needed)",
                    path, reason, target.name)
        return target


def _check_topic_ids(mine: dict[Path, tuple[TopicPartition, TopicRecord]],
                     strays: list[tuple[Path, str]], written: list[Path]
                     ) -> dict[TopicPartition, str]:
    """The topic id of each of ``mine`` whose directory records its topic's, or none (written
    by an earlier version: it adopts it, written here without an fsync, its path added to
    ``written``: the first start after an upgrade writes one per partition); why each other
    one is a stray is added to ``strays``. A file that cannot be read is refused (ConfigError
    naming it), as a bad ``meta.properties`` is. One small file read per directory."""
    kept: dict[TopicPartition, str] = {}
    for path, (tp, record) in mine.items():
        try:
            recorded = read_partition_metadata(path)
        except ValueError as e:
            raise ConfigError(
                f"{e}; it records which incarnation of topic {record.name!r} the partition's "
                f"log belongs to: restore it, or remove it to have the log taken as the "
                f"topic's now (topic id {record.topic_id})") from None
        if recorded is None:
            log.info("%s records no topic id; it adopts topic %r's, %s", path, record.name,
                     record.topic_id)
            write_partition_metadata(path, record.topic_id, durable=False)
            written.append(path / PARTITION_METADATA_FILE)
        elif recorded != record.topic_id:
            strays.append((path, f"it records topic id {recorded}, but topic {record.name!r} "
                                 f"is now topic id {record.topic_id} (deleted and created "
                                 "again)"))
            continue
        kept[tp] = record.topic_id
    return kept


def _lock_dir(d: Path) -> IO[bytes]:
    try:
        d.mkdir(parents=True, exist_ok=True)
        lock_file = open(d / LOCK_FILE, "ab")  # noqa: SIM115 (held open while running)
    except OSError as e:
        # mkdir on a regular file says "File exists"; say what is wrong with it.
        why = "it is not a directory" if isinstance(e, FileExistsError) else e.strerror or e
        raise ConfigError(f"log_dirs entry {str(d)!r} cannot be used as a log directory: "
                          f"{why}") from None
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise ConfigError(f"log_dirs entry {str(d)!r} is in use by another running broker "
                          f"(it holds {d / LOCK_FILE}); a log directory belongs to one broker"
                          ) from None
    return lock_file


def read_broker_id(path: Path) -> int | None:
    """The ``broker.id`` recorded in a ``meta.properties`` file (None: no file)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror or e}") from None
    props = dict(line.split("=", 1) for line in text.splitlines()
                 if "=" in line and not line.lstrip().startswith("#"))
    try:
        return int(props["broker.id"].strip())
    except (KeyError, ValueError):
        raise ConfigError(f"{path}: no valid broker.id line; the file records which broker "
                          "owns this log directory (restore it, or remove it if sure)") from None
