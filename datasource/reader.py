"""Executor-side reading of one offset range as Arrow record batches in Spark's shape.

Owns: choosing between the partition's segment files (when this executor sees the leader's
disk, proven by the incarnation id the leader gave the planner), the remote segment the planner
assigned (read straight from object storage: only the projected columns' buffers for a
projected read, else whole CRC-checked batches), and Flight fetches from the leader; following
leader moves; the failOnDataLoss rule at read time (a missing or corrupt remote object is data
loss); coalescing small batches so Spark gets few, large ones. Must not: import pyspark or plan
ranges, or import fsspec (the tiering ObjectStore does).

With ``kafka.isolation.level=read_committed`` every path drops control batches and the batches
of aborted transactions with txn_filter's vectorised filter: the files path with the ``.txnindex``
files (``PartitionFiles.read_committed``; the planner ended the range at the last stable
offset), the fetch path with the aborted transactions of each read_committed fetch's summary,
and the remote path with the list the planner collected for the task (``ReadTask.aborted``,
from the uploaded ``.txnindex`` objects and the leader; ``datasource/committed.py``).

A task either yields every record of its range or fails: a broker that stays unreachable, a
range that vanished with failOnDataLoss=true, or a high watermark that went back under the
range all raise, so Spark never presents partial data as complete. Fetches name the topic id
the range was planned on: a topic deleted and created again under its name since is data loss
(the range's records went with it), never the new topic's records at the same offsets. The
files path checks it too: the partition directory keeps its name across a recreate, so its
``partition.metadata`` must name the planned id, else the task fetches (and the leader's answer
is the loss).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from datasource.planning import DataLossError, RemoteStore
from datasource.schema import META_COLUMNS, BatchConverter
from logstore.client.fetcher import committed_batches, fetch_request
from logstore.client.metadata import ClusterMetadata
from logstore.errors import (
    ApiError,
    CorruptRecordError,
    LogstoreError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)
from logstore.messages.fetch import READ_COMMITTED, READ_UNCOMMITTED
from logstore.messages.log import ListOffsetsPartition, ListOffsetsRequest
from logstore.model import EARLIEST, LATEST, TopicPartition
from logstore.records import FLAG_LOG_APPEND_TIME, BatchHeader
from logstore.rpc.client import BrokerConnection, FetchedBatch
from logstore.security.config import PLAINTEXT, ClientSecurity
from logstore.segments.file_reader import PartitionFiles
from logstore.segments.format import INCARNATION_FILE, read_partition_metadata
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.projection import ProjectedSegmentReader
from logstore.tiering.remote_reader import scan_segment
from logstore.tiering.store import ObjectStore, RemoteObjectNotFoundError, RemoteStorageError
from logstore.txn_filter import AbortedTxn, ReadCommittedFilter

log = logging.getLogger(__name__)

COALESCE_ROWS = 64 * 1024      # smaller converted batches are gathered up to about this
LARGE_BATCH_ROWS = 8 * 1024    # a batch this big goes to Spark as it is
MAX_ATTEMPTS = 6               # per fetch, across leader moves and network errors
BACKOFF_S = 0.2


FILTER_CHUNK_BATCHES = 64     # remote batches filtered together by read_committed
_Stored = tuple[BatchHeader, pa.RecordBatch, np.ndarray]  # a stored batch and its offsets


class BrokerUnavailableError(LogstoreError, RuntimeError):
    """The leader of a partition could not be reached while reading a range."""


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark input partition: an offset range and where to find it."""

    tp: TopicPartition
    start: int
    end: int
    leader: str
    path: str | None = None
    incarnation: str | None = None
    remote: RemoteSegmentRead | None = None
    # read_committed reads of a remote segment: the aborted transactions overlapping the
    # range (with their markers' offsets), collected by the planner
    aborted: tuple[AbortedTxn, ...] = ()
    # the topic id of the leader's replica the range was planned on (None: not told): sent
    # with each fetch, so a topic deleted and created again since is not read at these offsets
    topic_id: str | None = None


