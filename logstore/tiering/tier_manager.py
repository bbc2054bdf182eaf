"""The RemoteLogManager: per partition this broker leads, one task that copies sealed segments
to the object store, applies local and remote retention, and cleans up after failed copies.

Owns: the per-partition task state (entries read once from the metadata store when leadership
starts, then kept in step with its own writes), the order of writes (metadata first, objects
second), retries with backoff, the copy rate limit, the partition's log start offset over both
tiers, what remote reads may use (``find_remote_segment``), and tier statistics. Must not:
decide the rules (``rules.py``), import fsspec or kazoo, delete a local segment that has no
finished copy, or write metadata for a partition it no longer leads.

One task run, in order:
1. (first run of a leadership) read the partition's entries; FINISHED segments outside the
   leader's epoch lineage are deleted, the rest are readable;
2. copy candidates oldest first: COPY_SEGMENT_STARTED entry, every file under a fresh segment
   id (the segment file, then its sidecars concurrently, the column checksums of projected
   reads among them), COPY_SEGMENT_FINISHED entry. On failure the objects uploaded so far are
   deleted, the entry is taken to DELETE_SEGMENT_FINISHED if possible, and the task retries
   with backoff; nothing local is deleted;
3. delete local segments that are copied and past local retention;
4. remote retention: DELETE_SEGMENT_STARTED, delete the objects, DELETE_SEGMENT_FINISHED (the
   entry is removed); the log start offset moves past them;
5. every ``orphan_grace_ms``: finish stale entries (copies STARTED longer than the grace period,
   deletions that never finished) and delete objects under the partition's prefix whose segment
   id has no entry, once older than the grace period.

Fencing: every metadata write carries the leader epoch the task started with; a refusal
(FencedLeaderEpochError: a newer leader epoch, or the topic is gone) stops the task cleanly. The
broker starts a new task (``on_become_leader``) at each new leader epoch it learns, including
its own after an ISR change.

Threads: ``start()`` runs due tasks on a background thread; tests call ``run_task`` directly
with a FakeClock. A task never runs concurrently with itself; readers call
``find_remote_segment`` from any thread and see an immutable snapshot.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from logstore.clock import Clock
from logstore.config import BrokerConfig
from logstore.errors import ApiError, FencedLeaderEpochError
from logstore.model import TopicPartition
from logstore.segments.format import TXN_INDEX_SUFFIX
from logstore.tiering import rules
from logstore.tiering.log_view import TieredLog
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    epoch_lineage_slice,
)
from logstore.tiering.naming import (
    COLUMN_CRC_SUFFIX,
    EPOCH_CHECKPOINT_SUFFIX,
    partition_prefix,
    segment_key,
    segment_keys,
)
from logstore.tiering.projection import column_checksums
from logstore.tiering.rules import LocalSegment, Retention
from logstore.tiering.store import ObjectStore, RemoteStorageError

logger = logging.getLogger(__name__)

S = RemoteLogSegmentState
DEFAULT_ORPHAN_GRACE_MS = 15 * 60_000
UPLOAD_THREADS = 6  # a segment's sidecars go up together (at most 6 of them)


class RemoteLogMetadataStore(Protocol):
    """The part of the cluster MetadataStore that tiering uses (controller/store.py)."""

    def remote_log_segments(self, partition: TopicIdPartition
                            ) -> list[RemoteLogSegmentMetadata]: ...

    def remote_log_partitions(self) -> list[TopicIdPartition]: ...

    def put_remote_log_segment(self, metadata: RemoteLogSegmentMetadata,
                               leader_epoch: int | None) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteLogManagerConfig:
    task_interval_ms: int = 30_000
    copy_max_bytes_per_second: int | None = None
    orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS
    retry_backoff_ms: int = 500
    retry_backoff_max_ms: int = 30_000
    broker_id: int = -1

    @classmethod
    def of(cls, broker: BrokerConfig) -> RemoteLogManagerConfig:
        return cls(task_interval_ms=broker.remote_log_manager_task_interval_ms,
                   copy_max_bytes_per_second=broker.remote_log_manager_copy_max_bytes_per_second,
                   orphan_grace_ms=broker.remote_log_manager_orphan_grace_ms,
                   retry_backoff_ms=broker.remote_log_manager_task_retry_backoff_ms,
                   retry_backoff_max_ms=broker.remote_log_manager_task_retry_backoff_max_ms,
                   broker_id=broker.broker_id)


@dataclass(frozen=True, slots=True)
class TierStats:
    """One partition's tiering state, for ``topics describe``."""

    log_start_offset: int
    local_log_start_offset: int
    remote_segments: int
    remote_bytes: int
    copy_lag_segments: int
    copy_lag_bytes: int
    leader_epoch: int
    stopped: bool


