"""What ``Consumer.poll`` returns per partition: its records as a Sequence of ConsumerRecords
built from the Arrow columns only when they are read.

Owns: turning a drained table (the topic's columns plus ``offset`` and ``partition``) into
ConsumerRecords. Must not: fetch, or hold positions (``fetcher.py``, ``consumer.py`` do).

Iterating builds each record as it is reached, with no Python frame per record: every field
is converted by one C loop (Arrow's conversion of a binary column, NumPy's ``tolist`` of the
timestamps, a ``range`` for contiguous offsets) and the records come out of ``map`` over
``tuple.__new__``. A record the caller drops is freed at once, so the garbage collector never
sees a poll's worth of young tuples. ``records[i]`` builds one record; a slice is a view.
Every record of a view has the view's ``timestamp_type`` (from its batch's header): one object
repeated, no work per record, unless the view's batches differ (a topic whose
``message_timestamp_type`` was altered), when a list gives each record its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any, overload

import numpy as np
import pyarrow as pa

from logstore.model import CREATE_TIME, ConsumerRecord, TopicPartition

_RESERVED = ["key", "timestamp", "headers", "offset", "partition"]


class RecordsView(Sequence[ConsumerRecord]):
    """One partition's polled records (equal to a list of the same ConsumerRecords)."""

    __slots__ = ("_table", "_timestamp_type", "_tp")

    def __init__(self, tp: TopicPartition, table: pa.Table,
                 timestamp_type: int | np.ndarray = CREATE_TIME) -> None:
        """``timestamp_type``: every record's, or one per record (batches that differ)."""
        self._tp = tp
        self._table = table
        self._timestamp_type = timestamp_type

    def __len__(self) -> int:
        return int(self._table.num_rows)

    @overload
    def __getitem__(self, index: int) -> ConsumerRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ConsumerRecord]: ...

    def __getitem__(self, index: int | slice) -> ConsumerRecord | Sequence[ConsumerRecord]:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return list(self)[index]
            return RecordsView(self._tp, self._table.slice(start, max(stop - start, 0)),
                               self._types(start, max(stop, start)))
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"record {index} of {n} polled from {self._tp}")
        return next(iter(RecordsView(self._tp, self._table.slice(i, 1), self._types(i, i + 1))))

    def _types(self, start: int, stop: int) -> int | np.ndarray:
        kinds = self._timestamp_type
        return kinds if isinstance(kinds, int) else kinds[start:stop]

    def __iter__(self) -> Iterator[ConsumerRecord]:
        t, n = self._table, len(self)
        fields = (repeat(self._tp.topic, n), repeat(self._tp.partition, n), _offsets(t),
                  t.column("timestamp").cast(pa.int64()).to_numpy().tolist(),
                  _binary(t.column("key")), _values(t), _headers(t.column("headers")),
                  repeat(kinds, n) if isinstance(kinds := self._timestamp_type, int)
                  else kinds.tolist())
        # tuple.__new__ builds each record in C; calling the NamedTuple runs its Python __new__.
        return map(tuple.__new__, repeat(ConsumerRecord, n), zip(*fields, strict=False))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordsView | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-list semantics: unhashable

    def __repr__(self) -> str:
        return repr(list(self))


def _offsets(table: pa.Table) -> Iterable[int]:
    column = table.column("offset")
    n = len(column)
    if not n:
        return ()
    first, last = column[0].as_py(), column[n - 1].as_py()
    if last - first == n - 1:  # offsets only increase: a contiguous run
        return range(first, last + 1)
    return column.to_numpy().tolist()  # type: ignore[no-any-return]


def _binary(column: pa.ChunkedArray) -> Iterable[bytes | None]:
    if column.null_count == len(column):
        return repeat(None, len(column))
    return column.to_numpy(zero_copy_only=False).tolist()  # type: ignore[no-any-return]


def _values(table: pa.Table) -> Iterable[Any]:
    """Bytes, or a typed topic's value columns as a dict per record."""
    if "value" in table.column_names:
        return _binary(table.column("value"))
    values: list[dict[str, Any]] = table.drop_columns(_RESERVED).to_pylist()
    return values


def _headers(column: pa.ChunkedArray) -> Iterable[Any]:
    """A record without headers (null) has the shared empty tuple, whatever its neighbours."""
    if column.null_count == len(column):
        return repeat((), len(column))
    return [() if hs is None else [(h["key"], h["value"]) for h in hs]
            for hs in column.to_pylist()]
