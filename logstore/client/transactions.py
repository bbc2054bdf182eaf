"""The producer's side of transactions (Kafka's TransactionManager).

Owns: the client's transaction state (uninitialised, ready, in a transaction, prepared, and the
two error states: abortable, where the transaction must be aborted, and fatal, where the
producer must be closed and every later call raises the same error), the producer id and epoch
from ``init_producer_id``, the partitions and groups already added to the open transaction, and
the requests to the transaction coordinator (init, add partitions, add offsets, prepare, end)
and to the group coordinator (``txn_offset_commit`` with the consumer's generation and member
id, KIP-447). Errors are Kafka's: PRODUCER_FENCED (also a partition's INVALID_PRODUCER_EPOCH:
only a fencing writes a newer epoch there) and a fenced coordinator are fatal; any
other failure inside a transaction makes it abortable; CONCURRENT_TRANSACTIONS and the
coordinator's retriable codes are retried here. Must not: send records (``sender.py`` does) or
reach into broker internals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from logstore.client.coordinator import CoordinatorClient
from logstore.client.metadata import ClusterMetadata
from logstore.coordinator import key_partition
from logstore.errors import (
    ApiError,
    ErrorCode,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)
from logstore.messages import Request
from logstore.messages.groups import KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION
from logstore.messages.produce import InitProducerIdRequest, InitProducerIdResponse
from logstore.messages.transactions import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    PreparedTxn,
    PrepareTxnRequest,
    TxnOffsetCommitEntry,
    TxnOffsetCommitRequest,
    TxnTopicPartitions,
)
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.transactions.state import validate_transactional_id

log = logging.getLogger(__name__)

FATAL = (ProducerFencedError, InvalidProducerEpochError, TransactionCoordinatorFencedError,
         InvalidProducerIdMappingError)
WITH_PREPARED = "with_prepared:"


@dataclass(frozen=True, slots=True)
class PreparedTxnState:
    """A transaction prepared for an external decision: which transactional id, and the
    producer id and epoch it was prepared under (prepare bumps the epoch, so the state names
    exactly one transaction of the id). Picklable (it travels in Spark commit messages)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What ``send_offsets_to_transaction`` needs of a consumer (KIP-447): its group, and the
    generation and member id the group coordinator fences zombies by."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


def colocated_transactional_id(anchor: str, prefix: str, num_partitions: int) -> str:
    """``<prefix>-<k>`` for the smallest k whose ``__transaction_state`` partition is
    ``anchor``'s (of ``num_partitions``), so that one coordinator partition holds both and
    ``commit_transaction(with_prepared=...)`` can decide them together."""
    target = key_partition(anchor, num_partitions)
    for k in range(1_000_000):
        candidate = f"{prefix}-{k}"
        if key_partition(candidate, num_partitions) == target:
            return validate_transactional_id(candidate)
    raise ValueError(f"no id with prefix {prefix!r} shares {anchor!r}'s partition")


