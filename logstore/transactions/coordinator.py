"""The transaction coordinator of one ``__transaction_state`` partition, as a pure state
machine (Kafka's TransactionCoordinator and TransactionStateManager, in the shape of the
group coordinator).

Owns: the transactional ids of one partition (``TxnCoordinatorShard``), building them by
replaying the partition (``TxnShardLoader``), the one way state changes (``TxnCoordinatorShard
.changed``: the new metadata as records, and once they are durable the change in memory, the
marker job of each transaction just decided and the wake-up of those waiting for a transaction
to complete), the marker jobs still owed (every PrepareCommit/PrepareAbort: after a failover
the new coordinator finishes them from the log) and the admin reads (describe, list). The
handlers live beside it, split by API: ``handlers.py`` (init_producer_id, add partitions and
offsets, verify, prepare, end, complete) and ``timeouts.py`` (the tick: timeouts and id
expiration). Every handler takes the shard, a typed request and ``now_ms`` and returns a
``CoordinatorResult``; a refused request raises its ApiError and changes nothing.

Invariant: memory is never ahead of the log; every transition is written (acks=all) before it
is answered. Must not: do I/O, take locks or read clocks (``broker/coordinator_runtime.py``
runs the results, ``broker/txn_coordinator.py`` routes requests and sends the markers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from logstore.config import DAY_MS
from logstore.coordinator import Completions, CoordinatorResult, LoggedBatch
from logstore.errors import InvalidProducerIdMappingError, NotCoordinatorError
from logstore.messages.transactions import (
    ListTransactionsRequest,
    TransactionDescription,
    TransactionListing,
    TxnTopicPartitions,
)
from logstore.model import TRANSACTION_STATE_TOPIC, TopicPartition
from logstore.transactions.log_records import records, replay, rows_of
from logstore.transactions.state import COMPLETE, DECIDING, OPEN, TransactionMetadata, TxnState

log = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnConfig:
    """The broker's transaction settings (Kafka's names and defaults)."""

    transaction_max_timeout_ms: int = 15 * 60 * 1000
    transaction_prepared_timeout_ms: int = 3600 * 1000
    transactional_id_expiration_ms: int = 7 * DAY_MS


@dataclass(frozen=True, slots=True)
class MarkerJob:
    """The markers a decided transaction still needs: COMMIT or ABORT for ``producer_id`` at
    ``producer_epoch`` in each of ``partitions``, from coordinator epoch
    ``coordinator_epoch`` (the leader epoch of ``__transaction_state``-``partition``)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    partition: int

    @property
    def key(self) -> tuple[str, int, int, bool]:
        return self.transactional_id, self.producer_id, self.producer_epoch, self.committed


def _ignore_job(job: MarkerJob) -> None:
    return None


