"""One partition's log: an ordered set of segments with a log start offset, a log end offset, a
high watermark, a last stable offset and a recovery point.

Owns: offset assignment, appends (leader and follower, data and transaction markers),
idempotent-producer and transaction checks, the last stable offset and the aborted-transaction
indexes, rolling, reads (read_uncommitted and read_committed), time lookups, planning flushes,
truncation, retention and the log start offset.
Must not: know about the network, replication protocol or other partitions.

Transactions, as in Kafka: the last stable offset (LSO) is the first offset of the earliest
transaction that is open or whose marker is not yet below the high watermark, else the high
watermark (never below the log start offset). A read_committed read stops at it and carries the
aborted transactions overlapping what it returns. Each ABORT marker that closes a transaction
adds an entry to the aborted-transaction index of the segment that holds it; at open, the
indexes recovery could not trust are rebuilt by replaying producer state from a snapshot at or
before the first of them. Retention and compaction never pass the LSO.

Durability, as in Kafka: a rolled segment is fsynced (file and indexes) soon after the roll by
the log manager's background flusher (``flush_rolled_segments``), which moves the recovery point
to the active segment's base offset. The active segment is fsynced only by flush_ms, by
flush_ms = 0 acks (``flush_until``) and at close.

Concurrency: one lock per Log serialises appends and structural changes (roll, truncate,
retention, compaction swap). Encoding happens before the lock; fsync happens outside it (group
commit, flusher.py). Reads take no lock: they capture the published segment list and end
offsets, hold a reference on each segment they read, and do I/O with ``os.pread``. When a
segment disappears under a read, the read starts over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from logstore.clock import Clock
from logstore.config import TopicConfig
from logstore.errors import InvalidRecordError, KafkaStorageError, OffsetOutOfRangeError
from logstore.records import (
    FLAG_LOG_APPEND_TIME,
    BatchHeader,
    ControlType,
    Encoded,
    EndTxnMarker,
    StoredBatch,
    patch_base_offset,
    schema_message,
)
from logstore.segments.batches import LeaderBatches, ProducerData, follower_bytes, follower_marker
from logstore.segments.file_cache import OpenFileCache
from logstore.segments.flusher import FlushPlan, LogFlusher, flush_range, take_dirty
from logstore.segments.format import remove_partition_dir
from logstore.segments.log_loader import LoadedSegments, load_segments, replay_producer_state
from logstore.segments.producer_state import (
    BatchMetadata,
    ProducerLastBatch,
    ProducerStateManager,
    VerificationGuard,
)
from logstore.segments.reads import SegmentList, read_log, search_time
from logstore.segments.recovery import count_segment_files, segment_files_usage
from logstore.segments.results import AppendInfo, FetchData
from logstore.segments.retention import deletable_segments
from logstore.segments.rolling import roll_reason
from logstore.segments.segment import NO_FILE_LIMIT, Bytes, LogSegment, SegmentClosedError
from logstore.segments.txn_index import TxnIndexEntry
from logstore.txn_filter import IsolationLevel

if TYPE_CHECKING:
    from logstore.segments.cleaner import CompactionStats

logger = logging.getLogger(__name__)

_READ_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class DeferredOpen:
    """What a log left unloaded at startup is opened with on its first use (``Log.deferred``).
    ``known_end``: the log is at rest, its log end offset is ``recovery_point`` (a clean
    shutdown flushed it), so offsets can be answered without opening it."""

    recovery_point: int
    log_start_offset: int
    clean_shutdown: bool
    known_end: bool


class Log:
    """A partition's log in the directory ``dir`` (``<log_dir>/<topic>-<partition>``)."""

    # Set when the log is loaded (``_attach``); a deferred log has none of them yet.
    _schema: pa.Schema
    _schema_bytes: bytes
    _encoder: LeaderBatches
    _flusher: LogFlusher
    _producers: ProducerStateManager
    _dir_dirty: bool
    _rolled_unflushed: bool

    def __init__(self, dir: Path, topic: str, partition: int, config: TopicConfig,
                 clock: Clock, files: OpenFileCache = NO_FILE_LIMIT) -> None:
        self._dir = dir
        self._topic = topic
        self._partition = partition
        self._tp = f"{topic}-{partition}"
        self._clock = clock
        self._config = config
        self._files = files
        self._lock = threading.Lock()
        self._deferred: DeferredOpen | None = None
        self._state = SegmentList((), (), 0)
        self._log_end_offset = 0
        self._high_watermark = 0
        self._last_stable_offset = 0
        self._closed = False
        self.cleaned_until = 0
        # The schema a deferred log is created with if its directory holds no segment file.
        self._empty_schema: pa.Schema | None = None
        # The id of the topic incarnation this log belongs to, as its directory records it
        # (``partition.metadata``; set by the log manager); None: not known.
        self.topic_id: str | None = None

    def _attach(self, schema: pa.Schema) -> None:
        """The parts of a loaded log that need its schema or its files."""
        self._schema = schema
        self._schema_bytes = schema_message(schema)
        self._encoder = LeaderBatches(self._tp, schema, self._config)
        self._flusher = LogFlusher(self._dir, self._tp, self._clock, self._plan_flush)
        self._producers = ProducerStateManager(self._dir, self._tp)
        self._dir_dirty = False
        self._rolled_unflushed = False

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, dir: Path, topic: str, partition: int, config: TopicConfig,
             schema: pa.Schema | None, clock: Clock, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool = False,
             files: OpenFileCache = NO_FILE_LIMIT) -> Log:
        """Open (recovering as needed) or create the log in the partition directory ``dir``.
        ``schema`` None reads it from the first segment file; a new log needs one."""
        log = cls(dir, topic, partition, config, clock, files)
        log._load_now(schema, recovery_point, log_start_offset, clean_shutdown, None)
        return log

    @classmethod
    def deferred(cls, dir: Path, topic: str, partition: int, config: TopicConfig,
                 clock: Clock, how: DeferredOpen, files: OpenFileCache = NO_FILE_LIMIT) -> Log:
        """The log in ``dir``, opened (and recovered, unless ``how.clean_shutdown``) only on
        its first use: an append, a read, a flush of what it holds, truncation, retention or
        compaction with work to do, or any question about its offsets whose answer
        ``how.known_end`` does not give. Nothing is read from disk here."""
        log = cls(dir, topic, partition, config, clock, files)
        log._deferred = how
        log._state = SegmentList((), (), how.log_start_offset)
        if how.known_end:
            log._log_end_offset = how.recovery_point
        log._high_watermark = how.log_start_offset
        return log

    def _load_now(self, schema: pa.Schema | None, recovery_point: int, log_start_offset: int,
                  clean_shutdown: bool, high_watermark: int | None) -> None:
        loaded = load_segments(self._dir, self._tp, self._config, schema, recovery_point,
                               log_start_offset, clean_shutdown, self._files,
                               self._empty_schema)
        self._attach(loaded.schema)
        self._finish_open(loaded, log_start_offset, self._clock.time_ms(), high_watermark)
        if loaded.created:  # one line per new partition would be thousands for a big
            # create_topics (and was a quarter of creating a log: the handler's lock); the
            # broker logs how many came online
            logger.debug("%s: created log at offset %d", self._tp, self._log_end_offset)
        else:
            logger.info("%s: opened log with %d segment(s), offsets [%d, %d), clean_shutdown=%s",
                        self._tp, len(loaded.segments), self._state.log_start_offset,
                        self._log_end_offset, clean_shutdown)

    def _ensure_loaded(self) -> None:
        if self._deferred is not None:
            self._load()

    def _ensure_end_known(self) -> None:
        deferred = self._deferred
        if deferred is not None and not deferred.known_end:
            self._load()

    def _load(self) -> None:
        """Open a deferred log (once; concurrent callers wait for the first). The high
        watermark it was given while deferred carries over."""
        with self._lock:
            how = self._deferred
            if how is None:
                return
            self._check_open()
            hw = self._high_watermark if how.known_end else None
            try:
                self._load_now(None, how.recovery_point, how.log_start_offset,
                               how.clean_shutdown, hw)
            except OSError as e:
                raise KafkaStorageError(f"{self._tp}: cannot open the log in {self._dir}: "
                                        f"{e}") from e
            if how.known_end and self._log_end_offset != how.recovery_point:
                logger.warning("%s: log end offset %d on disk, not the checkpointed %d",
                               self._tp, self._log_end_offset, how.recovery_point)
            self._deferred = None

    def expect_schema(self, schema: pa.Schema) -> None:
        """The topic's schema, for a deferred log whose directory turns out to hold no
        segment file (a crash before its creation was made durable): it starts empty."""
        self._empty_schema = schema

    @property
    def is_loaded(self) -> bool:
        return self._deferred is None

    @property
    def needs_recovery(self) -> bool:
        """Not loaded since an unclean shutdown: its tail may be torn."""
        deferred = self._deferred
        return deferred is not None and not deferred.clean_shutdown

    def _finish_open(self, loaded: LoadedSegments, log_start_offset: int, now: int,
                     high_watermark: int | None) -> None:
        segments = loaded.segments
        active = segments[-1]
        if not active.is_empty:
            stamps = active.time_index.entries()[0]
            active.rolling_base_ms = min(now, int(stamps[0])) if len(stamps) else now
        self._log_end_offset = max(active.next_offset, active.base_offset)
        lso = min(max(log_start_offset, segments[0].base_offset), self._log_end_offset)
        self._state = SegmentList.of(segments, lso)
        self._high_watermark = lso if high_watermark is None else \
            min(max(high_watermark, lso), self._log_end_offset)
        self._flusher.recovery_point = self._log_end_offset
        if loaded.created:  # the new segment's name is made durable by the first flush
            self._dir_dirty = True
        if loaded.fresh:  # nothing to replay
            self._producers.on_high_watermark(self._high_watermark)
            self._update_last_stable_offset()
        else:
            self._load_producer_state(loaded.stale_txn_index_from)

    def _load_producer_state(self, rebuild_from: int | None = None) -> None:
        """Reload producer state (log_loader.py); rebuild the aborted-transaction indexes from
        ``rebuild_from`` on, when given."""
        replay_producer_state(self._producers, self._state.segments,
                              self._state.log_start_offset, self._log_end_offset, self._schema,
                              self._tp, rebuild_from)
        self._producers.on_high_watermark(self._high_watermark)
        self._update_last_stable_offset()

    def _update_last_stable_offset(self) -> None:
        """Publish the LSO after the high watermark or the producer state changed."""
        first = self._producers.first_unstable_offset
        hw = self._high_watermark
        self._last_stable_offset = max(hw if first is None else min(first, hw),
                                       self._state.log_start_offset)

    # -- properties ------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def schema(self) -> pa.Schema:
        self._ensure_loaded()
        return self._schema

    @property
    def config(self) -> TopicConfig:
        return self._config

    @property
    def files(self) -> OpenFileCache:
        return self._files

    def update_config(self, config: TopicConfig) -> None:
        if config == self._config:
            return
        if self._deferred is None:
            self._encoder = LeaderBatches(self._tp, self._schema, config)
        self._config = config

    @property
    def log_start_offset(self) -> int:
        self._ensure_end_known()
        return self._state.log_start_offset

    @property
    def log_end_offset(self) -> int:
        self._ensure_end_known()
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        self._ensure_end_known()
        return self._high_watermark

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction is decided and its marker replicated (module docstring)."""
        self._ensure_loaded()
        return self._last_stable_offset

    @property
    def recovery_point(self) -> int:
        return self.checkpoint_offsets()[0]

    def checkpoint_offsets(self) -> tuple[int, int]:
        """(recovery point, log start offset) for the log manager's checkpoints; a deferred
        log keeps the ones it was opened with (nothing of it changed)."""
        deferred = self._deferred
        if deferred is not None:
            return deferred.recovery_point, deferred.log_start_offset
        return self._flusher.recovery_point, self._state.log_start_offset

    @property
    def producer_state(self) -> ProducerStateManager:
        self._ensure_loaded()
        return self._producers

    def __repr__(self) -> str:
        if self._deferred is not None:
            return f"Log({self._tp}, not loaded: {self._deferred})"
        return (f"Log({self._tp}, [{self.log_start_offset}, {self.log_end_offset}), "
                f"hw={self.high_watermark}, lso={self.last_stable_offset})")

    # -- appending -------------------------------------------------------------------------

    def verification_guard(self, producer_id: int, epoch: int) -> VerificationGuard | None:
        """The guard a transactional write of the producer must carry (None: its transaction
        is open here at ``epoch``); see ``ProducerStateManager.verification_guard``."""
        self._ensure_loaded()
        with self._lock:
            return self._producers.verification_guard(producer_id, epoch)

    def append_as_leader(self, batch: ProducerData, leader_epoch: int = 0,
                         producer_id: int = -1, producer_epoch: int = -1,
                         base_sequence: int = -1, flags: int = 0, verify: bool = False,
                         guard: VerificationGuard | None = None) -> AppendInfo:
        """Assign offsets LEO..LEO+n-1 to ``batch`` and append it (see module docstring). Only
        FLAG_TRANSACTIONAL is taken from ``flags``; a control flag is refused. With
        ``verify``, a transactional batch must join its producer's open transaction or carry
        a verified ``guard`` no marker has cleared (checked under the lock, with the
        append)."""
        self._ensure_loaded()
        now = self._clock.time_ms()
        data, header = self._encoder.producer_batch(batch, now, leader_epoch, producer_id,
                                                    producer_epoch, base_sequence, flags)
        with self._lock:
            self._check_open()
            if producer_id >= 0:
                duplicate = self._producers.check(producer_id, producer_epoch, base_sequence,
                                                  header.record_count, header.is_transactional,
                                                  verify, guard)
                if duplicate is not None:
                    return self._duplicate_info(duplicate)
            return self._assign_and_append(data, header, now)

    def append_control_marker(self, producer_id: int, producer_epoch: int, marker: ControlType,
                              coordinator_epoch: int, leader_epoch: int = 0) -> AppendInfo:
        """Append a COMMIT or ABORT marker for the producer's transaction, as leader (Kafka's
        WriteTxnMarkers): one control batch, replicated like any other; a stale producer or
        coordinator epoch is refused (``ProducerStateManager.check_marker``)."""
        self._ensure_loaded()
        now = self._clock.time_ms()
        end = EndTxnMarker(ControlType(marker), coordinator_epoch)
        data, header = self._encoder.marker_batch(now, producer_id, producer_epoch, end,
                                                  leader_epoch)
        with self._lock:
            self._check_open()
            self._producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            return self._assign_and_append(data, header, now, end)

    def _assign_and_append(self, data: Encoded, header: BatchHeader, now: int,
                           marker: EndTxnMarker | None = None) -> AppendInfo:
        """Under the lock: give the encoded batch the log end offset and append it."""
        base = self._log_end_offset
        patch_base_offset(data, base)
        stored = replace(header, base_offset=base, batch_size=len(data))
        self._append_locked(data, stored, now, marker)
        append_time = now if header.flags & FLAG_LOG_APPEND_TIME else -1
        return AppendInfo(base, stored.last_offset, header.max_timestamp, append_time, len(data),
                          self.log_start_offset)

    def _duplicate_info(self, original: BatchMetadata) -> AppendInfo:
        return AppendInfo(original.first_offset, original.last_offset, original.max_timestamp,
                          original.log_append_time, original.batch_size, self.log_start_offset,
                          duplicate=True)

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"{self._tp}: the log is closed")

    def _append_locked(self, data: Bytes | Encoded, header: BatchHeader, now: int,
                       marker: EndTxnMarker | None = None) -> None:
        segment = self._maybe_roll(len(data), header, now)
        segment.append(data, header, self._config.index_interval_bytes, now)
        entry = self._producers.index_entry(self._producers.update(header, marker))
        if entry is not None and segment.txn_index.append(entry):
            self._dir_dirty = True  # a new .txnindex file: the next flush makes its name durable
        self._log_end_offset = max(self._log_end_offset, header.next_offset)
        self._update_last_stable_offset()

    def append_as_follower(self, batches: list[StoredBatch]) -> AppendInfo | None:
        """Append batches fetched from the leader verbatim (offsets included) after checking
        their CRCs and that they start at or after the log end offset."""
        if not batches:
            return None
        self._ensure_loaded()
        prepared = [(*follower_bytes(self._tp, b), follower_marker(self._tp, b, self._schema))
                    for b in batches]
        now = self._clock.time_ms()
        with self._lock:
            self._check_open()
            for header, data, marker in prepared:
                if header.base_offset < self._log_end_offset:
                    raise InvalidRecordError(
                        f"{self._tp}: follower batch at offset {header.base_offset} is below "
                        f"the log end offset {self._log_end_offset}")
                self._append_locked(data, header, now, marker)
            lso = self.log_start_offset
        headers = [h for h, _, _ in prepared]
        return AppendInfo(headers[0].base_offset, headers[-1].last_offset,
                          max(h.max_timestamp for h in headers), -1,
                          sum(h.batch_size for h in headers), lso)

    # -- rolling ---------------------------------------------------------------------------

    @property
    def _active(self) -> LogSegment:
        return self._state.segments[-1]

    def _maybe_roll(self, size: int, header: BatchHeader, now: int) -> LogSegment:
        segment = self._active
        reason = roll_reason(segment, self._config, size, header, now)
        if reason is None:
            return segment
        logger.debug("%s: rolling segment %s: %s", self._tp, segment.path.name, reason)
        return self._roll_locked()

    def roll(self) -> None:
        """Seal the active segment and start a new one at the log end offset."""
        self._ensure_loaded()
        with self._lock:
            self._check_open()
            self._roll_locked()

    def _roll_locked(self) -> LogSegment:
        active, leo = self._active, self._log_end_offset
        if active.is_empty and active.base_offset == leo:
            return active
        active.seal()
        # Its last write is now, on the log's clock: the cleaner keeps its tombstones and
        # markers for delete_retention_ms from then (not from the records' own timestamps).
        active.stamp_written(self._clock.time_ms())
        new = LogSegment.create(self._dir, leo, self._schema_bytes,
                                self._config.segment_index_bytes, files=self._files)
        self._state = SegmentList.of(self._state.segments + (new,), self.log_start_offset)
        self._dir_dirty = True
        self._rolled_unflushed = True
        self._producers.take_snapshot(leo)
        logger.info("%s: rolled new segment at offset %d", self._tp, leo)
        return new

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one: bool = True,
             isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED) -> FetchData:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` in total (the
        first one regardless when ``min_one``), none starting at or after ``max_offset`` nor,
        for READ_COMMITTED, at or after the last stable offset; a READ_COMMITTED result also
        carries the aborted transactions overlapping the batches."""
        committed = isolation == IsolationLevel.READ_COMMITTED
        self._ensure_loaded()
        for _ in range(_READ_ATTEMPTS):
            self._check_open()
            stable, hw = self._last_stable_offset, self._high_watermark
            leo, state = self._log_end_offset, self._state
            self._check_range(offset, state.log_start_offset, leo)
            limit = leo if max_offset is None else min(max_offset, leo)
            try:
                batches, aborted = read_log(state, offset, max_bytes,
                                            min(limit, stable) if committed else limit, min_one,
                                            committed)
            except SegmentClosedError:
                continue
            return FetchData(batches, state.log_start_offset, leo, min(hw, leo), stable,
                             aborted)
        raise KafkaStorageError(f"{self._tp}: read at offset {offset} kept racing with "
                                "segment changes")

    def collect_aborted_transactions(self, start: int, end: int) -> list[TxnIndexEntry]:
        """The aborted transactions overlapping [start, end), in marker order."""
        self._ensure_loaded()
        return self._state.aborted(start, end)

    def _check_range(self, offset: int, lso: int, leo: int) -> None:
        if offset < lso or offset > leo:
            raise OffsetOutOfRangeError(f"{self._tp}: offset {offset} is out of range; valid "
                                        f"offsets are [{lso}, {leo}]")

    def offsets_for_time(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record, in offset order, whose timestamp is >=
        ``timestamp_ms``; None when there is none."""
        self._ensure_loaded()
        for _ in range(_READ_ATTEMPTS):
            leo, state = self._log_end_offset, self._state
            try:
                return search_time(state.segments, timestamp_ms, state.log_start_offset, leo,
                                   self._schema)
            except SegmentClosedError:
                continue
        raise KafkaStorageError(f"{self._tp}: time lookup kept racing with segment changes")

    # -- offsets ---------------------------------------------------------------------------

    def update_high_watermark(self, offset: int) -> None:
        """Move the high watermark forward to ``offset`` clamped to [log start, log end]. A
        deferred log whose end is known only remembers it (applied when it loads)."""
        if self._deferred is not None and self._defer_high_watermark(offset):
            return
        self._ensure_loaded()
        with self._lock:
            offset = min(max(offset, self.log_start_offset), self._log_end_offset)
            if offset > self._high_watermark:
                self._high_watermark = offset
                self._producers.on_high_watermark(offset)
                self._update_last_stable_offset()

    def _defer_high_watermark(self, offset: int) -> bool:
        with self._lock:
            how = self._deferred
            if how is None or not how.known_end:
                return False
            offset = min(max(offset, self._state.log_start_offset), self._log_end_offset)
            self._high_watermark = max(self._high_watermark, offset)
            return True

    def maybe_increment_log_start_offset(self, offset: int) -> None:
        """Raise the log start offset (never past the log end offset); segments wholly below
        it are deleted by the next ``delete_old_segments``."""
        self._ensure_loaded()
        with self._lock:
            offset = min(offset, self._log_end_offset)
            if offset <= self.log_start_offset:
                return
            self._state = SegmentList.of(self._state.segments, offset)
            self._high_watermark = max(self._high_watermark, offset)
            self._producers.on_high_watermark(self._high_watermark)
            self._update_last_stable_offset()
            logger.info("%s: log start offset raised to %d", self._tp, offset)

    # -- flushing --------------------------------------------------------------------------

    def flush_until(self, offset: int) -> None:
        """Return once every batch below ``offset`` is fsynced (group commit, see flusher.py);
        the recovery point becomes at least ``offset``. A deferred log holds nothing this
        process wrote: nothing to do."""
        if self._deferred is not None:
            return
        self._flusher.flush_until(min(offset, self._log_end_offset))

    def flush(self) -> None:
        """fsync everything written so far, including the directory."""
        if self._deferred is not None:
            return
        self._flusher.flush_until(self._log_end_offset, force=True)

    def maybe_flush(self) -> None:
        """For flush_ms > 0: flush when the last full flush is at least flush_ms old."""
        flush_ms = self._config.flush_ms
        if not flush_ms or self._deferred is not None or self._flusher.recovery_point >= self._log_end_offset:
            return
        if self._clock.time_ms() - self._flusher.last_flush_ms >= flush_ms:
            self.flush()

    def flush_rolled_segments(self) -> bool:
        """Kafka's flush after a roll, for the background flusher: fsync the sealed segments
        (files and indexes) and move the recovery point up to the active segment's base offset.
        The active segment is left alone. Returns whether a flush ran."""
        if self._deferred is not None:
            return False
        base, pending = self._active.base_offset, self._rolled_unflushed
        if not pending and self._flusher.recovery_point >= base:
            return False
        try:
            self._flusher.flush_until(base, force=pending)
        except KafkaStorageError:
            self._rolled_unflushed = True
            raise
        return True

    def _plan_flush(self, offset: int) -> FlushPlan:
        """Under the lock: the dirty segments holding offsets below ``offset`` (all of them when
        it is the log end offset), marked clean and acquired, and the recovery point earned."""
        with self._lock:
            state, leo = self._state, self._log_end_offset
            n, target = flush_range(state.bases, offset, leo)
            if n >= len(state.segments) - 1:
                self._rolled_unflushed = False
            segments = take_dirty(state.segments[:n])
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            return FlushPlan(target, segments, dir_dirty, self._flusher.generation,
                             target == leo)

    # -- truncation ------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Drop every batch holding an offset >= ``offset``. A batch straddling ``offset`` goes
        whole: the log end offset becomes ``offset`` or that batch's base offset, if lower (and
        when that is below the log start offset, the log restarts empty there)."""
        self._ensure_loaded()
        with self._lock:
            self._check_open()
            if offset >= self._log_end_offset:
                return
            lso = self.log_start_offset
            if offset < lso:
                self._truncate_fully_locked(offset)
                return
            segments = self._state.segments
            keep = [s for s in segments if s.base_offset <= offset] or [segments[0]]
            cut = keep[-1].truncate_to(offset, self._config.index_interval_bytes)
            new_leo = offset if cut is None else min(offset, cut)
            if new_leo < lso:
                self._truncate_fully_locked(lso)
                return
            self._replace_segments(keep, segments[len(keep):], new_leo, lso)
            if new_leo > keep[-1].next_offset:
                self._roll_locked()  # a segment based at the log end offset keeps it on reopen
            logger.info("%s: truncated to offset %d (log end offset %d)", self._tp, offset,
                        new_leo)

    def _replace_segments(self, keep: list[LogSegment], drop: Sequence[LogSegment],
                          leo: int, lso: int) -> None:
        """Publish ``keep`` after a truncation, delete ``drop`` and fix every offset."""
        self._state = SegmentList.of(keep, lso)
        for seg in drop:
            seg.delete()
        active = keep[-1]
        active.sealed = False
        if not active.is_empty and active.rolling_base_ms is None:
            active.rolling_base_ms = self._clock.time_ms()
        self._log_end_offset = leo
        self._high_watermark = min(max(self._high_watermark, lso), leo)
        self._flusher.truncated(leo)
        self._dir_dirty = True
        self._load_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``offset``."""
        self._ensure_loaded()
        with self._lock:
            self._check_open()
            self._truncate_fully_locked(offset)

    def _truncate_fully_locked(self, offset: int) -> None:
        old = self._state.segments
        self._state = SegmentList((), (), offset)
        for seg in old:
            seg.delete()
        self._producers.delete_all_snapshots()
        new = LogSegment.create(self._dir, offset, self._schema_bytes,
                                self._config.segment_index_bytes, files=self._files)
        self._replace_segments([new], (), offset, offset)
        self._high_watermark = offset
        logger.info("%s: truncated fully; log restarts at offset %d", self._tp, offset)

    # -- retention -------------------------------------------------------------------------

    def delete_old_segments(self) -> int:
        """Delete sealed segments wholly below the log start offset, and (cleanup policy
        "delete") those past retention_ms or beyond retention_bytes, oldest first, only below
        the last stable offset (so below the high watermark) and never the active segment.
        Returns how many were deleted. A deferred log is loaded only when it has a sealed
        segment (one file is the active segment, which retention never deletes)."""
        if self._deferred is not None:
            if count_segment_files(self._dir) < 2:
                return 0
            self._load()
        now = self._clock.time_ms()
        with self._lock:
            if self._closed:
                return 0
            segments = self._state.segments
            doomed = deletable_segments(segments, self._config, self.log_start_offset,
                                        self._last_stable_offset, now)
            if not doomed:
                return 0
            keep = segments[len(doomed):]
            lso = max(self.log_start_offset, keep[0].base_offset)
            self._state = SegmentList.of(keep, lso)
            self._high_watermark = max(self._high_watermark, lso)
            self._producers.on_high_watermark(self._high_watermark)
            self._update_last_stable_offset()
            self._dir_dirty = True
        for seg in doomed:
            seg.delete()
        logger.info("%s: retention deleted %d segment(s); log start offset is now %d",
                    self._tp, len(doomed), lso)
        return len(doomed)

    def remove_expired_producers(self) -> int:
        """Forget producers idle for producer_id_expiration_ms (none loaded in a deferred log);
        returns how many."""
        if self._deferred is not None:
            return 0
        now = self._clock.time_ms()
        with self._lock:
            if self._closed:
                return 0
            return self._producers.remove_expired_producers(
                now, self._config.producer_id_expiration_ms)

    # -- compaction ------------------------------------------------------------------------

    def compact(self, now_ms: int | None = None) -> CompactionStats:
        """Compact the sealed segments (see cleaner.py)."""
        from logstore.segments.cleaner import compact_log

        self._ensure_loaded()
        return compact_log(self, self._clock.time_ms() if now_ms is None else now_ms)

    def last_producer_batches(self) -> dict[int, ProducerLastBatch]:
        """For the cleaner: per producer, the batch that holds its state (it must stay)."""
        self._ensure_loaded()
        with self._lock:
            return self._producers.last_batches()

    def cleanable_segments(self, now_ms: int) -> tuple[list[LogSegment], int]:
        """For the cleaner: the sealed segments wholly below the last stable offset whose
        records are all older than min_compaction_lag_ms, each acquired (release them), and the
        truncation generation."""
        self._ensure_loaded()
        horizon = now_ms - self._config.min_compaction_lag_ms
        with self._lock:
            if self._closed:
                return [], self._flusher.generation
            chosen = self._state.sealed_below(self._last_stable_offset, horizon)
            for seg in chosen:
                seg.acquire()
            return chosen, self._flusher.generation

    def dirty_ratio(self) -> float:
        """Share of the sealed bytes at or after ``cleaned_until`` (not compacted yet). A
        deferred log with sealed segments and a compact policy is loaded to tell."""
        if self._deferred is not None:
            if not self._config.compact or count_segment_files(self._dir) < 2:
                return 0.0
            self._load()
        return self._state.dirty_ratio(self.cleaned_until)

    def swap_cleaned_segment(self, old: LogSegment, new: LogSegment, generation: int,
                             commit: Callable[[LogSegment, LogSegment], None]) -> bool:
        """For the cleaner: replace sealed segment ``old`` by its cleaned copy ``new`` (``commit``
        renames the files) unless the log was truncated or ``old`` left meanwhile."""
        with self._lock:
            segments = self._state.segments
            if self._closed or generation != self._flusher.generation or old not in segments[:-1]:
                return False
            commit(old, new)
            i = segments.index(old)
            self._state = SegmentList.of(segments[:i] + (new,) + segments[i + 1:],
                                         self.log_start_offset)
        old.close()
        return True

    # -- inspection and lifecycle ----------------------------------------------------------

    def disk_usage(self) -> tuple[int, int]:
        """(bytes, segment files) of the local log; a log not opened since the broker started
        stays unopened (its directory is listed instead), so a metrics scrape loads nothing."""
        if self._deferred is not None:
            return segment_files_usage(self._dir)
        segments = self._state.segments
        return sum(seg.size for seg in segments), len(segments)

    def segments_info(self) -> list[dict[str, Any]]:
        """base_offset, next_offset, size_bytes, path, sealed and max_timestamp per segment."""
        self._ensure_loaded()
        return self._state.info(self._log_end_offset)

    def close(self) -> None:
        """Flush, seal the active segment's indexes, snapshot producer state, close files. A
        deferred log has nothing open, and a log that took no write since it was loaded has
        nothing to make durable (10,000 idle logs close without 60,000 fsyncs), unless its
        producer state has no snapshot at the log end offset yet: a log flushed since its
        last write is closed with one (as Kafka does), so that a restart loads the state
        instead of replaying the batches after the last roll, which would find the
        transactions completed there unreplicated again and hold the last stable offset
        back until the high watermark passes their markers once more."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._deferred is not None:
                return
            quiet = self._unchanged_since_flush() and (
                not self._producers.has_producers
                or self._log_end_offset in self._producers.snapshot_offsets())
            if not quiet:
                self._active.seal()
                self._producers.take_snapshot(self._log_end_offset, durable=True)
        if not quiet:
            self.flush()
        with self._lock:
            for seg in self._state.segments:
                seg.close()
        logger.info("%s: closed at log end offset %d", self._tp, self._log_end_offset)

    def _unchanged_since_flush(self) -> bool:
        """Under the lock: everything is fsynced and no file changed since."""
        return (self._flusher.recovery_point >= self._log_end_offset and not self._dir_dirty
                and not self._rolled_unflushed
                and not any(seg.dirty for seg in self._state.segments))

    def delete(self) -> None:
        """Close the files and remove the partition directory (renamed aside first: a crash
        meanwhile must not leave part of this log where a new topic of its name would find
        it, see ``remove_partition_dir``)."""
        with self._lock:
            self._closed = True
            for seg in self._state.segments:
                seg.close()
        remove_partition_dir(self._dir)
        logger.info("%s: deleted log directory %s", self._tp, self._dir)

