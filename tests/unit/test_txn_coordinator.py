"""Unit tests of the transaction coordinator's state machine, with a FakeClock and an
in-memory log.

Goal: Kafka's transaction protocol on ``__transaction_state``: producer ids and epoch fencing,
transactions through Ongoing, PrepareX and CompleteX, timeouts that abort with an epoch bump,
two-phase participation (Prepared, keep_prepared_txn, with_prepared decided in one append),
Kafka's codes for every refusal (naming the transactional id), and state that survives a
replay. Method: ``TxnCoordinatorService`` (the pure handlers on the coordinator runtime) takes
typed requests against ``MemoryOffsetsLog``; a test completes the decided transactions itself
(``write_markers``), and time moves only when it advances the clock.
"""

from __future__ import annotations

import pytest

from logstore import errors
from logstore.messages.transactions import ListTransactionsRequest, PreparedTxn
from logstore.model import TopicPartition
from tests.unit.txn_coordinator_helpers import Harness, id_elsewhere, ids_on_one_partition

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_init_gives_a_producer_id_and_each_init_bumps_the_epoch(h: Harness) -> None:
    """Goal: a new transactional id gets a producer id at epoch 0; every later init keeps the
    id and bumps the epoch (fencing the previous instance). Method: three inits."""
    first = h.init("a")
    second = h.init("a")
    assert (first.error_code, first.producer_epoch) == (0, 0)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert h.state("a") == "Empty"


def test_a_committed_transaction_goes_through_prepare_commit_to_complete_commit(
        h: Harness) -> None:
    """Goal: add -> Ongoing; commit -> PrepareCommit (a marker job for every partition, the
    answer waiting); markers written -> CompleteCommit and the answer resolves. Method: one
    transaction over two partitions."""
    ids = h.init("a")
    h.add("a", ids.producer_id, 0, T0, T1)
    assert h.state("a") == "Ongoing"
    done = h.end("a", ids.producer_id, 0)
    assert h.state("a") == "PrepareCommit" and not done.done()
    (job,) = h.jobs
    assert (job.committed, job.partitions) == (True, frozenset({T0, T1}))
    assert h.write_markers() == 1
    assert done.result(1) is None and h.state("a") == "CompleteCommit"


def test_the_old_instance_is_fenced_with_producer_fenced(h: Harness) -> None:
    """Goal: once a new instance initialised, every request of the old epoch is
    PRODUCER_FENCED naming the id; another producer id is INVALID_PRODUCER_ID_MAPPING.
    Method: init twice, then add and end as the first instance."""
    old = h.init("a")
    h.init("a")
    with pytest.raises(errors.ProducerFencedError, match="transactional id a"):
        h.add("a", old.producer_id, 0)
    with pytest.raises(errors.ProducerFencedError):
        h.end("a", old.producer_id, 0)
    with pytest.raises(errors.InvalidProducerIdMappingError, match="transactional id a"):
        h.add("a", old.producer_id + 99, 1)


def test_init_aborts_an_open_transaction_at_a_fenced_epoch(h: Harness) -> None:
    """Goal: init on an Ongoing transaction aborts it at epoch + 1 and answers
    CONCURRENT_TRANSACTIONS; once the abort completes, init succeeds with a further bump.
    Method: open a transaction, init, complete the markers, init again."""
    ids = h.init("a")
    h.add("a", ids.producer_id, 0)
    busy = h.init("a")
    assert busy.error_code == errors.ErrorCode.CONCURRENT_TRANSACTIONS
    assert h.state("a") == "PrepareAbort" and h.describe("a").producer_epoch == 1
    (job,) = h.jobs
    assert (job.committed, job.producer_epoch) == (False, 1)
    with pytest.raises(errors.ConcurrentTransactionsError):
        h.init("a")
    h.write_markers()
    again = h.init("a")
    assert (again.error_code, again.producer_epoch) == (0, 2)


def test_a_timeout_above_the_maximum_is_refused_and_nothing_is_written(h: Harness) -> None:
    """Goal: transaction_timeout_ms above transaction_max_timeout_ms (or not positive) is
    INVALID_TRANSACTION_TIMEOUT naming the id; the log stays empty. Method: two inits."""
    for timeout in (h.config.transaction_max_timeout_ms + 1, 0):
        with pytest.raises(errors.InvalidTransactionTimeoutError, match="transactional id a"):
            h.init("a", timeout_ms=timeout)
    assert all(not batches for batches in h.log.logged.values())


@pytest.mark.parametrize("tid", ["", "x" * 250])
def test_an_empty_or_over_long_transactional_id_is_invalid_request(h: Harness, tid: str
                                                                   ) -> None:
    with pytest.raises(errors.InvalidRequestError, match="transactional id"):
        h.init(tid)


