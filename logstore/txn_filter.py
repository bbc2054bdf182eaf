"""What a read_committed reader keeps of the batches it fetched: the reading half of transactions.

Owns: the isolation levels, the aborted-transaction list a read_committed fetch carries (Kafka's
FetchResponse.AbortedTransactions), and the filter that drops control batches and the batches of
aborted transactions. The consumer, the Spark reader, the file reader and the log cleaner share
it. Must not: do I/O, or loop over records in Python (the filter is NumPy over arrays of batch
header fields; the only Python loops run once per batch header or per aborted transaction).

The rule is Kafka's consumer algorithm (a min-heap of aborted transactions by first offset and a
set of producers inside an aborted transaction): walking the batches in offset order, producer P
enters the set when the walk reaches the first offset of one of P's aborted transactions and
leaves it at P's next ABORT marker. Control batches are dropped; a transactional batch of a
producer in the set is dropped; everything else is kept.

Vectorised form: a transactional batch of P at base offset b is dropped iff, among P's events -
aborted starts at offsets <= b and abort ends before b - the latest is a start. Abort ends are
the ABORT markers among the batches and, when known, the aborted transactions' last offsets
(the offset of the ABORT marker, which the log's transaction index holds). With the last
offsets the filter needs no marker in the data: it can run chunk by chunk, and a marker that
compaction removed between a reader's index read and its data read cannot leave a producer in
the set (compaction removes a marker only after the transaction's data).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from logstore.records import (
    FLAG_CONTROL,
    FLAG_TRANSACTIONAL,
    BatchHeader,
    ControlType,
    control_marker,
)

BoolArray = npt.NDArray[np.bool_]

_START, _END, _QUERY = 0, 1, 2  # at one offset a start sorts before an end, both before a batch


class IsolationLevel(IntEnum):
    """Kafka's isolation levels and their wire numbers."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction overlapping a fetched range: its producer and the offset of its
    first batch, and, when the sender knows it, the offset of its ABORT marker."""

    producer_id: int
    first_offset: int
    last_offset: int | None = None


def is_abort_marker(header: BatchHeader, decode: Callable[[], pa.RecordBatch]) -> bool:
    """Whether the batch is an ABORT marker; ``decode`` (the batch's records) is called only for
    control batches. Raises CorruptRecordError when a control batch holds no marker."""
    return header.is_control and control_marker(decode()).type is ControlType.ABORT


def header_arrays(headers: Sequence[BatchHeader]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(producer ids, base offsets, flags) of ``headers`` as int64 arrays."""
    n = len(headers)
    return (np.fromiter((h.producer_id for h in headers), np.int64, n),
            np.fromiter((h.base_offset for h in headers), np.int64, n),
            np.fromiter((h.flags for h in headers), np.int64, n))


def keep_mask(producer_ids: npt.ArrayLike, base_offsets: npt.ArrayLike, flags: npt.ArrayLike,
              abort_markers: npt.ArrayLike, aborted: Sequence[AbortedTxn],
              prior_ends: Mapping[int, int] | None = None) -> BoolArray:
    """Which of the batches (given column-wise, in offset order) a read_committed reader keeps.
    ``abort_markers[i]`` says batch i is an ABORT marker; ``prior_ends`` maps a producer to the
    offset of its latest ABORT marker in batches before these (chunked use)."""
    pids = np.asarray(producer_ids, dtype=np.int64)
    bases = np.asarray(base_offsets, dtype=np.int64)
    bits = np.asarray(flags, dtype=np.int64)
    keep: BoolArray = (bits & FLAG_CONTROL) == 0
    queries = keep & ((bits & FLAG_TRANSACTIONAL) != 0)
    if not aborted or not queries.any():
        return keep
    ends = np.asarray(abort_markers, dtype=bool) & ~keep
    end_pids, end_offsets = _known_ends(aborted, prior_ends or {})
    starts = (np.fromiter((a.producer_id for a in aborted), np.int64, len(aborted)),
              np.fromiter((a.first_offset for a in aborted), np.int64, len(aborted)))
    dropped = _dropped(starts, (np.concatenate([pids[ends], end_pids]),
                                np.concatenate([bases[ends], end_offsets])),
                       (pids[queries], bases[queries]))
    keep[np.flatnonzero(queries)] = ~dropped
    return keep


def _known_ends(aborted: Sequence[AbortedTxn], prior_ends: Mapping[int, int]
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    known = [(a.producer_id, a.last_offset) for a in aborted if a.last_offset is not None]
    known += list(prior_ends.items())
    if not known:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    pairs = np.asarray(known, dtype=np.int64)
    return pairs[:, 0], pairs[:, 1]


def _dropped(starts: tuple[np.ndarray, np.ndarray], ends: tuple[np.ndarray, np.ndarray],
             queries: tuple[np.ndarray, np.ndarray]) -> BoolArray:
    """For each query (producer, base offset): is the producer's latest event at or before it
    an aborted start? One sort of all events by (producer, offset, kind), then a running
    maximum carries the position of the latest event to every query after it."""
    kinds = np.concatenate([np.full(len(starts[0]), _START), np.full(len(ends[0]), _END),
                            np.full(len(queries[0]), _QUERY)])
    pids = np.concatenate([starts[0], ends[0], queries[0]])
    offsets = np.concatenate([starts[1], ends[1], queries[1]])
    order = np.lexsort((kinds, offsets, pids))
    sorted_pids, sorted_kinds = pids[order], kinds[order]
    positions = np.where(sorted_kinds != _QUERY, np.arange(len(order)), -1)
    latest = np.maximum.accumulate(positions)
    found = latest >= 0
    latest = np.where(found, latest, 0)
    hit = found & (sorted_pids[latest] == sorted_pids) & (sorted_kinds[latest] == _START)
    unsorted = np.empty(len(order), dtype=bool)
    unsorted[order] = hit
    result: BoolArray = unsorted[len(kinds) - len(queries[0]):]
    return result


class ReadCommittedFilter:
    """The filter over one fetched range delivered in chunks (a segment, a fetch response at a
    time): it remembers the ABORT markers of earlier chunks."""

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        self._aborted = list(aborted)
        self._producers = {a.producer_id for a in aborted}
        self._ends: dict[int, int] = {}

    def keep(self, headers: Sequence[BatchHeader], abort_markers: Sequence[bool]) -> BoolArray:
        """Which of ``headers`` (the next chunk, in offset order) to keep."""
        pids, bases, flags = header_arrays(headers)
        markers = np.asarray(abort_markers, dtype=bool).reshape(len(headers))
        mask = keep_mask(pids, bases, flags, markers, self._aborted, self._ends)
        for i in np.flatnonzero(markers):  # once per ABORT marker batch
            if int(pids[i]) in self._producers:
                self._ends[int(pids[i])] = int(bases[i])
        return mask


def committed_mask(headers: Sequence[BatchHeader], abort_markers: Sequence[bool],
                   aborted: Sequence[AbortedTxn]) -> BoolArray:
    """Which of ``headers`` (one whole fetched range, in offset order) to keep."""
    return ReadCommittedFilter(aborted).keep(headers, abort_markers)


def row_mask(keep: BoolArray, record_counts: npt.ArrayLike) -> BoolArray:
    """The batch mask ``keep`` spread over the rows of the batches (for concatenated data)."""
    rows: BoolArray = np.repeat(keep, np.asarray(record_counts, dtype=np.int64))
    return rows
