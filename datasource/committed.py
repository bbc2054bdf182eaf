"""Driver side of read_committed reads of the remote tier: the aborted transactions that each
task reading a remote segment must drop.

Owns: collecting, once per partition and planning, the aborted transactions overlapping the
offsets that tasks read from object storage, the way a broker does for a read_committed fetch
of its remote tier (Kafka's ``collectAbortedTransactions``): the uploaded ``.txnindex`` objects
of the remote segment holding the first offset and of every later one, until an entry proves
that no later segment can add one; then, if the remote tier cannot prove it, the leader's
indexes for the rest. Must not: import pyspark or read records (one batch fetched from the
leader aside, for the aborted list its summary carries).

Why the leader's part is one fetch. An aborted transaction's entry sits in the index of the
segment holding its ABORT marker, which may lie past the remote tier's end (the remote segment
ending at ``remote_end`` was copied below the last stable offset; a later segment, not copied
yet, may hold the marker of a transaction that began before ``remote_end``). A read_committed
fetch of the batch holding ``remote_end - 1`` makes the leader collect, from that batch on,
every entry whose marker is at or after it and whose transaction began before the batch's
end: that covers every transaction a remote task can overlap (they all began before
``remote_end``), over the leader's remote and local indexes alike. ``remote_end - 1`` is below
the last stable offset (copies stop there), so that fetch always returns a batch.

Entries carry their markers' offsets, so a task's filter needs no marker (txn_filter.py).
Parsed ``.txnindex`` objects are kept per segment id for the planner's life (a stream plans
every micro-batch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from datasource.planning import OffsetRange, RemoteStore, holding_segment
from logstore.client.fetcher import fetch_request
from logstore.client.metadata import ClusterMetadata
from logstore.errors import CorruptRecordError, LogstoreError
from logstore.messages.fetch import READ_COMMITTED
from logstore.model import TopicPartition
from logstore.segments.format import TXN_INDEX_SUFFIX
from logstore.segments.txn_index import TxnIndexEntry, collect_entries, parse_entries
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.naming import segment_key
from logstore.tiering.store import RemoteObjectNotFoundError
from logstore.txn_filter import AbortedTxn

if TYPE_CHECKING:
    from logstore.tiering.store import ObjectStore

log = logging.getLogger(__name__)


class AbortedListError(LogstoreError, RuntimeError):
    """The aborted transactions of a remote range could not be learnt; the read cannot be
    read_committed."""


@dataclass
class RemoteAbortedCollector:
    """Collects for one planner (its connections and its ``.txnindex`` cache)."""

    metadata: ClusterMetadata
    _indexes: dict[str, list[TxnIndexEntry]] = field(default_factory=dict)
    _stores: dict[str, ObjectStore] = field(default_factory=dict)

    def per_task(self, ranges: Sequence[OffsetRange], store: RemoteStore,
                 segments: Mapping[TopicPartition, Sequence[RemoteLogSegmentMetadata]]
                 ) -> list[tuple[AbortedTxn, ...]]:
        """For each of ``ranges`` (the remote tasks' ranges), the aborted transactions
        overlapping it; one collection per partition, over the span of its ranges."""
        spans: dict[TopicPartition, tuple[int, int]] = {}
        for r in ranges:
            lo, hi = spans.get(r.tp, (r.start, r.end))
            spans[r.tp] = (min(lo, r.start), max(hi, r.end))
        found = {tp: self.collect(tp, lo, hi, segments.get(tp, ()), store)
                 for tp, (lo, hi) in spans.items()}
        return [tuple(a for a in found[r.tp] if _overlaps(a, r)) for r in ranges]

    def collect(self, tp: TopicPartition, start: int, end: int,
                segments: Sequence[RemoteLogSegmentMetadata], store: RemoteStore
                ) -> list[AbortedTxn]:
        """The aborted transactions overlapping ``[start, end)`` of ``tp``; ``segments``: the
        FINISHED remote segments from the one holding ``start`` to the remote tier's end."""
        found: list[TxnIndexEntry] = []
        offset = start
        # Bounded: every step moves to a later segment.
        while (segment := holding_segment(segments, offset)) is not None:
            more, complete = collect_entries(self._entries(store, segment), start, end)
            found += more
            if complete:
                return [e.aborted_txn() for e in found]
            offset = segment.next_offset
        if offset == start:
            raise AbortedListError(f"{tp}: no remote segment holds offset {start}")
        return [e.aborted_txn() for e in found] + self.from_leader(tp, offset)

    def from_leader(self, tp: TopicPartition, remote_end: int) -> list[AbortedTxn]:
        """The aborted transactions the leader lists for the batch holding ``remote_end - 1``
        (see the module docstring)."""
        response = self.metadata.leader_connection(tp).fetch(fetch_request(
            tp.topic, {tp.partition: remote_end - 1}, max_wait_ms=0, max_bytes=1,
            partition_max_bytes=1, end_offset=remote_end, isolation_level=READ_COMMITTED))
        summary = response.partitions.get(tp.partition)
        if summary is not None:
            summary.raise_error(f"read_committed fetch of {tp} at {remote_end - 1}")
        if summary is None or not any(b.partition == tp.partition for b in response.batches):
            raise AbortedListError(f"{tp}: the leader returned no batch at offset "
                                   f"{remote_end - 1} to list the aborted transactions past "
                                   "the remote tier's end")
        if any(a.last_offset < 0 for a in summary.aborted_transactions):
            raise AbortedListError(f"{tp}: the leader listed an aborted transaction without "
                                   "its marker's offset")
        return [AbortedTxn(a.producer_id, a.first_offset, a.last_offset)
                for a in summary.aborted_transactions]

    def _entries(self, store: RemoteStore, segment: RemoteLogSegmentMetadata
                 ) -> list[TxnIndexEntry]:
        cached = self._indexes.get(segment.segment_id)
        if cached is not None:
            return cached
        key = segment_key(segment, TXN_INDEX_SUFFIX)
        try:
            entries = parse_entries(self._store(store).read_object(key))
        except RemoteObjectNotFoundError as e:
            if segment.has_txn_index:
                raise CorruptRecordError(
                    f"{segment.describe()}: its remote transaction index {key} is missing, so "
                    "which of its records were aborted is not known") from e
            entries = []  # copied without one: no transaction was aborted in it
        except ValueError as e:
            raise CorruptRecordError(f"{segment.describe()}: remote transaction index {key}: "
                                     f"{e}") from e
        self._indexes[segment.segment_id] = entries
        return entries

    def _store(self, store: RemoteStore) -> ObjectStore:
        if store.uri not in self._stores:
            from logstore.tiering.fsspec_store import FsspecObjectStore

            self._stores[store.uri] = FsspecObjectStore(store.uri, store.options)
        return self._stores[store.uri]


def _overlaps(aborted: AbortedTxn, r: OffsetRange) -> bool:
    """Whether an aborted transaction can hold records of ``r`` (it began before the range's
    end and its marker is not before the range's start)."""
    last = aborted.last_offset
    return aborted.first_offset < r.end and (last is None or last >= r.start)


__all__ = ["AbortedListError", "RemoteAbortedCollector"]