class CopyRateLimiter:
    """Bytes per second across all copies, as a token bucket allowed into debt by one segment:
    a copy starts when the balance is not negative and spends its bytes. Never sleeps: the
    caller is told how long to wait and schedules itself."""

    def __init__(self, bytes_per_second: int | None, clock: Clock) -> None:
        self._rate = bytes_per_second
        self._clock = clock
        self._tokens = float(bytes_per_second or 0)
        self._at = clock.monotonic_ms()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock.monotonic_ms()
        assert self._rate is not None
        self._tokens = min(float(self._rate), self._tokens + (now - self._at) * self._rate / 1000)
        self._at = now

    def delay_ms(self) -> int:
        if self._rate is None:
            return 0
        with self._lock:
            self._refill()
            return 0 if self._tokens >= 0 else math.ceil(-self._tokens * 1000 / self._rate)

    def spend(self, size: int) -> None:
        if self._rate is not None:
            with self._lock:
                self._refill()
                self._tokens -= size


class _Stopped(Exception):
    """The task was stopped (leadership moved on) while it ran."""


@dataclass
class _Task:
    """One partition's tiering task for one leadership (one leader epoch)."""

    log: TieredLog
    tp: TopicIdPartition
    leader_epoch: int
    entries: dict[str, RemoteLogSegmentMetadata] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    readable: tuple[RemoteLogSegmentMetadata, ...] = ()
    log_start_offset: int = 0
    loaded: bool = False
    stopped: bool = False
    running: bool = False
    failures: int = 0
    next_run_ms: float = 0.0
    next_orphan_scan_ms: float = 0.0


