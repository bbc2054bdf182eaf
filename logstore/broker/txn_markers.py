"""Sending a decided transaction's markers to its partitions' leaders (Kafka's
TransactionMarkerChannelManager), and writing the markers this broker is asked for.

Owns: ``TxnMarkerSender``, which takes marker jobs (one per decided transaction, deduplicated)
and for each sends ``write_txn_markers`` to the current leader of every partition (this
broker's own partitions without a network hop), in parallel per leader, retrying with backoff
until every partition has its marker (leaders may move; a partition of a deleted topic needs
none), then reports the job done so the coordinator writes CompleteCommit/CompleteAbort; a job
whose coordinator was fenced or moved is dropped (the new coordinator owns it). And
``MarkerWriter``, the partition leader's side: append each marker with acks=all (the append
itself clears the producer's verification on the partition), and tell the group coordinator when the partition is one of
``__consumer_offsets`` (the pending transactional offsets the producer staged before the
marker's offset are applied or dropped; what it staged after belongs to its next transaction,
so a late completion cannot decide it). Must not:
decide anything about a transaction (``transactions/`` does) or touch the transport (peer
connections come from ``cluster.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.errors import (
    ApiError,
    BrokerNotAvailableError,
    CoordinatorLoadInProgressError,
    InvalidProducerEpochError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    TransactionCoordinatorFencedError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import error_kw
from logstore.messages.transactions import (
    TxnMarker,
    TxnPartitionResult,
    TxnTopicPartitions,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from logstore.model import OFFSETS_TOPIC, TopicPartition
from logstore.replication.fetcher import Connect
from logstore.replication.partition import PendingAppend
from logstore.transactions.coordinator import MarkerJob

log = logging.getLogger(__name__)

MARKER_APPEND_TIMEOUT_MS = 10_000
MARKER_CALL_TIMEOUT_S = 15.0
BACKOFF_S = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GROUP_COMPLETION_ATTEMPTS = 100


class MarkerWriter:
    """Writes the markers a coordinator sends to partitions this broker leads."""

    def __init__(self, replicas: ReplicaManager,
                 complete_offsets: Callable[[int, int, bool, int], int]) -> None:
        self._replicas = replicas
        # (partition, producer id, committed, the marker's offset)
        self._complete_offsets = complete_offsets

    def write(self, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
        """Append every marker first, then wait for each acknowledgement: the appends
        replicate together."""
        appended: list[tuple[TxnMarker, TopicPartition, PendingAppend | ApiError]] = []
        for marker in req.markers:
            for t in marker.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.topic, p)
                    appended.append((marker, tp, self._append(marker, tp)))
        return WriteTxnMarkersResponse(results=[self._settle(m, tp, pending)
                                                for m, tp, pending in appended])

    def _append(self, marker: TxnMarker, tp: TopicPartition) -> PendingAppend | ApiError:
        try:
            return self._replicas.write_txn_marker(tp, marker.producer_id,
                                                   marker.producer_epoch, marker.committed,
                                                   marker.coordinator_epoch)
        except ApiError as e:
            return e
        except Exception as e:  # boundary: one partition's failure is its own
            log.exception("%s: writing a marker of producer %d failed", tp, marker.producer_id)
            return UnknownServerError(f"{tp}: {type(e).__name__}: {e}")

    def _settle(self, marker: TxnMarker, tp: TopicPartition,
                pending: PendingAppend | ApiError) -> TxnPartitionResult:
        error = pending if isinstance(pending, ApiError) else None
        if isinstance(pending, PendingAppend):
            try:
                pending.wait(MARKER_APPEND_TIMEOUT_MS)
            except ApiError as e:
                error = e
        if error is None and isinstance(pending, PendingAppend) and tp.topic == OFFSETS_TOPIC:
            self._decide_offsets(tp.partition, marker.producer_id, marker.committed,
                                 pending.info.first_offset)
        return TxnPartitionResult(topic=tp.topic, partition=tp.partition, **error_kw(error))

    def _decide_offsets(self, partition: int, producer_id: int, committed: bool,
                        marker_offset: int) -> None:
        """Tell the group coordinator, from a thread of its own: while it loads the
        partition it answers LOAD_IN_PROGRESS, and the load may have read the log before
        the marker. However late it runs, only what the producer staged before
        ``marker_offset`` is decided."""
        def run() -> None:
            for attempt in range(GROUP_COMPLETION_ATTEMPTS):
                try:
                    self._complete_offsets(partition, producer_id, committed, marker_offset)
                    return
                except CoordinatorLoadInProgressError:
                    time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                except ApiError as e:  # not the coordinator: its replay sees the marker
                    log.debug("%s-%d: offsets of producer %d left to the replay: %s",
                              OFFSETS_TOPIC, partition, producer_id, e)
                    return
        threading.Thread(target=run, name="txn-offsets-completion", daemon=True).start()


class TxnMarkerSender:
    """Delivers marker jobs until every partition has its marker, then completes them."""

    def __init__(self, broker_id: int, store: MetadataStore, local: MarkerWriter,
                 peers: Connect | None, complete: Callable[[MarkerJob], bool],
                 max_jobs: int = 16) -> None:
        self._broker_id = broker_id
        self._store = store
        self._local = local
        self._peers = peers
        self._complete = complete
        self._lock = threading.Lock()
        self._active: set[tuple[str, int, int, bool]] = set()
        self._jobs = ThreadPoolExecutor(max_jobs, thread_name_prefix="txn-markers")
        self._sends = ThreadPoolExecutor(max_jobs, thread_name_prefix="txn-marker-send")
        self._stopping = threading.Event()

    def submit(self, job: MarkerJob) -> None:
        """Queue ``job`` unless the same one is already on its way (never blocks)."""
        with self._lock:
            if job.key in self._active or self._stopping.is_set():
                return
            self._active.add(job.key)
        self._jobs.submit(self._run, job)

    def stop(self) -> None:
        self._stopping.set()
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self._sends.shutdown(wait=False, cancel_futures=True)

    # -- one job -----------------------------------------------------------------------------

    def _run(self, job: MarkerJob) -> None:
        try:
            if self._deliver(job):
                self._finish(job)
        except Exception:  # boundary: a background job logs; the tick's scan resubmits it
            log.exception("transactional id %s: marker job failed", job.transactional_id)
        finally:
            with self._lock:
                self._active.discard(job.key)

    def _deliver(self, job: MarkerJob) -> bool:
        """True once every partition has its marker; False if the job must be dropped."""
        remaining = set(job.partitions)
        attempt = 0
        while remaining:
            if self._stopping.is_set():
                return False
            failed = self._send_round(job, remaining)
            if isinstance(failed, TransactionCoordinatorFencedError):
                log.info("transactional id %s: %s; a newer coordinator completes it",
                         job.transactional_id, failed.message)
                return False
            remaining = failed
            if remaining:
                self._stopping.wait(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                attempt += 1
        return True

    def _send_round(self, job: MarkerJob, partitions: set[TopicPartition]
                    ) -> set[TopicPartition] | TransactionCoordinatorFencedError:
        """One try for every partition, grouped by leader; the ones to try again."""
        by_leader: dict[int, list[TopicPartition]] = {}
        retry: set[TopicPartition] = set()
        for tp in partitions:
            leader = self._leader(tp)
            if leader is None:
                continue  # the topic is gone: no reader can need the marker
            if leader < 0:
                retry.add(tp)
            else:
                by_leader.setdefault(leader, []).append(tp)
        sends = {leader: self._sends.submit(self._send, leader, job, tps)
                 for leader, tps in by_leader.items()}
        for leader, future in sends.items():
            outcome = _outcome(future, by_leader[leader])
            if isinstance(outcome, TransactionCoordinatorFencedError):
                return outcome
            retry |= outcome
        return retry

    def _leader(self, tp: TopicPartition) -> int | None:
        """The partition's leader, -1 while it has none, None if its topic is gone."""
        record = self._store.topics().get(tp.topic)
        if record is None or tp.partition not in record.replicas:
            return None
        state = self._store.partition_states(tp.topic).get(tp.partition)
        return state.leader if state is not None else -1

    def _send(self, leader: int, job: MarkerJob, tps: list[TopicPartition]
              ) -> WriteTxnMarkersResponse:
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = WriteTxnMarkersRequest(markers=[TxnMarker(
            producer_id=job.producer_id, producer_epoch=job.producer_epoch,
            committed=job.committed, coordinator_epoch=job.coordinator_epoch,
            topics=[TxnTopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()])])
        if leader == self._broker_id:
            return self._local.write(request)
        conn = self._peers(leader) if self._peers is not None else None
        if conn is None:
            raise BrokerNotAvailableError(f"broker {leader} is not registered")
        return conn.call(request, timeout_s=MARKER_CALL_TIMEOUT_S)

    def _finish(self, job: MarkerJob) -> None:
        """Write the completion, retrying what may pass; a moved coordinator drops it."""
        for attempt in range(len(BACKOFF_S) * 10):
            if self._stopping.is_set():
                return
            try:
                self._complete(job)
                return
            except NotCoordinatorError:
                return
            except ApiError as e:
                if not e.retriable:
                    log.warning("transactional id %s: completion failed: %s",
                                job.transactional_id, e)
                    return
                self._stopping.wait(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])


def _outcome(future: Future[WriteTxnMarkersResponse], tps: list[TopicPartition]
             ) -> set[TopicPartition] | TransactionCoordinatorFencedError:
    """The partitions of one leader's answer that need another try."""
    try:
        response = future.result()
    except ApiError as e:
        log.debug("markers to %s failed: %s", tps, e)
        return set(tps)
    retry: set[TopicPartition] = set()
    for r in response.results:
        error = r.error()
        tp = TopicPartition(r.topic, r.partition)
        if error is None:
            continue
        if isinstance(error, TransactionCoordinatorFencedError):
            return error
        if isinstance(error, InvalidProducerEpochError):
            # A newer epoch already wrote to the partition: it is past this transaction.
            log.warning("%s: marker refused: %s", tp, error.message)
            continue
        if not isinstance(error, UnknownTopicOrPartitionError | LeaderNotAvailableError):
            log.info("%s: marker not written yet: %s", tp, error.message)
        retry.add(tp)
    return retry
