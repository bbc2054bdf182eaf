"""Runs a coordinator's pure state machine against its internal topic, one partition at a time.

Owns: for each partition of the internal topic this broker leads, the loaded state ("shard"),
replaying it when this broker becomes the leader (COORDINATOR_LOAD_IN_PROGRESS meanwhile,
NOT_COORDINATOR when it does not lead the partition) and giving it up when leadership moves;
the concurrency around each shard; appending a handler's records (acks=all) and applying its
change only once they are acknowledged; the background tick. Must not: hold a coordinator's
rules (the shard's handlers do) or parse wire requests.

Per partition there are two locks and a set:

- the state lock (a Condition), held only while a handler computes a result or a result is
  applied: short, never across an append;
- the write lock, which serializes the partition's writes, so each write's handler sees the
  state its predecessor left; it is held across that partition's append and nothing else needs
  it: requests of other partitions and reads never take it;
- ``in_flight``: the keys (group ids) whose state an appending write will replace. An update
  of such a key (a heartbeat, a sync) waits for the write to settle: applied to the old state,
  it would be lost when the write installs the new one, and its answer depends on the
  generation the write decides. Updates of other keys, and reads, do not wait.

A write runs ``handler(shard, now_ms)`` under the state lock. With no records its change is
applied at once. Otherwise the state lock is released, the records are appended, and the change
is applied under the state lock only if the append succeeded; if it failed nothing changes and
the request gets the append's error as Kafka's coordinators map it (NOT_LEADER_OR_FOLLOWER ->
NOT_COORDINATOR, a timeout or too few replicas -> COORDINATOR_NOT_AVAILABLE). A failed append may
still reach the log (a timeout): memory is then behind the log, never ahead of it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import pyarrow as pa

from logstore.clock import Clock
from logstore.coordinator import CoordinatorLog, CoordinatorResult, ShardLoader, TxnProducer
from logstore.errors import (
    ApiError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    ErrorCode,
    NotCoordinatorError,
    UnknownServerError,
)
from logstore.segments.producer_state import VerificationGuard

log = logging.getLogger(__name__)

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
Handler = Callable[[S, int], CoordinatorResult[R]]

# An update waits at most this long for its key's write (which the log bounds itself).
UPDATE_WAIT_S = 60.0
# How long a write on every partition (write_each) waits for a replay under way elsewhere.
LOAD_WAIT_S = 120.0

_AS_NOT_AVAILABLE = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                     ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT}
_AS_NOT_COORDINATOR = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR,
                       ErrorCode.FENCED_LEADER_EPOCH}
_AS_UNKNOWN = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
               ErrorCode.INVALID_FETCH_SIZE}


def coordinator_error(error: ApiError, where: str) -> ApiError:
    """The error a coordinator answers for a failed append (Kafka's mapping)."""
    message = f"{where}: the append failed: {error.message}"
    if error.code in _AS_NOT_AVAILABLE:
        return CoordinatorNotAvailableError(message)
    if error.code in _AS_NOT_COORDINATOR:
        return NotCoordinatorError(message)
    if error.code in _AS_UNKNOWN:
        return UnknownServerError(message)
    return error


@dataclass(eq=False)
class _Partition(Generic[S]):
    leader_epoch: int
    shard: S
    changed: threading.Condition = field(default_factory=threading.Condition)  # state lock
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: set[Hashable] = field(default_factory=set)


class CoordinatorRuntime(Generic[S]):
    """The shards of one coordinator on this broker. Thread-safe."""

    def __init__(self, topic: str, coordinator_log: CoordinatorLog, loader: ShardLoader[S],
                 clock: Clock) -> None:
        self.topic = topic
        self._log = coordinator_log
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()  # a leaf: guards the two fields below, nothing else
        self._partitions: dict[int, _Partition[S]] = {}
        self._loading: set[int] = set()
        self._replay_ended = threading.Condition(self._lock)  # a replay ended (_loading shrank)

    def num_partitions(self) -> int:
        return self._log.num_partitions()

    # -- requests ----------------------------------------------------------------------------

    def write(self, partition: int, key: Hashable, handler: Handler[S, R], *,
              exclusive: bool = True, verify: bool = False,
              guard: VerificationGuard | None = None) -> R:
        """Run a handler that may append records; its response once they are durable.
        ``exclusive``: the change replaces ``key``'s state, so updates of ``key`` wait while
        the records are appended; a change that merges into it (an offset commit) passes
        False. ``verify`` and ``guard`` go with a transactional append (the result names its
        producer) to the log, which checks them under its lock (``CoordinatorLog.append``);
        the handler never sees them."""
        part = self._current(partition)
        with part.write_lock:
            self._check_current(partition, part)
            with part.changed:
                result = handler(part.shard, self._clock.time_ms())
                if not result.records:
                    result.apply()
                    return result.response
                keys = {key} if exclusive else set()
                part.in_flight.update(keys)
            self._append_then_apply(partition, part, result.records,
                                    _applier(result), keys, result.producer, verify, guard)
        return result.response

    def write_each(self, handler: Handler[S, R], what: str) -> Future[dict[int, R]]:
        """Run ``handler`` as a write (merging, like an offset commit) on every partition
        this broker leads, replaying one not loaded yet, one partition after another on a
        thread of its own: the caller never waits on an append. The future of the responses
        by partition; a partition whose write failed (leadership moved, the append failed,
        a replay under way elsewhere) is logged and left out."""
        done: Future[dict[int, R]] = Future()
        threading.Thread(target=self._write_each, args=(handler, what, done),
                         name=f"{self.topic}-{what}", daemon=True).start()
        return done

    def _write_each(self, handler: Handler[S, R], what: str, done: Future[dict[int, R]]
                    ) -> None:
        out: dict[int, R] = {}
        try:
            led = [p for p in range(self.num_partitions())
                   if self._log.leader_epoch(p) is not None]
        except ApiError as e:  # no internal topic yet: nothing to write to
            log.info("%s: %s: no partition to write: %s", self.topic, what, e)
            led = []
        for partition in led:
            try:
                out[partition] = self._write_once_loaded(partition, what, handler)
            except Exception as e:  # boundary: one partition's failure must not stop the rest
                log.warning("%s-%d: %s failed: %s", self.topic, partition, what, e)
        done.set_result(out)

    def _write_once_loaded(self, partition: int, what: str, handler: Handler[S, R]) -> R:
        """``write``, waiting out a replay another thread has under way (a request's, up to
        LOAD_WAIT_S): a change nobody asks for again must not be skipped for it."""
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            try:
                return self.write(partition, what, handler, exclusive=False)
            except CoordinatorLoadInProgressError:
                with self._replay_ended:
                    if not self._replay_ended.wait_for(lambda: partition not in self._loading,
                                                 deadline - time.monotonic()):
                        raise

    def update(self, partition: int, key: Hashable, handler: Handler[S, R]) -> R:
        """Run a handler that never appends (it changes memory only), once no write of ``key``
        is in flight; it does not wait for writes of other keys."""
        part = self._current(partition)
        with part.changed:
            if not part.changed.wait_for(lambda: key not in part.in_flight, UPDATE_WAIT_S):
                raise CoordinatorNotAvailableError(
                    f"{self.topic}-{partition}: a write of {key!r} is still in flight")
            self._check_current(partition, part)
            result = handler(part.shard, self._clock.time_ms())
            assert not result.records, "an update must not append records; use write()"
            result.apply()
            return result.response

    def read(self, partition: int, reader: Callable[[S], R]) -> R:
        """Read the partition's state as its last acknowledged write left it; never waits
        for an append."""
        part = self._current(partition)
        with part.changed:
            return reader(part.shard)

    def read_all(self, reader: Callable[[S], Iterable[T]]) -> list[T]:
        """``reader`` over every loaded partition this broker still leads."""
        out: list[T] = []
        for partition, part in self._loaded():
            if self._log.leader_epoch(partition) == part.leader_epoch:
                with part.changed:
                    out.extend(reader(part.shard))
        return out

    # -- the background tick -----------------------------------------------------------------

    def tick(self, handler: Callable[[S, int], Mapping[K, CoordinatorResult[None]]]
             ) -> list[Future[None]]:
        """Run ``handler`` (one result per key that changed) over every loaded partition,
        without ever waiting: a partition whose write is in flight is skipped until the next
        tick, and the records a tick appends are appended by a thread of their own. The
        futures of those appends (tests wait on them)."""
        appends: list[Future[None]] = []
        for partition, part in self._loaded():
            if self._log.leader_epoch(partition) != part.leader_epoch:
                self._unload(partition, part)
            elif part.write_lock.acquire(blocking=False):
                try:
                    appends.extend(self._tick_partition(partition, part, handler))
                except Exception:  # boundary: one partition's failure must not stop the tick
                    part.write_lock.release()
                    log.exception("%s-%d: tick failed", self.topic, partition)
        return appends

    def _tick_partition(self, partition: int, part: _Partition[S],
                        handler: Callable[[S, int], Mapping[K, CoordinatorResult[None]]]
                        ) -> list[Future[None]]:
        """With the write lock held: apply what needs no append, hand the rest (and the write
        lock) to an appending thread."""
        with part.changed:
            results = handler(part.shard, self._clock.time_ms())
            durable = {k: r for k, r in results.items() if r.records}
            for r in results.values():
                if not r.records:
                    r.apply()
            part.in_flight.update(durable)
        if not durable:
            part.write_lock.release()
            return []
        done: Future[None] = Future()
        threading.Thread(target=self._tick_append, args=(partition, part, durable, done),
                         name=f"{self.topic}-{partition}-tick", daemon=True).start()
        return [done]

    def _tick_append(self, partition: int, part: _Partition[S],
                     durable: dict[K, CoordinatorResult[None]], done: Future[None]
                     ) -> None:
        try:
            records = [b for r in durable.values() for b in r.records]
            self._append_then_apply(partition, part, records,
                                    lambda _offset: _apply_all(durable.values()), set(durable))
            done.set_result(None)
        except Exception as e:  # boundary: a background write logs; the next tick retries
            log.warning("%s-%d: tick append failed: %s", self.topic, partition, e)
            done.set_exception(e)
        finally:
            part.write_lock.release()

    # -- appending ---------------------------------------------------------------------------

    def _append_then_apply(self, partition: int, part: _Partition[S],
                           records: list[pa.RecordBatch], apply: Callable[[int], None],
                           keys: Collection[Hashable], producer: TxnProducer | None = None,
                           verify: bool = False, guard: VerificationGuard | None = None
                           ) -> None:
        """Append with no state lock held; apply (given the batch's offset) only if the
        append succeeded; always let the keys' updates go on."""
        applied: Callable[[], None] | None = None
        try:
            batch = records[0] if len(records) == 1 else pa.concat_batches(records)
            offset = self._log.append(partition, batch, producer, verify, guard)
            applied = functools.partial(apply, offset)
        except ApiError as e:
            log.info("%s-%d: append failed, nothing applied: %s", self.topic, partition, e)
            raise coordinator_error(e, f"{self.topic}-{partition}") from None
        finally:
            with part.changed:
                try:
                    if applied is not None:
                        applied()
                finally:
                    part.in_flight.difference_update(keys)
                    part.changed.notify_all()

    # -- loading and unloading ---------------------------------------------------------------

    def _loaded(self) -> list[tuple[int, _Partition[S]]]:
        with self._lock:
            return list(self._partitions.items())

    def _current(self, partition: int) -> _Partition[S]:
        """The partition's shard at its current leader epoch, replayed first if need be."""
        epoch = self._log.leader_epoch(partition)
        with self._lock:
            part = self._partitions.get(partition)
            if part is not None and part.leader_epoch == epoch:
                return part
            if part is not None:
                del self._partitions[partition]
            loading = epoch is not None and partition in self._loading
            if epoch is not None and not loading:
                self._loading.add(partition)
        if part is not None:
            self._give_up(partition, part)
        if epoch is None:
            raise NotCoordinatorError(f"this broker does not lead {self.topic}-{partition}")
        if loading:
            raise CoordinatorLoadInProgressError(f"loading {self.topic}-{partition}")
        return self._load(partition, epoch)

    def _load(self, partition: int, epoch: int) -> _Partition[S]:
        """Replay the partition with no lock held: other partitions go on meanwhile, and this
        one's requests get COORDINATOR_LOAD_IN_PROGRESS."""
        try:
            shard = self._loader.load(partition, epoch, self._log.read(partition),
                                      self._clock.time_ms())
            part = _Partition(epoch, shard)
            with self._lock:
                self._partitions[partition] = part
            return part
        finally:
            with self._lock:
                self._loading.discard(partition)
                self._replay_ended.notify_all()

    def _check_current(self, partition: int, part: _Partition[S]) -> None:
        """After a wait: the shard may have been given up meanwhile."""
        with self._lock:
            current = self._partitions.get(partition) is part
        if not current:
            raise NotCoordinatorError(f"{self.topic}-{partition} moved to another leader")

    def _unload(self, partition: int, part: _Partition[S]) -> None:
        with self._lock:
            if self._partitions.get(partition) is not part:
                return
            del self._partitions[partition]
        self._give_up(partition, part)

    def _give_up(self, partition: int, part: _Partition[S]) -> None:
        """Fail the shard's waiting requests (they find the new coordinator)."""
        with part.changed:
            self._loader.unload(part.shard, partition).fire()
        log.info("%s-%d: unloaded (leader epoch %d)", self.topic, partition, part.leader_epoch)


def _applier(result: CoordinatorResult[R]) -> Callable[[int], None]:
    """The result's change, given the offset its records were appended at."""
    apply_at = result.apply_at
    if apply_at is not None:
        return apply_at
    return lambda _offset: result.apply()


def _apply_all(results: Iterable[CoordinatorResult[None]]) -> None:
    for r in results:
        r.apply()