def test_an_expired_transaction_is_aborted_with_an_epoch_bump(h: Harness) -> None:
    """Goal: an Ongoing transaction past its timeout is aborted at epoch + 1 by the tick, so
    its producer is fenced; before the timeout nothing happens. Method: advance the clock to
    just before and just after the timeout."""
    ids = h.init("a", timeout_ms=5000)
    h.add("a", ids.producer_id, 0)
    h.clock.advance(4999)
    h.tick()
    assert h.state("a") == "Ongoing"
    h.clock.advance(1)
    h.tick()
    assert h.state("a") == "PrepareAbort" and h.describe("a").producer_epoch == 1
    h.write_markers()
    with pytest.raises(errors.ProducerFencedError):
        h.end("a", ids.producer_id, 0)
    assert h.state("a") == "CompleteAbort"


def test_a_decided_commit_is_never_aborted_and_survives_a_replay(h: Harness) -> None:
    """Goal: once PrepareCommit is written, no timeout, init or abort changes the decision;
    a coordinator that replays the log finishes it (its marker job comes back). Method:
    decide, let every timeout pass, try to abort, replay, complete."""
    ids = h.init("a", timeout_ms=1000)
    h.add("a", ids.producer_id, 0)
    h.end("a", ids.producer_id, 0)
    h.clock.advance(10 * h.config.transaction_prepared_timeout_ms)
    h.tick()
    assert h.state("a") == "PrepareCommit"
    with pytest.raises(errors.InvalidTxnStateError, match="PrepareCommit"):
        h.end("a", ids.producer_id, 0, committed=False)
    with pytest.raises(errors.ConcurrentTransactionsError):
        h.init("a")
    h.new_coordinator()
    assert h.state("a") == "PrepareCommit"
    assert [j.committed for j in h.jobs] == [True]
    h.write_markers()
    assert h.state("a") == "CompleteCommit"


def test_add_and_verify(h: Harness) -> None:
    """Goal: verify_only (a partition leader's KIP-890 check) changes nothing and answers per
    partition: OK in the ongoing transaction, INVALID_TXN_STATE outside it, and
    TRANSACTION_ABORTABLE when no transaction is ongoing; an old epoch is PRODUCER_FENCED.
    Method: verify before and after an add, and after the commit."""
    ids = h.init("a")
    pid = ids.producer_id
    before = h.add("a", pid, 0, T0, verify_only=True).results[0].error()
    assert isinstance(before, errors.TransactionAbortableError)
    h.add("a", pid, 0, T0)
    results = h.add("a", pid, 0, T0, T1, verify_only=True).results
    assert [r.error_code for r in results] == [0, errors.ErrorCode.INVALID_TXN_STATE]
    assert h.describe("a").topics[0].partitions == [0]
    h.end("a", pid, 0)
    h.write_markers()
    after = h.add("a", pid, 0, T0, verify_only=True).results[0]
    assert after.error_code == errors.ErrorCode.TRANSACTION_ABORTABLE
    h.init("a")
    with pytest.raises(errors.ProducerFencedError):
        h.add("a", pid, 0, T0, verify_only=True)


def test_commit_without_a_transaction_is_invalid_txn_state(h: Harness) -> None:
    ids = h.init("a")
    with pytest.raises(errors.InvalidTxnStateError, match="transactional id a has no "
                                                          "transaction to commit"):
        h.end("a", ids.producer_id, 0)


def test_an_unknown_producer_is_invalid_producer_id_mapping(h: Harness) -> None:
    with pytest.raises(errors.InvalidProducerIdMappingError, match="transactional id x"):
        h.add("x", 5, 0)


def test_ids_expire_after_the_expiration_time_with_a_tombstone(h: Harness) -> None:
    """Goal: an id idle longer than transactional_id_expiration_ms is removed (a tombstone),
    also after a replay; an id with an open transaction is not. Method: two ids, one open."""
    h.init("idle")
    busy = h.init("busy", timeout_ms=60_000)
    h.add("busy", busy.producer_id, 0)
    h.clock.advance(h.config.transactional_id_expiration_ms)
    h.tick()
    with pytest.raises(errors.InvalidProducerIdMappingError):
        h.describe("idle")
    h.new_coordinator()
    with pytest.raises(errors.InvalidProducerIdMappingError):
        h.describe("idle")
    assert h.state("busy") in ("Ongoing", "PrepareAbort")