class TxnState(Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


class TransactionManager:
    """Thread-safe."""

    def __init__(self, metadata: ClusterMetadata, transactional_id: str,
                 transaction_timeout_ms: int, two_phase_commit: bool,
                 max_block_s: float) -> None:
        self.transactional_id = validate_transactional_id(transactional_id)
        self._metadata = metadata
        self.timeout_ms = transaction_timeout_ms
        self.two_phase = two_phase_commit
        self.max_block_s = max_block_s
        self._coordinator = CoordinatorClient(metadata, transactional_id,
                                              KEY_TYPE_TRANSACTION, max_block_s)
        self._lock = threading.RLock()
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.prepared_in_coordinator: tuple[int, int] | None = None
        self._partitions: set[TopicPartition] = set()
        self._groups: set[str] = set()
        self._error: ApiError | None = None
        self.needs_epoch_bump = False  # a batch failed: sequences have a hole

    # -- state -------------------------------------------------------------------------------

    def _what(self) -> str:
        return f"transactional id {self.transactional_id}"

    def check(self, *allowed: TxnState, action: str) -> None:
        """Raise unless the state allows ``action``: the fatal error in the fatal state, the
        abortable one (telling to abort) in the abortable state, INVALID_TXN_STATE
        otherwise."""
        with self._lock:
            if self.state in allowed:
                return
            if self.state == TxnState.FATAL_ERROR and self._error is not None:
                raise type(self._error)(self._error.message)
            if self.state == TxnState.ABORTABLE_ERROR and self._error is not None:
                raise type(self._error)(f"{self._what()}: {action} refused: the transaction "
                                        f"failed ({self._error.message}); abort it")
            raise InvalidTxnStateError(f"{self._what()}: cannot {action} in state "
                                       f"{self.state.value}")

    def fail(self, error: ApiError, about_others: bool = False) -> ApiError:
        """Record a failure inside the transaction (fatal, or abortable when the error is
        about this producer's transaction; ``about_others``: it names another id's prepared
        transaction, which fences nothing here); the error to raise."""
        with self._lock:
            if isinstance(error, FATAL) and not about_others:
                # A newer epoch on a partition means a newer instance (or the coordinator,
                # aborting a timed-out transaction) fenced this one: Kafka's ProducerFenced.
                kind = ProducerFencedError if isinstance(error, InvalidProducerEpochError) \
                    else type(error)
                error = kind(
                    f"{self._what()}: this producer (id {self.producer_id}, epoch "
                    f"{self.producer_epoch}) is fenced: {error.message}; close it")
                self.state, self._error = TxnState.FATAL_ERROR, error
            elif self.state not in (TxnState.FATAL_ERROR,):
                self.needs_epoch_bump = True
                if self.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
                    self.state, self._error = TxnState.ABORTABLE_ERROR, error
            return error

    def _call_or_fail(self, request: Request[Any],
                      coordinator: CoordinatorClient | None = None) -> None:
        try:
            response: Any = (coordinator or self._coordinator).call(request)
        except ApiError as e:
            # The coordinator names a with_prepared entry it refuses after "with_prepared:".
            raise self.fail(e, about_others=WITH_PREPARED in e.message) from None
        results = getattr(response, "results", [])
        stale = sorted({e.topic for e in results if e.error_code == ErrorCode.UNKNOWN_TOPIC_ID})
        if stale:  # offsets for a topic recreated since it was cached: the next ones name
            try:   # its new id
                self._metadata.refresh(stale)
            except (ApiError, OSError) as e:  # the entry's own error is the one to raise
                log.info("%s: metadata refresh of %s failed: %s", self._what(), stale, e)
        for entry in results:
            error = entry.error()
            if error is not None:
                raise self.fail(type(error)(f"{self._what()}: {entry.topic}-{entry.partition}"
                                            f": {error.message}"))

    # -- init --------------------------------------------------------------------------------

    def init(self, keep_prepared_txn: bool) -> tuple[int, int]:
        """A producer id and epoch from the coordinator (retried while it aborts or
        completes the previous instance's transaction)."""
        self.check(TxnState.UNINITIALIZED, TxnState.READY, action="init_transactions")
        response = self._init(InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
            enable_two_phase_commit=self.two_phase, keep_prepared_txn=keep_prepared_txn))
        with self._lock:
            prepared = (response.prepared_producer_id, response.prepared_producer_epoch)
            self.prepared_in_coordinator = prepared if prepared[0] >= 0 else None
        return self.producer_id, self.producer_epoch

    def bump_epoch(self) -> tuple[int, int]:
        """KIP-360: the same producer re-initialises for a fresh epoch (after an aborted
        transaction whose batches failed, so its sequences restart at 0)."""
        self._init(InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
            enable_two_phase_commit=self.two_phase, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch))
        return self.producer_id, self.producer_epoch

    def _init(self, request: InitProducerIdRequest) -> InitProducerIdResponse:
        try:
            response = self._coordinator.call(request)
        except FATAL as e:
            raise self.fail(e) from None
        with self._lock:
            self.producer_id, self.producer_epoch = response.producer_id, \
                response.producer_epoch
            self.state, self._error, self.needs_epoch_bump = TxnState.READY, None, False
            self._partitions, self._groups = set(), set()
        log.info("%s: producer id %d epoch %d", self._what(), self.producer_id,
                 self.producer_epoch)
        return response

    # -- inside a transaction ----------------------------------------------------------------

    def begin(self) -> None:
        self.check(TxnState.READY, action="begin a transaction")
        with self._lock:
            self.state = TxnState.IN_TRANSACTION
            self._partitions, self._groups = set(), set()

    def add_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Add the partitions not in the transaction yet, in one request."""
        self.check(TxnState.IN_TRANSACTION, action="send")
        with self._lock:
            new = sorted(set(tps) - self._partitions)
        if not new:
            return
        by_topic: dict[str, list[int]] = {}
        for tp in new:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        self._call_or_fail(AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            topics=[TxnTopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]))
        with self._lock:
            self._partitions.update(new)

    def send_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata],
                     group: ConsumerGroupMetadata) -> None:
        """add_offsets_to_txn, then txn_offset_commit to the group's coordinator."""
        self.check(TxnState.IN_TRANSACTION, action="send offsets")
        if group.group_id not in self._groups:
            self._call_or_fail(AddOffsetsToTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, group_id=group.group_id))
            with self._lock:
                self._groups.add(group.group_id)
        group_coordinator = CoordinatorClient(self._metadata, group.group_id, KEY_TYPE_GROUP,
                                              self.max_block_s)
        self._call_or_fail(TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group.group_id,
            producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            generation_id=group.generation_id, member_id=group.member_id,
            group_instance_id=group.group_instance_id,
            offsets=[TxnOffsetCommitEntry(topic=tp.topic, partition=tp.partition,
                                          offset=om.offset, metadata=om.metadata,
                                          topic_id=self._metadata.known_topic_id(tp.topic))
                     for tp, om in offsets.items()]), group_coordinator)

    @property
    def has_writes(self) -> bool:
        with self._lock:
            return bool(self._partitions or self._groups)

    # -- ending ------------------------------------------------------------------------------

    def prepare(self) -> PreparedTxnState:
        self.check(TxnState.IN_TRANSACTION, action="prepare the transaction")
        if not self.two_phase:
            raise InvalidTxnStateError(f"{self._what()}: prepare_transaction needs "
                                       "Producer(transaction_two_phase_commit=True)")
        try:
            response = self._coordinator.call(PrepareTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch))
        except ApiError as e:
            raise self.fail(e) from None
        with self._lock:
            # Prepare bumps the epoch: the state names this transaction alone, and the
            # producer goes on (abort, its next transaction) at the new epoch.
            self.producer_id, self.producer_epoch = response.producer_id, \
                response.producer_epoch
            self.state = TxnState.PREPARED
            return PreparedTxnState(self.transactional_id, self.producer_id,
                                    self.producer_epoch)

    def end(self, committed: bool, with_prepared: Iterable[PreparedTxnState] = (),
            force: bool = False) -> None:
        """Commit or abort (with ``with_prepared``, commit those prepared transactions too,
        in one decision); an empty transaction needs no request unless ``force``."""
        prepared = [PreparedTxn(transactional_id=s.transactional_id,
                                producer_id=s.producer_id, producer_epoch=s.producer_epoch)
                    for s in with_prepared]
        with self._lock:
            opened = self.state == TxnState.PREPARED or self.has_writes
        if opened or prepared or force:
            self._call_or_fail(EndTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, committed=committed,
                with_prepared=prepared))
        with self._lock:
            self.state, self._error = TxnState.READY, None
            self._partitions, self._groups = set(), set()
            self.prepared_in_coordinator = None


__all__ = ["ConsumerGroupMetadata", "PreparedTxnState", "TransactionManager", "TxnState",
           "colocated_transactional_id"]