@dataclass(frozen=True, slots=True)
class RemoteSegmentRead:
    """The remote segment holding a task's whole range, and the store to read it from."""

    segment: RemoteLogSegmentMetadata
    store: RemoteStore


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """What every task of one scan shares (shipped once with the reader)."""

    bootstrap_servers: str
    target: pa.Schema
    read_mode: str = "auto"
    fail_on_data_loss: bool = True
    fetch_max_bytes: int = 64 * 1024 * 1024
    security: ClientSecurity = PLAINTEXT
    isolation_level: str = "read_uncommitted"  # or "read_committed" (options.py's names)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


def read_range(task: ReadTask, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Every record of ``task``'s range, as record batches of ``settings.target``."""
    converter = BatchConverter(settings.target, task.tp.topic, task.tp.partition)
    yield from _coalesce(_converted(task, settings, converter))


def _converted(task: ReadTask, settings: ReadSettings, converter: BatchConverter
               ) -> Iterator[pa.RecordBatch]:
    if task.remote is not None:
        yield from _RemoteRange(task, task.remote, settings, converter).read()
        return
    position = task.start
    if task.path is not None and _use_files(task, settings):
        files = PartitionFiles(task.path)
        try:
            # read_committed: the planner ended the range at the last stable offset
            read = files.read_committed(position, task.end, task.end) \
                if settings.read_committed else files.read(position, task.end)
            for schema, stored in read:
                position = stored.header.next_offset
                if not stored.header.is_control:
                    out = converter.convert(
                        stored.record_batch(schema), stored.offsets(),
                        bool(stored.header.flags & FLAG_LOG_APPEND_TIME), task.start, task.end)
                    if out is not None:
                        yield out
            return
        except OffsetOutOfRangeError as e:
            log.info("%s: files no longer hold offset %d (%s); fetching from the leader",
                     task.tp, position, e.message)
    yield from _fetched(task, settings, converter, max(position, task.start))


def _use_files(task: ReadTask, settings: ReadSettings) -> bool:
    """True when this process sees the leader's own files of the topic the range was planned
    on (``local`` demands the leader's files). Files of another topic id (deleted and created
    again under the name since planning) are not read: the fetch path reports the loss."""
    if settings.read_mode == "fetch" or task.path is None:
        return False
    try:
        found = (Path(task.path).parent / INCARNATION_FILE).read_text().strip()
    except OSError:
        found = None
    if found == task.incarnation:
        if task.topic_id is None or _files_of_topic(task.path, task.topic_id):
            return True
        log.info("%s: %s now holds another topic id than the planned %s; fetching", task.tp,
                 task.path, task.topic_id)
        return False
    if settings.read_mode == "local":
        raise BrokerUnavailableError(
            f"{task.tp}: readMode=local but {task.path} is not the leader's directory here "
            "(different machine, or the broker restarted); use readMode=auto or fetch")
    return False


def _files_of_topic(path: str, topic_id: str) -> bool:
    """Whether the partition directory holds the log of ``topic_id``: it records that id, or
    none (a log older than the file: the incarnation check stands alone then). An unreadable
    or malformed file is no proof."""
    try:
        found = read_partition_metadata(Path(path))
    except ValueError:
        return False
    return found is None or found == topic_id


class _RemoteRange:
    """One task's range read from its remote segment, retrying an unavailable store a bounded
    number of times; a missing or corrupt object is data loss (failOnDataLoss)."""

    def __init__(self, task: ReadTask, remote: RemoteSegmentRead, settings: ReadSettings,
                 converter: BatchConverter) -> None:
        self.task = task
        self.remote = remote
        self.settings = settings
        self.converter = converter
        self.position = task.start
        self.committed = ReadCommittedFilter(task.aborted)

    def read(self) -> Iterator[pa.RecordBatch]:
        from logstore.tiering.fsspec_store import FsspecObjectStore  # executors only

        store = FsspecObjectStore(self.remote.store.uri, self.remote.store.options)
        for attempt in range(MAX_ATTEMPTS):
            try:
                yield from self._batches(store)
                return
            except RemoteStorageError as e:
                log.info("%s: remote read at offset %d failed (%s); retrying", self.task.tp,
                         self.position, e.message)
                last = e
            except (CorruptRecordError, RemoteObjectNotFoundError) as e:
                self._lost(e)
                return
            time.sleep(BACKOFF_S * (attempt + 1))  # back off before the next attempt
        raise BrokerUnavailableError(
            f"{self.task.tp}: could not read offsets [{self.position}, {self.task.end}) from "
            f"the remote tier after {MAX_ATTEMPTS} attempts (last: {last})")

    def _batches(self, store: ObjectStore) -> Iterator[pa.RecordBatch]:
        """Converted batches from ``self.position`` on. A projected read (the target leaves
        out a stored column other than ``headers``, which a read without includeHeaders
        always leaves out) fetches only the wanted columns' buffers and checks them against
        the segment's per-column CRC32Cs (its ``.colcrc`` sidecar; a segment copied without
        one is read whole). Any other read fetches whole batches and checks their CRCs."""
        reader = ProjectedSegmentReader(store, self.remote.segment)
        stored = reader.schema()
        wanted = [f.name for f in self.settings.target if f.name not in META_COLUMNS]
        items: Iterator[_Stored]
        if set(stored.names) - set(wanted) - {"headers"}:
            items = ((p.header, p.batch, p.offsets())
                     for p in reader.read(wanted, self.position, self.task.end))
        else:
            items = ((b.header, b.record_batch(stored), b.offsets())
                     for b in scan_segment(store, self.remote.segment, self.position,
                                           self.task.end))
        if not self.settings.read_committed:
            for header, batch, offsets in items:
                yield from self._convert(header, batch, offsets)
            return
        chunk: list[_Stored] = []
        for item in items:
            chunk.append(item)
            if len(chunk) >= FILTER_CHUNK_BATCHES:
                yield from self._committed(chunk)
                chunk = []
        yield from self._committed(chunk)

    def _committed(self, chunk: list[_Stored]) -> Iterator[pa.RecordBatch]:
        """The batches of ``chunk`` a read_committed reader keeps, converted. The task's
        aborted transactions carry their markers' offsets, so no marker needs decoding
        (a projected read could not: it fetches only the projected columns)."""
        if not chunk:
            return
        keep = self.committed.keep([h for h, _, _ in chunk], [False] * len(chunk))
        for (header, batch, offsets), kept in zip(chunk, keep, strict=True):
            if kept:
                yield from self._convert(header, batch, offsets)
            else:
                self.position = max(self.position, header.next_offset)

    def _convert(self, header: BatchHeader, batch: pa.RecordBatch, offsets: np.ndarray
                 ) -> Iterator[pa.RecordBatch]:
        self.position = max(self.position, header.next_offset)
        if header.is_control:
            return
        out = self.converter.convert(batch, offsets, bool(header.flags & FLAG_LOG_APPEND_TIME),
                                     self.task.start, self.task.end)
        if out is not None:
            yield out

    def _lost(self, error: LogstoreError) -> None:
        lost = (f"{self.task.tp}: offsets [{self.position}, {self.task.end}) of the range "
                f"[{self.task.start}, {self.task.end}) cannot be read from the remote tier: "
                f"{error}")
        if self.settings.fail_on_data_loss:
            raise DataLossError(f"{lost}; set failOnDataLoss=false to skip them") from error
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)