def test_list_filters_by_state_producer_and_prefix(h: Harness) -> None:
    """Goal: list_transactions finds ids by state, producer id and prefix (the Spark sink
    finds its undecided Prepared transactions so). Method: three ids in three states."""
    ids = ids_on_one_partition(3, "sink")
    produced = {tid: h.init(tid, two_phase=True) for tid in ids}
    h.add(ids[0], produced[ids[0]].producer_id, 0)
    h.prepare(ids[1], produced[ids[1]].producer_id, 0)
    h.init("other-prepared", two_phase=True)

    def listed(**filters: object) -> set[str]:
        req = ListTransactionsRequest(**filters)  # type: ignore[arg-type]
        return {t.transactional_id for t in h.coord.list_transactions(req)}
    assert listed(state_filters=["Prepared"], transactional_id_prefix="sink") == {ids[1]}
    assert listed(state_filters=["Ongoing", "Empty"], transactional_id_prefix="sink-") == \
        {ids[0], ids[2]}
    assert listed(producer_id_filters=[produced[ids[2]].producer_id]) == {ids[2]}


# -- two-phase participation ---------------------------------------------------------------


def test_prepare_needs_two_phase_commit_and_blocks_further_adds(h: Harness) -> None:
    ids = h.init("a")
    h.add("a", ids.producer_id, 0)
    with pytest.raises(errors.InvalidTxnStateError, match="enable_two_phase_commit"):
        h.prepare("a", ids.producer_id, 0)
    two = h.init("b", two_phase=True)
    h.add("b", two.producer_id, 0)
    prepared = h.prepare("b", two.producer_id, 0)
    assert h.state("b") == "Prepared"
    with pytest.raises(errors.InvalidTxnStateError, match="Prepared"):
        h.add("b", two.producer_id, prepared.producer_epoch, T1)


def test_a_prepared_transaction_waits_for_its_own_longer_timeout(h: Harness) -> None:
    """Goal: a Prepared transaction outlives its producer's transaction timeout and is
    aborted (at a fenced epoch) only after transaction_prepared_timeout_ms. Method: advance
    past one, then the other."""
    ids = h.init("a", timeout_ms=1000, two_phase=True)
    h.add("a", ids.producer_id, 0)
    h.prepare("a", ids.producer_id, 0)  # epoch 1
    h.clock.advance(h.config.transaction_prepared_timeout_ms - 1)
    h.tick()
    assert h.state("a") == "Prepared"
    h.clock.advance(1)
    h.tick()
    assert h.state("a") == "PrepareAbort" and h.describe("a").producer_epoch == 2


def test_keep_prepared_returns_the_prepared_producer_and_the_new_instance_completes_it(
        h: Harness) -> None:
    """Goal: a new instance with keep_prepared_txn fences the old one but keeps its Prepared
    transaction, learns the (producer id, epoch) it was prepared under, and commits it.
    Method: prepare, re-init with keep_prepared, end_txn as the new instance."""
    ids = h.init("a", two_phase=True)
    h.add("a", ids.producer_id, 0)
    prepared = h.prepare("a", ids.producer_id, 0)
    assert (prepared.producer_id, prepared.producer_epoch) == (ids.producer_id, 1)
    kept = h.init("a", two_phase=True, keep_prepared=True)
    assert (kept.producer_epoch, kept.prepared_producer_id, kept.prepared_producer_epoch) == \
        (2, ids.producer_id, 1)
    assert h.state("a") == "Prepared"
    h.end("a", kept.producer_id, kept.producer_epoch)
    h.write_markers()
    assert h.state("a") == "CompleteCommit"
    without = h.init("b", two_phase=True)
    h.add("b", without.producer_id, 0)
    h.prepare("b", without.producer_id, 0)
    assert h.init("b").error_code == errors.ErrorCode.CONCURRENT_TRANSACTIONS  # aborted


def test_with_prepared_decides_every_transaction_in_one_append(h: Harness) -> None:
    """Goal: end_txn with_prepared commits the caller's transaction and the prepared ones of
    other ids with one record batch, and answers once all are complete. Method: two
    prepared ids and a caller on one partition; count the batches appended."""
    caller, a, b = ids_on_one_partition(3, "sink")
    staged = []
    for tid in (a, b):
        ids = h.init(tid, two_phase=True)
        h.add(tid, ids.producer_id, 0, T0)
        staged.append(h.prepare(tid, ids.producer_id, 0))
    me = h.init(caller)
    h.add(caller, me.producer_id, 0, T1)
    partition = h.coord.partition(caller)
    appended = len(h.log.logged[partition])
    done = h.end(caller, me.producer_id, 0, with_prepared=staged)
    assert len(h.log.logged[partition]) == appended + 1
    assert h.log.logged[partition][-1].records.num_rows == 3
    assert {h.state(t) for t in (caller, a, b)} == {"PrepareCommit"}
    assert h.write_markers() == 3 and done.result(1) is None
    assert {h.state(t) for t in (caller, a, b)} == {"CompleteCommit"}
    h.end(caller, me.producer_id, 0, with_prepared=staged).result(1)  # a retry: all done


