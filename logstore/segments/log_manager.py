"""Every partition log of one broker, across its log directories.

Owns: finding the ``<topic>-<partition>`` directories at startup (with the recovery-point and
log-start-offset checkpoints and the clean-shutdown marker), placing new partitions in the log
directory with the fewest, the bound on open segment files (``max_open_segment_files``, an
``OpenFileCache`` every segment shares), writing checkpoints, and the background threads
(retention, cleaner, flusher, periodic checkpoint) that stop on ``shutdown``. Must not: know
about replication, leadership or the network.

Topic ids (KIP-516): a log created for a topic whose id is known records it in its directory
(``partition.metadata``) before it is handed out, made durable by the next checkpoint; at startup the caller gives each found log the
id its directory records (the broker reads them while checking them against the metadata, so
nothing is read twice); a log asked for under another topic id is refused (UNKNOWN_TOPIC_ID:
it belongs to a deleted incarnation of the topic), and one that records none adopts the id it
is asked for.

Startup opens no log: each directory becomes a deferred ``Log`` that loads (and recovers) on its
first use, so a broker with 10,000 idle partitions starts in the time it takes to list them.
After a clean shutdown a deferred log is at rest: its checkpointed recovery point is its log end
offset (the shutdown flushed it), so leadership and offset questions need not open it. After an
unclean one, each log is recovered from its recovery point (Kafka's rule) when first used, before
anything reads it. A clean shutdown that finds logs still unrecovered names them in the marker
(one partition directory per line), so the next start recovers them too.

The flusher does, as Kafka does: every ``flush_check_interval_ms`` it fsyncs the segments
rolled since the last pass (moving each log's recovery point to its active segment's base
offset, so a crash re-validates only the active segment), and the whole log when its flush_ms
has elapsed. The checkpoint thread and ``shutdown`` record the recovery points.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from logstore.clock import Clock
from logstore.config import TopicConfig
from logstore.errors import UnknownTopicIdError
from logstore.model import TopicPartition
from logstore.segments.file_cache import OpenFileCache
from logstore.segments.format import (
    CLEAN_SHUTDOWN_FILE,
    INCARNATION_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA_FILE,
    RECOVERY_POINT_CHECKPOINT,
    atomic_write,
    fsync_dir,
    fsync_file,
    is_deleted_partition_dir,
    parse_partition_dir,
    partition_dir_name,
    read_checkpoint,
    unlink_quietly,
    write_checkpoint,
    write_partition_metadata,
)
from logstore.segments.log import DeferredOpen, Log

logger = logging.getLogger(__name__)

CLOSE_THREADS = 16


class LogManager:
    """Opens, creates, deletes and maintains the logs in ``log_dirs``."""

    def __init__(self, log_dirs: list[Path], clock: Clock,
                 config_for: Callable[[str], TopicConfig],
                 retention_check_interval_ms: int = 60_000, cleaner_interval_ms: int = 15_000,
                 flush_check_interval_ms: int = 1_000,
                 checkpoint_interval_ms: int = 60_000,
                 max_open_segment_files: int | None = None) -> None:
        if not log_dirs:
            raise ValueError("LogManager needs at least one log directory")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.clock = clock
        self.config_for = config_for
        self.retention_check_interval_ms = retention_check_interval_ms
        self.cleaner_interval_ms = cleaner_interval_ms
        self.flush_check_interval_ms = flush_check_interval_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.files = OpenFileCache(max_open_segment_files)
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_counts: dict[Path, int] = {d: 0 for d in self.log_dirs}
        self._creating: dict[TopicPartition, threading.Lock] = {}
        # partition.metadata files written without an fsync (checkpoint() makes them durable)
        self._unsynced_metadata: list[Path] = []
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        # Per thread: inside checkpoint_once (depth), and a checkpoint owed by its deletions.
        self._deferring = threading.local()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self.incarnation = uuid.uuid4().hex

    # -- startup and shutdown ------------------------------------------------------------------

    def sync_metadata_later(self, paths: list[Path]) -> None:
        """partition.metadata files written without an fsync, for the next checkpoint to make
        durable (as a new log's)."""
        with self._lock:
            self._unsynced_metadata += paths

    def startup(self, topic_ids: Mapping[TopicPartition, str] | None = None) -> None:
        """Find every partition directory (opening none), then start the threads.
        ``topic_ids``: the topic id each found partition's directory records (none read
        here; a partition left out has an unknown one)."""
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._load_dir(log_dir, topic_ids or {})
            atomic_write(log_dir / INCARNATION_FILE, self.incarnation.encode(), durable=False)
        self._started = True
        self._stop.clear()
        for name, interval, task in (
                ("retention", lambda: self.retention_check_interval_ms, self.run_retention_once),
                ("cleaner", lambda: self.cleaner_interval_ms, self.run_cleaner_once),
                ("flusher", self._flush_interval_ms, self.run_flush_once),
                ("checkpoint", lambda: self.checkpoint_interval_ms, self.checkpoint)):
            thread = threading.Thread(target=self._loop, args=(name, interval, task),
                                      name=f"log-manager-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("log manager started with %d log(s) in %s", len(self._logs),
                    [str(d) for d in self.log_dirs])

    def _load_dir(self, log_dir: Path, topic_ids: Mapping[TopicPartition, str]) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean, unrecovered = _read_marker(marker)
        recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
        found: dict[TopicPartition, Log] = {}
        deleting: list[Path] = []  # deleted logs a stop interrupted
        configs: dict[str, TopicConfig] = {}  # asked once per topic, not per partition
        with os.scandir(log_dir) as entries:
            for entry in entries:
                tp = parse_partition_dir(entry.name) if entry.is_dir() else None
                if tp is None:
                    if is_deleted_partition_dir(entry.name) and entry.is_dir():
                        deleting.append(Path(entry.path))
                    continue
                tp_clean = clean and entry.name not in unrecovered
                how = DeferredOpen(recovery_points.get(tp, 0), start_offsets.get(tp, 0),
                                   tp_clean, tp_clean and tp in recovery_points)
                config = configs.get(tp.topic)
                if config is None:
                    config = configs[tp.topic] = self.config_for(tp.topic)
                found[tp] = log = Log.deferred(Path(entry.path), tp.topic, tp.partition,
                                               config, self.clock, how, self.files)
                log.topic_id = topic_ids.get(tp)
        with self._lock:
            self._logs.update(found)
            self._dir_counts[log_dir] = self._dir_counts.get(log_dir, 0) + len(found)
        logger.info("%s: %d log(s) found, %s shutdown%s", log_dir, len(found),
                    "clean" if clean else "unclean",
                    f" ({len(unrecovered)} still to recover)" if unrecovered else "")
        for path in deleting:
            logger.info("%s: removing the rest of a deleted log", path)
            shutil.rmtree(path, ignore_errors=True)
        unlink_quietly(marker)
        fsync_dir(log_dir)

    @staticmethod
    def _read_checkpoint(path: Path) -> dict[TopicPartition, int]:
        try:
            return read_checkpoint(path)
        except ValueError as e:
            logger.warning("%s; recovering every log in %s from its start", e, path.parent)
            return {}

    def shutdown(self) -> None:
        """Stop the threads, flush and close every log, checkpoint, mark a clean shutdown."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        with self._lock:
            logs = list(self._logs.values())
        loaded = [log for log in logs if log.is_loaded]
        if len(loaded) > 1:  # closing is mostly fsync: overlap them
            with ThreadPoolExecutor(CLOSE_THREADS, thread_name_prefix="log-close") as pool:
                list(pool.map(Log.close, loaded))
        for log in logs:
            log.close()
        self.checkpoint()
        for log_dir in self.log_dirs:
            if log_dir.exists():
                unrecovered = sorted(log.dir.name for log in logs
                                     if log.needs_recovery and log.dir.parent == log_dir)
                atomic_write(log_dir / CLEAN_SHUTDOWN_FILE, "".join(
                    f"{name}\n" for name in unrecovered).encode())
        self._started = False
        logger.info("log manager shut down cleanly (%d logs)", len(logs))

    def _loop(self, name: str, interval_ms: Callable[[], int],
              task: Callable[[], object]) -> None:
        while not self._stop.wait(interval_ms() / 1000.0):
            try:
                task()
            except Exception:
                logger.exception("log manager %s task failed", name)

    def _flush_interval_ms(self) -> int:
        """Check often enough for the smallest positive flush_ms of any log."""
        periods = [log.config.flush_ms for log in self.all_logs().values()
                   if log.config.flush_ms]
        return max(1, min([self.flush_check_interval_ms, *periods]))

    # -- logs ----------------------------------------------------------------------------------

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def all_logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def get_or_create_log(self, tp: TopicPartition, config: TopicConfig,
                          schema: pa.Schema, topic_id: str | None = None) -> Log:
        """The log of ``tp``, created in the log directory with the fewest partitions. Logs of
        different partitions are created concurrently (the files are made outside the lock).
        ``topic_id`` (None: unchecked) is recorded in a new log's directory; an existing log
        of another topic id is refused with UNKNOWN_TOPIC_ID (the caller deletes it first)."""
        tp = TopicPartition(tp.topic, tp.partition)
        with self._lock:
            log = self._logs.get(tp)
            if log is not None:
                log.expect_schema(schema)
            else:
                creating = self._creating.setdefault(tp, threading.Lock())
        if log is not None:
            if topic_id is not None:
                _check_topic_id(log, tp, topic_id)
            return log
        with creating:
            return self._create_log(tp, config, schema, topic_id)

    def _create_log(self, tp: TopicPartition, config: TopicConfig, schema: pa.Schema,
                    topic_id: str | None) -> Log:
        with self._lock:
            log = self._logs.get(tp)
            if log is not None:
                return log
            log_dir = min(self.log_dirs, key=lambda d: self._dir_counts.get(d, 0))
            self._dir_counts[log_dir] = self._dir_counts.get(log_dir, 0) + 1
        try:
            log = Log.open(log_dir / partition_dir_name(tp.topic, tp.partition), tp.topic,
                           tp.partition, config, schema, self.clock, files=self.files)
            _record_topic_id(log, topic_id)
        except BaseException:
            with self._lock:
                self._dir_counts[log_dir] -= 1
                self._creating.pop(tp, None)
            raise
        with self._lock:
            self._logs[tp] = log
            self._creating.pop(tp, None)
            if topic_id is not None:
                self._unsynced_metadata.append(log.dir / PARTITION_METADATA_FILE)
        return log

    def delete_log(self, tp: TopicPartition) -> None:
        """Delete the log of ``tp`` and its directory (no-op if absent)."""
        key = TopicPartition(tp.topic, tp.partition)
        with self._lock:
            log = self._logs.pop(key, None)
            if log is not None:
                parent = log.dir.parent
                self._dir_counts[parent] = self._dir_counts.get(parent, 1) - 1
        if log is not None:
            try:
                log.delete()
            except BaseException:
                # Still on disk (a failed rename): known again, closed, so that a later
                # delete tries again and no new log of the name adopts its directory.
                with self._lock:
                    if self._logs.setdefault(key, log) is log:
                        self._dir_counts[parent] = self._dir_counts.get(parent, 0) + 1
                raise
            if getattr(self._deferring, "depth", 0):
                self._deferring.owed = True
            else:
                self.checkpoint()

    @contextmanager
    def checkpoint_once(self) -> Iterator[None]:
        """Logs this thread deletes inside the block rewrite the checkpoints once, as it ends,
        not once each: a checkpoint of 10k logs takes about 50 ms, so deleting a 200-partition
        topic took 10 s. Whoever creates a log of a deleted partition's name again must do it
        after the block (a stale checkpoint entry must never meet a new log at a restart)."""
        deferring = self._deferring
        deferring.depth = getattr(deferring, "depth", 0) + 1
        try:
            yield
        finally:
            deferring.depth -= 1
            if not deferring.depth and getattr(deferring, "owed", False):
                deferring.owed = False
                self.checkpoint()

    # -- checkpoints and background work -----------------------------------------------------

    def checkpoint(self) -> None:
        """Atomically write the recovery-point and log-start-offset checkpoint of every dir,
        after making the topic ids recorded since the last one durable."""
        with self._checkpoint_lock:
            self._sync_metadata()
            logs = self.all_logs()
            for log_dir in self.log_dirs:
                if not log_dir.exists():
                    continue
                mine = {tp: log.checkpoint_offsets() for tp, log in logs.items()
                        if log.dir.parent == log_dir}
                write_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT,
                                 {tp: offsets[0] for tp, offsets in mine.items()})
                write_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT,
                                 {tp: offsets[1] for tp, offsets in mine.items()})

    def _sync_metadata(self) -> None:
        """fsync the partition.metadata files new logs recorded their topic ids in (one of a
        log deleted since is gone: nothing to do)."""
        with self._lock:
            paths, self._unsynced_metadata = self._unsynced_metadata, []
        for i, path in enumerate(paths):
            try:
                fsync_file(path)
            except FileNotFoundError:
                continue
            except BaseException:
                with self._lock:
                    self._unsynced_metadata += paths[i:]
                raise

    def run_retention_once(self) -> int:
        """Apply retention to every log, and forget its idle producers
        (producer_id_expiration_ms); returns the number of segments deleted."""
        deleted = 0
        for tp, log in self.all_logs().items():
            try:
                deleted += log.delete_old_segments()
                log.remove_expired_producers()
            except Exception:
                logger.exception("%s: retention failed", tp)
        return deleted

    def run_cleaner_once(self) -> int:
        """Compact every log with a compact policy whose dirty ratio is at least
        min_cleanable_dirty_ratio; returns the number of logs compacted."""
        compacted = 0
        for tp, log in self.all_logs().items():
            config = log.config
            ratio = log.dirty_ratio() if config.compact else 0.0
            if ratio == 0.0 or ratio < config.min_cleanable_dirty_ratio:
                continue
            try:
                log.compact()
                compacted += 1
            except Exception:
                logger.exception("%s: compaction failed", tp)
        return compacted

    def run_flush_once(self) -> int:
        """Flush every log whose flush_ms has elapsed since its last flush, then the segments
        of every log rolled since its last flush. Returns how many logs flushed rolled
        segments."""
        flushed = 0
        for tp, log in self.all_logs().items():
            try:
                log.maybe_flush()
                flushed += log.flush_rolled_segments()
            except Exception:
                logger.exception("%s: background flush failed", tp)
        return flushed


def _record_topic_id(log: Log, topic_id: str | None) -> None:
    """Record a new log's topic id before anyone can append to it, without an fsync (see
    format.py); the log is closed again if that fails."""
    if topic_id is None:
        return
    try:
        write_partition_metadata(log.dir, topic_id, durable=False)
    except BaseException:
        log.close()
        raise
    log.topic_id = topic_id


def _check_topic_id(log: Log, tp: TopicPartition, topic_id: str) -> None:
    """``log`` may serve topic id ``topic_id``: it records it, or records none and adopts it
    (a log written before topic ids were recorded)."""
    if log.topic_id == topic_id:
        return
    if log.topic_id is not None:
        raise UnknownTopicIdError(
            f"{tp}: the log in {log.dir} belongs to topic id {log.topic_id}, not to "
            f"{topic_id} (the topic was deleted and created again)")
    write_partition_metadata(log.dir, topic_id)
    log.topic_id = topic_id
    logger.info("%s: log in %s recorded no topic id; it adopts %s", tp, log.dir, topic_id)


def _read_marker(path: Path) -> tuple[bool, frozenset[str]]:
    """(whether the last shutdown was clean, the partition directories it left unrecovered)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False, frozenset()
    except UnicodeDecodeError as e:
        # Which directories it lists is unknown: recover them all, as after a crash.
        logger.warning("%s is unreadable (%s); treating the last shutdown as unclean", path, e)
        return False, frozenset()
    return True, frozenset(line for line in text.splitlines() if line)
