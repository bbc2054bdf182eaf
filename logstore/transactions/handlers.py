"""Handlers of the transaction API on one ``__transaction_state`` partition: init_producer_id,
add_partitions_to_txn (and its verify-only form), prepare_txn, end_txn (alone or with prepared
transactions of other ids) and the completion a marker job reports.

Owns: Kafka's answers, each naming the transactional id: a producer id or epoch that is not the
id's current one is INVALID_PRODUCER_ID_MAPPING or PRODUCER_FENCED; a transaction whose markers
are on the way is CONCURRENT_TRANSACTIONS (the client retries); a request the state does not
allow is INVALID_TXN_STATE; a timeout above ``transaction_max_timeout_ms`` is
INVALID_TRANSACTION_TIMEOUT. A decided transaction (PrepareCommit) is never aborted: nothing
here moves it anywhere but to CompleteCommit. Must not: do I/O, take locks or read clocks.
"""

from __future__ import annotations

from concurrent.futures import Future

from logstore.coordinator import CoordinatorResult
from logstore.errors import (
    ApiError,
    ConcurrentTransactionsError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionAbortableError,
)
from logstore.messages import error_kw
from logstore.messages.produce import InitProducerIdRequest, InitProducerIdResponse
from logstore.messages.transactions import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    PreparedTxn,
    PrepareTxnRequest,
    PrepareTxnResponse,
    TxnPartitionResult,
)
from logstore.model import TopicPartition
from logstore.transactions.coordinator import TxnCoordinatorShard
from logstore.transactions.state import (
    DECIDING,
    IDLE,
    MAX_PRODUCER_EPOCH,
    TransactionMetadata,
    TxnState,
    bumped,
    fence_epoch,
    validate_transactional_id,
)

_PREPARE = {True: TxnState.PREPARE_COMMIT, False: TxnState.PREPARE_ABORT}
_COMPLETE = {True: TxnState.COMPLETE_COMMIT, False: TxnState.COMPLETE_ABORT}


def requested_partitions(req: AddPartitionsToTxnRequest) -> list[TopicPartition]:
    return [TopicPartition(t.topic, p) for t in req.topics for p in t.partitions]


# -- init_producer_id ------------------------------------------------------------------------


def init_producer_id(shard: TxnCoordinatorShard, req: InitProducerIdRequest, now_ms: int,
                     new_producer_id: int) -> CoordinatorResult[InitProducerIdResponse]:
    """A producer id and a bumped epoch for the transactional id (``new_producer_id`` when the
    id is new or its epoch is exhausted); the previous instance is fenced. An open transaction
    is aborted at a fenced epoch (CONCURRENT_TRANSACTIONS: retry once it completes), except a
    Prepared one with ``keep_prepared_txn``, which stays for the caller to complete."""
    tid = validate_transactional_id(req.transactional_id or "")
    _check_init(shard, req)
    meta = shard.txns.get(tid)
    if meta is None or meta.state == TxnState.DEAD:
        fresh = TransactionMetadata(tid, new_producer_id, 0, req.transaction_timeout_ms,
                                    last_update_ms=now_ms, two_phase=req.enable_two_phase_commit)
        return shard.changed([fresh], now_ms, _ids(fresh))
    if req.producer_id >= 0:  # KIP-360: an existing producer re-initialising names itself
        meta.check_producer(req.producer_id, req.producer_epoch)
    if meta.state in DECIDING:
        raise ConcurrentTransactionsError(
            f"transactional id {tid}: its transaction is completing ({meta.state}); retry")
    if meta.state == TxnState.PREPARED and req.keep_prepared_txn:
        kept = meta.moved(TxnState.PREPARED, now_ms, producer_epoch=fence_epoch(meta),
                          timeout_ms=req.transaction_timeout_ms)
        return shard.changed([kept], now_ms, _ids(kept, meta.prepared))
    if meta.state not in IDLE:  # Ongoing, or Prepared without keep_prepared_txn
        fenced = meta.moved(TxnState.PREPARE_ABORT, now_ms, producer_epoch=fence_epoch(meta))
        busy = ConcurrentTransactionsError(
            f"transactional id {tid}: its open transaction is being aborted to fence the "
            f"previous producer (epoch {meta.producer_epoch}); retry")
        return shard.changed([fenced], now_ms, InitProducerIdResponse(**error_kw(busy)))
    producer_id, epoch = bumped(meta, new_producer_id)
    ready = meta.moved(TxnState.EMPTY, now_ms, producer_id=producer_id, producer_epoch=epoch,
                       timeout_ms=req.transaction_timeout_ms, partitions=frozenset(),
                       txn_start_ms=-1, two_phase=req.enable_two_phase_commit, prepared=None)
    return shard.changed([ready], now_ms, _ids(ready))


