"""What compaction does with transactions: which batches of aborted transactions it removes and
which transaction markers it may drop (Kafka's CleanedTransactionMetadata).

Owns: the per-batch rules, as a small state machine fed the batches of one cleaning pass in
offset order, seeded with the aborted transactions (from the transaction indexes) that overlap
the cleaned range. Must not: read or write files, or decide the time horizon (the cleaner keeps
a droppable marker until ``delete_retention_ms`` has passed since it was written).

Rules:
- a transactional batch of a producer inside an aborted transaction (its aborted start reached,
  its ABORT marker not yet) is removed, whatever its keys (the cleaner keeps a producer's last
  batch: it then still counts as data seen, so its marker and index entry stay with it; this
  holds because every pass starts at the log's first segment);
- an ABORT marker is kept while the pass saw data of its transaction (that data is removed in
  this pass, and a reader that fetched it earlier may still need the marker); its index entry
  is then kept with it. Once a pass sees none of its data, the marker is droppable and its
  index entry goes: no reader can meet its data any more;
- a COMMIT marker is kept while the pass saw batches of its transaction (replaying the log
  without it would leave that transaction open and pin the LSO); otherwise it is droppable;
- a droppable marker still stays until it is ``delete_retention_ms`` old (cleaner.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from logstore.records import BatchHeader, ControlType
from logstore.segments.txn_index import TxnIndexEntry


@dataclass(slots=True)
class _AbortedInPass:
    entry: TxnIndexEntry
    data_seen: bool = False


class CleanedTxnState:
    """The transaction state of one cleaning pass (see the module docstring)."""

    def __init__(self, aborted: Iterable[TxnIndexEntry]) -> None:
        self._pending = [(e.first_offset, e.last_offset, e) for e in aborted]
        heapq.heapify(self._pending)
        self._aborted: dict[int, _AbortedInPass] = {}
        self._committed: set[int] = set()

    def _reach(self, offset: int) -> None:
        """Every aborted transaction starting at or before ``offset`` is now under way."""
        while self._pending and self._pending[0][0] <= offset:
            entry = heapq.heappop(self._pending)[2]
            self._aborted.setdefault(entry.producer_id, _AbortedInPass(entry))

    def on_data_batch(self, header: BatchHeader) -> bool:
        """Whether the data batch ``header`` belongs to an aborted transaction (remove it)."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        aborted = self._aborted.get(header.producer_id)
        if aborted is None:
            self._committed.add(header.producer_id)
            return False
        aborted.data_seen = True
        return True

    def on_marker(self, header: BatchHeader,
                  marker: ControlType) -> tuple[bool, TxnIndexEntry | None]:
        """(droppable, index entry to keep with the marker) for the marker batch ``header``."""
        self._reach(header.last_offset)
        producer_id = header.producer_id
        if marker is ControlType.ABORT:
            aborted = self._aborted.pop(producer_id, None)
            if aborted is not None and aborted.data_seen:
                return False, aborted.entry
            return True, None
        if producer_id in self._committed:
            self._committed.discard(producer_id)
            return False, None
        return True, None
