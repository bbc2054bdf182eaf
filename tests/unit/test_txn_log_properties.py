"""Property test of transactions in Log against an in-memory model.

Goal: under any interleaving of transactional appends by several producers, commits, aborts
(with and without an open transaction), non-transactional appends, epoch bumps, rolls, high
watermark moves, flushes, truncations, retention, compaction and clean or unclean restarts:
- LSO <= HW, and the LSO is the first offset of the earliest transaction that is open or whose
  marker the HW has not passed (as far as the reloaded producer state can know), else the HW;
- read_committed below the LSO, filtered as a client does (per fetch response, with and without
  the markers' offsets), never returns an aborted or open record or a control batch, and returns
  every committed and non-transactional record exactly once, in offset order; so does the file
  reader given the LSO;
- the aborted-transaction indexes hold exactly the aborted transactions with data whose markers
  are in the log, each in the segment holding its marker;
- compaction (keys are unique, so only transactions give it work) removes nothing at or after
  the LSO, no data but that of aborted transactions, and no marker whose transaction still has
  data; later restarts replay the compacted log to the same state.
Method: a hypothesis rule-based state machine over a real log directory with tiny segments;
the invariants are checked after every step. Hypothesis prints the failing steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from segment_helpers import make_batch
from txn_helpers import ABORT, COMMIT, committed, file_committed, index_entries

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.records import DEFAULT_SCHEMA, FLAG_TRANSACTIONAL
from logstore.segments.log import Log

CONFIG = TopicConfig(segment_bytes=3_000, index_interval_bytes=700, segment_index_bytes=48,
                     retention_ms=5_000, cleanup_policy="compact,delete",
                     delete_retention_ms=1_000)
PRODUCERS = st.sampled_from([1, 2, 3])


@dataclass
class Txn:
    producer_id: int
    first: int
    marker: int | None = None
    aborted: bool = False
    # Whether the producer state holds the completed transaction as not yet replicated, and
    # from which first offset: a reload knows only those completed after its snapshot (_reloaded)
    tracked: bool = True
    tracked_first: int = 0
    marker_gone: bool = False  # compaction dropped the marker
    # After a truncation dropped its marker (_reopened): the first offset the log knows it from
    # (None: ``first``; ``first`` itself stays, as truncate keeps the list's order by it), or
    # lost, when compaction had removed all its (aborted) data and no snapshot holds it open
    log_first: int | None = None
    lost: bool = False

    @property
    def known_first(self) -> int:
        return self.first if self.log_first is None else self.log_first


@dataclass
class Batch:
    base: int
    keys: list[bytes]
    txn: int | None = None      # index into TxnLogModel.txns, for transactional data
    control: bool = False
    closes: int | None = None   # for a marker: the transaction it closed, if any

    @property
    def next(self) -> int:
        return self.base + len(self.keys)


@dataclass
class Producer:
    epoch: int = 0
    sequence: int = 0
    open_txn: int | None = None


class TxnLogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="txnprops-"))
        self.clock = FakeClock()
        self.log = Log.open(self.root / "t-0", "t", 0, CONFIG, DEFAULT_SCHEMA, self.clock)
        self.batches: list[Batch] = []
        self.txns: list[Txn] = []
        self.producers = {pid: Producer() for pid in (1, 2, 3)}
        self.leo = self.hw = self.log_start = 0
        self.committed_hw = 0  # the highest HW ever: replication never truncates below it
        self.serial = 0

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _keys(self, n: int) -> list[bytes]:
        self.serial += n
        return [b"r%d" % i for i in range(self.serial - n, self.serial)]

    # -- rules -------------------------------------------------------------------------------

    @rule(pid=PRODUCERS, n=st.integers(1, 4))
    def send_transactional(self, pid: int, n: int) -> None:
        p, keys = self.producers[pid], self._keys(n)
        info = self.log.append_as_leader(
            make_batch(keys, clock=self.clock), producer_id=pid, producer_epoch=p.epoch,
            base_sequence=p.sequence, flags=FLAG_TRANSACTIONAL)
        assert info.first_offset == self.leo and not info.duplicate
        if p.open_txn is None:
            p.open_txn = len(self.txns)
            self.txns.append(Txn(pid, self.leo))
        self.batches.append(Batch(self.leo, keys, txn=p.open_txn))
        p.sequence += n
        self.leo += n

    @rule(pid=st.sampled_from([-1, 1, 2, 3]), n=st.integers(1, 4))
    def send_plain(self, pid: int, n: int) -> None:
        keys = self._keys(n)
        p = self.producers.get(pid, Producer())
        args = {"producer_id": pid, "producer_epoch": p.epoch, "base_sequence": p.sequence}
        if pid < 0:
            args = {}
        if p.open_txn is not None:
            with pytest.raises(errors.InvalidTxnStateError):
                self.log.append_as_leader(make_batch(keys, clock=self.clock), **args)
            return
        assert self.log.append_as_leader(make_batch(keys, clock=self.clock),
                                         **args).first_offset == self.leo
        self.batches.append(Batch(self.leo, keys))
        p.sequence += n
        self.leo += n

    @rule(pid=PRODUCERS, commit=st.booleans())
    def end_transaction(self, pid: int, commit: bool) -> None:
        p = self.producers[pid]
        info = self.log.append_control_marker(pid, p.epoch, COMMIT if commit else ABORT, 0)
        assert info.first_offset == self.leo
        self.batches.append(Batch(self.leo, [b"marker"], control=True, closes=p.open_txn))
        if p.open_txn is not None:
            txn = self.txns[p.open_txn]
            txn.marker, txn.aborted = self.leo, not commit
            txn.tracked, txn.tracked_first = True, txn.known_first
            p.open_txn = None
        self.leo += 1

    @rule(pid=PRODUCERS)
    def bump_epoch(self, pid: int) -> None:
        p = self.producers[pid]
        if p.open_txn is None:  # a coordinator ends the transaction before a new epoch
            p.epoch, p.sequence = p.epoch + 1, 0

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()

    @rule(data=st.data())
    def advance_high_watermark(self, data: st.DataObject) -> None:
        self.hw = data.draw(st.integers(self.hw, self.leo))
        self.log.update_high_watermark(self.hw)
        self.committed_hw = max(self.committed_hw, self.hw)

    @rule()
    def replicate_everything(self) -> None:
        """The HW reaches the log end offset (the common case, and the one that frees most)."""
        self.hw = self.committed_hw = self.leo
        self.log.update_high_watermark(self.hw)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """As a follower does: the log drops every batch holding an offset >= ``offset``."""
        offset = data.draw(st.integers(max(self.log_start, self.committed_hw), self.leo))
        snapshots = self.log.producer_state.snapshot_offsets()
        self.log.truncate_to(offset)
        if offset >= self.leo:
            return
        dropped = [b for b in self.batches if b.next > offset]
        self.leo = min(offset, dropped[0].base) if dropped else offset
        self.batches = [b for b in self.batches if b.next <= offset]
        self.hw, self.committed_hw = min(self.hw, self.leo), min(self.committed_hw, self.leo)
        self.txns = [t for t in self.txns if t.first < self.leo]  # a suffix of the list goes
        usable = [s for s in snapshots if s <= self.leo]
        for i, txn in enumerate(self.txns):
            if txn.marker is not None and txn.marker >= self.leo:
                txn.marker = None
            if txn.marker is None and not txn.lost:
                self._reopened(i, max(usable) if usable else None)
        for pid, p in self.producers.items():
            opened = [i for i, t in enumerate(self.txns)
                      if t.producer_id == pid and t.marker is None and not t.lost]
            p.open_txn = opened[0] if opened else None
            p.epoch, p.sequence = p.epoch + 1, 0  # the producer retries under a new epoch
        self._reloaded(snapshots, self.leo)

    @rule(ms=st.integers(0, 20_000))
    def retention(self, ms: int) -> None:
        lso = self.log.last_stable_offset
        self.clock.advance(ms)
        self.log.delete_old_segments()
        assert self.log.log_start_offset <= max(lso, self.log_start)
        self.log_start = self.log.log_start_offset
        self.hw = max(self.hw, self.log_start)
        self.batches = [b for b in self.batches if b.base >= self.log_start]

    @rule()
    def compact(self) -> None:
        lso = self.log.last_stable_offset
        self.log.compact()
        left = {b.header.base_offset
                for b in self.log.read(self.log_start, 1 << 30).batches}
        gone = [b for b in self.batches if b.base not in left]
        self.batches = [b for b in self.batches if b.base in left]
        data_left = {b.txn for b in self.batches if b.txn is not None}
        for b in gone:
            assert b.next <= lso, f"compaction removed offset {b.base} at/after the LSO {lso}"
            if b.control:
                assert b.closes not in data_left, f"marker {b.base} dropped before its data"
                if b.closes is not None:
                    self.txns[b.closes].marker_gone = True
            else:
                assert b.txn is not None and self.txns[b.txn].aborted, f"removed {b.base}"

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        snapshots = self.log.producer_state.snapshot_offsets()
        point = self.log.recovery_point
        bases = [info["base_offset"] for info in self.log.segments_info()]
        if clean:
            self.log.close()
        else:
            for seg in self.log._state.segments:
                seg.flush_indexes()
                seg.close()
        self.log = Log.open(self.root / "t-0", "t", 0, CONFIG, None, self.clock,
                            recovery_point=point, log_start_offset=self.log_start,
                            clean_shutdown=clean)
        self.hw = self.log_start
        if clean:
            self._reloaded([self.leo], self.leo)
        else:
            rebuild_from = max([b for b in bases if b <= point], default=bases[0])
            self._reloaded(snapshots, min(self.leo, rebuild_from))

    def _reopened(self, index: int, snapshot: int | None) -> None:
        """After a truncation, open transaction ``index`` (open all along, or its marker just
        dropped): the rebuilt producer state holds it open from the snapshot it was open in
        (the newest at or below the new log end), else from the first of its batches the
        replay meets. There may be none: compaction may have removed its data (it removes an
        aborted transaction's data below the LSO, and a reloaded state no longer holds the LSO
        back for a transaction completed before its snapshot) and the truncation the rest;
        then the log knows nothing of it, and a new marker for its producer closes nothing."""
        txn = self.txns[index]
        if snapshot is not None and txn.known_first < snapshot:
            return
        remaining = [b.base for b in self.batches if b.txn == index]
        if remaining:
            txn.log_first = min(remaining)
        else:
            txn.lost = True

    def _reloaded(self, snapshots: list[int], at_most: int) -> None:
        """The producer state was reloaded from the newest snapshot at or below ``at_most`` and a
        replay of the batches after it: it holds as not yet replicated only the transactions
        whose markers the replay met, each from the first offset it knew (the snapshot's, or the
        first batch the replay met: retention may have deleted earlier ones)."""
        usable = [s for s in snapshots if s <= at_most]
        start = max(usable) if usable else None
        for i, txn in enumerate(self.txns):
            if txn.marker is None:
                continue
            remaining = [b.base for b in self.batches if b.txn == i]
            if start is not None and txn.marker < start:
                txn.tracked = False
            elif start is not None and txn.known_first < start:
                txn.tracked, txn.tracked_first = True, txn.known_first
            else:
                txn.tracked = bool(remaining)
                txn.tracked_first = min(remaining, default=txn.known_first)

    # -- invariants --------------------------------------------------------------------------

    def expected_lso(self) -> int:
        unstable = [t.known_first for t in self.txns if t.marker is None and not t.lost]
        unstable += [t.tracked_first for t in self.txns
                     if t.marker is not None and t.tracked and t.marker >= self.hw]
        return max(self.log_start, min([self.hw, *unstable]))

    @invariant()
    def offsets_match(self) -> None:
        log = self.log
        assert (log.log_start_offset, log.log_end_offset) == (self.log_start, self.leo)
        assert log.high_watermark == self.hw
        assert log.last_stable_offset <= log.high_watermark
        assert log.last_stable_offset == self.expected_lso()
        opened = {t.producer_id: t.known_first for t in self.txns
                  if t.marker is None and not t.lost}
        assert log.producer_state.open_transactions == opened

    @invariant()
    def read_committed_matches(self) -> None:
        lso = self.log.last_stable_offset
        expected = []
        for b in self.batches:
            if b.control or b.base >= lso:
                continue
            if b.txn is not None:
                txn = self.txns[b.txn]
                assert txn.marker is not None, "data of an open transaction below the LSO"
                if txn.aborted:
                    continue
            expected += [(b.base + i, k) for i, k in enumerate(b.keys)]
        page = 1 + (self.leo * 389) % 3_000
        assert committed(self.log, page=page) == expected
        assert committed(self.log, page=page, with_ends=False) == expected
        assert file_committed(self.log, self.log_start, self.leo) == expected

    @invariant()
    def aborted_index_matches(self) -> None:
        """Every aborted transaction with data left has its entry, in the marker's segment,
        covering all its data; one whose data retention deleted may have lost its entry to an
        index rebuild; nothing else is indexed."""
        first_base = self.log.segments_info()[0]["base_offset"]
        data: dict[int, list[int]] = {}
        for b in self.batches:
            if b.txn is not None:
                data.setdefault(b.txn, []).append(b.base)
        got = {(pid, last): first for pid, first, last in index_entries(self.log)}
        for i, txn in enumerate(self.txns):
            if not txn.aborted or txn.marker is None or txn.marker < first_base:
                continue
            if txn.marker_gone:
                assert (txn.producer_id, txn.marker) not in got
                continue
            found = got.pop((txn.producer_id, txn.marker), None)
            if i in data:
                assert found is not None and txn.first <= found <= min(data[i])
        assert got == {}


TestTxnLogModel = TxnLogModel.TestCase
TestTxnLogModel.settings = settings(
    max_examples=int(os.environ.get("LOGSTORE_PROPERTY_EXAMPLES", "100")),
    stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Drawn:
    """Stands for hypothesis's ``data`` in a rule called by hand: every draw is ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, strategy: object) -> int:
        return self.value