def _check_init(shard: TxnCoordinatorShard, req: InitProducerIdRequest) -> None:
    limit = shard.config.transaction_max_timeout_ms
    if not 0 < req.transaction_timeout_ms <= limit:
        raise InvalidTransactionTimeoutError(
            f"transactional id {req.transactional_id}: transaction_timeout_ms "
            f"{req.transaction_timeout_ms} must be in (0, {limit}] (the broker's "
            "transaction_max_timeout_ms)")
    if req.keep_prepared_txn and not req.enable_two_phase_commit:
        raise InvalidRequestError(
            f"transactional id {req.transactional_id}: keep_prepared_txn needs "
            "enable_two_phase_commit")


def _ids(meta: TransactionMetadata, prepared: tuple[int, int] | None = None
         ) -> InitProducerIdResponse:
    pid, epoch = prepared or (-1, -1)
    return InitProducerIdResponse(producer_id=meta.producer_id,
                                  producer_epoch=meta.producer_epoch,
                                  prepared_producer_id=pid, prepared_producer_epoch=epoch)


# -- partitions ------------------------------------------------------------------------------


def add_partitions(shard: TxnCoordinatorShard, req: AddPartitionsToTxnRequest,
                   tps: list[TopicPartition], now_ms: int
                   ) -> CoordinatorResult[AddPartitionsToTxnResponse]:
    """Add ``tps`` to the producer's transaction, opening it if none is open."""
    meta = shard.get(req.transactional_id)
    meta.check_producer(req.producer_id, req.producer_epoch)
    tid = req.transactional_id
    if meta.state in DECIDING:
        raise ConcurrentTransactionsError(
            f"transactional id {tid}: its previous transaction is completing; retry")
    if meta.state == TxnState.PREPARED:
        raise InvalidTxnStateError(f"transactional id {tid}: its transaction is Prepared; "
                                   "nothing can be added until it is committed or aborted")
    response = AddPartitionsToTxnResponse(results=[
        TxnPartitionResult(topic=tp.topic, partition=tp.partition) for tp in tps])
    partitions = meta.partitions | set(tps)
    if meta.state == TxnState.ONGOING and partitions == meta.partitions:
        return CoordinatorResult.answer(response)
    start = meta.txn_start_ms if meta.state == TxnState.ONGOING else now_ms
    return shard.changed([meta.moved(TxnState.ONGOING, now_ms, partitions=partitions,
                                     txn_start_ms=start, prepared=None)], now_ms, response)


def verify(shard: TxnCoordinatorShard, req: AddPartitionsToTxnRequest
           ) -> AddPartitionsToTxnResponse:
    """KIP-890 part 1, for partition leaders: is each partition in this producer's ongoing
    transaction? Per partition: INVALID_TXN_STATE when the transaction is ongoing without it,
    TRANSACTION_ABORTABLE when no transaction is ongoing (it ended, or is ending)."""
    meta = shard.get(req.transactional_id)
    meta.check_producer(req.producer_id, req.producer_epoch)
    results = []
    for tp in requested_partitions(req):
        error: ApiError | None = None
        if meta.state != TxnState.ONGOING:
            error = TransactionAbortableError(
                f"transactional id {req.transactional_id}: no transaction is ongoing "
                f"({meta.state}); a write to {tp} must be part of a new transaction")
        elif tp not in meta.partitions:
            error = InvalidTxnStateError(
                f"transactional id {req.transactional_id}: {tp} was not added to the "
                "ongoing transaction")
        results.append(TxnPartitionResult(topic=tp.topic, partition=tp.partition,
                                           **error_kw(error)))
    return AddPartitionsToTxnResponse(results=results)


