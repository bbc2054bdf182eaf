"""The admin client's transaction calls (Kafka's KIP-664 and KIP-618): list, describe, the
producers of partitions, finding and aborting hanging transactions, fencing transactional ids.

Owns: the value types these calls return and how each is asked: list_transactions of every
broker (each lists the ids it coordinates), describe_transactions of each id's coordinator,
describe_producers of each partition's leader, abort_transaction as an ABORT marker written
to the partition by its leader (a hanging transaction's coordinator no longer knows it), and
fence_producers as init_producer_id for the id (its open transaction is aborted at a bumped
epoch). A transaction is hanging (Kafka's ``find-hanging``) when a partition's producer has had
a transaction open for longer than the maximum transaction timeout and no coordinator has an
ongoing transaction of that producer which includes the partition. Must not: reach into broker
internals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from logstore.client.coordinator import CoordinatorClient
from logstore.client.metadata import ClusterMetadata
from logstore.errors import ApiError
from logstore.messages.groups import KEY_TYPE_TRANSACTION
from logstore.messages.produce import InitProducerIdRequest
from logstore.messages.transactions import (
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListTransactionsRequest,
    TxnMarker,
    TxnTopicPartitions,
    WriteTxnMarkersRequest,
)
from logstore.model import TRANSACTION_STATE_TOPIC, TopicPartition


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int  # -1 when no transaction is open
    partitions: list[TopicPartition]
    two_phase_commit: bool


@dataclass(frozen=True, slots=True)
class ProducerState:
    """One producer of a partition, as its leader knows it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_transaction_start_offset: int  # -1: no open transaction here


def list_transactions(metadata: ClusterMetadata, state_filters: list[str],
                      producer_id_filters: list[int], transactional_id_prefix: str
                      ) -> list[TransactionListing]:
    metadata.refresh([])
    request = ListTransactionsRequest(state_filters=state_filters,
                                      producer_id_filters=producer_id_filters,
                                      transactional_id_prefix=transactional_id_prefix)
    found: dict[str, TransactionListing] = {}
    for broker_id in sorted(metadata.brokers()):
        response = metadata.broker_connection(broker_id).call(request)
        response.raise_error(f"list_transactions on broker {broker_id}")
        for t in response.transactions:
            found[t.transactional_id] = TransactionListing(t.transactional_id, t.producer_id,
                                                           t.state)
    return sorted(found.values(), key=lambda t: t.transactional_id)


def describe_transactions(metadata: ClusterMetadata, transactional_ids: list[str],
                          timeout_s: float) -> list[TransactionDescription]:
    out = []
    for tid in transactional_ids:
        coordinator = CoordinatorClient(metadata, tid, KEY_TYPE_TRANSACTION, timeout_s)
        (d,) = coordinator.call(DescribeTransactionsRequest(
            transactional_ids=[tid])).transactions
        d.raise_error()
        out.append(TransactionDescription(
            d.transactional_id, d.state, d.producer_id, d.producer_epoch,
            d.transaction_timeout_ms, d.transaction_start_time_ms,
            [TopicPartition(t.topic, p) for t in d.topics for p in t.partitions],
            d.two_phase_commit))
    return out


def describe_producers(metadata: ClusterMetadata, partitions: list[TopicPartition]
                       ) -> dict[TopicPartition, list[ProducerState]]:
    out: dict[TopicPartition, list[ProducerState]] = {}
    for tp in partitions:
        tp = TopicPartition(*tp)
        response = metadata.leader_connection(tp).call(DescribeProducersRequest(
            topic=tp.topic, partitions=[tp.partition]))
        (entry,) = response.partitions
        entry.raise_error(f"describe_producers of {tp}")
        out[tp] = [ProducerState(p.producer_id, p.producer_epoch, p.last_sequence,
                                 p.last_timestamp, p.coordinator_epoch,
                                 p.current_txn_start_offset) for p in entry.producers]
    return out


def abort_transaction(metadata: ClusterMetadata, tp: TopicPartition, producer_id: int,
                      producer_epoch: int, coordinator_epoch: int) -> None:
    """Write an ABORT marker for the producer's open transaction on ``tp``."""
    response = metadata.leader_connection(tp).call(WriteTxnMarkersRequest(markers=[TxnMarker(
        producer_id=producer_id, producer_epoch=producer_epoch, committed=False,
        coordinator_epoch=coordinator_epoch,
        topics=[TxnTopicPartitions(topic=tp.topic, partitions=[tp.partition])])]))
    for r in response.results:
        r.raise_error(f"abort of producer {producer_id}'s transaction on {tp}")


def transaction_state_partitions(metadata: ClusterMetadata, timeout_s: float) -> int:
    """The partition count of ``__transaction_state`` (created first if need be, by asking
    for a coordinator)."""
    CoordinatorClient(metadata, "logstore-admin", KEY_TYPE_TRANSACTION, timeout_s).call(
        DescribeTransactionsRequest(transactional_ids=[]))
    info = metadata.topic(TRANSACTION_STATE_TOPIC, refresh=True)
    return info.num_partitions


def fence_producers(metadata: ClusterMetadata, transactional_ids: list[str],
                    timeout_s: float) -> None:
    """Bump each id's epoch (its producer is fenced, its open transaction aborted, a
    Prepared one too); waits until the abort is complete."""
    for tid in transactional_ids:
        CoordinatorClient(metadata, tid, KEY_TYPE_TRANSACTION, timeout_s).call(
            InitProducerIdRequest(transactional_id=tid))


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """An open transaction on a partition that no coordinator will ever end."""

    partition: TopicPartition
    producer: ProducerState


def find_hanging(metadata: ClusterMetadata, partitions: list[TopicPartition],
                 max_transaction_timeout_ms: int, timeout_s: float
                 ) -> list[HangingTransaction]:
    now_ms = int(time.time() * 1000)
    out = []
    for tp, producers in describe_producers(metadata, partitions).items():
        for p in producers:
            if p.current_transaction_start_offset < 0 or \
                    now_ms - p.last_timestamp < max_transaction_timeout_ms:
                continue
            if not _ongoing_with(metadata, p.producer_id, tp, timeout_s):
                out.append(HangingTransaction(tp, p))
    return out


def _ongoing_with(metadata: ClusterMetadata, producer_id: int, tp: TopicPartition,
                  timeout_s: float) -> bool:
    """Whether some coordinator has an open transaction of ``producer_id`` covering ``tp``."""
    open_states = ["Ongoing", "Prepared", "PrepareCommit", "PrepareAbort"]
    for listing in list_transactions(metadata, open_states, [producer_id], ""):
        try:
            (d,) = describe_transactions(metadata, [listing.transactional_id], timeout_s)
        except ApiError:
            continue
        if d.producer_id == producer_id and tp in d.partitions:
            return True
    return False