def _fetched(task: ReadTask, settings: ReadSettings, converter: BatchConverter,
             position: int) -> Iterator[pa.RecordBatch]:
    fetcher = _Fetcher(task, settings)
    try:
        while position < task.end:
            batches, position = fetcher.fetch(position)
            for fetched in batches:
                if fetched.header.is_control:
                    continue
                out = converter.convert(fetched.batch, fetched.offsets(),
                                        bool(fetched.header.flags & FLAG_LOG_APPEND_TIME),
                                        task.start, task.end)
                if out is not None:
                    yield out
    finally:
        fetcher.close()


class _HighWatermarkBehind(LogstoreError):
    """The leader's high watermark is below the range's end: a new leader may not have caught
    up with the high watermark yet (asked again), or the log was truncated (data loss)."""

    def __init__(self, high_watermark: int) -> None:
        super().__init__(high_watermark)
        self.high_watermark = high_watermark


class _Fetcher:
    """Fetches of one partition from its leader, following leader moves and retrying network
    errors a bounded number of times."""

    def __init__(self, task: ReadTask, settings: ReadSettings) -> None:
        self.task = task
        self.settings = settings
        self.address = task.leader
        self._conn: BrokerConnection | None = None

    def fetch(self, position: int) -> tuple[list[FetchedBatch], int]:
        """(batches, next position) from ``position``; raises when the range cannot be read."""
        last: Exception | None = None
        for attempt in range(MAX_ATTEMPTS):
            try:
                return self._fetch_once(position)
            except OffsetOutOfRangeError:
                return [], self._lost(position)
            except _HighWatermarkBehind as e:
                last = e
                self._reconnect(NotLeaderOrFollowerError("high watermark behind the range"))
            except ApiError as e:
                if not e.retriable:
                    raise
                last = e
                # A leader that no longer hosts the partition (or knows the id) may hold a
                # topic recreated since planning: then the range is lost, not retried.
                recreated = self._reconnect(e)
                if recreated is not None:
                    return [], self._recreated(position, recreated)
            time.sleep(BACKOFF_S * (attempt + 1))  # back off before the next attempt
        if isinstance(last, _HighWatermarkBehind):
            return [], self._truncated(position, last.high_watermark)
        raise BrokerUnavailableError(
            f"{self.task.tp}: could not read offsets [{position}, {self.task.end}) from the "
            f"leader after {MAX_ATTEMPTS} attempts (last: {last})")

    def _fetch_once(self, position: int) -> tuple[list[FetchedBatch], int]:
        """(batches to keep, next position); read_committed keeps no control batch and none
        of an aborted transaction (the summary lists those overlapping the batches)."""
        tp = self.task.tp
        max_bytes = self.settings.fetch_max_bytes
        committed = self.settings.read_committed
        response = self._connection().fetch(fetch_request(
            tp.topic, {tp.partition: position}, max_wait_ms=0, max_bytes=max_bytes,
            partition_max_bytes=max_bytes, end_offset=self.task.end,
            isolation_level=READ_COMMITTED if committed else READ_UNCOMMITTED,
            topic_ids={tp.partition: self.task.topic_id}))
        summary = response.partitions.get(tp.partition)
        if summary is not None:
            summary.raise_error()
        batches = [b for b in response.batches if b.partition == tp.partition]
        if not batches:
            # read_committed reads stop at the last stable offset, which the planner ended
            # the range at: a leader below it has not caught up (or the log lost offsets)
            end = -1 if summary is None else \
                summary.last_stable_offset if committed else summary.high_watermark
            if end < self.task.end:
                raise _HighWatermarkBehind(end)
            return [], self.task.end  # no record lives in [position, end): a compaction gap
        following = max(position, batches[-1].header.next_offset)
        if committed:
            if summary is None:  # the aborted transactions come with the summary
                raise _HighWatermarkBehind(-1)
            batches = committed_batches(batches, summary.aborted_transactions)
        return batches, following

    def _lost(self, position: int) -> int:
        """Where to go on after OFFSET_OUT_OF_RANGE at ``position`` (or raise)."""
        tp = self.task.tp
        start = _list_offset(self._connection(), tp, EARLIEST)
        if start <= position:  # not below the log start: the log now ends before position
            return self._truncated(position, _list_offset(self._connection(), tp, LATEST))
        return self._loss(f"{tp}: offsets [{position}, {min(start, self.task.end)}) of the "
                          f"range [{self.task.start}, {self.task.end}) are no longer in the "
                          f"log (log start offset {start})", min(start, self.task.end))

    def _truncated(self, position: int, high_watermark: int) -> int:
        """The log ends before the range does (truncated by an unclean leader change, or the
        topic recreated): data loss, or with failOnDataLoss=false the rest is skipped."""
        return self._loss(
            f"{self.task.tp}: offsets [{max(position, high_watermark)}, {self.task.end}) of the "
            f"range [{self.task.start}, {self.task.end}) are gone: the log now ends at "
            f"{high_watermark} (truncated by a leader change, or the topic recreated)",
            self.task.end)

    def _recreated(self, position: int, topic_id: str) -> int:
        """The topic is now ``topic_id``, not the one the range was planned on: the range's
        records went with the deleted topic (the new one's at these offsets are others)."""
        return self._loss(
            f"{self.task.tp}: offsets [{position}, {self.task.end}) of the range "
            f"[{self.task.start}, {self.task.end}) are gone: the topic was deleted and created "
            f"again since the range was planned (topic id {self.task.topic_id}, now "
            f"{topic_id})", self.task.end)

    def _loss(self, lost: str, resume_at: int) -> int:
        """failOnDataLoss: raise, or warn and go on at ``resume_at``."""
        if self.settings.fail_on_data_loss:
            raise DataLossError(f"{lost}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)
        return resume_at

    def _connection(self) -> BrokerConnection:
        if self._conn is None:
            self._conn = BrokerConnection(self.address, timeout_s=30.0,
                                          security=self.settings.security)
        return self._conn

    def _reconnect(self, error: ApiError) -> str | None:
        """Look the leader up again. The topic's id in the fresh metadata when it is known and
        not the task's (the topic was recreated since planning), else None."""
        log.info("%s: fetch from %s failed (%s); looking up the leader again",
                 self.task.tp, self.address, error)
        self.close()
        metadata = ClusterMetadata(self.settings.bootstrap_servers,
                                   security=self.settings.security)
        try:
            # The id first: a recreated topic may have no leader (or no such partition) yet,
            # and the range is lost whatever its leader.
            now = metadata.topic(self.task.tp.topic).topic_id
            if self.task.topic_id is not None and now is not None and now != self.task.topic_id:
                return now
            leader = metadata.leader(self.task.tp)
            self.address = metadata.brokers().get(leader, self.address)
            return None
        except ApiError as e:
            log.info("%s: leader lookup failed: %s", self.task.tp, e)
            return None
        finally:
            metadata.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _list_offset(conn: BrokerConnection, tp: TopicPartition, spec: int) -> int:
    """The log start offset (EARLIEST) or high watermark (LATEST) of ``tp``."""
    entry = conn.call(ListOffsetsRequest(topic=tp.topic, partitions=[
        ListOffsetsPartition(partition=tp.partition, timestamp=spec)])).partitions[0]
    entry.raise_error()
    return entry.offset


def _coalesce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Pass large batches through; gather small ones into batches of about COALESCE_ROWS
    (each Arrow batch costs Spark a fixed overhead, so a log of tiny producer batches would
    otherwise read slowly)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if batch.num_rows >= LARGE_BATCH_ROWS and not pending:
            yield batch
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows >= COALESCE_ROWS:
            yield _concat(pending)
            pending, rows = [], 0
    if pending:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


__all__ = ["BrokerUnavailableError", "ReadSettings", "ReadTask", "RemoteSegmentRead",
           "read_range"]