@pytest.mark.parametrize("fault", ["epoch", "state", "elsewhere", "unknown"])
def test_with_prepared_fails_whole_and_decides_nothing(h: Harness, fault: str) -> None:
    """Goal: one stale or wrong prepared state fails the whole request (PRODUCER_FENCED or
    INVALID_TXN_STATE naming that id) and nothing is decided or written. Method: a good and a
    bad entry; the log and the states are unchanged after."""
    caller, good, bad = ids_on_one_partition(3, "sink")
    entries = []
    for tid in (good, bad):
        ids = h.init(tid, two_phase=True)
        h.add(tid, ids.producer_id, 0)
        if tid == bad and fault == "state":
            entries.append(PreparedTxn(transactional_id=tid, producer_id=ids.producer_id,
                                       producer_epoch=0))
        else:
            entries.append(h.prepare(tid, ids.producer_id, 0))
    if fault == "epoch":
        h.init(bad, two_phase=True, keep_prepared=True)  # a new instance: epoch 2
    elif fault == "elsewhere":
        entries[1] = PreparedTxn(transactional_id=id_elsewhere(caller), producer_id=1,
                                 producer_epoch=0)
    elif fault == "unknown":
        entries[1] = PreparedTxn(transactional_id=ids_on_one_partition(4, "sink")[3],
                                 producer_id=1, producer_epoch=0)
    me = h.init(caller)
    h.add(caller, me.producer_id, 0)
    before = {p: len(b) for p, b in h.log.logged.items()}
    expected = errors.ProducerFencedError if fault == "epoch" else errors.InvalidTxnStateError
    with pytest.raises(expected, match=entries[1].transactional_id):
        h.end(caller, me.producer_id, 0, with_prepared=entries)
    assert {p: len(b) for p, b in h.log.logged.items()} == before and not h.jobs
    assert h.state(good) == "Prepared" and h.state(caller) == "Ongoing"


def test_a_stale_prepared_state_never_decides_a_later_transaction(h: Harness) -> None:
    """Goal: a prepared state names one transaction. Spark may call commit(N) again after a
    restart; by then the task's producer may have prepared batch N+1's transaction, which the
    retried with_prepared of batch N must not commit. Method: prepare T1 and commit it with
    the driver's transaction; the same producer (no init between) prepares T2; the driver
    retries T1's decision."""
    driver, task = ids_on_one_partition(2)
    d = h.init(driver)
    t = h.init(task, two_phase=True)
    h.add(task, t.producer_id, t.producer_epoch, T0)
    s1 = h.prepare(task, t.producer_id, t.producer_epoch)
    assert s1.producer_epoch == t.producer_epoch + 1  # prepare bumps the epoch
    h.add(driver, d.producer_id, d.producer_epoch, T1)
    h.end(driver, d.producer_id, d.producer_epoch, True, [s1])
    h.write_markers()
    assert h.state(task) == "CompleteCommit"
    h.add(driver, d.producer_id, d.producer_epoch, T1)  # the driver's next transaction
    retried = h.end(driver, d.producer_id, d.producer_epoch, True, [s1])  # T1: already done
    h.write_markers()
    assert retried.result(1) is None
    h.add(task, s1.producer_id, s1.producer_epoch, T0)  # batch N+1, same producer
    s2 = h.prepare(task, s1.producer_id, s1.producer_epoch)
    assert s2 != s1 and h.state(task) == "Prepared"
    h.add(driver, d.producer_id, d.producer_epoch, T1)
    with pytest.raises(errors.ProducerFencedError, match=task):
        h.end(driver, d.producer_id, d.producer_epoch, True, [s1])
    assert h.state(task) == "Prepared"
    h.end(driver, d.producer_id, d.producer_epoch, True, [s2])
    h.write_markers()
    assert h.state(task) == "CompleteCommit"


def test_a_retried_prepare_gets_the_same_state(h: Harness) -> None:
    """Goal: a prepare whose answer was lost is retried at the epoch it was sent with; it
    gets the state the first one returned, and nothing more is written. A prepare at the new
    epoch (the transaction is already Prepared) is INVALID_TXN_STATE."""
    t = h.init("a", two_phase=True)
    h.add("a", t.producer_id, 0)
    first = h.prepare("a", t.producer_id, 0)
    written = len(h.log.logged[h.coord.partition("a")])
    assert h.prepare("a", t.producer_id, 0) == first
    assert len(h.log.logged[h.coord.partition("a")]) == written
    with pytest.raises(errors.InvalidTxnStateError, match="already Prepared"):
        h.prepare("a", first.producer_id, first.producer_epoch)
    h.init("a", two_phase=True, keep_prepared=True)  # a new instance fences the old one
    with pytest.raises(errors.ProducerFencedError):
        h.prepare("a", t.producer_id, 0)
