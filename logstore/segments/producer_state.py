"""Producer state of one partition: per producer id, its epoch, its last five batches (duplicate
detection and sequence checks) and its open transaction, with Kafka's semantics; and from the
open transactions, the partition's first unstable offset (the LSO before the high watermark).

Owns: the sequence and transaction rules, the open and the not-yet-replicated completed
transactions, and the producer snapshot files ``{offset:020d}.snapshot`` (JSON, the state after
every batch below ``offset``, layout in format.py) written at segment roll and clean close.
After a restart the state is the newest snapshot at or below the log end offset plus a re-scan
of the batches after it (the Log does the scan and feeds ``update``).
Must not: read segment files or write the transaction index (the Log does, from ``update``'s
result).

Rules (``check``), for a leader batch of producer ``pid`` with ``epoch``, sequences first..last:
- unknown producer: any sequence is accepted (its state may have been lost to retention);
- ``epoch`` below the producer's epoch: InvalidProducerEpochError;
- ``epoch`` above it: the sequence must start at 0, else OutOfOrderSequenceError;
- same epoch: a batch equal to one of the last five is a duplicate (the original metadata is
  returned and nothing is written); otherwise ``first`` must follow the last sequence, if one
  is known (as in Kafka, a producer whose epoch only a marker wrote, or whose batches
  retention took, may go on from any sequence);
- a non-transactional batch from a producer with an open transaction: InvalidTxnStateError;
- with verification (KIP-890 part 1, ``verification_guard``): a transactional batch (the
  producer's, or one a coordinator writes for it: offsets committed in its transaction) joins
  the producer's transaction open on this partition at its epoch, or else must carry the guard
  of a verification with the coordinator that no marker has cleared since: otherwise
  TransactionAbortableError (its transaction ended meanwhile). Checked under the log's lock
  together with the append, so a batch whose transaction was completed or aborted between its
  check and its append never opens a transaction nobody will close (and pins the LSO).

Transactions (``update``): a transactional batch of a producer with no open transaction opens
one at its base offset; a marker (control batch) closes the open one and returns it as a
``CompletedTxn``. A marker with an epoch older than the producer's, or from a coordinator
epoch older than the producer's last marker's, is refused by ``check_marker`` (leader
appends); a marker with no open transaction is written but opens or
closes nothing (Kafka writes them, e.g. for an abort after a timeout); its epoch still becomes
the producer's, which fences the producer's older epoch. A completed transaction stays
"unreplicated" until the high watermark passes its marker: until then it holds the first
unstable offset down as an open one does, so read_committed readers never see a transaction
whose marker could still be lost with a leader change (Kafka's rule).

Expiry (Kafka's, so the state and every snapshot do not grow with each short-lived producer):
a producer with no open transaction is forgotten once it wrote nothing for
``producer_id_expiration_ms`` (``remove_expired_producers``), never because the log start
moved past its records: a retry of a batch whose acknowledgement was lost would then be
taken from an unknown producer and stored twice (Kafka dropped that eviction, KIP-360).
Idle time is counted
on the broker's clock, not from the records' timestamps (a producer that writes old
timestamps must not lose its duplicate detection): a producer that wrote since the last check
is stamped with that check's time. A forgotten producer's next batch is accepted at any
sequence, as for any unknown producer.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from logstore.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionAbortableError,
    TransactionCoordinatorFencedError,
)
from logstore.records import FLAG_LOG_APPEND_TIME, BatchHeader, ControlType, EndTxnMarker
from logstore.segments.format import (
    SNAPSHOT_SUFFIX,
    atomic_write,
    file_name,
    fsync_dir,
    parse_file_name,
)
from logstore.segments.txn_index import TxnIndexEntry

logger = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
SEQUENCE_MODULUS = 2**31
SNAPSHOT_VERSION = 2
READABLE_SNAPSHOT_VERSIONS = (1, 2)
SNAPSHOTS_KEPT = 2


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    return (base_sequence + last_offset_delta) % SEQUENCE_MODULUS


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What a producer batch did, enough to answer its retry with the original result."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time: int
    batch_size: int

    @classmethod
    def of(cls, header: BatchHeader) -> BatchMetadata:
        append_time = header.max_timestamp if header.flags & FLAG_LOG_APPEND_TIME else -1
        return cls(header.base_sequence, last_sequence(header.base_sequence,
                                                       header.last_offset_delta),
                   header.base_offset, header.last_offset, header.max_timestamp, append_time,
                   header.batch_size)


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker closed: its producer, first offset and marker offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class ProducerLastBatch(NamedTuple):
    """A producer's last data batch (its last offset; None when its epoch wrote only markers)
    and its epoch."""

    last_data_offset: int | None
    epoch: int

    def is_last(self, header: BatchHeader) -> bool:
        """Whether ``header`` (of this producer) is the batch that holds the producer's state:
        its last data batch, or, with no data at its epoch, a marker of its epoch."""
        if self.last_data_offset is not None:
            return header.last_offset == self.last_data_offset
        return header.is_control and header.producer_epoch == self.epoch


class VerificationGuard:
    """One verification of a producer's transaction for one partition (Kafka's
    VerificationGuard): created before the leader asks the coordinator, ``verified`` once it
    said yes, and valid until a marker of the producer reaches the partition."""

    __slots__ = ("producer_id", "epoch", "verified")

    def __init__(self, producer_id: int, epoch: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.verified = False


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))
    coordinator_epoch: int = -1
    txn_first_offset: int | None = None
    last_offset: int = -1  # of its last batch, data or marker
    # Broker time of the first expiry check since its last batch; -1: none yet.
    last_seen_ms: int = -1
    # Last offset of its last data batch at this epoch, sequence -1 ones included (the
    # coordinator's offset commits); -1: none (compaction keeps it: ProducerLastBatch).
    last_data_offset: int = -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


def _last_data_offset(entry: ProducerEntry) -> int | None:
    """The entry's last data batch's last offset (from its cached batches when a snapshot
    older than the field left it unknown); None: its epoch wrote only markers."""
    if entry.last_data_offset >= 0:
        return entry.last_data_offset
    return entry.batches[-1].last_offset if entry.batches else None


class ProducerStateManager:
    """Producer entries of one partition, with their snapshots in the partition directory."""

    def __init__(self, dir: Path, tp: str) -> None:
        self.dir = dir
        self.tp = tp
        self._producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open txn
        self._unreplicated: deque[CompletedTxn] = deque()  # in marker order
        self._first_unstable: int | None = None
        self._guards: dict[int, VerificationGuard] = {}  # producer id -> its verification

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    @property
    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction (a copy)."""
        return dict(self._ongoing)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction that is open or whose marker is not yet
        below the high watermark; None when there is none."""
        return self._first_unstable

    def verification_guard(self, producer_id: int, epoch: int) -> VerificationGuard | None:
        """(Under the log's lock.) None when the producer's transaction is open on this
        partition at ``epoch`` (its batches join it unchecked); else the guard a
        verification of (``producer_id``, ``epoch``) must carry: the current one, or a new
        one (then unverified)."""
        entry = self._producers.get(producer_id)
        if entry is not None and entry.txn_first_offset is not None and entry.epoch == epoch:
            return None
        guard = self._guards.get(producer_id)
        if guard is None or guard.epoch != epoch:
            guard = self._guards[producer_id] = VerificationGuard(producer_id, epoch)
        return guard

    def check(self, producer_id: int, epoch: int, base_sequence: int, record_count: int,
              transactional: bool = False, verify: bool = False,
              guard: VerificationGuard | None = None) -> BatchMetadata | None:
        """Validate a leader append; returns the original batch when it is a duplicate. A
        transactional batch without a sequence (-1) is one a coordinator writes for the
        producer (offsets committed in its transaction): only its epoch is checked. With
        ``verify``, a producer's transactional batch (a coordinator's too) must join its open
        transaction or carry a still valid, verified ``guard``."""
        if epoch < 0 or (base_sequence < 0 and not (transactional and base_sequence == -1)):
            raise InvalidRecordError(f"{self.tp}: producer {producer_id} sent base_sequence "
                                     f"{base_sequence} and epoch {epoch}; both must be >= 0")
        entry = self._producers.get(producer_id)
        duplicate = None
        if entry is not None and base_sequence < 0:
            self._check_epoch(entry, epoch)
        elif entry is not None:
            duplicate = self._check_sequence(entry, epoch, base_sequence, record_count)
            if duplicate is None:
                self._check_txn_state(entry, transactional)
        if duplicate is None and transactional and verify:
            self._check_verified(entry, producer_id, epoch, guard)
        return duplicate

    def _check_verified(self, entry: ProducerEntry | None, producer_id: int, epoch: int,
                        guard: VerificationGuard | None) -> None:
        if entry is not None and entry.txn_first_offset is not None and entry.epoch == epoch:
            return  # it joins the transaction open here
        current = self._guards.get(producer_id)
        if guard is None or guard is not current or not guard.verified or \
                guard.epoch != epoch:
            raise TransactionAbortableError(
                f"{self.tp}: producer {producer_id} epoch {epoch} has no transaction verified "
                "for this partition any more (it was completed or aborted since the check); "
                "the batch is not written: abort and retry in a new transaction")

    def _check_epoch(self, entry: ProducerEntry, epoch: int) -> None:
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.tp}: producer {entry.producer_id} epoch {epoch} is older than the "
                f"current epoch {entry.epoch}")

    def _check_sequence(self, entry: ProducerEntry, epoch: int, base_sequence: int,
                        record_count: int) -> BatchMetadata | None:
        producer_id = entry.producer_id
        self._check_epoch(entry, epoch)
        if epoch > entry.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"{self.tp}: producer {producer_id} bumped its epoch to {epoch} but sent "
                    f"sequence {base_sequence}; a new epoch starts at 0")
            return None
        duplicate = entry.find_duplicate(base_sequence, last_sequence(base_sequence,
                                                                      record_count - 1))
        if duplicate is not None or entry.last_seq is None:
            return duplicate
        expected = (entry.last_seq + 1) % SEQUENCE_MODULUS
        if base_sequence != expected:
            raise OutOfOrderSequenceError(
                f"{self.tp}: producer {producer_id} epoch {epoch} sent sequence {base_sequence}, "
                f"expected {expected}")
        return None

    def _check_txn_state(self, entry: ProducerEntry, transactional: bool) -> None:
        if entry.txn_first_offset is not None and not transactional:
            raise InvalidTxnStateError(
                f"{self.tp}: producer {entry.producer_id} sent a non-transactional batch while "
                f"its transaction opened at offset {entry.txn_first_offset} is still open")

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int = -1) -> None:
        """Validate a transaction marker the leader is about to append: its producer epoch
        must not be older than the producer's, nor its coordinator epoch older than the one of
        the last marker written for the producer (a coordinator that lost its partition to a
        newer one is fenced: TRANSACTION_COORDINATOR_FENCED)."""
        if producer_id < 0 or epoch < 0:
            raise InvalidRecordError(f"{self.tp}: a transaction marker needs a producer id and "
                                     f"epoch >= 0, got {producer_id} and {epoch}")
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.tp}: transaction marker for producer {producer_id} has epoch {epoch}, "
                f"older than the producer's epoch {entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{self.tp}: transaction marker for producer {producer_id} comes from "
                f"coordinator epoch {coordinator_epoch}, older than the coordinator epoch "
                f"{entry.coordinator_epoch} of its last marker")

    @property
    def has_producers(self) -> bool:
        return bool(self._producers)

    def last_batches(self) -> dict[int, ProducerLastBatch]:
        """Per producer, what compaction must keep so that a rebuild from the log finds its
        epoch and last sequence (Kafka's lastRecordsOfActiveProducers)."""
        return {pid: ProducerLastBatch(_last_data_offset(e), e.epoch)
                for pid, e in self._producers.items()}

    def producers(self) -> list[ProducerEntry]:
        """The producers of the partition, each a copy (describe_producers)."""
        return [ProducerEntry(e.producer_id, e.epoch, deque(e.batches, MAX_CACHED_BATCHES),
                              e.coordinator_epoch, e.txn_first_offset, e.last_offset,
                              e.last_seen_ms, e.last_data_offset)
                for e in self._producers.values()]

    def update(self, header: BatchHeader,
               marker: EndTxnMarker | None = None) -> CompletedTxn | None:
        """Record a written batch (leader append, follower append or recovery scan); a control
        batch comes with its ``marker``. Returns the transaction the marker closed, if any."""
        if header.producer_id < 0:
            return None
        entry = self._entry_for(header.producer_id, header.producer_epoch)
        entry.last_offset = max(entry.last_offset, header.last_offset)
        entry.last_seen_ms = -1
        if header.is_control:
            if marker is None:
                raise ValueError(f"{self.tp}: control batch at offset {header.base_offset} "
                                 "given without its marker")
            self._guards.pop(header.producer_id, None)  # its transaction ended here
            return self._end_txn(entry, header.base_offset, marker)
        entry.last_data_offset = max(entry.last_data_offset, header.last_offset)
        if header.base_sequence >= 0:
            entry.batches.append(BatchMetadata.of(header))
        if header.is_transactional and entry.txn_first_offset is None:
            self._guards.pop(header.producer_id, None)  # used: the transaction is open here
            entry.txn_first_offset = header.base_offset
            self._ongoing[entry.producer_id] = header.base_offset
            self._refresh_first_unstable()
        return None

    def _entry_for(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry; a new epoch forgets its batches but not its transaction."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(producer_id, epoch)
        elif entry.epoch != epoch:
            entry.epoch = epoch
            entry.batches.clear()
            entry.last_data_offset = -1
        return entry

    def _end_txn(self, entry: ProducerEntry, offset: int,
                 marker: EndTxnMarker) -> CompletedTxn | None:
        entry.coordinator_epoch = marker.coordinator_epoch
        first, entry.txn_first_offset = entry.txn_first_offset, None
        if first is None:
            return None
        del self._ongoing[entry.producer_id]
        completed = CompletedTxn(entry.producer_id, first, offset,
                                 marker.type is ControlType.ABORT)
        self._unreplicated.append(completed)
        self._refresh_first_unstable()
        return completed

    def index_entry(self, completed: CompletedTxn | None) -> TxnIndexEntry | None:
        """The aborted-transaction index entry of ``completed`` (just closed) when it was
        aborted, with the LSO right after it ignoring the high watermark: the first offset of
        the earliest other open transaction, else the marker's offset + 1."""
        if completed is None or not completed.is_aborted:
            return None
        lso = min(self._ongoing.values(), default=completed.last_offset + 1)
        return TxnIndexEntry(completed.producer_id, completed.first_offset,
                             completed.last_offset, lso)

    def on_high_watermark(self, high_watermark: int) -> None:
        """Completed transactions whose marker is below ``high_watermark`` become stable."""
        unreplicated = self._unreplicated
        if unreplicated and unreplicated[0].last_offset < high_watermark:
            while unreplicated and unreplicated[0].last_offset < high_watermark:
                unreplicated.popleft()
            self._refresh_first_unstable()

    def _refresh_first_unstable(self) -> None:
        firsts = [*self._ongoing.values(), *(t.first_offset for t in self._unreplicated)]
        self._first_unstable = min(firsts, default=None)

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> int:
        """(Under the log's lock, periodically.) Forget the producers with no open transaction
        that wrote nothing for ``expiration_ms`` as of ``now_ms``; returns how many. One that
        wrote since the last check (or comes from a snapshot without the time) is stamped
        ``now_ms`` and kept."""
        doomed = []
        for entry in self._producers.values():
            if entry.last_seen_ms < 0:
                entry.last_seen_ms = now_ms
            elif entry.txn_first_offset is None and now_ms - entry.last_seen_ms >= expiration_ms:
                doomed.append(entry.producer_id)
        return self._remove(doomed)

    def _remove(self, producer_ids: list[int]) -> int:
        for producer_id in producer_ids:
            del self._producers[producer_id]
        if producer_ids:
            logger.info("%s: forgot %d expired producer(s), %d left", self.tp,
                        len(producer_ids), len(self._producers))
        return len(producer_ids)

    def clear(self) -> None:
        self._guards.clear()
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self._first_unstable = None

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot_offsets(self) -> list[int]:
        found = (parse_file_name(p.name) for p in self.dir.iterdir())
        return sorted(p[0] for p in found if p is not None and p[1] == SNAPSHOT_SUFFIX)

    def _path(self, offset: int) -> Path:
        return self.dir / file_name(offset, SNAPSHOT_SUFFIX)

    def take_snapshot(self, offset: int, durable: bool = False) -> None:
        """Write the current state as the snapshot at ``offset``; keep the newest few. An
        unreadable snapshot is skipped at load, so only a clean close needs ``durable``."""
        body = {"version": SNAPSHOT_VERSION, "offset": offset, "producers": [
            {"producer_id": e.producer_id, "epoch": e.epoch,
             "coordinator_epoch": e.coordinator_epoch, "txn_first_offset": e.txn_first_offset,
             "last_offset": e.last_offset, "last_seen_ms": e.last_seen_ms,
             "last_data_offset": e.last_data_offset,
             "batches": [asdict(b) for b in e.batches]} for e in self._producers.values()]}
        atomic_write(self._path(offset), json.dumps(body).encode(), durable=durable)
        for old in self.snapshot_offsets()[:-SNAPSHOTS_KEPT]:
            self._path(old).unlink(missing_ok=True)

    def delete_snapshots_above(self, offset: int) -> None:
        for found in self.snapshot_offsets():
            if found > offset:
                self._path(found).unlink(missing_ok=True)

    def delete_snapshots_through(self, offset: int) -> None:
        """Durably delete the snapshots at or below ``offset``. The cleaner calls it before it
        drops a transaction marker at ``offset``: such a snapshot may hold that transaction
        open, and nothing after it would close it any more."""
        doomed = [found for found in self.snapshot_offsets() if found <= offset]
        for found in doomed:
            self._path(found).unlink(missing_ok=True)
        if doomed:
            fsync_dir(self.dir)

    def delete_all_snapshots(self) -> None:
        self.delete_snapshots_above(-1)

    def load(self, log_end_offset: int, at_most: int | None = None) -> int | None:
        """Replace the state with the newest readable snapshot at or below ``log_end_offset``
        (and ``at_most``, when given); returns its offset (the caller re-scans batches from
        there), or None when there is none (re-scan the whole log)."""
        self.clear()
        self.delete_snapshots_above(log_end_offset)
        limit = log_end_offset if at_most is None else min(at_most, log_end_offset)
        for offset in reversed([o for o in self.snapshot_offsets() if o <= limit]):
            try:
                self._read(self._path(offset))
                return offset
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("%s: ignoring unreadable producer snapshot %s: %s", self.tp,
                               self._path(offset).name, e)
                self.clear()
                self._path(offset).unlink(missing_ok=True)
        return None

    def _read(self, path: Path) -> None:
        body = json.loads(path.read_bytes())
        if body["version"] not in READABLE_SNAPSHOT_VERSIONS:
            raise ValueError(f"unknown snapshot version {body['version']}")
        for raw in body["producers"]:
            entry = ProducerEntry(int(raw["producer_id"]), int(raw["epoch"]))
            entry.batches.extend(BatchMetadata(**b) for b in raw["batches"])
            entry.coordinator_epoch = int(raw.get("coordinator_epoch", -1))
            # Older snapshots lack these: its last batch is below the snapshot's offset, at
            # most; its idle time is counted from the first check after the load.
            entry.last_offset = int(raw.get("last_offset", int(body["offset"]) - 1))
            entry.last_seen_ms = int(raw.get("last_seen_ms", -1))
            entry.last_data_offset = int(raw.get("last_data_offset", -1))
            first = raw.get("txn_first_offset")
            if first is not None:
                entry.txn_first_offset = self._ongoing[entry.producer_id] = int(first)
            self._producers[entry.producer_id] = entry
        self._refresh_first_unstable()
