"""The consumer's fetcher: fetch sessions or fetch requests to partition leaders, and what they
bring back.

Owns: what to fetch from each leader and topic (``FetchTarget``): where each wanted
partition's buffer ends; by default a push session per target (``fetch_session.py``: the
broker pushes as the log grows, and the consumer grants credit back as it drains), or with
``fetch_session`` off one fetch request per target kept in flight, so the next one is on the
wire while the caller decodes (a partition whose buffer holds ``partition_max_bytes`` waits
until it is drained); buffering fetched batches per partition; per-partition errors (a metadata
refresh for leadership errors, OFFSET_OUT_OF_RANGE handed to the consumer's callback, and so
is a position whose topic was deleted and created again: each fetch names the topic id its
offset belongs to, and once the metadata has another one the position is reset);
``list_offsets`` with a retry when the leader moved; and turning buffered batches into Tables
with ``offset`` and ``partition`` columns, or into ConsumerRecords. Control batches are never
records, and read_committed drops the batches of aborted transactions (``committed_batches``,
vectorised, shared with range readers); their offsets are passed over silently.
``fetch_request`` builds the fetch a consumer or a range reader (``datasource/reader.py``)
sends. Must not: hold positions,
the assignment or group state (``consumer.py`` does), or reach into broker internals.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from logstore.client import lookups
from logstore.client.fetch_session import (
    ClientSession,
    Credit,
    FetchSessions,
    FetchTarget,
    SessionSettings,
)
from logstore.client.metadata import ClusterMetadata
from logstore.client.metrics import ConsumerMetrics
from logstore.errors import (
    ApiError,
    InconsistentTopicIdError,
    OffsetOutOfRangeError,
    UnknownTopicIdError,
)
from logstore.messages.fetch import (
    DEFAULT_FETCH_MAX_BYTES,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    AbortedTransaction,
    FetchPartition,
    FetchRequest,
)
from logstore.messages.fetch_session import FetchSessionPartitionEnd, FetchSessionUpdated
from logstore.messages.log import (
    ListOffsetsPartitionResult,
)
from logstore.model import CREATE_TIME, LOG_APPEND_TIME, TopicPartition
from logstore.records import FLAG_LOG_APPEND_TIME
from logstore.rpc.client import FetchedBatch, FetchResponse
from logstore.rpc.session_client import PartitionNews, SessionFrame
from logstore.txn_filter import AbortedTxn, BoolArray, is_abort_marker
from logstore.txn_filter import committed_mask as txn_committed_mask

log = logging.getLogger(__name__)

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FetchConfig:
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES  # fetch_max_bytes: per request
    partition_max_bytes: int = 1 * MiB  # max_partition_fetch_bytes: per partition (Kafka's)
    min_bytes: int = 1
    max_wait_ms: int = 500
    isolation_level: int = READ_UNCOMMITTED
    fetch_session: bool = True  # push sessions; False: a fetch request per round trip
    lookup_timeout_s: float = 60.0  # default_api_timeout_ms: list_offsets across a failover


class Drained(NamedTuple):
    """Records taken from one partition's buffer: the topic's columns plus ``offset`` and
    ``partition``, the offset after the last of them (the partition's new position), and
    their timestamp type, as each batch's header says (Kafka's rule): CREATE_TIME or
    LOG_APPEND_TIME for all of them, or one per record when the batches differ (a topic
    whose ``message_timestamp_type`` was altered)."""

    table: pa.Table
    next_offset: int
    timestamp_type: int | np.ndarray = CREATE_TIME


# The consumer's answer to OFFSET_OUT_OF_RANGE for a partition: reset its position, or raise.
OutOfRange = Callable[[TopicPartition, ApiError], None]
# A batch from the position on, its offsets, the session credit it holds (None: fetched), and
# its records' timestamp type (CREATE_TIME or LOG_APPEND_TIME, from the batch's header).
_Buffered = tuple[pa.RecordBatch, np.ndarray, Credit | None, int]
_InFlight = tuple[dict[TopicPartition, int], Future[FetchResponse]]


def fetch_request(topic: str, offsets: Mapping[int, int], *, max_wait_ms: int,
                  max_bytes: int, partition_max_bytes: int | None = None, min_bytes: int = 1,
                  end_offset: int | None = None,
                  isolation_level: int = READ_UNCOMMITTED,
                  topic_ids: Mapping[int, str | None] | None = None) -> FetchRequest:
    """A consumer's fetch of ``topic`` from the given offsets (partition -> offset).
    ``end_offset`` bounds a range reader's partition: no batch starting at or after it.
    READ_COMMITTED (1) reads below the last stable offset only; filter what comes back with
    ``committed_batches``. ``topic_ids``: the topic id each partition's offset belongs to (a
    leader whose replica is of another one answers INCONSISTENT_TOPIC_ID: the topic was
    deleted and created again); a partition left out is not checked."""
    ids = topic_ids or {}
    return FetchRequest(topic=topic, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                        max_bytes=max_bytes, isolation_level=isolation_level,
                        partitions=[FetchPartition(
                            partition=p, offset=o, max_bytes=partition_max_bytes,
                            end_offset=end_offset, topic_id=ids.get(p))
                            for p, o in offsets.items()])


def committed_mask(batches: Sequence[FetchedBatch], aborted: Sequence[AbortedTransaction]
                   ) -> BoolArray:
    """Which of one partition's fetched batches (in offset order, one response's) a
    read_committed reader keeps: no control batch, no batch of an aborted transaction
    (``aborted`` is the response's list for the partition). Vectorised over the batch
    headers (txn_filter.py); only control batches are decoded, to tell ABORT markers."""
    markers = [is_abort_marker(b.header, partial(_records, b)) for b in batches]
    return txn_committed_mask([b.header for b in batches], markers, [
        AbortedTxn(a.producer_id, a.first_offset, None if a.last_offset < 0 else a.last_offset)
        for a in aborted])


def _records(fetched: FetchedBatch) -> pa.RecordBatch:
    return fetched.batch


def committed_batches(batches: Sequence[FetchedBatch],
                      aborted: Sequence[AbortedTransaction]) -> list[FetchedBatch]:
    """The batches a read_committed reader keeps (see ``committed_mask``)."""
    keep = committed_mask(batches, aborted)
    return [b for b, k in zip(batches, keep, strict=True) if k]


# How long a partition whose leader and metadata disagree about its topic id waits before it
# is fetched again (Kafka's retry.backoff.ms): until they agree, a fetch is refused each time.
TOPIC_ID_RETRY_BACKOFF_S = 0.1


class Fetcher:
    """Fetches for one consumer (used from the thread that polls; the pool only sends)."""

    def __init__(self, metadata: ClusterMetadata, config: FetchConfig,
                 on_out_of_range: OutOfRange, metrics: ConsumerMetrics | None = None) -> None:
        self._metadata = metadata
        self.metrics = metrics or ConsumerMetrics()
        self._config = config
        self._on_out_of_range = on_out_of_range
        self._buffer: dict[TopicPartition, deque[_Buffered]] = {}
        self._fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        # The topic id each fetch offset belongs to, as the metadata knew it when the offset
        # was taken from the position (None: not known): sent with every fetch, so a topic
        # deleted and created again under its name is not read from the old one's offsets.
        self._fetch_ids: dict[TopicPartition, str | None] = {}
        # Fetch offsets a leader answered for under their recorded id: only those are known to
        # be of that incarnation (a position taken while the cached metadata was stale, say a
        # seek after the topic was recreated, may be the new one's).
        self._confirmed: set[TopicPartition] = set()
        # Partitions not fetched before this monotonic time (TOPIC_ID_RETRY_BACKOFF_S).
        self._backoff_until: dict[TopicPartition, float] = {}
        self._inflight: dict[FetchTarget, _InFlight] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="logstore-fetch")
        self._sessions = FetchSessions(metadata, SessionSettings(
            config.max_bytes, config.max_bytes, config.partition_max_bytes,
            config.isolation_level), self._fetch_ids.get) if config.fetch_session else None

    # -- offsets lookups ---------------------------------------------------------------------

    def list_offsets(self, partitions: Iterable[TopicPartition], timestamp: int
                     ) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition for EARLIEST, LATEST or a timestamp."""
        out = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            entry = self._list_offset(tp, timestamp)
            entry.raise_error()
            out[tp] = (entry.offset, entry.timestamp)
        return out

    def _list_offset(self, tp: TopicPartition, timestamp: int) -> ListOffsetsPartitionResult:
        """Asked of ``tp``'s leader, again across a failover (``lookups.list_offset``)."""
        return lookups.list_offset(self._metadata, tp, timestamp, self._config.lookup_timeout_s,
                                   self._config.isolation_level)

    # -- fetching ----------------------------------------------------------------------------

    def fetch(self, partitions: list[TopicPartition], position: Callable[[TopicPartition], int],
              timeout_s: float) -> bool:
        """Fetch ``partitions`` (each from where its buffer ends, else from ``position(tp)``):
        wait up to ``timeout_s`` for a fetch to land, buffer it, and send the next straight
        away. False when there was nothing to fetch (every buffer full, or none wanted).
        With sessions: subscribe, and buffer what arrives within ``timeout_s``."""
        if self._sessions is not None:
            return self._fetch_pushed(self._sessions, partitions, position, timeout_s)
        self._send(partitions, position, int(min(timeout_s * 1000, self._config.max_wait_ms)))
        if not self._inflight:
            return False
        done, _ = wait([f for _, f in self._inflight.values()], timeout=timeout_s,
                       return_when=FIRST_COMPLETED)
        for target, (sent, future) in list(self._inflight.items()):
            # pop, not del: handling one response may have forgotten another (a reset)
            if future in done and self._inflight.pop(target, None) is not None:
                self._handle(target, sent, future)
        self._send(partitions, position, self._config.max_wait_ms)
        return True

    def _targets(self, partitions: list[TopicPartition],
                 position: Callable[[TopicPartition], int]
                 ) -> dict[FetchTarget, dict[TopicPartition, int]]:
        """The partitions to fetch now and their offsets, by leader and topic."""
        targets: dict[FetchTarget, dict[TopicPartition, int]] = {}
        now = time.monotonic()
        for tp in partitions:
            if self._backoff_until.get(tp, 0.0) > now:
                continue
            self._backoff_until.pop(tp, None)
            queue = self._buffer.get(tp)
            if self._sessions is None and queue and \
                    sum(b[0].nbytes for b in queue) >= self._config.partition_max_bytes:
                continue
            try:
                offset = self._fetch_offsets.get(tp)
                if offset is None:
                    offset = position(tp)
                leader = self._metadata.leader(tp)  # may refresh the topic first
                if tp not in self._fetch_offsets:
                    self._fetch_offsets[tp] = offset
                    self._fetch_ids[tp] = self._metadata.known_topic_id(tp.topic)
            except ApiError as e:
                if not e.retriable:
                    raise
                self._metadata.refresh([tp.topic])
                continue
            targets.setdefault(FetchTarget(leader, tp.topic), {})[tp] = offset
        return targets

    def _send(self, partitions: list[TopicPartition],
              position: Callable[[TopicPartition], int], max_wait_ms: int) -> None:
        for target, offsets in self._targets(partitions, position).items():
            if target not in self._inflight:
                # the ids are read here, on the polling thread, which alone changes them
                ids = {tp.partition: self._fetch_ids.get(tp) for tp in offsets}
                self._inflight[target] = (offsets, self._pool.submit(
                    self._fetch, target, offsets, ids, max_wait_ms))

    def _fetch(self, target: FetchTarget, offsets: dict[TopicPartition, int],
               topic_ids: dict[int, str | None], max_wait_ms: int) -> FetchResponse:
        request = fetch_request(
            target.topic, {tp.partition: o for tp, o in offsets.items()},
            max_wait_ms=max_wait_ms, max_bytes=self._config.max_bytes,
            partition_max_bytes=self._config.partition_max_bytes,
            min_bytes=self._config.min_bytes, isolation_level=self._config.isolation_level,
            topic_ids=topic_ids)
        started = time.monotonic()
        response = self._metadata.broker_connection(target.leader).fetch(request)
        self.metrics.fetched(target.topic, (time.monotonic() - started) * 1000.0,
                             sum(b.header.batch_size for b in response.batches),
                             sum(b.batch.num_rows for b in response.batches))
        return response

    def _handle(self, target: FetchTarget, sent: dict[TopicPartition, int],
                future: Future[FetchResponse]) -> None:
        try:
            response = future.result()
        except ApiError as e:
            if not e.retriable:
                raise
            log.info("fetch of %r from broker %d failed (%s); refreshing metadata",
                     target.topic, target.leader, e)
            self._metadata.refresh([target.topic])
            return
        for partition, summary in response.partitions.items():
            error = summary.error()
            if error is not None:
                self._on_partition_error(TopicPartition(target.topic, partition), error)
            elif TopicPartition(target.topic, partition) in sent:
                self._confirmed.add(TopicPartition(target.topic, partition))
        by_partition: dict[int, list[FetchedBatch]] = {}
        for fetched in response.batches:
            by_partition.setdefault(fetched.partition, []).append(fetched)
        for partition, batches in by_partition.items():
            entry = response.partitions.get(partition)
            keep = self._keep(batches, entry.aborted_transactions if entry else [])
            for fetched, kept in zip(batches, keep, strict=True):
                self._buffer_batch(TopicPartition(target.topic, partition), sent, fetched,
                                   bool(kept))
        for partition, summary in response.partitions.items():
            self._record_lag(TopicPartition(target.topic, partition), summary.high_watermark)

    def _record_lag(self, tp: TopicPartition, high_watermark: int) -> None:
        position = self._fetch_offsets.get(tp)
        if high_watermark >= 0 and position is not None:
            self.metrics.lag(tp.topic, tp.partition, max(high_watermark - position, 0))

    def _keep(self, batches: list[FetchedBatch], aborted: list[AbortedTransaction]
              ) -> Sequence[bool] | BoolArray:
        """Control batches are never records; read_committed also drops aborted data."""
        if self._config.isolation_level == READ_COMMITTED:
            return committed_mask(batches, aborted)
        return [not b.header.is_control for b in batches]

    def _buffer_batch(self, tp: TopicPartition, sent: dict[TopicPartition, int] | None,
                      fetched: FetchedBatch, keep: bool, credit: Credit | None = None) -> None:
        """Buffer the records of ``fetched`` from the fetch position on (none when not
        ``keep``: their offsets are passed over silently). ``sent`` None: pushed by a
        session, whose fences already dropped what an old position sent."""
        expected = self._fetch_offsets.get(tp)
        if expected is None or sent is not None and (tp not in sent or sent[tp] > expected):
            return  # the position moved (seek, reset) while the fetch was in flight
        offsets = fetched.offsets()
        start = int(np.searchsorted(offsets, expected))
        if start < len(offsets):
            self._fetch_offsets[tp] = int(offsets[-1]) + 1
            if keep:
                self._buffer.setdefault(tp, deque()).append(
                    (fetched.batch.slice(start), offsets[start:], credit,
                     LOG_APPEND_TIME if fetched.header.flags & FLAG_LOG_APPEND_TIME
                     else CREATE_TIME))
                return
        else:
            self._fetch_offsets[tp] = max(expected, fetched.header.next_offset)
        if credit is not None:
            credit.release()

    def _on_partition_error(self, tp: TopicPartition, error: ApiError) -> None:
        if isinstance(error, OffsetOutOfRangeError):
            self._on_out_of_range(tp, error)
        elif isinstance(error, InconsistentTopicIdError | UnknownTopicIdError):
            self._on_other_topic_id(tp, error)
        elif error.refresh_metadata or error.retriable:
            self._metadata.refresh([tp.topic])
        else:
            raise error

    def _on_other_topic_id(self, tp: TopicPartition, error: ApiError) -> None:
        """The leader's replica of ``tp`` is of another topic id than its fetch offset's. Once
        the metadata says the topic's id changed (deleted and created again under its name),
        a position a leader already answered for under the old id belongs to a topic that is
        gone: it is reset as an out-of-range one is (auto_offset_reset), never read from the
        new topic's same offset. A position never answered for was taken from metadata that
        may have been stale (a seek, a reset or a committed offset looked up after the
        recreate are of the new topic): it takes the new id and is fetched again. Until the
        metadata changes (the leader knows the new topic before this consumer's metadata, or
        the other way round) the fetch is retried with fresh metadata."""
        self._metadata.refresh([tp.topic])
        was, now = self._fetch_ids.get(tp), self._metadata.known_topic_id(tp.topic)
        if was is None or now is None or was == now:
            log.info("%s; refreshing metadata and fetching again in %.0f ms", error.message,
                     TOPIC_ID_RETRY_BACKOFF_S * 1000)
            self._backoff_until[tp] = time.monotonic() + TOPIC_ID_RETRY_BACKOFF_S
            return
        if tp not in self._confirmed:
            log.info("%s: position %s was taken while the metadata still had topic id %s; "
                     "it is of %s", tp, self._fetch_offsets.get(tp), was, now)
            self._fetch_ids[tp] = now
            return
        self._on_out_of_range(tp, OffsetOutOfRangeError(
            f"{tp}: the topic was deleted and created again (topic id {was}, now {now}), so "
            f"position {self._fetch_offsets.get(tp)} belongs to a topic that is gone"))

    # -- the buffer --------------------------------------------------------------------------

    def drain(self, partitions: list[TopicPartition], limit: int
              ) -> dict[TopicPartition, Drained]:
        """Buffered records of ``partitions``, taken in that order, at most ``limit`` in all."""
        out: dict[TopicPartition, Drained] = {}
        for tp in partitions:
            queue = self._buffer.get(tp)
            if not queue or limit <= 0:
                continue
            batches, offsets, types = [], [], []
            while queue and limit > 0:
                batch, offs, credit, kind = queue.popleft()
                if batch.num_rows > limit:
                    queue.appendleft((batch.slice(limit), offs[limit:], credit, kind))
                    batch, offs = batch.slice(0, limit), offs[:limit]
                elif credit is not None:
                    credit.release()
                batches.append(batch)
                offsets.append(offs)
                types.append(kind)
                limit -= batch.num_rows
            all_offsets = np.concatenate(offsets)
            kinds: int | np.ndarray = types[0] if len(set(types)) == 1 else np.repeat(
                np.array(types), [len(o) for o in offsets])
            out[tp] = Drained(_with_offsets(pa.Table.from_batches(batches), all_offsets,
                                            tp.partition), int(all_offsets[-1]) + 1, kinds)
        if self._sessions is not None:
            self._sessions.grant_owed()
        return out

    def retry_in(self) -> float | None:
        """Seconds until the first partition backing off may be fetched again (None: none
        is): a poll with nothing else to fetch waits no longer than that."""
        # A backoff that ended is forgotten here: its partition may be paused, and a wait of
        # zero for it would make every poll spin until it resumes.
        now = time.monotonic()
        self._backoff_until = {tp: t for tp, t in self._backoff_until.items() if t > now}
        if not self._backoff_until:
            return None
        return min(self._backoff_until.values()) - now

    def position_topic_id(self, tp: TopicPartition) -> str | None:
        """The topic id ``tp``'s fetch position was taken under (None: not fetched since
        its position was last set, or a broker that sends no ids): the id a commit of the
        consumer's position must name, so that a position of a deleted topic is never
        committed as the offset of the topic created again under its name."""
        return self._fetch_ids.get(tp) if tp in self._fetch_offsets else None

    def idle_position(self, tp: TopicPartition) -> int | None:
        """With nothing of ``tp`` buffered: where its fetching stands (past any control or
        aborted batches it passed over), the consumer's position; else None."""
        return None if self._buffer.get(tp) else self._fetch_offsets.get(tp)

    def forget(self, tp: TopicPartition) -> None:
        """``tp``'s position moved: drop its buffer, where its fetching was, and fetches in
        flight for it."""
        self._fetch_offsets.pop(tp, None)
        self._fetch_ids.pop(tp, None)
        self._confirmed.discard(tp)
        self._backoff_until.pop(tp, None)
        _release(self._buffer.pop(tp, None))
        self.metrics.forget(tp.topic, tp.partition)
        for target in [t for t, (sent, _) in self._inflight.items() if tp in sent]:
            del self._inflight[target]
        if self._sessions is not None:
            self._sessions.forget(tp)

    def retain(self, keep: set[TopicPartition]) -> None:
        """The assignment changed: keep the buffers of ``keep`` only, and send every fetch
        anew (their targets may have changed)."""
        for tp in set(self._fetch_offsets) - keep:
            self.metrics.forget(tp.topic, tp.partition)
            if self._sessions is not None:  # assigned again later, it is positioned anew
                self._sessions.forget(tp)
        for tp in set(self._buffer) - keep:
            _release(self._buffer.pop(tp))
        self._fetch_offsets = {tp: o for tp, o in self._fetch_offsets.items() if tp in keep}
        for tp in set(self._fetch_ids) - keep:
            del self._fetch_ids[tp]
        self._confirmed &= keep
        self._backoff_until = {tp: t for tp, t in self._backoff_until.items() if tp in keep}
        self._inflight.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._sessions is not None:
            self._sessions.close()

    # -- fetch sessions ----------------------------------------------------------------------

    def _fetch_pushed(self, sessions: FetchSessions, partitions: list[TopicPartition],
                      position: Callable[[TopicPartition], int], timeout_s: float) -> bool:
        targets = self._targets(partitions, position)
        sessions.sync(targets)
        if not targets:
            return False
        sessions.grant_owed(waiting=True)  # nothing to return: the broker must not wait on us
        # A partition backing off rejoins its session when the backoff ends, not when the
        # poll's whole timeout has passed with nothing pushed for the others.
        retry_in = self.retry_in()
        self._take_frames(sessions, timeout_s if retry_in is None else min(timeout_s, retry_in))
        return True

    def take_arrived(self) -> None:
        """Buffer what has already arrived, without waiting or asking for more: the frames
        sessions pushed, or the fetch responses that came back. A poll that returns buffered
        records calls this first, so a partition whose records came after another's is
        served in turn instead of once every other buffer is drained."""
        if self._sessions is not None:
            self._take_frames(self._sessions, 0.0)
            return
        for target, (sent, future) in list(self._inflight.items()):
            # pop, not del: handling one response may have forgotten another (a reset)
            if future.done() and self._inflight.pop(target, None) is not None:
                self._handle(target, sent, future)

    def _take_frames(self, sessions: FetchSessions, timeout_s: float) -> None:
        """Buffer the frames that arrive within ``timeout_s`` (0: those already here). Every
        frame is handled before an error that one of them raised (an out-of-range position
        with no reset policy) reaches the caller: the frames after it hold other partitions'
        records, which the broker has moved past and will not push again."""
        raised: Exception | None = None
        for session, frame in sessions.wait(timeout_s):
            try:
                if isinstance(frame, ApiError):
                    sessions.fail(session, frame)
                elif isinstance(frame, FetchSessionUpdated):
                    session.applied_update(frame)
                else:
                    self._pushed(sessions, session, frame)
            except Exception as e:  # raised once the rest are buffered (a later one's lost:
                raised = raised or e  # its partition left the session, and fails again)
        sessions.grant_owed()
        if raised is not None:
            raise raised

    def _pushed(self, sessions: FetchSessions, session: ClientSession,
                frame: SessionFrame) -> None:
        """One partition's frame: buffered, or (from an old position) dropped."""
        assert isinstance(frame, PartitionNews | FetchSessionPartitionEnd)
        state = frame.state if isinstance(frame, PartitionNews) else frame
        tp = TopicPartition(session.target.topic, state.partition)
        if isinstance(frame, PartitionNews):
            session.received(frame.size_bytes)
        if not sessions.accepts(session, tp):
            if isinstance(frame, PartitionNews):
                session.owe(frame.size_bytes)
            return
        if isinstance(frame, FetchSessionPartitionEnd):
            sessions.left(tp)
            error = frame.error()
            if error is not None:
                self._on_partition_error(tp, error)
            return
        self._confirmed.add(tp)  # the session's leader answered for its position
        keep = self._keep(frame.batches, frame.state.aborted_transactions)
        for fetched, kept in zip(frame.batches, keep, strict=True):
            self._buffer_batch(tp, None, fetched, bool(kept),
                               Credit(session, fetched.header.batch_size))
        if frame.batches:
            self.metrics.pushed(tp.topic, frame.size_bytes,
                                sum(b.batch.num_rows for b in frame.batches))
        self._record_lag(tp, frame.state.high_watermark)


def _release(queue: deque[_Buffered] | None) -> None:
    """Give back the session credit a dropped buffer held."""
    for _, _, credit, _ in queue or ():
        if credit is not None:
            credit.release()


def _with_offsets(table: pa.Table, offsets: np.ndarray, partition: int) -> pa.Table:
    table = table.append_column("offset", pa.array(offsets, pa.int64()))
    return table.append_column("partition",
                               pa.array(np.full(len(offsets), partition, dtype=np.int32)))
