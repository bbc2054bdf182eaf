"""Messages of the produce path: producer ids, the DoPut descriptor, each batch's metadata and
its acknowledgement.

Owns: the declaration of these bodies. On a DoPut stream the descriptor's command is a
``ProduceRequest``; each batch's app_metadata is a ``ProduceBatchMetadata``; the broker answers
each batch (unless acks=0) with a ``ProduceAck`` in the same order. Must not: do I/O.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from logstore.messages.base import (
    ErrorFields,
    Int32,
    LeaderEpoch,
    Message,
    PartitionId,
    ProducerEpoch,
    ProducerId,
    Request,
    TimeoutMs,
)

# -- producer ids ----------------------------------------------------------------------------


class InitProducerIdResponse(ErrorFields, frozen=True, kw_only=True):
    producer_id: int = -1
    producer_epoch: int = -1
    # With keep_prepared_txn: the transaction the previous instance left Prepared, which the
    # caller completes with end_txn (commit if it matches its own record, else abort).
    prepared_producer_id: int = -1
    prepared_producer_epoch: int = -1


class InitProducerIdRequest(Request[InitProducerIdResponse], frozen=True, kw_only=True, tag=0):
    """A producer id and epoch. Without ``transactional_id`` any broker answers, for an
    idempotent producer. With one, its coordinator answers: the epoch is bumped, fencing the
    previous instance, whose open transaction is aborted (or, while it completes,
    CONCURRENT_TRANSACTIONS: retry); ``keep_prepared_txn`` keeps a Prepared transaction for
    the caller to complete (two-phase participation)."""

    ACTION: ClassVar[str] = "init_producer_id"
    RESPONSE: ClassVar[type[Message]] = InitProducerIdResponse
    transactional_id: str | None = None
    transaction_timeout_ms: TimeoutMs = 60_000  # above transaction_max_timeout_ms: refused
    # An existing producer re-initialising (KIP-360) names itself; the coordinator checks it.
    producer_id: ProducerId = -1
    producer_epoch: ProducerEpoch = -1
    enable_two_phase_commit: bool = False
    keep_prepared_txn: bool = False


# -- the DoPut stream ------------------------------------------------------------------------


class ProduceAck(ErrorFields, frozen=True, kw_only=True):
    """The answer to one batch: where it landed, or why it was refused."""

    seq: int = -1  # the batch's seq, echoed so the producer matches acks to batches
    partition: int = -1
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1


class ProduceRequest(Request[ProduceAck], frozen=True, kw_only=True, tag=0):
    """The descriptor of a produce stream: one topic, its acks and the ack timeout."""

    ACTION: ClassVar[str] = "produce"
    RESPONSE: ClassVar[type[Message]] = ProduceAck
    # Travels as "type" (a field named ``type`` would shadow the builtin in the class body).
    kind: str = msgspec.field(default="produce", name="type")
    topic: str
    acks: int = 1  # 0, 1 or -1 (all); other values are INVALID_REQUIRED_ACKS
    timeout_ms: TimeoutMs = 30_000
    # The producer's transactional id: the partition leader checks that a transactional batch
    # belongs to an ongoing transaction (KIP-890 part 1), and with ACLs on it needs WRITE on
    # the transactional id as well as on the topic.
    transactional_id: str | None = None
    # Each batch is one row of records.STORED_MESSAGE_SCHEMA holding the batch already encoded
    # as an IPC message with a blank header (produced.py), which the leader stores as it came
    # when it can: the data is copied once, into the segment file. False: topic records.
    messages: bool = False
    # The id of the topic the batches were encoded for (its value schema): the leader refuses
    # each batch with UNKNOWN_TOPIC_ID if the topic now has another id (deleted and recreated
    # under the same name; Kafka's produce by topic id). None (older clients): unchecked.
    topic_id: str | None = None


class ProduceBatchMetadata(Message, frozen=True, kw_only=True):
    """The metadata of one produced batch. ``leader_epoch`` is the epoch the producer saw (-1:
    unchecked; older than the partition's: FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH).
    ``transactional``: the batch belongs to the producer's transaction (the stream's
    ``transactional_id``); it stays invisible to read_committed readers until its marker."""

    seq: int = -1
    partition: PartitionId
    producer_id: ProducerId = -1
    producer_epoch: ProducerEpoch = -1
    base_sequence: Int32 = -1
    leader_epoch: LeaderEpoch = -1
    transactional: bool = False


class BatchSeq(Message, frozen=True, kw_only=True):
    """Only the ``seq`` of a batch's metadata: enough to answer a batch whose other fields
    do not decode."""

    seq: int = -1
