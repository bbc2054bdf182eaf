"""The transaction coordinator on this broker: the pure transaction handlers
(``transactions/``) run by the coordinator runtime over the ``__transaction_state`` partitions
this broker leads.

Owns: routing a typed transaction request to its id's partition (``key_partition``; an empty or
over-long id is INVALID_REQUEST), choosing how the runtime runs it (init, add, prepare, end and
a marker job's completion are writes; verify, describe and list are reads), the checks that need
more than one shard (every id of an end_txn ``with_prepared`` must live on the caller's
partition), loading every led partition without waiting for a request (a failed-over coordinator
must finish the transactions its predecessor decided), and the tick (timeouts, expiration, and
the marker jobs still owed). Must not: send markers (``txn_markers.py``), encode responses or
wait on futures (``txn_handlers.py``), or hold transaction rules (``transactions/``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from logstore.broker.coordinator_runtime import CoordinatorRuntime
from logstore.broker.handlers import ProducerIdSource
from logstore.clock import Clock
from logstore.coordinator import CoordinatorLog, key_partition
from logstore.errors import ApiError, InvalidTxnStateError
from logstore.messages.produce import InitProducerIdRequest, InitProducerIdResponse
from logstore.messages.transactions import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    ListTransactionsRequest,
    PrepareTxnRequest,
    PrepareTxnResponse,
    TransactionDescription,
    TransactionListing,
)
from logstore.model import TRANSACTION_STATE_TOPIC, TopicPartition
from logstore.transactions import handlers, timeouts
from logstore.transactions.coordinator import (
    MarkerJob,
    TxnConfig,
    TxnCoordinatorShard,
    TxnShardLoader,
    describe,
    list_transactions,
    marker_jobs,
)
from logstore.transactions.state import validate_transactional_id

log = logging.getLogger(__name__)


class TxnCoordinatorService:
    """Thread-safe: the runtime serializes what must be. ``on_decided`` gets the marker job
    of every transaction decided here (it must only queue it)."""

    def __init__(self, state_log: CoordinatorLog, config: TxnConfig, clock: Clock,
                 producer_ids: ProducerIdSource, on_decided: Callable[[MarkerJob], None]
                 ) -> None:
        self.config = config
        self._log = state_log
        self._producer_ids = producer_ids
        self.runtime: CoordinatorRuntime[TxnCoordinatorShard] = CoordinatorRuntime(
            TRANSACTION_STATE_TOPIC, state_log, TxnShardLoader(config, on_decided), clock)

    def partition(self, transactional_id: str) -> int:
        return key_partition(validate_transactional_id(transactional_id),
                             self.runtime.num_partitions())

    # -- the producer's requests -------------------------------------------------------------

    def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResponse:
        tid = req.transactional_id or ""
        partition = self.partition(tid)
        new_producer_id = self._producer_ids.next_producer_id()
        return self.runtime.write(partition, tid, lambda shard, now: handlers.init_producer_id(
            shard, req, now, new_producer_id))

    def add_partitions(self, req: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse:
        partition = self.partition(req.transactional_id)
        if req.verify_only:
            return self.runtime.read(partition, lambda shard: handlers.verify(shard, req))
        tps = handlers.requested_partitions(req)
        return self.runtime.write(partition, req.transactional_id, lambda shard, now:
                                  handlers.add_partitions(shard, req, tps, now))

    def add_offsets(self, req: AddOffsetsToTxnRequest, offsets_partition: TopicPartition
                    ) -> None:
        """Add the group's ``__consumer_offsets`` partition to the transaction."""
        add = AddPartitionsToTxnRequest(
            transactional_id=req.transactional_id, producer_id=req.producer_id,
            producer_epoch=req.producer_epoch, topics=[])
        self.runtime.write(self.partition(req.transactional_id), req.transactional_id,
                           lambda shard, now: handlers.add_partitions(
                               shard, add, [offsets_partition], now))

    def prepare(self, req: PrepareTxnRequest) -> PrepareTxnResponse:
        return self.runtime.write(self.partition(req.transactional_id), req.transactional_id,
                                  lambda shard, now: handlers.prepare_txn(shard, req, now))

    def end_txn(self, req: EndTxnRequest) -> Future[None]:
        """The decision is durable when this returns; the future resolves once every decided
        transaction is complete."""
        partition = self.partition(req.transactional_id)
        for p in req.with_prepared:
            other = self.partition(p.transactional_id)
            if other != partition:
                raise InvalidTxnStateError(
                    f"with_prepared: transactional id {p.transactional_id} is coordinated by "
                    f"{TRANSACTION_STATE_TOPIC}-{other}, not by {TRANSACTION_STATE_TOPIC}-"
                    f"{partition} as {req.transactional_id} is; one decision covers one "
                    "partition")
        return self.runtime.write(partition, req.transactional_id,
                                  lambda shard, now: handlers.end_txn(shard, req, now))

    # -- markers -----------------------------------------------------------------------------

    def complete(self, job: MarkerJob) -> bool:
        """Every marker of ``job`` is written: CompleteCommit/CompleteAbort. False if the
        transaction moved on meanwhile (nothing written)."""
        return self.runtime.write(job.partition, job.transactional_id, lambda shard, now:
                                  handlers.complete_txn(shard, job.transactional_id,
                                                        job.producer_id, job.producer_epoch,
                                                        job.committed, now))

    def owed_marker_jobs(self) -> list[MarkerJob]:
        return self.runtime.read_all(marker_jobs)

    # -- admin -------------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TransactionDescription:
        return self.runtime.read(self.partition(transactional_id),
                                 lambda shard: describe(shard, transactional_id))

    def list_transactions(self, req: ListTransactionsRequest) -> list[TransactionListing]:
        return self.runtime.read_all(lambda shard: list_transactions(shard, req))

    # -- time --------------------------------------------------------------------------------

    def load_led_partitions(self) -> None:
        """Load every partition this broker leads that is not loaded yet."""
        try:
            count = self.runtime.num_partitions()
        except ApiError:
            return  # the topic does not exist yet
        for partition in range(count):
            if self._log.leader_epoch(partition) is None:
                continue
            try:
                self.runtime.read(partition, lambda shard: None)
            except ApiError as e:
                log.debug("%s-%d: not loaded yet: %s", TRANSACTION_STATE_TOPIC, partition, e)

    def tick(self) -> list[Future[None]]:
        """Timeouts and expiration on every loaded partition; the futures of the appends it
        started."""
        return self.runtime.tick(timeouts.tick)
