"""The shape every coordinator shares (group now, transactions next): a pure state machine per
partition of an internal topic, which answers a request with the records to append and the
memory change to make once they are durable.

Owns: ``CoordinatorResult`` (records, response, apply), ``Completions`` (futures a state machine
resolves only when its change is applied), and the two seams a coordinator runtime drives:
``CoordinatorLog`` (the internal topic's partitions on this broker) and ``ShardLoader`` (builds a
partition's state by replaying its records, and gives it up). Must not: do I/O, hold locks or read
clocks; ``broker/coordinator_runtime.py`` runs these values against the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

R = TypeVar("R")
S = TypeVar("S")


def _no_change() -> None:
    return None


@dataclass(frozen=True, slots=True)
class CoordinatorResult(Generic[R]):
    """What a handler decided: ``records`` to append to the coordinator's partition (none for a
    request that changes nothing durable), the ``response``, and ``apply``, the memory change,
    run only once the records are acknowledged (at once when there are none). A handler that
    refuses a request raises its ApiError instead: nothing is appended or changed."""

    records: list[pa.RecordBatch]
    response: R
    apply: Callable[[], None] = _no_change

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


class CoordinatorLog(Protocol):
    """A coordinator's view of its internal topic's partitions on this broker."""

    def num_partitions(self) -> int: ...

    def leader_epoch(self, partition: int) -> int | None:
        """The leader epoch if this broker leads ``partition``, else None."""

    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append and wait for the acknowledgement (acks=all); raises ApiError."""

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """Every record batch up to the log end (this broker leads the partition), in offset
        order."""


class ShardLoader(Protocol[S]):
    """Builds and gives up the state (the "shard") of one partition of the internal topic."""

    def load(self, partition: int, leader_epoch: int, batches: Iterable[pa.RecordBatch],
             now_ms: int) -> S:
        """The partition's state after replaying ``batches`` (its whole log)."""

    def unload(self, shard: S, partition: int) -> Completions:
        """The partition moved to another leader: the completions that fail its waiting
        requests (NOT_COORDINATOR)."""
