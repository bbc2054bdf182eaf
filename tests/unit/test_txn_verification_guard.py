"""The partition leader's half of KIP-890 part 1, in the storage layer: a transactional batch
joins its producer's transaction open on the partition at its epoch, or carries a verified
guard that no marker has cleared since the leader asked the coordinator; the check runs under
the log's lock together with the append.

Goal: a batch whose transaction ended (a marker reached the partition) between its check
with the coordinator and its append is refused with TRANSACTION_ABORTABLE and writes nothing,
so it can never open a transaction nobody will end and pin the last stable offset; an
unverified guard, a guard of another epoch and a missing guard are refused the same way;
without verification (``verify`` False) the log behaves as before. The same holds for the
batch a group coordinator writes for the producer (offsets committed in its transaction, no
sequence). Method: a real Log on
tmp_path with a FakeClock; the test plays the broker (takes the guard, marks it verified as
a positive answer does) and the coordinator's marker writer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from segment_helpers import keyed, open_log
from txn_helpers import ABORT, COMMIT

from logstore import errors
from logstore.clock import FakeClock
from logstore.records import FLAG_TRANSACTIONAL
from logstore.segments.log import Log
from logstore.segments.producer_state import VerificationGuard
from logstore.segments.results import AppendInfo

PID = 7


def send(log: Log, sequence: int, guard: VerificationGuard | None, epoch: int = 0,
         verify: bool = True) -> AppendInfo:
    return log.append_as_leader(keyed(0, 1), producer_id=PID, producer_epoch=epoch,
                                base_sequence=sequence, flags=FLAG_TRANSACTIONAL,
                                verify=verify, guard=guard)


def verified(log: Log, epoch: int = 0) -> VerificationGuard:
    guard = log.verification_guard(PID, epoch)
    assert guard is not None
    guard.verified = True  # the coordinator said yes
    return guard


def assert_nothing_pinned(log: Log, end: int) -> None:
    log.update_high_watermark(log.log_end_offset)
    assert log.log_end_offset == end
    assert log.producer_state.open_transactions == {}
    assert log.last_stable_offset == log.high_watermark


def test_a_marker_between_the_check_and_the_append_refuses_the_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, FakeClock())
    send(log, 0, verified(log))                  # the transaction opens at 0
    log.append_control_marker(PID, 0, COMMIT, 0)  # 1
    guard = verified(log)                        # the next transaction's first write is checked
    log.append_control_marker(PID, 0, ABORT, 0)  # 2: ... and aborted before it lands
    with pytest.raises(errors.TransactionAbortableError, match="topic-0.*producer 7 epoch 0"):
        send(log, 1, guard)
    assert_nothing_pinned(log, 3)


def test_a_verified_guard_opens_the_transaction_and_later_batches_join_it(
        tmp_path: Path) -> None:
    log = open_log(tmp_path, FakeClock())
    guard = verified(log)
    send(log, 0, guard)
    assert log.producer_state.open_transactions == {PID: 0}
    assert log.verification_guard(PID, 0) is None  # open here: no check needed
    send(log, 1, None)                           # joins the open transaction
    with pytest.raises(errors.TransactionAbortableError):
        send(log, 0, None, epoch=1)              # another epoch does not join it
    log.append_control_marker(PID, 0, COMMIT, 0)
    with pytest.raises(errors.TransactionAbortableError):
        send(log, 2, guard)                      # used, and the marker ended its transaction
    assert_nothing_pinned(log, 3)


@pytest.mark.parametrize("fault", ["unverified", "none", "other epoch", "replaced"])
def test_a_batch_without_a_valid_verification_is_refused(tmp_path: Path, fault: str) -> None:
    log = open_log(tmp_path, FakeClock())
    guard: VerificationGuard | None = log.verification_guard(PID, 0)
    epoch = 0
    if fault == "none":
        guard = None
    elif fault == "other epoch":
        guard, epoch = verified(log, 0), 1
    elif fault == "replaced":
        guard = verified(log, 0)
        verified(log, 1)                         # a newer epoch's check replaces it
    with pytest.raises(errors.TransactionAbortableError):
        send(log, 0, guard, epoch=epoch)
    assert_nothing_pinned(log, 0)


def test_without_verification_the_log_appends_as_before(tmp_path: Path) -> None:
    log = open_log(tmp_path, FakeClock())
    send(log, 0, None, verify=False)
    assert log.producer_state.open_transactions == {PID: 0}


def test_a_duplicate_of_a_written_batch_is_answered_even_after_its_marker(
        tmp_path: Path) -> None:
    """A retried batch the log already holds gets its original answer (it was written inside
    its transaction); it writes nothing again."""
    log = open_log(tmp_path, FakeClock())
    first = send(log, 0, verified(log))
    log.append_control_marker(PID, 0, ABORT, 0)
    again = send(log, 0, None)
    assert again.duplicate and again.first_offset == first.first_offset
    assert_nothing_pinned(log, 2)


def coordinator_send(log: Log, guard: VerificationGuard | None, verify: bool = True
                     ) -> AppendInfo:
    """Offsets a group coordinator commits in the producer's transaction: its transactional
    batch without a sequence."""
    return log.append_as_leader(keyed(0, 1), producer_id=PID, producer_epoch=0,
                                base_sequence=-1, flags=FLAG_TRANSACTIONAL, verify=verify,
                                guard=guard)


@pytest.mark.parametrize("known", [False, True], ids=["new producer", "known producer"])
def test_a_coordinators_batch_after_a_marker_is_refused_like_the_producers(
        tmp_path: Path, known: bool) -> None:
    """Goal: the same check holds for the batch a group coordinator writes for the producer
    (no sequence), whether or not the partition knew the producer before."""
    log = open_log(tmp_path, FakeClock())
    if known:
        coordinator_send(log, verified(log))        # 0: a first transaction ...
        log.append_control_marker(PID, 0, COMMIT, 0)  # 1: ... committed
    guard = verified(log)
    log.append_control_marker(PID, 0, ABORT, 0)     # aborted between the check and the append
    with pytest.raises(errors.TransactionAbortableError, match="producer 7 epoch 0"):
        coordinator_send(log, guard)
    assert_nothing_pinned(log, 3 if known else 1)


def test_a_coordinators_batch_joins_the_open_transaction_or_needs_a_guard(
        tmp_path: Path) -> None:
    log = open_log(tmp_path, FakeClock())
    with pytest.raises(errors.TransactionAbortableError):
        coordinator_send(log, None)                 # not open here, no verification
    coordinator_send(log, verified(log))            # 0: opens the transaction
    coordinator_send(log, None)                     # 1: joins it
    assert log.producer_state.open_transactions == {PID: 0}
    log.append_control_marker(PID, 0, ABORT, 0)     # 2
    with pytest.raises(errors.TransactionAbortableError):
        coordinator_send(log, None)                 # open at the check, ended before the append
    assert_nothing_pinned(log, 3)
    coordinator_send(log, None, verify=False)       # without verification: as before
    assert log.producer_state.open_transactions == {PID: 3}