def test_a_transaction_whose_data_compaction_and_truncation_removed_is_forgotten() -> None:
    """Goal: the model follows the log when compaction removed an aborted transaction's first
    batches (its marker above the HW after a clean restart), a truncation dropped the marker
    (the log knows the transaction from its later batches), and another truncation those
    batches (the log knows nothing of it, and a later transaction of another producer still
    checks out). Method: the rules called in that order (found by a review), the invariants
    after each step."""
    model = TxnLogModel()

    def step(rule: str, *args: object) -> None:
        getattr(model, rule)(*args)
        model.offsets_match()
        model.read_committed_matches()
        model.aborted_index_matches()

    try:
        step("send_plain", -1, 4)
        step("send_plain", -1, 1)
        step("send_transactional", 1, 2)  # producer 1's transaction at 5-6
        step("send_plain", -1, 3)
        step("roll")
        step("send_transactional", 2, 2)  # producer 2's at 10-11
        step("send_plain", -1, 4)
        step("send_plain", -1, 4)
        step("send_transactional", 1, 2)  # producer 1's again at 20-21, aborted at 22
        step("end_transaction", 1, False)
        for _ in range(2):
            step("roll")
            step("send_plain", -1, 1)
        step("roll")
        step("restart", True)
        step("advance_high_watermark", _Drawn(12))
        step("compact")  # removes 5-6: aborted, below the LSO
        step("truncate", _Drawn(22))  # drops the marker: producer 1 open from 20
        step("truncate", _Drawn(15))  # drops 20-21: producer 1's transaction is forgotten
        assert model.log.producer_state.open_transactions == {2: 10}
        step("end_transaction", 2, True)
        step("replicate_everything")
    finally:
        model.teardown()
