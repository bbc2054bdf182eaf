"""Shared helpers of the transaction tests of the storage layer: transactional appends, the
read_committed view (fetch pages filtered as a client would) and the aborted-transaction
indexes."""

from __future__ import annotations

from functools import partial

import pyarrow as pa
from segment_helpers import keyed, make_batch

from logstore.records import FLAG_TRANSACTIONAL, ControlType, StoredBatch
from logstore.segments.file_reader import PartitionFiles
from logstore.segments.log import Log
from logstore.segments.results import AppendInfo
from logstore.txn_filter import AbortedTxn, IsolationLevel, committed_mask, is_abort_marker

COMMIT, ABORT = ControlType.COMMIT, ControlType.ABORT


class Producer:
    """A transactional producer's view of one partition: its id, epoch and next sequence."""

    def __init__(self, log: Log, producer_id: int, epoch: int = 0) -> None:
        self.log, self.producer_id, self.epoch, self.sequence = log, producer_id, epoch, 0

    def send(self, keys: list[bytes] | int, transactional: bool = True,
             values: list[bytes | None] | None = None) -> AppendInfo:
        batch = keyed(0, keys) if isinstance(keys, int) else make_batch(keys, values)
        info = self.log.append_as_leader(batch, producer_id=self.producer_id,
                                         producer_epoch=self.epoch, base_sequence=self.sequence,
                                         flags=FLAG_TRANSACTIONAL if transactional else 0)
        self.sequence += batch.num_rows
        return info

    def end(self, marker: ControlType, coordinator_epoch: int = 0) -> AppendInfo:
        return self.log.append_control_marker(self.producer_id, self.epoch, marker,
                                              coordinator_epoch)

    def bump(self) -> None:
        self.epoch, self.sequence = self.epoch + 1, 0


def abort_markers(batches: list[StoredBatch], schema: pa.Schema) -> list[bool]:
    return [is_abort_marker(b.header, partial(b.record_batch, schema)) for b in batches]


def kept_records(batches: list[StoredBatch], aborted: list[AbortedTxn], schema: pa.Schema,
                 start: int) -> list[tuple[int, bytes]]:
    """(offset, key) of the records a read_committed client keeps of one fetch response."""
    mask = committed_mask([b.header for b in batches], abort_markers(batches, schema), aborted)
    out = []
    for batch, kept in zip(batches, mask, strict=True):
        if kept:
            keys = batch.record_batch(schema).column("key").to_pylist()
            out += [(o, k) for o, k in zip(batch.offsets().tolist(), keys, strict=True)
                    if o >= start]
    return out


def committed(log: Log, start: int | None = None, page: int = 1 << 30,
              with_ends: bool = True) -> list[tuple[int, bytes]]:
    """Every record a read_committed consumer gets from ``start`` (the log start) on, fetching
    pages of ``page`` bytes and filtering each response on its own, as Kafka's consumer does.
    Without ``with_ends`` the aborted list is cut to Kafka's wire form (no marker offsets)."""
    offset = log.log_start_offset if start is None else start
    out: list[tuple[int, bytes]] = []
    while True:
        fetch = log.read(offset, page, isolation=IsolationLevel.READ_COMMITTED)
        if not fetch.batches:
            return out
        assert fetch.batches[-1].header.base_offset < fetch.last_stable_offset
        aborted = fetch.aborted_transactions if with_ends else [
            AbortedTxn(a.producer_id, a.first_offset) for a in fetch.aborted_transactions]
        out += kept_records(fetch.batches, aborted, log.schema, offset)
        offset = fetch.batches[-1].header.next_offset


def file_committed(log: Log, start: int, end: int) -> list[tuple[int, bytes]]:
    """What a Spark executor reading the files read_committed gets for [start, end)."""
    out = []
    for schema, batch in PartitionFiles(log.dir).read_committed(start, end,
                                                                log.last_stable_offset):
        assert not batch.header.is_control
        keys = batch.record_batch(schema).column("key").to_pylist()
        out += [(o, k) for o, k in zip(batch.offsets().tolist(), keys, strict=True)
                if start <= o < end]
    return out


def index_entries(log: Log) -> list[tuple[int, int, int]]:
    """(producer id, first offset, last offset) of every aborted-transaction index entry, each
    checked to lie in the segment that holds its marker."""
    infos = log.segments_info()
    out = []
    for seg, info in zip(log._state.segments, infos, strict=True):
        for entry in seg.txn_index.entries():
            assert info["base_offset"] <= entry.last_offset < info["next_offset"]
            out.append((entry.producer_id, entry.first_offset, entry.last_offset))
    return out
