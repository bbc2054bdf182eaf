"""Messages of transactions (KIP-98, with KIP-447's group fencing, KIP-890's verification and
two-phase participation in the spirit of KIP-939).

Owns: the declaration of the transaction requests and responses (the producer id of a
transactional producer comes from ``init_producer_id``, produce.py): adding partitions and offsets to a transaction, ending it (alone or
together with prepared transactions of the same coordinator partition), preparing it for an
external coordinator, the markers the coordinator sends to partition leaders, transactional
offset commits, and the admin views (describe/list transactions, describe producers). Must
not: do I/O or hold transaction rules (``transactions/`` does).

Coordinator routing: the coordinator of transactional id T is the leader of partition
``abs(java_hash(T)) % N`` of ``__transaction_state``; ``find_coordinator`` with
``key_type`` = ``TRANSACTION`` finds it.
"""

from __future__ import annotations

from typing import ClassVar

from logstore.messages.base import (
    ErrorFields,
    Int32,
    Int64,
    Message,
    PartitionId,
    ProducerEpoch,
    ProducerId,
    Request,
)

# Transaction states as Kafka names them, plus Prepared (two-phase participation: the
# producer's writes are done and it waits for an external decision).
EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARED = "Prepared"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
PREPARE_EPOCH_FENCE = "PrepareEpochFence"
DEAD = "Dead"
TRANSACTION_STATES = (EMPTY, ONGOING, PREPARED, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT,
                      COMPLETE_ABORT, PREPARE_EPOCH_FENCE, DEAD)

# -- a transaction's partitions and offsets ---------------------------------------------------


