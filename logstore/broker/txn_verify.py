"""The partition leader's check of a transactional write (KIP-890 part 1).

Owns: ``CoordinatorVerifier``: before the first transactional batch of a producer's transaction
lands on a partition, it asks the transactional id's coordinator (itself, or the broker leading
the id's ``__transaction_state`` partition) whether the partition is in that producer's ongoing
transaction, with ``add_partitions_to_txn`` ``verify_only``; a refusal (PRODUCER_FENCED,
INVALID_TXN_STATE, TRANSACTION_ABORTABLE...) refuses the batch, and a coordinator that cannot
answer now makes it NOT_ENOUGH_REPLICAS, which the producer retries (Kafka's mapping for clients
that predate the check). It keeps no cache: a positive answer lives in the partition's
producer state as a verified guard, which a marker of the producer clears under the log's lock
(``segments/producer_state.py``), so an answer can never outlive its transaction. Must not:
hold transaction state or touch the transport (peer connections are injected).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from logstore.controller.store import MetadataStore
from logstore.coordinator import key_partition
from logstore.errors import ApiError, NotEnoughReplicasError
from logstore.messages.transactions import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    TxnTopicPartitions,
)
from logstore.model import TRANSACTION_STATE_TOPIC, TopicPartition
from logstore.replication.fetcher import Connect

log = logging.getLogger(__name__)

VERIFY_TIMEOUT_S = 10.0

Local = Callable[[AddPartitionsToTxnRequest], AddPartitionsToTxnResponse]


class CoordinatorVerifier:
    """``TxnVerifier`` (handlers.py) through the coordinator of each transactional id."""

    def __init__(self, broker_id: int, store: MetadataStore, local: Local,
                 peers: Connect | None) -> None:
        self._broker_id = broker_id
        self._store = store
        self._local = local
        self._peers = peers

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               tp: TopicPartition) -> None:
        """Raise the ApiError that refuses the write unless ``tp`` is in the producer's
        ongoing transaction now."""
        request = AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, verify_only=True,
            topics=[TxnTopicPartitions(topic=tp.topic, partitions=[tp.partition])])
        response = self._ask(request, tp)
        for entry in (response, *response.results):
            error = entry.error()
            if error is not None:
                raise _refusal(error, tp, transactional_id)

    def _ask(self, request: AddPartitionsToTxnRequest, tp: TopicPartition
             ) -> AddPartitionsToTxnResponse:
        try:
            leader = self._coordinator(request.transactional_id)
            if leader == self._broker_id:
                return self._local(request)
            conn = self._peers(leader) if self._peers is not None else None
            if conn is None:
                raise NotEnoughReplicasError(f"broker {leader} is not registered")
            return conn.call(request, timeout_s=VERIFY_TIMEOUT_S)
        except ApiError as e:
            raise _refusal(e, tp, request.transactional_id) from None

    def _coordinator(self, transactional_id: str) -> int:
        record = self._store.topics().get(TRANSACTION_STATE_TOPIC)
        if record is None:
            raise NotEnoughReplicasError(f"{TRANSACTION_STATE_TOPIC} does not exist yet")
        partition = key_partition(transactional_id, record.num_partitions)
        state = self._store.partition_states(TRANSACTION_STATE_TOPIC).get(partition)
        if state is None or state.leader < 0:
            raise NotEnoughReplicasError(f"{TRANSACTION_STATE_TOPIC}-{partition} has no leader")
        return state.leader


def _refusal(error: ApiError, tp: TopicPartition, transactional_id: str) -> ApiError:
    """The error that refuses the batch: the coordinator's own, or NOT_ENOUGH_REPLICAS (retry)
    when it could not answer now."""
    if error.retriable:
        return NotEnoughReplicasError(
            f"{tp}: the coordinator of transactional id {transactional_id} could not verify "
            f"the write yet ({error.message}); retry")
    return type(error)(f"{tp}: {error.message}")