# -- prepare ---------------------------------------------------------------------------------


def prepare_txn(shard: TxnCoordinatorShard, req: PrepareTxnRequest, now_ms: int
                ) -> CoordinatorResult[PrepareTxnResponse]:
    """Two-phase participation: the producer's writes are done; its transaction waits,
    Prepared, for a decision (an empty transaction may be prepared too). Preparing bumps the
    epoch (KIP-890 part 2's per-transaction bump, at prepare as in KIP-939), and the response
    is the (producer id, epoch) the transaction is prepared under: it names this transaction
    alone, so a stale state can never decide a later transaction of the same producer, and
    the producer goes on at the new epoch. A retry at the epoch it prepared from gets the
    same answer."""
    meta = shard.get(req.transactional_id)
    tid = req.transactional_id
    if meta.state == TxnState.PREPARED and req.producer_id == meta.producer_id and \
            meta.prepared == (req.producer_id, req.producer_epoch + 1) == \
            (meta.producer_id, meta.producer_epoch):
        return CoordinatorResult.answer(PrepareTxnResponse(  # a retry
            producer_id=meta.producer_id, producer_epoch=meta.producer_epoch))
    meta.check_producer(req.producer_id, req.producer_epoch)
    if not meta.two_phase:
        raise InvalidTxnStateError(f"transactional id {tid} was not initialised with "
                                   "enable_two_phase_commit; it cannot prepare")
    if meta.state == TxnState.PREPARED:
        raise InvalidTxnStateError(f"transactional id {tid}: its transaction is already "
                                   f"Prepared (producer {meta.producer_id} epoch "
                                   f"{meta.producer_epoch})")
    if meta.state in DECIDING:
        raise InvalidTxnStateError(f"transactional id {tid}: its transaction is already "
                                   f"decided ({meta.state})")
    if meta.producer_epoch >= MAX_PRODUCER_EPOCH:
        raise ProducerFencedError(
            f"transactional id {tid}: producer {meta.producer_id} has used up its epochs "
            f"({meta.producer_epoch}); init_transactions again for a new producer id")
    epoch = meta.producer_epoch + 1
    start = meta.txn_start_ms if meta.state == TxnState.ONGOING else now_ms
    prepared = meta.moved(TxnState.PREPARED, now_ms, txn_start_ms=start,
                          producer_epoch=epoch, prepared=(meta.producer_id, epoch))
    return shard.changed([prepared], now_ms, PrepareTxnResponse(
        producer_id=meta.producer_id, producer_epoch=epoch))


# -- end -------------------------------------------------------------------------------------


def end_txn(shard: TxnCoordinatorShard, req: EndTxnRequest, now_ms: int
            ) -> CoordinatorResult[Future[None]]:
    """Decide the producer's transaction (PrepareCommit or PrepareAbort), and with
    ``with_prepared`` the given Prepared transactions of other ids, all in one append; the
    future resolves once every one of them is complete (its markers written)."""
    if req.with_prepared and not req.committed:
        raise InvalidRequestError(f"transactional id {req.transactional_id}: with_prepared "
                                  "commits; it cannot abort")
    meta = shard.get(req.transactional_id)
    meta.check_producer(req.producer_id, req.producer_epoch)
    own = _own_decision(meta, req.committed, bool(req.with_prepared), now_ms)
    others = [_prepared_decision(shard, p, req.transactional_id, now_ms)
              for p in req.with_prepared]
    decided = [m for m in [own, *others] if m is not None]
    ids = [req.transactional_id, *(p.transactional_id for p in req.with_prepared)]
    done: Future[None] = Future()

    def wait() -> None:
        _wait_all(shard, ids, done)
    if not decided:
        return CoordinatorResult.answer(done, wait)
    return shard.changed(decided, now_ms, done, then=wait)


