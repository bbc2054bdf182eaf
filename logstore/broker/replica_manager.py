"""The partitions this broker hosts: produce, fetch (with long poll) and list offsets.

Owns: the map of hosted ``Partition`` objects, routing appends (data and transaction markers)
and reads to them, waiting for ``min_bytes`` or ``max_wait_ms`` on fetches, read_committed reads
(below the last stable offset, with the aborted transactions they overlap), answering
list-offsets, and the producers of a led partition. Must not: parse wire requests (that is
``handlers.py``) or touch the transport.

Topic incarnations: each hosted partition knows the topic id its log belongs to
(``Partition.topic_id``). Until the metadata sync replaces a partition whose topic was deleted
and created again under its name, the old replica answers nothing (UNKNOWN_TOPIC_ID, retriable)
once the broker's metadata knows the topic's new id (``topic_id_of``): a producer's batch for
the new topic must not be acknowledged into the old log (the sync deletes it), and a follower
or consumer of the new topic must not read the old records. A follower's requests also carry
its replica's topic id (fetch, offsets_for_leader_epoch, leader_epochs, its acknowledgements):
one of another id than this replica's log is INCONSISTENT_TOPIC_ID whatever the metadata of
either broker says, since the two may learn of a recreated topic in either order and both
incarnations start at leader epoch 0 (Kafka's check of a fetch's topic id against its log's).

Tiered partitions (``remote_tier.py``): a consumer's fetch below the local log start offset is
read from the remote tier, every such partition of the fetch at once on the remote reader's
pool, while the local partitions are read here; a follower's is refused with
OFFSET_MOVED_TO_TIERED_STORAGE. The log start offset reported (fetch, list_offsets EARLIEST,
describe_log_dirs) and checked is the one over both tiers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from logstore.broker.remote_tier import RemoteTier
from logstore.clock import Clock
from logstore.config import TopicConfig
from logstore.errors import (
    ApiError,
    InconsistentTopicIdError,
    InvalidRequiredAcksError,
    NotLeaderOrFollowerError,
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    UnknownServerError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from logstore.model import EARLIEST, LATEST, TopicPartition
from logstore.produced import ProducerData
from logstore.records import ControlType, StoredBatch
from logstore.replication.partition import IsrProposer, Partition, PendingAppend
from logstore.segments.log import Log
from logstore.segments.log_manager import LogManager
from logstore.segments.producer_state import ProducerEntry, VerificationGuard
from logstore.tiering.remote_reader import RemoteFetchRequest
from logstore.tiering.store import RemoteStorageError
from logstore.txn_filter import AbortedTxn, IsolationLevel

log = logging.getLogger(__name__)

# Called with a partition whose log or watermarks moved, or whose role changed (fetch sessions
# watch the partitions they push; the call must be quick and must not take partition locks).
Watcher = Callable[[TopicPartition], None]
# A topic's id in the broker's metadata now, None when it has none (a dict lookup: it is asked
# on every request's partitions).
TopicIdOf = Callable[[str], str | None]

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition of a fetch request."""

    tp: TopicPartition
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    end_offset: int | None = None  # a range reader's end: no batch starting at or after it
    topic_id: str | None = None  # the fetcher's replica's (None: unchecked)


@dataclass
class PartitionFetchResult:
    tp: TopicPartition
    error: ApiError | None = None
    batches: list[StoredBatch] = field(default_factory=list)
    high_watermark: int = -1
    log_start_offset: int = -1  # over both tiers
    log_end_offset: int = -1
    local_log_start_offset: int = -1
    from_remote: bool = False  # a remote read was started for it (done or not)
    last_stable_offset: int = -1
    aborted: list[AbortedTxn] = field(default_factory=list)  # read_committed only

    @property
    def size_bytes(self) -> int:
        return sum(b.header.batch_size for b in self.batches)


