"""One transactional id's transaction state, and the rules of its transitions (Kafka's
``TransactionMetadata``).

Owns: the states (Kafka's, plus Prepared for two-phase participation), ``TransactionMetadata``
(a frozen value: the producer id and epoch, the timeout, the state, the partitions of the open
transaction, when it started and last changed, whether two-phase commit is on, and the
(producer id, epoch) a Prepared transaction was prepared under), the transitions each state
allows (Kafka's ``validPreviousStates``; a change outside them is a programming error), the
epoch bump (a new producer id once the epoch is exhausted), and the checks every request makes
of the producer it names. Must not: do I/O, read clocks or know the wire.

The states and what moves between them::

    Empty ---add---> Ongoing ---prepare---> Prepared
      ^                |  \\                   |   \\
      |             end|   \\end(abort),     end|    \\ its timeout or a new instance:
      |       (commit) v    \\timeout      (commit)     \\ abort with an epoch bump
      |        PrepareCommit  PrepareAbort <----------------'
      |                |             |
      |        markers v     markers v
      +--init-- CompleteCommit   CompleteAbort --init/add--> ...

Kafka's PrepareEpochFence is the moment between fencing an Ongoing transaction's producer and
its PrepareAbort; here both happen in one record (PrepareAbort at the bumped epoch), so the
state is never written. Dead is an expired id's tombstone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from logstore.errors import (
    InvalidProducerIdMappingError,
    InvalidRequestError,
    ProducerFencedError,
)
from logstore.messages import transactions as wire
from logstore.model import TopicPartition

MAX_TRANSACTIONAL_ID_LENGTH = 249  # as topic names: ids appear in tools and file names
# Kafka's rule: at Short.MAX_VALUE - 1 the next bump takes a new producer id.
MAX_PRODUCER_EPOCH = 2**15 - 2


class TxnState(StrEnum):
    EMPTY = wire.EMPTY
    ONGOING = wire.ONGOING
    PREPARED = wire.PREPARED
    PREPARE_COMMIT = wire.PREPARE_COMMIT
    PREPARE_ABORT = wire.PREPARE_ABORT
    COMPLETE_COMMIT = wire.COMPLETE_COMMIT
    COMPLETE_ABORT = wire.COMPLETE_ABORT
    PREPARE_EPOCH_FENCE = wire.PREPARE_EPOCH_FENCE
    DEAD = wire.DEAD


COMPLETE = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
IDLE = COMPLETE | {TxnState.EMPTY}  # no transaction open
DECIDING = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})  # markers on the way
OPEN = frozenset({TxnState.ONGOING, TxnState.PREPARED})  # writes may be in the partitions

_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: IDLE,
    TxnState.ONGOING: IDLE | {TxnState.ONGOING},
    TxnState.PREPARED: IDLE | OPEN,
    TxnState.PREPARE_COMMIT: OPEN,
    TxnState.PREPARE_ABORT: OPEN,
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: IDLE,
}


def can_transition(old: TxnState, new: TxnState) -> bool:
    return old in _PREVIOUS.get(new, frozenset())


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """A transactional id's producer and its transaction, as ``__transaction_state`` holds
    them."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1  # -1 while no transaction is open
    last_update_ms: int = -1
    two_phase: bool = False
    # While Prepared (and once decided from Prepared): the producer id and epoch the
    # transaction was prepared under (prepare bumps the epoch, so they name one transaction),
    # which a new instance's PreparedTxnState must match.
    prepared: tuple[int, int] | None = None

    def moved(self, state: TxnState, now_ms: int, **changes: object) -> TransactionMetadata:
        """A copy in ``state`` (which must be a valid successor), stamped ``now_ms``."""
        if not can_transition(self.state, state):
            raise AssertionError(f"transactional id {self.transactional_id}: "
                                 f"{self.state} -> {state} is not a transition")
        return replace(self, state=state, last_update_ms=now_ms, **changes)  # type: ignore[arg-type]

    @property
    def expires_at_ms(self) -> int:
        """When an Ongoing transaction times out."""
        return self.txn_start_ms + self.timeout_ms

    def check_producer(self, producer_id: int, producer_epoch: int) -> None:
        """The request's producer must be this id's current one: another producer id is
        INVALID_PRODUCER_ID_MAPPING, another epoch PRODUCER_FENCED (an older instance, or one
        whose transaction timed out and was aborted with an epoch bump)."""
        if producer_id != self.producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {self.transactional_id}: producer id {producer_id} is not "
                f"its current producer id {self.producer_id}")
        if producer_epoch != self.producer_epoch:
            raise ProducerFencedError(
                f"transactional id {self.transactional_id}: producer {producer_id} epoch "
                f"{producer_epoch} is fenced by epoch {self.producer_epoch}")


def bumped(meta: TransactionMetadata, new_producer_id: int) -> tuple[int, int]:
    """The next (producer id, epoch): the epoch + 1, or ``new_producer_id`` at epoch 0 once the
    epoch is exhausted."""
    if meta.producer_epoch >= MAX_PRODUCER_EPOCH:
        return new_producer_id, 0
    return meta.producer_id, meta.producer_epoch + 1


def fence_epoch(meta: TransactionMetadata) -> int:
    """The epoch an open transaction is aborted with to fence its producer: one more, unless
    exhausted (the transaction's markers must keep its producer id; the next init then moves
    to a new one)."""
    return min(meta.producer_epoch + 1, MAX_PRODUCER_EPOCH + 1)


def validate_transactional_id(transactional_id: str) -> str:
    """INVALID_REQUEST for an empty id or one longer than 249 characters."""
    if not transactional_id:
        raise InvalidRequestError("transactional id must be a non-empty string")
    if len(transactional_id) > MAX_TRANSACTIONAL_ID_LENGTH:
        raise InvalidRequestError(
            f"transactional id {transactional_id[:40]!r}... is {len(transactional_id)} "
            f"characters; the limit is {MAX_TRANSACTIONAL_ID_LENGTH}")
    return transactional_id