def _own_decision(meta: TransactionMetadata, committed: bool, deciding_others: bool,
                  now_ms: int) -> TransactionMetadata | None:
    """The caller's new metadata, None when it needs no record (a retry, or a caller that
    only decides others' transactions)."""
    tid = meta.transactional_id
    if meta.state in (TxnState.ONGOING, TxnState.PREPARED):
        return meta.moved(_PREPARE[committed], now_ms)
    if meta.state in (_PREPARE[committed], _COMPLETE[committed]):
        return None  # a retry: wait for (or report) the completion
    if meta.state in IDLE and deciding_others:
        return None
    if meta.state == TxnState.EMPTY:
        raise InvalidTxnStateError(f"transactional id {tid} has no transaction to "
                                   f"{'commit' if committed else 'abort'}")
    raise InvalidTxnStateError(f"transactional id {tid}: cannot "
                               f"{'commit' if committed else 'abort'} a transaction in "
                               f"state {meta.state}")


def _prepared_decision(shard: TxnCoordinatorShard, p: PreparedTxn, caller: str, now_ms: int
                       ) -> TransactionMetadata | None:
    """The commit of another id's Prepared transaction; None if it is already committed at
    that producer id and epoch (a retry); else INVALID_TXN_STATE or PRODUCER_FENCED naming
    it, which fails the whole request."""
    tid = p.transactional_id
    meta = shard.txns.get(tid)
    if tid == caller or meta is None:
        raise InvalidTxnStateError(f"with_prepared: transactional id {tid} is "
                                   f"{'the caller' if tid == caller else 'not known here'}")
    if (meta.producer_id, meta.producer_epoch) != (p.producer_id, p.producer_epoch):
        raise ProducerFencedError(
            f"with_prepared: transactional id {tid} is at producer {meta.producer_id} epoch "
            f"{meta.producer_epoch}, not the prepared producer {p.producer_id} epoch "
            f"{p.producer_epoch}")
    if meta.state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT):
        return None
    if meta.state != TxnState.PREPARED:
        raise InvalidTxnStateError(f"with_prepared: transactional id {tid} is {meta.state}, "
                                   "not Prepared")
    return meta.moved(TxnState.PREPARE_COMMIT, now_ms)


def _wait_all(shard: TxnCoordinatorShard, ids: list[str], done: Future[None]) -> None:
    """Resolve ``done`` once each of ``ids`` has completed its transaction."""
    left = [len(ids)]

    def one(future: Future[None]) -> None:
        left[0] -= 1
        error = future.exception()
        if done.done():
            return
        if error is not None:
            done.set_exception(error)  # the coordinator moved: the client asks the new one
        elif left[0] == 0:
            done.set_result(None)
    for tid in ids:
        future: Future[None] = Future()
        future.add_done_callback(one)
        shard.wait_for_completion(tid, future)


def complete_txn(shard: TxnCoordinatorShard, transactional_id: str, producer_id: int,
                 producer_epoch: int, committed: bool, now_ms: int
                 ) -> CoordinatorResult[bool]:
    """A marker job is done: PrepareX -> CompleteX, if the transaction is still the one the
    job was for (False, nothing written, otherwise)."""
    meta = shard.txns.get(transactional_id)
    if meta is None or meta.state != _PREPARE[committed] or \
            (meta.producer_id, meta.producer_epoch) != (producer_id, producer_epoch):
        return CoordinatorResult.answer(False)
    done = meta.moved(_COMPLETE[committed], now_ms, partitions=frozenset(), txn_start_ms=-1)
    return shard.changed([done], now_ms, True)