@dataclass(frozen=True, slots=True)
class LogDir:
    """Where a led partition's files are, and its offsets now."""

    path: str
    incarnation: str  # the log manager's: proves a reader sees this broker's disk
    log_start_offset: int  # over both tiers
    high_watermark: int
    local_log_start_offset: int
    last_stable_offset: int
    topic_id: str | None = None  # the replica's topic incarnation (None: not recorded)


@dataclass
class FetchStats:
    """Counters of what fetches served (approximate under concurrency: for tests and tools)."""

    requests: int = 0
    batches: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"fetch_requests": self.requests, "fetch_batches": self.batches,
                "fetch_bytes": self.bytes}


@dataclass
class IsrStats:
    """ISR changes the controller committed for partitions this broker leads (Kafka's
    IsrShrinksPerSec and IsrExpandsPerSec; read by the metrics endpoint)."""

    shrinks: int = 0
    expands: int = 0

    def on_isr_change(self, old: frozenset[int], new: frozenset[int]) -> None:
        if new < old:
            self.shrinks += 1
        elif new > old:
            self.expands += 1


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager, clock: Clock,
                 propose_isr: IsrProposer | None = None, tier: RemoteTier | None = None,
                 topic_id_of: TopicIdOf | None = None) -> None:
        self.broker_id = broker_id
        self._topic_id_of = topic_id_of
        self._logs = log_manager
        self._clock = clock
        self._propose_isr = propose_isr
        self.tier = tier
        self._partitions: dict[TopicPartition, Partition] = {}
        self._lock = threading.Lock()
        self._data_arrived = threading.Condition()
        self._generation = 0
        # Copy-on-write under self._lock: _notify_data reads it without a lock.
        self._watchers: dict[TopicPartition, tuple[Watcher, ...]] = {}
        self.stats = FetchStats()
        self.isr_stats = IsrStats()

    # -- hosting -----------------------------------------------------------------------------

    def partition(self, tp: TopicPartition) -> Partition:
        """The hosted partition ``tp``: UNKNOWN_TOPIC_OR_PARTITION if there is none, and
        UNKNOWN_TOPIC_ID while it is of an incarnation of its topic that the metadata has
        replaced (see the module docstring)."""
        p = self._partitions.get(tp)
        if p is None:
            raise UnknownTopicOrPartitionError(f"partition {tp} is not hosted on broker "
                                               f"{self.broker_id}")
        if self._topic_id_of is not None and p.topic_id is not None:
            current = self._topic_id_of(tp.topic)
            if current is not None and current != p.topic_id:
                raise UnknownTopicIdError(
                    f"{tp}: broker {self.broker_id} still hosts topic id {p.topic_id}, which "
                    f"was deleted; {tp.topic!r} is now topic id {current}: retry once this "
                    "broker has brought the new topic online")
        return p

    def hosted(self) -> dict[TopicPartition, Partition]:
        return dict(self._partitions)

    def get(self, tp: TopicPartition) -> Partition | None:
        """The hosted partition ``tp``, or None (no copy of the map: the metadata sync asks
        this for every partition)."""
        return self._partitions.get(tp)

    def make_leader(self, tp: TopicPartition, config: TopicConfig, schema: pa.Schema,
                    leader_epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...],
                    topic_id: str | None = None) -> None:
        p = self._get_or_create(tp, config, schema, topic_id)
        p.make_leader(leader_epoch, replicas, isr)

    def make_follower(self, tp: TopicPartition, config: TopicConfig, schema: pa.Schema,
                      leader_id: int, leader_epoch: int, replicas: tuple[int, ...],
                      topic_id: str | None = None) -> Partition:
        p = self._get_or_create(tp, config, schema, topic_id)
        p.make_follower(leader_id, leader_epoch, replicas)
        self._notify_data(tp)  # long-polling fetches learn that this broker stopped leading
        return p

    def _get_or_create(self, tp: TopicPartition, config: TopicConfig, schema: pa.Schema,
                       topic_id: str | None = None) -> Partition:
        """The partition, created with its log if new. The files are made outside the lock, so
        the metadata sync brings many partitions online at once. ``topic_id`` (None:
        unchecked): the log must belong to it (UNKNOWN_TOPIC_ID otherwise: the caller stops
        and deletes an old incarnation's replica first)."""
        p = self._partitions.get(tp)
        if p is not None:
            if topic_id is not None and p.topic_id != topic_id:  # refused, or adopted
                self._logs.get_or_create_log(tp, config, schema, topic_id)
            p.log.update_config(config)
            return p
        log_ = self._logs.get_or_create_log(tp, config, schema, topic_id)
        created = Partition(tp, log_, self.broker_id, self._clock, self._notify_data,
                            self._propose_isr, self.isr_stats.on_isr_change)
        with self._lock:
            return self._partitions.setdefault(tp, created)

    def update_config(self, tp: TopicPartition, config: TopicConfig) -> None:
        p = self._partitions.get(tp)
        if p is not None:
            p.log.update_config(config)

    def stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        with self._lock:
            p = self._partitions.pop(tp, None)
        if p is not None:
            p.make_follower(-1, p.leader_epoch, p.replicas)
            if delete:
                self._logs.delete_log(tp)
        self._notify_data(tp)

    # -- produce -----------------------------------------------------------------------------

    def append_records(self, tp: TopicPartition, batch: ProducerData, required_acks: int,
                       producer_id: int = -1, producer_epoch: int = -1,
                       base_sequence: int = -1, flags: int = 0,
                       current_leader_epoch: int = -1, verify: bool = False,
                       guard: VerificationGuard | None = None) -> PendingAppend:
        """Append now; ``wait(timeout_ms)`` on the result gives the acknowledgement.
        ``current_leader_epoch`` (-1: unchecked) is checked against the partition's. With
        ``verify``, a transactional batch needs its open transaction here or a verified
        ``guard`` (``verification_guard``)."""
        if required_acks not in (-1, 0, 1):
            raise InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), got {required_acks}")
        return self.partition(tp).append_records_to_leader(
            batch, required_acks, current_leader_epoch, verify, guard, producer_id=producer_id,
            producer_epoch=producer_epoch, base_sequence=base_sequence, flags=flags)

    def verification_guard(self, tp: TopicPartition, producer_id: int, producer_epoch: int
                           ) -> VerificationGuard | None:
        """None if the producer's transaction is open on ``tp`` at ``producer_epoch``; else
        the guard its verification with the coordinator must carry into the append."""
        return self.partition(tp).log.verification_guard(producer_id, producer_epoch)

    def write_txn_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                         committed: bool, coordinator_epoch: int) -> PendingAppend:
        """Append a COMMIT or ABORT marker to a led partition (acks=all: wait on the
        result)."""
        marker = ControlType.COMMIT if committed else ControlType.ABORT
        return self.partition(tp).append_marker_to_leader(producer_id, producer_epoch, marker,
                                                          coordinator_epoch)

    def producers(self, tp: TopicPartition) -> list[ProducerEntry]:
        """The producers of a led partition (describe_producers)."""
        p = self.partition(tp)
        if not p.is_leader:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead {tp}")
        return p.log.producer_state.producers()

    # -- fetch -------------------------------------------------------------------------------

    def fetch(self, requests: list[FetchPartition], max_wait_ms: int, min_bytes: int,
              max_bytes: int, isolation_level: int = READ_UNCOMMITTED, replica_id: int = -1
              ) -> list[PartitionFetchResult]:
        """Read each partition, waiting up to ``max_wait_ms`` until ``min_bytes`` are ready or
        a partition has an error. Consumers read below the high watermark; followers to LEO."""
        deadline = self._clock.monotonic_ms() + max_wait_ms
        while True:
            with self._data_arrived:
                generation = self._generation
            results = self._read_once(requests, max_bytes, isolation_level, replica_id)
            ready = sum(r.size_bytes for r in results)
            remaining = deadline - self._clock.monotonic_ms()
            # A remote read is not waited for again: no append wakes it, and it goes on
            # filling the chunk cache for the retry.
            if ready >= min_bytes or remaining <= 0 or any(
                    r.error or r.from_remote for r in results):
                self.stats.requests += 1
                self.stats.batches += sum(len(r.batches) for r in results)
                self.stats.bytes += ready
                return results
            with self._data_arrived:
                if self._generation == generation:
                    self._data_arrived.wait(remaining / 1000.0)

    def await_high_watermarks(self, positions: dict[TopicPartition, int], max_wait_ms: int
                              ) -> dict[TopicPartition, int]:
        """Each led partition's high watermark, once one of them is above its position in
        ``positions`` or after ``max_wait_ms`` (a long poll for readers that only need to know
        whether there is more, such as an idle Spark stream). Partitions this broker does not
        lead are left out."""
        deadline = self._clock.monotonic_ms() + max_wait_ms
        while True:
            with self._data_arrived:
                generation = self._generation
            hws = {tp: p.log.high_watermark for tp in positions
                   if (p := self._partitions.get(tp)) is not None and p.is_leader}
            remaining = deadline - self._clock.monotonic_ms()
            if remaining <= 0 or len(hws) < len(positions) or any(
                    hw > positions[tp] for tp, hw in hws.items()):
                return hws
            with self._data_arrived:
                if self._generation == generation:
                    self._data_arrived.wait(remaining / 1000.0)

    def read(self, requests: list[FetchPartition], max_bytes: int, isolation_level: int,
             replica_id: int) -> list[PartitionFetchResult]:
        """Read every partition once, without waiting, as a fetch would, except that a
        follower's position is not taken as its log end offset (a fetch session's follower
        acknowledges with ``acknowledge_follower`` once it appended)."""
        results = self._read_once(requests, max_bytes, isolation_level, replica_id,
                                  track_follower=False)
        self.stats.batches += sum(len(r.batches) for r in results)
        self.stats.bytes += sum(r.size_bytes for r in results)
        return results

    def acknowledge_follower(self, tp: TopicPartition, replica_id: int, log_end_offset: int,
                             leader_epoch: int, topic_id: str | None = None,
                             replica: Partition | None = None) -> None:
        """A session's follower has everything below ``log_end_offset`` on its disk, as of
        ``leader_epoch``, the epoch it follows. Ignored when this broker no longer leads
        ``tp``, when the follower's epoch is not the leader's (a follower on another epoch
        may hold a divergent tail it has not truncated yet: counting it could acknowledge
        acks=all records, or readmit it to the ISR, on the word of a replica without them),
        or when the offset is past the leader's log end offset, which no follower can have, or
        when the follower's replica is of another topic id than ``p``'s (``topic_id``; None:
        unchecked), whose offsets say nothing of this log's, or when ``p`` is not ``replica``
        (not None: the replica the follower subscribed to, since replaced)."""
        p = self._partitions.get(tp)
        if p is None or (replica is not None and p is not replica) or \
                leader_epoch != p.leader_epoch or \
                log_end_offset > p.log.log_end_offset or \
                not consistent_topic_id(topic_id, p.topic_id):
            return
        p.update_follower_fetch(replica_id, log_end_offset)

    def watch(self, tp: TopicPartition, watcher: Watcher) -> None:
        with self._lock:
            self._watchers[tp] = (*self._watchers.get(tp, ()), watcher)

    def unwatch(self, tp: TopicPartition, watcher: Watcher) -> None:
        with self._lock:
            left = tuple(w for w in self._watchers.get(tp, ()) if w is not watcher)
            if left:
                self._watchers[tp] = left
            else:
                self._watchers.pop(tp, None)

    def _read_once(self, requests: list[FetchPartition], max_bytes: int, isolation_level: int,
                   replica_id: int, track_follower: bool = True) -> list[PartitionFetchResult]:
        """Read every partition once: local ones here, in order, within ``max_bytes``; those
        below a tiered partition's local log start offset on the remote tier, concurrently."""
        results: list[PartitionFetchResult] = []
        remote: list[tuple[PartitionFetchResult, RemoteFetchRequest]] = []
        budget = max_bytes
        for req in requests:
            result = PartitionFetchResult(req.tp)
            remote_read = self._read_partition(req, result, budget, isolation_level, replica_id,
                                               min_one=not any(r.batches for r in results),
                                               track_follower=track_follower)
            if remote_read is not None:
                remote.append((result, remote_read))
            budget -= result.size_bytes
            results.append(result)
        if remote:
            self._read_remote(remote, committed=isolation_level == READ_COMMITTED)
            _trim(results, max_bytes)
        return results

    def _read_partition(self, req: FetchPartition, result: PartitionFetchResult, budget: int,
                        isolation_level: int, replica_id: int, min_one: bool,
                        track_follower: bool = True) -> RemoteFetchRequest | None:
        """Fill ``result`` from the local log, or return the remote read it needs."""
        try:
            p = self._leader(req.tp, req.topic_id)
            p.check_leader_epoch(req.current_leader_epoch)
            log_ = p.log
            self._describe_result(result, log_)
            if replica_id >= 0 and track_follower:
                p.update_follower_fetch(replica_id, req.offset)
            max_offset = log_.log_end_offset if replica_id >= 0 else log_.high_watermark
            if req.end_offset is not None:
                max_offset = max(min(max_offset, req.end_offset), req.offset)
            if req.offset == max_offset or budget <= 0:
                return None
            if req.offset < log_.log_start_offset and self._is_tiered(req.tp):
                return self._remote_request(req, log_, min(req.max_bytes, max(budget, 1)),
                                            max_offset, isolation_level, replica_id)
            committed = replica_id < 0 and isolation_level == READ_COMMITTED
            data = log_.read(req.offset, min(req.max_bytes, max(budget, 1)),
                             max_offset=max_offset, min_one=min_one,
                             isolation=IsolationLevel(int(committed)))
            result.batches = data.batches
            result.aborted = data.aborted_transactions
        except ApiError as e:
            result.error = e
        except Exception as e:  # a boundary: one broken partition must not fail the request
            log.exception("%s: fetch at offset %d failed", req.tp, req.offset)
            result.error = UnknownServerError(f"{req.tp}: {type(e).__name__}: {e}")
        return None

    def _describe_result(self, result: PartitionFetchResult, log_: Log) -> None:
        result.high_watermark = log_.high_watermark
        result.local_log_start_offset = log_.log_start_offset
        with contextlib.suppress(RemoteStorageError):  # not known yet: -1 (reads go on)
            result.log_start_offset = self.log_start_offset(result.tp, log_)
        result.log_end_offset = log_.log_end_offset
        result.last_stable_offset = log_.last_stable_offset

    def _remote_request(self, req: FetchPartition, log_: Log, max_bytes: int, max_offset: int,
                        isolation_level: int, replica_id: int) -> RemoteFetchRequest:
        """The remote read of a fetch below the local log start offset (a follower's is
        refused: it restarts at the local log start offset instead). Below the log start
        offset over both tiers, the remote reader answers OFFSET_OUT_OF_RANGE."""
        local_start = log_.log_start_offset
        if replica_id >= 0:
            raise OffsetMovedToTieredStorageError(
                f"{req.tp}: offset {req.offset} is below the leader's local log start offset "
                f"{local_start}; it is in the remote tier, which replicas do not fetch")
        if isolation_level == READ_COMMITTED:  # copies stop at the LSO; this is a bound
            max_offset = min(max_offset, log_.last_stable_offset)
        return RemoteFetchRequest(req.tp, req.offset, max_bytes, min_one=True,
                                  max_offset=max_offset)

    def _read_remote(self, remote: list[tuple[PartitionFetchResult, RemoteFetchRequest]],
                     committed: bool) -> None:
        assert self.tier is not None
        # A read that outlasts the wait wakes the partition's waiters when it ends (sessions,
        # long-polling fetches), so they read again from the filled chunk cache.
        outcomes = self.tier.read([request for _, request in remote], self._notify_data)
        for (result, _), outcome in zip(remote, outcomes, strict=True):
            result.from_remote = True
            if isinstance(outcome, ApiError):
                result.error = outcome
            elif outcome is not None:
                result.batches = outcome.batches
                if committed and result.batches:
                    self._add_remote_aborted(result)

    def _add_remote_aborted(self, result: PartitionFetchResult) -> None:
        """``result``'s aborted transactions, or, when the remote tier cannot give them (an
        index object unreadable), its error: this partition's alone, the fetch's others are
        served (its batches are dropped: without their aborts they cannot be filtered)."""
        try:
            result.aborted = self._remote_aborted(result)
        except ApiError as e:
            result.error, result.batches = e, []
        except Exception as e:  # a boundary, as in _read_partition
            log.exception("%s: aborted transactions of a remote read failed", result.tp)
            result.error = UnknownServerError(f"{result.tp}: {type(e).__name__}: {e}")
            result.batches = []

    def _remote_aborted(self, result: PartitionFetchResult) -> list[AbortedTxn]:
        """The aborted transactions overlapping a remote read (read_committed): the uploaded
        ``.txnindex`` entries of its segment and the later remote ones and, where those cannot
        prove there are no more, the local segments' (which all lie after the range)."""
        assert self.tier is not None
        start = result.batches[0].header.base_offset
        end = result.batches[-1].header.next_offset
        entries, complete = self.tier.collect_aborted(result.tp, start, end)
        aborted = [e.aborted_txn() for e in entries]
        if not complete:  # the local segments hold the markers of the later aborts
            local = self.partition(result.tp).log.collect_aborted_transactions(start, end)
            aborted += [e.aborted_txn() for e in local]
        return aborted

    def _is_tiered(self, tp: TopicPartition) -> bool:
        return self.tier is not None and self.tier.is_tiered(tp)

    def log_start_offset(self, tp: TopicPartition, log_: Log) -> int:
        """The partition's log start offset over both tiers (the local one if not tiered);
        RemoteStorageError (retriable) while the remote tier's entries are not loaded."""
        tiered = self.tier.log_start_offset(tp) if self.tier is not None else None
        return log_.log_start_offset if tiered is None else min(tiered, log_.log_start_offset)

    def _leader(self, tp: TopicPartition, topic_id: str | None = None) -> Partition:
        """The partition ``tp`` if this broker leads it, and (``topic_id`` not None) its log
        is of that topic id: INCONSISTENT_TOPIC_ID otherwise, checked before leadership, as
        a replica of another incarnation says nothing of this one's leader."""
        p = self.partition(tp)
        if not consistent_topic_id(topic_id, p.topic_id):
            raise InconsistentTopicIdError(
                f"{tp}: the request is for topic id {topic_id}, but broker {self.broker_id}'s "
                f"replica is of topic id {p.topic_id} ({tp.topic!r} was deleted and created "
                "again): retry once both brokers have the topic's current incarnation")
        if not p.is_leader:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead {tp}")
        return p

    def _notify_data(self, tp: TopicPartition) -> None:
        with self._data_arrived:
            self._generation += 1
            self._data_arrived.notify_all()
        for watcher in self._watchers.get(tp, ()):
            watcher(tp)

    def offsets_for_leader_epoch(self, tp: TopicPartition, leader_epoch: int,
                                 current_leader_epoch: int = -1, topic_id: str | None = None
                                 ) -> tuple[int, int]:
        """(epoch, end offset) of ``leader_epoch`` on this leader (see epoch_cache.py), for a
        follower whose replica is of ``topic_id`` (None: unchecked)."""
        p = self._leader(tp, topic_id)
        p.check_leader_epoch(current_leader_epoch)
        return p.end_offset_for_epoch(leader_epoch)

    def leader_epochs(self, tp: TopicPartition, current_leader_epoch: int = -1,
                      topic_id: str | None = None) -> list[tuple[int, int]]:
        """This leader's whole leader-epoch cache: (epoch, start offset), ascending."""
        p = self._leader(tp, topic_id)
        p.check_leader_epoch(current_leader_epoch)
        return [(e.epoch, e.start_offset) for e in p.epochs.entries]

    def leader_log(self, tp: TopicPartition) -> Log:
        """The log of a partition this broker leads (NOT_LEADER_OR_FOLLOWER otherwise)."""
        return self._leader(tp).log

    def leaders(self) -> list[Partition]:
        return [p for p in self.hosted().values() if p.is_leader]

    # -- log directories ---------------------------------------------------------------------

    def describe_log_dir(self, tp: TopicPartition, end_known: bool = False) -> LogDir:
        """Where a led partition's files are, for readers on this machine (file_reader.py):
        its directory, the log manager's incarnation id, and its offsets now. ``end_known``:
        OFFSET_NOT_AVAILABLE from a new leader that has not learned its high watermark yet
        (``Partition.check_end_known``), for readers that plan up to it."""
        p = self._leader(tp)
        if end_known:
            p.check_end_known()
        return LogDir(str(p.log.dir.resolve()), self._logs.incarnation,
                      self.log_start_offset(tp, p.log), p.log.high_watermark,
                      p.log.log_start_offset, p.log.last_stable_offset, p.topic_id)

    # -- list offsets ------------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int,
                    isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int]:
        """(offset, timestamp) for EARLIEST, LATEST (the high watermark; for READ_COMMITTED
        the last stable offset) or the first record at or after ``timestamp``; (-1, -1) when
        no record is that late. A new leader that has not learned its high watermark yet
        answers LATEST, and a lookup it finds nothing for below it, with OFFSET_NOT_AVAILABLE
        (``Partition.check_end_known``)."""
        p = self._leader(tp)
        if timestamp == EARLIEST:
            return self.log_start_offset(tp, p.log), -1
        if timestamp == LATEST:
            p.check_end_known()
            committed = isolation_level == READ_COMMITTED
            return p.log.last_stable_offset if committed else p.log.high_watermark, -1
        if timestamp < 0:
            raise OffsetOutOfRangeError(f"{tp}: invalid list-offsets timestamp {timestamp}")
        found = None
        if self.tier is not None and self._is_tiered(tp):  # the older records first
            found = self.tier.offset_for_time(tp, timestamp, p.log.schema,
                                              below=p.log.log_start_offset)
        found = found or p.log.offsets_for_time(timestamp)
        if found is None or found[0] >= p.log.high_watermark:
            p.check_end_known()
            return -1, -1
        return found


def consistent_topic_id(requested: str | None, hosted: str | None) -> bool:
    """Whether a request for topic id ``requested`` may be answered from a replica of
    ``hosted``: equal, or either unknown (a peer or a log from before topic ids), as Kafka's
    ``hasConsistentTopicId``."""
    return requested is None or hosted is None or requested == hosted


def _trim(results: list[PartitionFetchResult], max_bytes: int) -> None:
    """Keep a fetch within ``max_bytes`` after its remote reads joined the local ones: whole
    batches in request order, the first batch of the response whatever its size."""
    total = 0
    for result in results:
        kept = []
        for batch in result.batches:
            size = batch.header.batch_size
            if total and total + size > max_bytes:
                break
            kept.append(batch)
            total += size
        result.batches = kept