class RemoteLogManager:
    """Tiering for the partitions this broker leads (see the module docstring)."""

    def __init__(self, object_store: ObjectStore, metadata_store: RemoteLogMetadataStore,
                 clock: Clock, config: RemoteLogManagerConfig | None = None) -> None:
        self._store = object_store
        self._meta = metadata_store
        self._clock = clock
        self._config = config or RemoteLogManagerConfig()
        self._limiter = CopyRateLimiter(self._config.copy_max_bytes_per_second, clock)
        self._tasks: dict[TopicPartition, _Task] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._uploads = ThreadPoolExecutor(max_workers=UPLOAD_THREADS,
                                           thread_name_prefix="remote-upload")

    # -- leadership ------------------------------------------------------------------------

    def on_become_leader(self, log: TieredLog, topic_id: str, leader_epoch: int) -> None:
        """Start (or restart, at a new leader epoch) the task of ``log``'s partition; it reads
        the partition's entries at once and its first run is due now."""
        tp = TopicIdPartition(log.topic, topic_id, log.partition)
        task = _Task(log, tp, leader_epoch, log_start_offset=log.local_log_start_offset,
                     next_orphan_scan_ms=self._clock.monotonic_ms())
        with self._lock:
            old = self._tasks.get(TopicPartition(log.topic, log.partition))
            if old is not None:
                old.stopped = True
            self._tasks[TopicPartition(log.topic, log.partition)] = task
        try:
            self._load(task)
        except (ApiError, OSError) as e:  # the first run tries again
            logger.warning("%s: remote log metadata not loaded yet: %s", tp, e)
        self._wake.set()

    def on_stop_leading(self, tp: TopicPartition) -> None:
        """Stop the partition's task (it ends after the step it is in)."""
        with self._lock:
            task = self._tasks.pop(tp, None)
        if task is not None:
            task.stopped = True

    def leader_epoch(self, tp: TopicPartition) -> int | None:
        """The leader epoch the partition's task runs at (None: no task: not led here, or its
        task was fenced and stopped)."""
        task = self._tasks.get(tp)
        return None if task is None else task.leader_epoch

    # -- reads -----------------------------------------------------------------------------

    def find_remote_segment(self, tp: TopicPartition, offset: int
                            ) -> RemoteLogSegmentMetadata | None:
        """The readable (FINISHED, in lineage) segment holding ``offset``; the newest one when
        copies overlap. None when no remote segment holds it. While the partition's entries are
        not loaded yet (the metadata store was unreachable), RemoteStorageError (retriable):
        answering "out of range" then could make a consumer reset its offset."""
        task = self._tasks.get(tp)
        if task is None:
            return None
        if not task.loaded and not task.readable:
            raise RemoteStorageError(f"{tp}: offset {offset}: the remote log metadata of the "
                                     "partition is not loaded yet")
        if offset < task.log_start_offset:
            return None
        found = [m for m in task.readable if m.base_offset <= offset <= m.end_offset]
        return max(found, key=lambda m: m.base_offset) if found else None

    def remote_segments(self, tp: TopicPartition) -> list[RemoteLogSegmentMetadata]:
        task = self._tasks.get(tp)
        return [] if task is None else list(task.readable)

    def log_start_offset(self, tp: TopicPartition) -> int | None:
        """The partition's log start offset over both tiers (None: not led here). While the
        partition's entries are not loaded yet, RemoteStorageError (retriable), as for
        ``find_remote_segment``: the local log start offset would make EARLIEST skip the
        remote tier."""
        task = self._tasks.get(tp)
        if task is None:
            return None
        if not task.loaded and not task.readable:
            raise RemoteStorageError(f"{tp}: the log start offset is not known yet: the remote "
                                     "log metadata of the partition is not loaded yet")
        return task.log_start_offset

    def stats(self, tp: TopicPartition) -> TierStats | None:
        task = self._tasks.get(tp)
        if task is None:
            return None
        readable = task.readable
        lag = rules.copy_lag(task.log.local_segments(), readable)
        return TierStats(task.log_start_offset, task.log.local_log_start_offset, len(readable),
                         sum(m.size_bytes for m in readable), lag.segments, lag.bytes,
                         task.leader_epoch, task.stopped)

    # -- scheduling ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="remote-log-manager",
                                        daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            for task in self._tasks.values():
                task.stopped = True
            self._tasks.clear()
        self._uploads.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        while not self._closing.is_set():
            self.run_due()
            with self._lock:
                due = min((t.next_run_ms for t in self._tasks.values()), default=math.inf)
            wait_ms = min(due - self._clock.monotonic_ms(), self._config.task_interval_ms)
            self._wake.wait(max(wait_ms, 10) / 1000)
            self._wake.clear()

    def run_due(self) -> int:
        """Run every task whose time has come; returns how many ran."""
        now = self._clock.monotonic_ms()
        with self._lock:
            due = [tp for tp, t in self._tasks.items() if t.next_run_ms <= now]
        for tp in due:
            self.run_task(tp)
        return len(due)

    def run_task(self, tp: TopicPartition) -> None:
        """One run of the partition's task now (see the module docstring)."""
        with self._lock:
            task = self._tasks.get(tp)
            if task is None or task.running:
                return
            task.running = True
        try:
            wait_ms = self._run(task)
            task.failures = 0
            task.next_run_ms = self._clock.monotonic_ms() + (
                wait_ms or self._config.task_interval_ms)
        except FencedLeaderEpochError as e:
            logger.info("%s: tiering stops at leader epoch %d: %s", task.tp, task.leader_epoch,
                        e.message)
            self._stop(task)
        except _Stopped:
            pass
        except Exception as e:  # boundary: a background task logs, backs off and retries
            self._back_off(task, e)
        finally:
            task.running = False

    def _stop(self, task: _Task) -> None:
        task.stopped = True
        key = TopicPartition(task.tp.topic, task.tp.partition)
        with self._lock:
            if self._tasks.get(key) is task:
                del self._tasks[key]

    def _back_off(self, task: _Task, error: Exception) -> None:
        task.failures += 1
        delay = min(self._config.retry_backoff_ms * 2 ** (task.failures - 1),
                    self._config.retry_backoff_max_ms)
        task.next_run_ms = self._clock.monotonic_ms() + delay
        level = logging.WARNING if isinstance(error, ApiError | OSError) else logging.ERROR
        logger.log(level, "%s: tiering failed (attempt %d), retrying in %d ms: %s", task.tp,
                   task.failures, delay, error, exc_info=level == logging.ERROR)

    # -- one run ---------------------------------------------------------------------------

    def _run(self, task: _Task) -> int:
        """One run; returns how soon the copy rate limit wants the next one (0: no hurry)."""
        if not task.loaded:
            self._load(task)
        for segment in [m for m in task.entries.values() if m.segment_id in task.rejected]:
            self._delete_remote(task, segment, "outside the leader's epoch lineage")
        wait_ms = self._copy_candidates(task)
        self._apply_local_retention(task)
        self._apply_remote_retention(task)
        if self._clock.monotonic_ms() >= task.next_orphan_scan_ms:
            self._clean_orphans(task)
            task.next_orphan_scan_ms = self._clock.monotonic_ms() + self._config.orphan_grace_ms
        return wait_ms

    def _load(self, task: _Task) -> None:
        """Read the partition's entries (one read of the metadata store) and split the FINISHED
        ones by the leader's epoch lineage."""
        entries = self._meta.remote_log_segments(task.tp)
        accepted, rejected = rules.split_by_lineage(entries, task.log.epoch_entries(),
                                                    task.log.log_end_offset)
        task.entries = {m.segment_id: m for m in entries}
        task.rejected = {m.segment_id for m in rejected}
        for m in rejected:
            logger.warning("%s: will delete it: outside the leader's epoch lineage %s",
                           m.describe(), task.log.epoch_entries())
        task.loaded = True
        task.log_start_offset = rules.log_start_offset(
            0, accepted, task.log.local_log_start_offset)
        self._publish(task)
        logger.info("%s: loaded %d remote segment entries at leader epoch %d; log start "
                    "offset %d", task.tp, len(entries), task.leader_epoch, task.log_start_offset)

    def _publish(self, task: _Task) -> None:
        task.readable = tuple(m for m in rules.finished(list(task.entries.values()))
                              if m.segment_id not in task.rejected)

    def _put(self, task: _Task, metadata: RemoteLogSegmentMetadata) -> None:
        """Write an entry, fenced by the task's leader epoch, and apply it to the task."""
        if task.stopped:
            raise _Stopped()
        try:
            self._meta.put_remote_log_segment(metadata, task.leader_epoch)
        except FencedLeaderEpochError:
            raise
        except Exception:
            task.loaded = False  # the write may have happened: read the truth next run
            raise
        if metadata.state is S.DELETE_SEGMENT_FINISHED:
            task.entries.pop(metadata.segment_id, None)
            task.rejected.discard(metadata.segment_id)
        else:
            task.entries[metadata.segment_id] = metadata
        self._publish(task)

    # -- copying ---------------------------------------------------------------------------

    def _copy_candidates(self, task: _Task) -> int:
        """Copy candidates oldest first; stops early (returning the wait) at the rate limit."""
        log = task.log
        for segment in rules.copy_candidates(log.local_segments(), log.high_watermark,
                                             log.last_stable_offset, task.readable):
            wait_ms = self._limiter.delay_ms()
            if wait_ms > 0:
                return wait_ms
            self._copy(task, segment)
        return 0

    def _copy(self, task: _Task, segment: LocalSegment) -> None:
        now = self._clock.time_ms()
        lineage = epoch_lineage_slice(task.log.epoch_entries(), segment.base_offset,
                                      segment.next_offset - 1)
        files = task.log.segment_files(segment)
        started = RemoteLogSegmentMetadata(
            task.tp, uuid.uuid4().hex, segment.base_offset, segment.next_offset - 1,
            segment.max_timestamp_ms, segment.size_bytes, task.leader_epoch, lineage,
            S.COPY_SEGMENT_STARTED, now, self._config.broker_id,
            has_txn_index=TXN_INDEX_SUFFIX in files)
        self._put(task, started)
        uploaded: list[str] = []
        try:
            self._upload(task, started, files, uploaded)
            self._put(task, started.with_state(S.COPY_SEGMENT_FINISHED, self._clock.time_ms()))
        except BaseException as e:
            self._abandon_copy(task, started, uploaded, e)
            raise
        logger.info("%s: copied local segment [%d, %d) (%d bytes)", started.describe(),
                    segment.base_offset, segment.next_offset, segment.size_bytes)

    def _upload(self, task: _Task, started: RemoteLogSegmentMetadata,
                local_files: dict[str, Path], uploaded: list[str]) -> None:
        """The segment file, then its sidecars all at once (small objects: their requests'
        latencies overlap); ``uploaded`` gets every key before its upload starts, so a
        failure cleans them all up."""
        files = {segment_key(started, suffix): path for suffix, path in local_files.items()}
        (first, path), *sidecars = files.items()  # the segment file comes first
        if task.stopped:
            raise _Stopped()
        uploaded.append(first)
        self._limiter.spend(self._store.put_file(first, path))
        if task.stopped:
            raise _Stopped()
        checkpoint = segment_key(started, EPOCH_CHECKPOINT_SUFFIX)
        column_crcs = segment_key(started, COLUMN_CRC_SUFFIX)
        uploaded += [key for key, _ in sidecars] + [checkpoint, column_crcs]
        futures = [self._uploads.submit(self._store.put_file, key, p) for key, p in sidecars]
        futures.append(self._uploads.submit(
            self._put_bytes, checkpoint, epoch_checkpoint(started.segment_leader_epochs)))
        futures.append(self._uploads.submit(
            lambda: self._put_bytes(column_crcs, column_checksums(path))))
        wait(futures)
        self._limiter.spend(sum(f.result() for f in futures))  # the first failure raises

    def _put_bytes(self, key: str, data: bytes) -> int:
        self._store.put_bytes(key, data)
        return len(data)

    def _abandon_copy(self, task: _Task, started: RemoteLogSegmentMetadata,
                      uploaded: list[str], error: BaseException) -> None:
        """After a failed copy: delete what was (maybe) uploaded and retire the entry, as far
        as possible. What is left (store down, leadership lost, or the FINISHED write's fate
        unknown) is a STARTED entry that the orphan cleanup finishes after the grace period."""
        if not task.loaded and started.segment_id in task.entries:
            return  # the FINISHED write may have succeeded: leave the objects alone
        logger.warning("%s: copy failed, deleting %d uploaded object(s): %s",
                       started.describe(), len(uploaded), error)
        try:
            for key in uploaded:
                self._store.delete(key)
            if not task.stopped and not isinstance(error, FencedLeaderEpochError):
                deleting = started.with_state(S.DELETE_SEGMENT_STARTED, self._clock.time_ms())
                self._put(task, deleting)
                self._put(task, deleting.with_state(S.DELETE_SEGMENT_FINISHED,
                                                    self._clock.time_ms()))
        except Exception as e:  # best effort: the orphan cleanup finishes the job
            logger.warning("%s: cleanup after the failed copy is left to orphan cleanup: %s",
                           started.describe(), e)

    # -- retention -------------------------------------------------------------------------

    def _apply_local_retention(self, task: _Task) -> None:
        config = task.log.config
        retention = Retention(config.effective_local_retention_ms,
                              config.effective_local_retention_bytes)
        doomed = rules.local_deletable(task.log.local_segments(), task.readable, retention,
                                       self._clock.time_ms())
        if doomed:
            task.log.delete_local_segments_below(doomed[-1].next_offset)
            logger.info("%s: deleted %d local segment(s) already in the remote tier; local log "
                        "start offset %d", task.tp, len(doomed), task.log.local_log_start_offset)

    def _apply_remote_retention(self, task: _Task) -> None:
        config = task.log.config
        retention = Retention(config.retention_ms if config.delete else None,
                              config.retention_bytes if config.delete else None)
        doomed = rules.remote_expired(task.readable, task.log.local_segments(), retention,
                                      self._clock.time_ms())
        for segment in doomed:
            self._delete_remote(task, segment, "past the total retention")
        task.log_start_offset = rules.log_start_offset(
            task.log_start_offset, task.readable, task.log.local_log_start_offset, doomed)
        if task.log.local_log_start_offset < task.log_start_offset:
            task.log.delete_local_segments_below(task.log_start_offset)

    def _delete_remote(self, task: _Task, segment: RemoteLogSegmentMetadata, why: str) -> None:
        self._retire(segment, lambda m: self._put(task, m))
        logger.info("%s: deleted from the remote tier: %s", segment.describe(), why)

    def _retire(self, segment: RemoteLogSegmentMetadata,
                write: Callable[[RemoteLogSegmentMetadata], None]) -> None:
        """DELETE_SEGMENT_STARTED (the segment stops being readable), delete every object it
        may have, DELETE_SEGMENT_FINISHED (the entry goes). Each step is idempotent."""
        if segment.state is not S.DELETE_SEGMENT_STARTED:
            segment = segment.with_state(S.DELETE_SEGMENT_STARTED, self._clock.time_ms())
            write(segment)
        for key in segment_keys(segment):
            self._store.delete(key)
        write(segment.with_state(S.DELETE_SEGMENT_FINISHED, self._clock.time_ms()))

    def _clean_orphans(self, task: _Task) -> None:
        now, grace = self._clock.time_ms(), self._config.orphan_grace_ms
        for segment in rules.stale_entries(list(task.entries.values()), now, grace):
            self._delete_remote(task, segment, "a copy or deletion that never finished")
        objects = self._store.list(partition_prefix(task.tp))
        for info in rules.orphan_objects(objects, list(task.entries.values()), now, grace):
            if task.stopped:
                raise _Stopped()
            self._store.delete(info.key)
            logger.info("%s: deleted orphan object %s", task.tp, info.key)

    # -- deleted topics --------------------------------------------------------------------

    def cleanup_deleted_topics(self, live_topic_ids: Collection[str]) -> int:
        """Delete the remote segments, entries and objects of every topic whose id is not in
        ``live_topic_ids`` (run by the controller; idempotent). Returns segments deleted."""
        deleted = 0
        for tp in self._meta.remote_log_partitions():
            if tp.topic_id in live_topic_ids:
                continue
            for segment in self._meta.remote_log_segments(tp):
                self._retire(segment, lambda m: self._meta.put_remote_log_segment(m, None))
                deleted += 1
            for info in self._store.list(partition_prefix(tp)):
                self._store.delete(info.key)
            logger.info("%s: remote segments of deleted topic id %s deleted", tp, tp.topic_id)
        return deleted


def epoch_checkpoint(lineage: tuple[tuple[int, int], ...]) -> bytes:
    """The segment's leader-epoch entries in the leader-epoch-checkpoint text format."""
    lines = ["0", str(len(lineage)), *(f"{epoch} {start}" for epoch, start in lineage)]
    return ("\n".join(lines) + "\n").encode()

