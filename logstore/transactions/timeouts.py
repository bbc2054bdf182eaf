"""Time in the transaction coordinator: transaction timeouts and transactional id expiration.

Owns: the tick over one shard. An Ongoing transaction open longer than its producer's
``transaction_timeout_ms``, and a Prepared one waiting longer than the broker's
``transaction_prepared_timeout_ms``, is aborted at a bumped epoch (PrepareAbort), so the
producer that left it is fenced (PRODUCER_FENCED) and its late writes are refused by every
partition the abort marker reaches. A decided transaction (PrepareCommit, PrepareAbort) is never
touched: its markers are owed whatever the time. An id idle (no transaction open) for longer
than ``transactional_id_expiration_ms`` is removed with a tombstone. Must not: do I/O, take
locks or read clocks.
"""

from __future__ import annotations

import logging

from logstore.coordinator import CoordinatorResult
from logstore.model import TRANSACTION_STATE_TOPIC
from logstore.transactions.coordinator import TxnCoordinatorShard
from logstore.transactions.log_records import records, tombstone
from logstore.transactions.state import IDLE, TransactionMetadata, TxnState, fence_epoch

log = logging.getLogger(__name__)


def tick(shard: TxnCoordinatorShard, now_ms: int) -> dict[str, CoordinatorResult[None]]:
    """A result for every transactional id with something due."""
    out: dict[str, CoordinatorResult[None]] = {}
    for tid, meta in list(shard.txns.items()):
        if _timed_out(shard, meta, now_ms):
            log.info("%s-%d: transactional id %s: %s transaction of producer %d epoch %d "
                     "timed out; aborting it at epoch %d", TRANSACTION_STATE_TOPIC,
                     shard.partition, tid, meta.state, meta.producer_id, meta.producer_epoch,
                     fence_epoch(meta))
            fenced = meta.moved(TxnState.PREPARE_ABORT, now_ms,
                                producer_epoch=fence_epoch(meta))
            out[tid] = shard.changed([fenced], now_ms, None)
        elif meta.state in IDLE and now_ms - meta.last_update_ms >= \
                shard.config.transactional_id_expiration_ms:
            out[tid] = _expire(shard, tid, now_ms)
    return out


def _timed_out(shard: TxnCoordinatorShard, meta: TransactionMetadata, now_ms: int) -> bool:
    if meta.state == TxnState.ONGOING:
        return now_ms >= meta.expires_at_ms
    if meta.state == TxnState.PREPARED:
        return now_ms - meta.last_update_ms >= shard.config.transaction_prepared_timeout_ms
    return False


def _expire(shard: TxnCoordinatorShard, tid: str, now_ms: int) -> CoordinatorResult[None]:
    def remove() -> None:
        shard.txns.pop(tid, None)
        log.info("%s-%d: transactional id %s expired", TRANSACTION_STATE_TOPIC,
                 shard.partition, tid)
    return CoordinatorResult(records(tombstone(tid), now_ms), None, remove)
