"""The shape every coordinator shares (group, transactions): a pure state machine per
partition of an internal topic, which answers a request with the records to append and the
memory change to make once they are durable.

Owns: ``CoordinatorResult`` (records, response, apply, and the producer of a transactional
append, whose change learns the appended batch's offset), ``Completions`` (futures a state
machine resolves only when its change is applied),
``LoggedBatch`` (a batch as a replay reads it: its records, producer, transactional flag and, for
a control batch, its COMMIT or ABORT), and the two seams a coordinator runtime drives:
``CoordinatorLog`` (the internal topic's partitions on this broker) and ``ShardLoader`` (builds a
partition's state by replaying its records, and gives it up); and Kafka's hash that picks the
partition of a key. Must not: do I/O, hold locks or read
clocks; ``broker/coordinator_runtime.py`` runs these values against the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE, ControlType

if TYPE_CHECKING:
    from logstore.segments.producer_state import VerificationGuard

R = TypeVar("R")
S = TypeVar("S")


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (as Kafka hashes group and transactional ids), as a signed
    32-bit int."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: str, num_partitions: int) -> int:
    """The internal-topic partition of a group or transactional id: Kafka's
    ``abs(hashCode) % n`` (``Utils.abs``: the sign bit cleared)."""
    return (java_string_hash(key) & 0x7FFFFFFF) % num_partitions


def encode_rows(rows: list[tuple[bytes, bytes | None]], now_ms: int) -> pa.RecordBatch:
    """An internal topic's records: (key, value) rows (a None value is a tombstone) in the
    default topic schema, stamped ``now_ms``."""
    n = len(rows)
    return pa.record_batch([
        pa.array([k for k, _ in rows], pa.binary()),
        pa.array([v for _, v in rows], pa.binary()),
        pa.array([now_ms] * n, pa.int64()).cast(TIMESTAMP_TYPE),
        pa.nulls(n, DEFAULT_SCHEMA.field("headers").type),
    ], schema=DEFAULT_SCHEMA)


def _no_change() -> None:
    return None


@dataclass(frozen=True, slots=True)
class TxnProducer:
    """The producer a transactional append is made for (offsets committed inside a
    transaction are appended to ``__consumer_offsets`` as that producer's batch, so its
    marker decides them)."""

    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class CoordinatorResult(Generic[R]):
    """What a handler decided: ``records`` to append to the coordinator's partition (none for a
    request that changes nothing durable), the ``response``, and ``apply``, the memory change,
    run only once the records are acknowledged (at once when there are none). A handler that
    refuses a request raises its ApiError instead: nothing is appended or changed. With
    ``producer`` the records are appended as that producer's transactional batch."""

    records: list[pa.RecordBatch]
    response: R
    apply: Callable[[], None] = _no_change
    producer: TxnProducer | None = None
    # The change, given the log offset of the appended batch (run instead of ``apply``): so
    # that a marker decides only what its producer wrote before it, and a transaction's
    # offsets never replace a commit appended after them.
    apply_at: Callable[[int], None] | None = None

    @staticmethod
    def answer(response: R, apply: Callable[[], None] = _no_change) -> CoordinatorResult[R]:
        """A result that appends nothing."""
        return CoordinatorResult([], response, apply)


@dataclass(slots=True)
class Completions:
    """Futures to resolve once a change is applied: a state machine working on a copy of its
    state must not wake a waiter with a result the log may never hold."""

    pending: list[tuple[Future[Any], Any, BaseException | None]] = field(default_factory=list)

    def resolve(self, future: Future[Any], value: Any) -> None:
        self.pending.append((future, value, None))

    def fail(self, future: Future[Any], error: BaseException) -> None:
        self.pending.append((future, None, error))

    def take(self) -> Completions:
        """The queued completions, leaving this queue empty."""
        taken, self.pending = Completions(self.pending), []
        return taken

    def fire(self) -> None:
        """Resolve every queued future not resolved meanwhile (e.g. failed by an unload)."""
        for future, value, error in self.pending:
            try:
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)
            except InvalidStateError:
                pass  # already resolved: the first answer stands
        self.pending = []


@dataclass(frozen=True, slots=True)
class LoggedBatch:
    """One batch of an internal topic as a replay reads it. A control batch (a transaction
    marker some partition leader wrote) has no records of the coordinator's and its
    ``marker``; a transactional batch belongs to ``producer_id``'s open transaction."""

    records: pa.RecordBatch
    producer_id: int = -1
    transactional: bool = False
    marker: ControlType | None = None
    offset: int = -1  # the batch's base offset in the partition


class CoordinatorLog(Protocol):
    """A coordinator's view of its internal topic's partitions on this broker."""

    def num_partitions(self) -> int: ...

    def leader_epoch(self, partition: int) -> int | None:
        """The leader epoch if this broker leads ``partition``, else None."""

    def append(self, partition: int, batch: pa.RecordBatch,
               producer: TxnProducer | None = None, verify: bool = False,
               guard: VerificationGuard | None = None) -> int:
        """Append and wait for the acknowledgement (acks=all); the batch's base offset;
        raises ApiError. With ``producer``, as that producer's transactional batch; with
        ``verify`` too, that batch must join the producer's transaction open on the partition
        or carry the verified ``guard`` of the partition leader's check with the transaction
        coordinator that no marker has cleared since (else TRANSACTION_ABORTABLE, nothing
        written: KIP-890 part 1, as for a producer's own batch)."""

    def read(self, partition: int) -> Iterator[LoggedBatch]:
        """Every batch up to the log end (this broker leads the partition), in offset order,
        control batches included."""


class ShardLoader(Protocol[S]):
    """Builds and gives up the state (the "shard") of one partition of the internal topic."""

    def load(self, partition: int, leader_epoch: int, batches: Iterable[LoggedBatch],
             now_ms: int) -> S:
        """The partition's state after replaying ``batches`` (its whole log)."""

    def unload(self, shard: S, partition: int) -> Completions:
        """The partition moved to another leader: the completions that fail its waiting
        requests (NOT_COORDINATOR)."""