@dataclass
class TxnCoordinatorShard:
    """The transactional ids of one ``__transaction_state`` partition, as its log has them."""

    partition: int
    coordinator_epoch: int
    config: TxnConfig
    txns: dict[str, TransactionMetadata] = field(default_factory=dict)
    # Futures of requests waiting for a transaction to complete (end_txn), by id.
    waiters: dict[str, list[Future[None]]] = field(default_factory=dict)
    on_decided: Callable[[MarkerJob], None] = _ignore_job

    def get(self, transactional_id: str) -> TransactionMetadata:
        meta = self.txns.get(transactional_id)
        if meta is None:
            raise InvalidProducerIdMappingError(
                f"transactional id {transactional_id} has no producer id here; call "
                "init_producer_id first")
        return meta

    def changed(self, metas: list[TransactionMetadata], now_ms: int, response: R,
                then: Callable[[], None] | None = None) -> CoordinatorResult[R]:
        """The result of a request that moved ``metas``: their records in one batch (one
        atomic append decides them all); once durable, they are installed, decided ones get
        their marker jobs and completed ones wake their waiters, then ``then`` runs."""
        def install() -> None:
            for meta in metas:
                self.txns[meta.transactional_id] = meta
                if meta.state in DECIDING:
                    self.on_decided(self.marker_job(meta))
                elif meta.state in COMPLETE:
                    self._wake(meta.transactional_id)
            if then is not None:
                then()
        return CoordinatorResult(records(rows_of(metas), now_ms), response, install)

    def wait_for_completion(self, transactional_id: str, future: Future[None]) -> None:
        """Resolve ``future`` when the id's transaction completes (at once if it has)."""
        meta = self.txns.get(transactional_id)
        if meta is not None and meta.state in DECIDING:
            self.waiters.setdefault(transactional_id, []).append(future)
        else:
            future.set_result(None)

    def _wake(self, transactional_id: str) -> None:
        for future in self.waiters.pop(transactional_id, []):
            if not future.done():
                future.set_result(None)

    def marker_job(self, meta: TransactionMetadata) -> MarkerJob:
        return MarkerJob(meta.transactional_id, meta.producer_id, meta.producer_epoch,
                         meta.state == TxnState.PREPARE_COMMIT, self.coordinator_epoch,
                         meta.partitions, self.partition)


class TxnShardLoader:
    """Builds a partition's shard from its log, and gives one up (``ShardLoader``).
    ``on_decided`` receives the marker job of every transaction decided from then on."""

    def __init__(self, config: TxnConfig,
                 on_decided: Callable[[MarkerJob], None] = _ignore_job) -> None:
        self.config = config
        self.on_decided = on_decided

    def load(self, partition: int, leader_epoch: int, batches: Iterable[LoggedBatch],
             now_ms: int) -> TxnCoordinatorShard:
        shard = TxnCoordinatorShard(partition, leader_epoch, self.config, replay(batches),
                                    on_decided=self.on_decided)
        owed = marker_jobs(shard)
        for job in owed:  # a failed-over coordinator finishes what its predecessor decided
            self.on_decided(job)
        log.info("%s-%d: loaded %d transactional id(s) at coordinator epoch %d, %d "
                 "transaction(s) to complete", TRANSACTION_STATE_TOPIC, partition,
                 len(shard.txns), leader_epoch, len(owed))
        return shard

    def unload(self, shard: TxnCoordinatorShard, partition: int) -> Completions:
        moved = NotCoordinatorError(
            f"{TRANSACTION_STATE_TOPIC}-{partition} moved to another leader")
        failed = Completions()
        for futures in shard.waiters.values():
            for future in futures:
                failed.fail(future, moved)
        shard.waiters.clear()
        return failed


def marker_jobs(shard: TxnCoordinatorShard) -> list[MarkerJob]:
    """The marker jobs of every decided transaction not completed yet."""
    return [shard.marker_job(m) for m in shard.txns.values() if m.state in DECIDING]


# -- admin reads ---------------------------------------------------------------------------


def describe(shard: TxnCoordinatorShard, transactional_id: str) -> TransactionDescription:
    meta = shard.get(transactional_id)
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(meta.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return TransactionDescription(
        transactional_id=transactional_id, state=meta.state.value,
        producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
        transaction_timeout_ms=meta.timeout_ms,
        transaction_start_time_ms=meta.txn_start_ms if meta.state in OPEN | DECIDING else -1,
        topics=[TxnTopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        two_phase_commit=meta.two_phase)


def list_transactions(shard: TxnCoordinatorShard, req: ListTransactionsRequest
                      ) -> list[TransactionListing]:
    states, pids = set(req.state_filters), set(req.producer_id_filters)
    return [TransactionListing(transactional_id=m.transactional_id, producer_id=m.producer_id,
                               state=m.state.value)
            for m in shard.txns.values()
            if (not states or m.state.value in states) and (not pids or m.producer_id in pids)
            and m.transactional_id.startswith(req.transactional_id_prefix)]