class TxnTopicPartitions(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[PartitionId]


class TxnPartitionResult(ErrorFields, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId


class AddPartitionsToTxnResponse(ErrorFields, frozen=True, kw_only=True):
    results: list[TxnPartitionResult] = []


class AddPartitionsToTxnRequest(Request[AddPartitionsToTxnResponse], frozen=True, kw_only=True,
                                tag=0):
    """Add partitions to the producer's transaction before its first write to them.
    ``verify_only`` (KIP-890 part 1, sent by partition leaders): change nothing, answer whether
    the partitions are in the ongoing transaction of this producer id and epoch."""

    ACTION: ClassVar[str] = "add_partitions_to_txn"
    RESPONSE: ClassVar[type[Message]] = AddPartitionsToTxnResponse
    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    topics: list[TxnTopicPartitions]
    verify_only: bool = False


class AddOffsetsToTxnResponse(ErrorFields, frozen=True, kw_only=True):
    pass


class AddOffsetsToTxnRequest(Request[AddOffsetsToTxnResponse], frozen=True, kw_only=True, tag=0):
    """Add the group's ``__consumer_offsets`` partition to the transaction, before a
    ``txn_offset_commit`` to the group coordinator."""

    ACTION: ClassVar[str] = "add_offsets_to_txn"
    RESPONSE: ClassVar[type[Message]] = AddOffsetsToTxnResponse
    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    group_id: str


class TxnOffsetCommitEntry(Message, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId
    offset: Int64
    metadata: str = ""
    topic_id: str | None = None  # as in OffsetCommitEntry: None, the coordinator's current id


class TxnOffsetCommitResponse(ErrorFields, frozen=True, kw_only=True):
    results: list[TxnPartitionResult] = []


class TxnOffsetCommitRequest(Request[TxnOffsetCommitResponse], frozen=True, kw_only=True, tag=0):
    """Offsets committed inside a transaction, sent to the GROUP coordinator: pending until
    the transaction's marker reaches the group's partition. With a generation and member id
    (KIP-447) a zombie member of an older generation is fenced (ILLEGAL_GENERATION)."""

    ACTION: ClassVar[str] = "txn_offset_commit"
    RESPONSE: ClassVar[type[Message]] = TxnOffsetCommitResponse
    transactional_id: str
    group_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    generation_id: Int32 = -1
    member_id: str = ""
    group_instance_id: str | None = None
    offsets: list[TxnOffsetCommitEntry]


# -- ending a transaction ---------------------------------------------------------------------


class PreparedTxn(Message, frozen=True, kw_only=True):
    """A transaction some other producer prepared (two-phase participation)."""

    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch


class EndTxnResponse(ErrorFields, frozen=True, kw_only=True):
    pass


class EndTxnRequest(Request[EndTxnResponse], frozen=True, kw_only=True, tag=0):
    """Commit or abort the producer's transaction. ``with_prepared`` commits prepared
    transactions of other transactional ids atomically with this one (one append to the
    coordinator's partition decides them all); they must be coordinated by the same
    ``__transaction_state`` partition, each must be Prepared at the given producer id and
    epoch, else the whole request fails and nothing is decided."""

    ACTION: ClassVar[str] = "end_txn"
    RESPONSE: ClassVar[type[Message]] = EndTxnResponse
    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    committed: bool
    with_prepared: list[PreparedTxn] = []


class PrepareTxnResponse(ErrorFields, frozen=True, kw_only=True):
    """The producer id and the new epoch (prepare bumps it) the transaction is prepared
    under: what a ``PreparedTxn`` names, and the epoch the producer goes on with."""

    producer_id: int = -1
    producer_epoch: int = -1


class PrepareTxnRequest(Request[PrepareTxnResponse], frozen=True, kw_only=True, tag=0):
    """Two-phase participation: the producer's writes are done; the transaction waits,
    Prepared, for an external decision (end_txn by a new instance with keep_prepared_txn, or
    with_prepared), or is aborted after ``transaction_prepared_timeout_ms``."""

    ACTION: ClassVar[str] = "prepare_txn"
    RESPONSE: ClassVar[type[Message]] = PrepareTxnResponse
    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch


# -- markers (coordinator -> partition leaders) ----------------------------------------------


class TxnMarker(Message, frozen=True, kw_only=True):
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    committed: bool
    coordinator_epoch: Int32
    topics: list[TxnTopicPartitions]


class WriteTxnMarkersResponse(ErrorFields, frozen=True, kw_only=True):
    results: list[TxnPartitionResult] = []  # one per (marker, partition), in request order


class WriteTxnMarkersRequest(Request[WriteTxnMarkersResponse], frozen=True, kw_only=True, tag=0):
    """Append COMMIT or ABORT control batches to partitions this broker leads."""

    ACTION: ClassVar[str] = "write_txn_markers"
    RESPONSE: ClassVar[type[Message]] = WriteTxnMarkersResponse
    markers: list[TxnMarker]


# -- admin views ------------------------------------------------------------------------------


class TransactionDescription(ErrorFields, frozen=True, kw_only=True):
    transactional_id: str
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    transaction_timeout_ms: int = -1
    transaction_start_time_ms: int = -1  # -1 when no transaction is open
    topics: list[TxnTopicPartitions] = []
    two_phase_commit: bool = False


class DescribeTransactionsResponse(Message, frozen=True, kw_only=True):
    transactions: list[TransactionDescription]


class DescribeTransactionsRequest(Request[DescribeTransactionsResponse], frozen=True,
                                  kw_only=True, tag=0):
    ACTION: ClassVar[str] = "describe_transactions"
    RESPONSE: ClassVar[type[Message]] = DescribeTransactionsResponse
    transactional_ids: list[str]


class TransactionListing(Message, frozen=True, kw_only=True):
    transactional_id: str
    producer_id: int
    state: str


class ListTransactionsResponse(ErrorFields, frozen=True, kw_only=True):
    transactions: list[TransactionListing] = []


class ListTransactionsRequest(Request[ListTransactionsResponse], frozen=True, kw_only=True,
                              tag=0):
    """The transactional ids this broker coordinates, filtered by state, producer id and
    transactional id prefix (empty filters match everything)."""

    ACTION: ClassVar[str] = "list_transactions"
    RESPONSE: ClassVar[type[Message]] = ListTransactionsResponse
    state_filters: list[str] = []
    producer_id_filters: list[int] = []
    transactional_id_prefix: str = ""


class ProducerDescription(Message, frozen=True, kw_only=True):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1  # -1: no open transaction on this partition


class PartitionProducers(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    producers: list[ProducerDescription] = []


class DescribeProducersResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[PartitionProducers]


class DescribeProducersRequest(Request[DescribeProducersResponse], frozen=True, kw_only=True,
                               tag=0):
    """The active producers of partitions this broker leads (find hanging transactions)."""

    ACTION: ClassVar[str] = "describe_producers"
    RESPONSE: ClassVar[type[Message]] = DescribeProducersResponse
    topic: str
    partitions: list[PartitionId]
