"""The internal topics a coordinator keeps its state in, as this broker hosts them.

Owns: ``ReplicaCoordinatorLog``, the ``CoordinatorLog`` seam over one internal topic
(``__consumer_offsets``, ``__transaction_state``): reading a led partition to its log end as
``LoggedBatch`` values (control batches and transactional batches marked as such) and appending
through the replica manager with acks=all (as a producer's transactional batch when a result
names one, checked against the verification guard the caller brings); and ``InternalTopic``,
which creates such a topic on first use (compacted, its partition count, a replication factor
capped to the live brokers, a min ISR the replication factor allows) and answers which broker
leads the partition of a key (never tiered, whatever topic_defaults say). Must not: hold
coordinator state or rules, or touch the transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.controller.topics import TopicController
from logstore.coordinator import LoggedBatch, TxnProducer
from logstore.errors import (
    CoordinatorNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from logstore.messages.groups import FindCoordinatorResponse
from logstore.model import NewTopic, TopicPartition
from logstore.records import DEFAULT_SCHEMA, FLAG_TRANSACTIONAL, control_marker
from logstore.segments.producer_state import VerificationGuard

READ_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_TIMEOUT_MS = 30_000


class ReplicaCoordinatorLog:
    """``CoordinatorLog`` over the partitions of ``topic`` this broker hosts."""

    def __init__(self, replicas: ReplicaManager, store: MetadataStore, topic: str) -> None:
        self._replicas = replicas
        self._store = store
        self.topic = topic

    def num_partitions(self) -> int:
        record = self._store.topics().get(self.topic)
        if record is None:
            raise CoordinatorNotAvailableError(f"{self.topic} does not exist yet")
        return record.num_partitions

    def leader_epoch(self, partition: int) -> int | None:
        try:  # not hosted(): that copies every hosted partition, and ticks ask often
            p = self._replicas.partition(TopicPartition(self.topic, partition))
        except UnknownTopicOrPartitionError:
            return None
        return p.leader_epoch if p.is_leader else None

    def append(self, partition: int, batch: pa.RecordBatch,
               producer: TxnProducer | None = None, verify: bool = False,
               guard: VerificationGuard | None = None) -> int:
        tp = TopicPartition(self.topic, partition)
        if producer is None:
            pending = self._replicas.append_records(tp, batch, -1)
        else:  # no sequence: the coordinator, not the producer, writes it (Kafka's origin)
            pending = self._replicas.append_records(
                tp, batch, -1, producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch, flags=FLAG_TRANSACTIONAL,
                verify=verify, guard=guard)
        return pending.wait(APPEND_TIMEOUT_MS).first_offset

    def read(self, partition: int) -> Iterator[LoggedBatch]:
        """Up to the log end, not the high watermark: a newly elected leader's high
        watermark lags until its followers fetch again, and the records between it and the
        log end (acknowledged by the old leader) would be lost to the replay. A leader never
        truncates its log, and the shard is dropped if leadership moves."""
        log_ = self._replicas.partition(TopicPartition(self.topic, partition)).log
        offset, end = log_.log_start_offset, log_.log_end_offset
        for _ in range(end - offset + 1):  # bounded: every read advances at least one offset
            if offset >= end:
                return
            data = log_.read(offset, READ_CHUNK_BYTES, max_offset=end)
            if not data.batches:
                return
            for stored in data.batches:
                h = stored.header
                records = stored.record_batch(DEFAULT_SCHEMA)
                if h.is_control:
                    yield LoggedBatch(records.slice(0, 0), h.producer_id, True,
                                      control_marker(records).type, h.base_offset)
                else:
                    yield LoggedBatch(records, h.producer_id, h.is_transactional,
                                      offset=h.base_offset)
                offset = h.next_offset


@dataclass(frozen=True, slots=True)
class InternalTopicSpec:
    """How to create an internal topic: Kafka's settings of ``__consumer_offsets`` and
    ``__transaction_state``."""

    name: str
    num_partitions: int
    replication_factor: int
    segment_bytes: int
    min_insync_replicas: int = 1


def internal_topic_config(segment_bytes: int, min_isr: int) -> dict[str, object]:
    """An internal topic's config, every key that topic_defaults could set against it pinned:
    compacted, kept forever, and never tiered (tiering refuses compacted topics; a broker's
    ``remote_storage_enable = true`` default must not break groups and transactions)."""
    return {"cleanup_policy": "compact", "segment_bytes": segment_bytes, "retention_ms": None,
            "min_insync_replicas": min_isr, "remote_storage_enable": False}


class InternalTopic:
    """An internal topic created on first use, and the leader of a key's partition."""

    def __init__(self, store: MetadataStore, controller: TopicController,
                 spec: InternalTopicSpec) -> None:
        self._store = store
        self._controller = controller
        self.spec = spec

    def ensure(self) -> int:
        """The topic's partition count, creating the topic first if it does not exist."""
        record = self._store.topics().get(self.spec.name)
        if record is not None:
            return record.num_partitions
        live = len(self._store.brokers())
        rf = max(1, min(self.spec.replication_factor, live))
        # min ISR where the cluster allows it: never all replicas, so one broker may be down.
        min_isr = max(1, min(self.spec.min_insync_replicas, rf - 1))
        with contextlib.suppress(TopicAlreadyExistsError):  # another broker was first
            self._controller.create_topic(NewTopic(
                self.spec.name, self.spec.num_partitions, rf,
                config=internal_topic_config(self.spec.segment_bytes, min_isr)))
        record = self._store.topics().get(self.spec.name)
        return record.num_partitions if record is not None else self.spec.num_partitions

    def coordinator(self, key: str, partition_for: Callable[[str, int], int]
                    ) -> FindCoordinatorResponse:
        """The broker leading the partition of ``key`` (creating the topic if need be)."""
        partition = partition_for(key, self.ensure())
        state = self._store.partition_states(self.spec.name).get(partition)
        broker = self._store.brokers().get(state.leader) if state else None
        if broker is None:
            raise CoordinatorNotAvailableError(
                f"{self.spec.name}-{partition} (key {key!r}) has no leader")
        return FindCoordinatorResponse(node_id=broker.broker_id, host=broker.host,
                                       port=broker.port, partition=partition)
