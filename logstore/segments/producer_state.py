"""Idempotent-producer state of one partition: per producer id, its epoch and its last five
batches, for duplicate detection and sequence checks with Kafka's semantics.

Owns: the sequence rules, and the producer snapshot files ``{offset:020d}.snapshot`` (JSON, the
state after every batch below ``offset``) written at segment roll and clean close. After a
restart the state is the newest snapshot at or below the log end offset plus a re-scan of the
batch headers after it (the Log does the scan and feeds ``update``).
Must not: read segment files or know about transactions' markers (later work).

Rules (``check``), for a batch of producer ``pid`` with ``epoch``, sequences first..last:
- unknown producer: any sequence is accepted (its state may have been lost to retention);
- ``epoch`` below the producer's epoch: InvalidProducerEpochError;
- ``epoch`` above it: the sequence must start at 0, else OutOfOrderSequenceError;
- same epoch: a batch equal to one of the last five is a duplicate (the original metadata is
  returned and nothing is written); otherwise ``first`` must follow the last sequence.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from logstore.errors import InvalidProducerEpochError, InvalidRecordError, OutOfOrderSequenceError
from logstore.records import FLAG_LOG_APPEND_TIME, BatchHeader
from logstore.segments.format import SNAPSHOT_SUFFIX, atomic_write, file_name, parse_file_name

logger = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
SEQUENCE_MODULUS = 2**31
SNAPSHOT_VERSION = 1
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


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


class ProducerStateManager:
    """Producer entries of one partition, with their snapshots in the partition directory."""

    def __init__(self, dir: Path, tp: str) -> None:
        self.dir = dir
        self.tp = tp
        self._producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def check(self, producer_id: int, epoch: int, base_sequence: int,
              record_count: int) -> BatchMetadata | None:
        """Validate a leader append; returns the original batch when it is a duplicate."""
        if base_sequence < 0 or epoch < 0:
            raise InvalidRecordError(f"{self.tp}: producer {producer_id} sent base_sequence "
                                     f"{base_sequence} and epoch {epoch}; both must be >= 0")
        entry = self._producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.tp}: producer {producer_id} epoch {epoch} is older than the current "
                f"epoch {entry.epoch}")
        if epoch > entry.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"{self.tp}: producer {producer_id} bumped its epoch to {epoch} but sent "
                    f"sequence {base_sequence}; a new epoch starts at 0")
            return None
        duplicate = entry.find_duplicate(base_sequence, last_sequence(base_sequence,
                                                                      record_count - 1))
        if duplicate is not None:
            return duplicate
        expected = 0 if entry.last_seq is None else (entry.last_seq + 1) % SEQUENCE_MODULUS
        if base_sequence != expected:
            raise OutOfOrderSequenceError(
                f"{self.tp}: producer {producer_id} epoch {epoch} sent sequence {base_sequence}, "
                f"expected {expected}")
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a written batch (leader append, follower append or recovery scan)."""
        if header.producer_id < 0:
            return
        entry = self._producers.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = ProducerEntry(header.producer_id, header.producer_epoch)
            self._producers[header.producer_id] = entry
        if header.base_sequence >= 0:
            entry.batches.append(BatchMetadata.of(header))

    def clear(self) -> None:
        self._producers.clear()

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
             "batches": [asdict(b) for b in e.batches]} for e in self._producers.values()]}
        atomic_write(self._path(offset), json.dumps(body).encode(), durable=durable)
        for old in self.snapshot_offsets()[:-SNAPSHOTS_KEPT]:
            self._path(old).unlink(missing_ok=True)

    def delete_snapshots_above(self, offset: int) -> None:
        for found in self.snapshot_offsets():
            if found > offset:
                self._path(found).unlink(missing_ok=True)

    def delete_all_snapshots(self) -> None:
        self.delete_snapshots_above(-1)

    def load(self, log_end_offset: int) -> int | None:
        """Replace the state with the newest readable snapshot at or below ``log_end_offset``;
        returns its offset (the caller re-scans batches from there), or None when there is none
        (re-scan the whole log)."""
        self.clear()
        self.delete_snapshots_above(log_end_offset)
        for offset in reversed(self.snapshot_offsets()):
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
        if body["version"] != SNAPSHOT_VERSION:
            raise ValueError(f"unknown snapshot version {body['version']}")
        for raw in body["producers"]:
            entry = ProducerEntry(int(raw["producer_id"]), int(raw["epoch"]))
            entry.batches.extend(BatchMetadata(**b) for b in raw["batches"])
            self._producers[entry.producer_id] = entry
