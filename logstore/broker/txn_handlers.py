"""Typed handlers of the transaction protocol, and the transaction coordinator's parts on this
broker put together.

Owns: the Routes of init_producer_id (an idempotent producer's id from any broker, a
transactional one's from its coordinator), add_partitions_to_txn (and its verify-only form),
add_offsets_to_txn, txn_offset_commit (to the group coordinator, after the partition leader's
check that the group's partition is in the transaction, whose guard goes with the offsets
batch to the log), end_txn (answered once the decided
transactions are complete, or, if their markers take longer than END_TXN_WAIT_S, once the
decision is durable, as Kafka answers), prepare_txn, write_txn_markers, describe_transactions,
list_transactions and describe_producers; the transactional half of find_coordinator; creating
``__transaction_state`` on first use (compacted, ``transaction_state_log_num_partitions``,
replication like ``__consumer_offsets``, min ISR ``transaction_state_log_min_isr`` where the
replication factor allows); and the tick (loading led partitions, timeouts, the marker jobs
owed). Must not: hold transaction state (``transactions/``) or touch the transport.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from logstore.broker import acl_rules as rules
from logstore.broker.coordinator_log import (
    InternalTopic,
    InternalTopicSpec,
    ReplicaCoordinatorLog,
)
from logstore.broker.group_handlers import GroupHandlers
from logstore.broker.handlers import ProducerIdSource
from logstore.broker.replica_manager import ReplicaManager
from logstore.broker.txn_coordinator import TxnCoordinatorService
from logstore.broker.txn_markers import MarkerWriter, TxnMarkerSender
from logstore.broker.txn_verify import CoordinatorVerifier
from logstore.clock import Clock
from logstore.config import BrokerConfig
from logstore.controller.store import MetadataStore
from logstore.controller.topics import TopicController
from logstore.coordinator import key_partition
from logstore.errors import (
    ApiError,
    InvalidGroupIdError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.groups.offsets import partition_for
from logstore.messages import ErrorFields, Route, error_kw
from logstore.messages.groups import FindCoordinatorResponse
from logstore.messages.produce import InitProducerIdRequest, InitProducerIdResponse
from logstore.messages.transactions import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    PartitionProducers,
    PrepareTxnRequest,
    PrepareTxnResponse,
    ProducerDescription,
    TransactionDescription,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from logstore.model import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicPartition
from logstore.replication.fetcher import Connect
from logstore.transactions.coordinator import MarkerJob, TxnConfig
from logstore.transactions.handlers import requested_partitions
from logstore.transactions.state import validate_transactional_id

log = logging.getLogger(__name__)

END_TXN_WAIT_S = 20.0
E = TypeVar("E", bound=ErrorFields)


class TxnHandlers:
    def __init__(self, config: BrokerConfig, store: MetadataStore, controller: TopicController,
                 replicas: ReplicaManager, producer_ids: ProducerIdSource,
                 groups: GroupHandlers, clock: Clock, peers: Connect | None) -> None:
        self._store = store
        self._replicas = replicas
        self._producer_ids = producer_ids
        self._groups = groups
        self.state_topic = InternalTopic(store, controller, InternalTopicSpec(
            TRANSACTION_STATE_TOPIC, config.transaction_state_partitions,
            config.transaction_state_log_replication_factor,
            config.transaction_state_log_segment_bytes, config.transaction_state_log_min_isr))
        self.service = TxnCoordinatorService(
            ReplicaCoordinatorLog(replicas, store, TRANSACTION_STATE_TOPIC), TxnConfig(
                transaction_max_timeout_ms=config.transaction_max_timeout_ms,
                transaction_prepared_timeout_ms=config.transaction_prepared_timeout_ms,
                transactional_id_expiration_ms=config.transactional_id_expiration_ms),
            clock, producer_ids, self._on_decided)
        self.verifier = CoordinatorVerifier(config.broker_id, store, self.add_partitions_to_txn,
                                            peers)
        self.writer = MarkerWriter(replicas, groups.coordinator.complete_txn)
        self.markers = TxnMarkerSender(config.broker_id, store, self.writer, peers,
                                       self.service.complete)
        self._cleanup_ms = config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        self._next_cleanup_ms = 0.0
        self._clock = clock

    def _on_decided(self, job: MarkerJob) -> None:
        self.markers.submit(job)

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(InitProducerIdRequest, self.init_producer_id, rules.INIT_PRODUCER_ID),
                Route(AddPartitionsToTxnRequest, self.add_partitions_to_txn,
                      rules.ADD_PARTITIONS_TO_TXN),
                Route(AddOffsetsToTxnRequest, self.add_offsets_to_txn, rules.ADD_OFFSETS_TO_TXN),
                Route(TxnOffsetCommitRequest, self.txn_offset_commit, rules.TXN_OFFSET_COMMIT),
                Route(EndTxnRequest, self.end_txn, rules.END_TXN),
                Route(PrepareTxnRequest, self.prepare_txn, rules.PREPARE_TXN),
                Route(WriteTxnMarkersRequest, self.write_txn_markers, rules.WRITE_TXN_MARKERS),
                Route(DescribeTransactionsRequest, self.describe_transactions,
                      rules.DESCRIBE_TRANSACTIONS),
                Route(ListTransactionsRequest, self.list_transactions, rules.LIST_TRANSACTIONS),
                Route(DescribeProducersRequest, self.describe_producers,
                      rules.DESCRIBE_PRODUCERS)]

    def find_coordinator(self, transactional_id: str) -> FindCoordinatorResponse:
        validate_transactional_id(transactional_id)
        return self.state_topic.coordinator(transactional_id, key_partition)

    # -- the producer's requests -------------------------------------------------------------

    def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResponse:
        if req.transactional_id is None:  # an idempotent producer: any broker answers
            return InitProducerIdResponse(producer_id=self._producer_ids.next_producer_id(),
                                          producer_epoch=0)
        return _answer(InitProducerIdResponse, lambda: self.service.init_producer_id(req))

    def add_partitions_to_txn(self, req: AddPartitionsToTxnRequest
                              ) -> AddPartitionsToTxnResponse:
        def add() -> AddPartitionsToTxnResponse:
            if not req.verify_only:
                self._check_partitions(requested_partitions(req), req.transactional_id)
            return self.service.add_partitions(req)
        return _answer(AddPartitionsToTxnResponse, add)

    def _check_partitions(self, tps: list[TopicPartition], transactional_id: str) -> None:
        topics = self._store.topics()
        for tp in tps:
            record = topics.get(tp.topic)
            if record is None or tp.partition not in record.replicas:
                raise UnknownTopicOrPartitionError(
                    f"transactional id {transactional_id}: {tp} does not exist; nothing was "
                    "added to the transaction")

    def add_offsets_to_txn(self, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
        def add() -> AddOffsetsToTxnResponse:
            self.service.add_offsets(req, self._offsets_partition(req.group_id))
            return AddOffsetsToTxnResponse()
        return _answer(AddOffsetsToTxnResponse, add)

    def _offsets_partition(self, group_id: str) -> TopicPartition:
        if not group_id:
            raise InvalidGroupIdError("group id must be a non-empty string")
        return TopicPartition(OFFSETS_TOPIC,
                              partition_for(group_id, self._groups.ensure_offsets_topic()))

    def txn_offset_commit(self, req: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
        """Unless the producer's transaction is open on the group's offsets partition at its
        epoch, ask the transactional id's coordinator first (KIP-890 part 1), as a leader
        does for a data batch (``handlers._transactional_flags``): the offsets batch then
        carries the guard of that answer, which the log checks under its lock, so a marker
        written meanwhile makes the commit TRANSACTION_ABORTABLE instead of opening a
        transaction nobody would end on ``__consumer_offsets``."""
        def commit() -> TxnOffsetCommitResponse:
            tp = self._offsets_partition(req.group_id)
            guard = self._replicas.verification_guard(tp, req.producer_id, req.producer_epoch)
            if guard is not None and not guard.verified:
                self.verifier.verify(req.transactional_id, req.producer_id,
                                     req.producer_epoch, tp)
                guard.verified = True
            return self._groups.coordinator.txn_offset_commit(req, verify=True, guard=guard)
        return _answer(TxnOffsetCommitResponse, commit)

    def end_txn(self, req: EndTxnRequest) -> EndTxnResponse:
        def end() -> EndTxnResponse:
            done = self.service.end_txn(req)
            try:
                done.result(timeout=END_TXN_WAIT_S)
            except FutureTimeout:
                log.info("transactional id %s: decided; its markers are still on their way",
                         req.transactional_id)
            return EndTxnResponse()
        return _answer(EndTxnResponse, end)

    def prepare_txn(self, req: PrepareTxnRequest) -> PrepareTxnResponse:
        return _answer(PrepareTxnResponse, lambda: self.service.prepare(req))

    # -- partition leaders -------------------------------------------------------------------

    def write_txn_markers(self, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
        return self.writer.write(req)

    def describe_producers(self, req: DescribeProducersRequest) -> DescribeProducersResponse:
        return DescribeProducersResponse(topic=req.topic, partitions=[
            self._producers(TopicPartition(req.topic, p)) for p in req.partitions])

    def _producers(self, tp: TopicPartition) -> PartitionProducers:
        def describe() -> PartitionProducers:
            return PartitionProducers(partition=tp.partition, producers=[ProducerDescription(
                producer_id=e.producer_id, producer_epoch=e.epoch,
                last_sequence=-1 if e.last_seq is None else e.last_seq,
                last_timestamp=e.batches[-1].max_timestamp if e.batches else -1,
                coordinator_epoch=e.coordinator_epoch,
                current_txn_start_offset=-1 if e.txn_first_offset is None
                else e.txn_first_offset) for e in self._replicas.producers(tp)])
        return _answer(PartitionProducers, describe, partition=tp.partition)

    # -- admin -------------------------------------------------------------------------------

    def describe_transactions(self, req: DescribeTransactionsRequest
                              ) -> DescribeTransactionsResponse:
        return DescribeTransactionsResponse(transactions=[
            self._describe(tid) for tid in req.transactional_ids])

    def _describe(self, transactional_id: str) -> TransactionDescription:
        return _answer(TransactionDescription,
                       lambda: self.service.describe(transactional_id),
                       transactional_id=transactional_id)

    def list_transactions(self, req: ListTransactionsRequest) -> ListTransactionsResponse:
        return _answer(ListTransactionsResponse, lambda: ListTransactionsResponse(
            transactions=self.service.list_transactions(req)))

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> None:
        """Load led partitions; every cleanup interval, timeouts and expiration, and the
        marker jobs owed (resubmitted: a job that failed or lost its coordinator)."""
        self.service.load_led_partitions()
        now = self._clock.monotonic_ms()
        if now < self._next_cleanup_ms:
            return
        self._next_cleanup_ms = now + self._cleanup_ms
        self.service.tick()
        for job in self.service.owed_marker_jobs():
            self.markers.submit(job)

    def stop(self) -> None:
        self.markers.stop()


def _answer(response_type: type[E], fn: Callable[[], E], **fields: Any) -> E:
    """``fn``'s response; an ApiError becomes the response's code (``fields`` fill the
    entry's required fields)."""
    try:
        return fn()
    except ApiError as e:
        return response_type(**fields, **error_kw(e))
    except Exception as e:  # boundary: report, never crash the broker
        log.exception("transaction request failed")
        return response_type(**fields, **error_kw(UnknownServerError(f"{type(e).__name__}: {e}")))
