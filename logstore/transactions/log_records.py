"""The records of the ``__transaction_state`` topic.

Owns: the key and value encoding of a transactional id's ``TransactionMetadata`` and replaying
read batches into the latest metadata per id. Records (default topic schema, JSON bytes):

| key                 | value                                                              |
|---------------------|--------------------------------------------------------------------|
| ``["txn", id]``     | ``{"producer_id", "producer_epoch", "timeout_ms", "state",          |
|                     | "partitions": [[topic, partition], ...], "txn_start_ms",           |
|                     | "last_update_ms", "two_phase", "prepared": [pid, epoch] | null}``, |
|                     | null = the id expired (tombstone)                                  |

Keys are compact JSON arrays, so compaction keeps the latest record per id. Must not: do I/O
(the coordinator runtime reads and appends the partition) or hold transaction rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa

from logstore.coordinator import LoggedBatch, encode_rows
from logstore.model import TopicPartition
from logstore.transactions.state import TransactionMetadata, TxnState

TXN_KEY = "txn"
Rows = list[tuple[bytes, bytes | None]]


def txn_key(transactional_id: str) -> bytes:
    return orjson.dumps([TXN_KEY, transactional_id])


def txn_value(meta: TransactionMetadata) -> bytes:
    return orjson.dumps({
        "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
        "timeout_ms": meta.timeout_ms, "state": meta.state.value,
        "partitions": sorted([tp.topic, tp.partition] for tp in meta.partitions),
        "txn_start_ms": meta.txn_start_ms, "last_update_ms": meta.last_update_ms,
        "two_phase": meta.two_phase,
        "prepared": None if meta.prepared is None else list(meta.prepared)})


def decode_value(transactional_id: str, value: bytes) -> TransactionMetadata:
    v: dict[str, Any] = orjson.loads(value)
    prepared = v.get("prepared")
    return TransactionMetadata(
        transactional_id, int(v["producer_id"]), int(v["producer_epoch"]),
        int(v["timeout_ms"]), TxnState(v["state"]),
        frozenset(TopicPartition(t, int(p)) for t, p in v.get("partitions", [])),
        int(v.get("txn_start_ms", -1)), int(v.get("last_update_ms", -1)),
        bool(v.get("two_phase", False)),
        None if prepared is None else (int(prepared[0]), int(prepared[1])))


def rows_of(metas: Iterable[TransactionMetadata]) -> Rows:
    return [(txn_key(m.transactional_id), txn_value(m)) for m in metas]


def tombstone(transactional_id: str) -> Rows:
    return [(txn_key(transactional_id), None)]


def records(rows: Rows, now_ms: int) -> list[pa.RecordBatch]:
    """The batch to append for ``rows`` (all of them in one batch: one atomic append)."""
    return [encode_rows(rows, now_ms)] if rows else []


def replay(batches: Iterable[LoggedBatch]) -> dict[str, TransactionMetadata]:
    """The latest metadata of every transactional id in ``batches`` (tombstones remove)."""
    found: dict[str, TransactionMetadata] = {}
    for logged in batches:
        if logged.marker is not None:
            continue  # nothing writes markers here; a stray one carries no state
        keys = logged.records.column("key").to_pylist()
        values = logged.records.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            if key is None:
                continue
            kind, transactional_id = orjson.loads(key)
            if kind != TXN_KEY:
                continue
            if value is None:
                found.pop(transactional_id, None)
            else:
                found[transactional_id] = decode_value(transactional_id, value)
    return found
