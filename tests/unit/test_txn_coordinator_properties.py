"""Property test of the transaction coordinator (transactions/ on the coordinator runtime).

Goal: whatever producers do (init with or without keep_prepared, add, prepare, commit, abort,
commit with others' prepared transactions, act with a stale epoch), however time moves
(timeouts, prepared timeouts, expiration) and whenever the coordinator fails over (a replay of
its log) or the markers land, the coordinator keeps Kafka's invariants:
- every transition of every id is one the state machine allows (so an id never has two open
  transactions: a new one opens only from Empty/CompleteX);
- epochs never go back (for one producer id);
- a decided transaction is never aborted: PrepareCommit only ever moves to CompleteCommit, and
  PrepareAbort only to CompleteAbort;
- a with_prepared commit decides all of its transactions or none;
- a prepared state names one transaction: no two prepares of an id return the same state, and
  a with_prepared commit only ever decides the transaction its state was returned for (a
  stale state, kept from an earlier transaction, decides nothing);
- once the markers are written, no transaction is left in PrepareX (every PrepareX ends in
  its CompleteX), also after a failover;
- a replay rebuilds exactly the state in memory.
Method: a hypothesis rule-based state machine over three ids of one partition, with the
coordinator's answers (errors included) taken as they come; the invariants are checked after
every step. Hypothesis prints the failing steps.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from logstore.errors import ApiError, ErrorCode
from logstore.messages.transactions import PreparedTxn
from logstore.model import TopicPartition
from logstore.transactions.state import TxnState, can_transition
from tests.unit.txn_coordinator_helpers import Harness, ids_on_one_partition

IDS = ids_on_one_partition(3, "p")
ID = st.sampled_from(IDS)
TPS = st.lists(st.sampled_from([TopicPartition("t", p) for p in range(3)]), min_size=1,
               max_size=3)
DECIDED = {TxnState.PREPARE_COMMIT: TxnState.COMPLETE_COMMIT,
           TxnState.PREPARE_ABORT: TxnState.COMPLETE_ABORT}


class TxnCoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.producers: dict[str, list[tuple[int, int]]] = {tid: [] for tid in IDS}
        self.prepared: dict[str, list[PreparedTxn]] = {tid: [] for tid in IDS}
        self.before = self._states()

    # -- what the producers do --

    @rule(tid=ID, two_phase=st.booleans(), keep=st.booleans())
    def init(self, tid: str, two_phase: bool, keep: bool) -> None:
        try:
            r = self.h.init(tid, timeout_ms=5000, two_phase=two_phase or keep,
                            keep_prepared=keep)
        except ApiError:
            return
        if r.error_code == 0:
            self.producers[tid].append((r.producer_id, r.producer_epoch))

    @rule(tid=ID, tps=TPS, stale=st.booleans())
    def add(self, tid: str, tps: list[TopicPartition], stale: bool) -> None:
        self._call(lambda pid, epoch: self.h.add(tid, pid, epoch, *tps), tid, stale)

    @rule(tid=ID, stale=st.booleans())
    def prepare(self, tid: str, stale: bool) -> None:
        def prepare(pid: int, epoch: int) -> None:
            state = self.h.prepare(tid, pid, epoch)
            if state not in self.prepared[tid]:  # else a retry: the same answer
                self.producers[tid].append((state.producer_id, state.producer_epoch))
                self.prepared[tid].append(state)
            elif (pid, epoch) != (state.producer_id, state.producer_epoch - 1):
                raise AssertionError(f"{tid}: prepare returned an earlier state {state}")
        self._call(prepare, tid, stale)

    @rule(tid=ID, committed=st.booleans(), stale=st.booleans())
    def end(self, tid: str, committed: bool, stale: bool) -> None:
        self._call(lambda pid, epoch: self.h.end(tid, pid, epoch, committed), tid, stale)

    @rule(tid=ID, others=st.lists(ID, max_size=2, unique=True), stale=st.booleans())
    def commit_with_prepared(self, tid: str, others: list[str], stale: bool) -> None:
        entries = [self.prepared[o][0 if stale else -1] for o in others
                   if o != tid and self.prepared[o]]
        before = self._states()
        named = {e.transactional_id: self._prepared_as(e.transactional_id) for e in entries}
        opened = before[tid] in (TxnState.ONGOING, TxnState.PREPARED)
        decided = {*(e.transactional_id for e in entries), *([tid] if opened else [])}
        ok = self._call(lambda pid, epoch: self.h.end(tid, pid, epoch, True, entries), tid,
                        False)
        after = self._states()
        if ok and entries:
            assert all(after[t] in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
                       for t in decided), (before, after)
            for e in entries:
                if before[e.transactional_id] == TxnState.PREPARED:
                    assert named[e.transactional_id] == (e.producer_id, e.producer_epoch), \
                        f"{e} decided the transaction prepared as {named[e.transactional_id]}"
        elif not ok:
            assert after == before, "a refused with_prepared changed something"

    # -- what happens to them --

    @rule(ms=st.sampled_from([1000, 5000, 300_000, 3_600_000]))
    def time_passes(self, ms: int) -> None:
        self.h.clock.advance(ms)
        self.h.tick()

    @rule()
    def markers_land(self) -> None:
        self.h.write_markers()

    @rule()
    def coordinator_fails_over(self) -> None:
        memory = self._states()
        self.h.new_coordinator()
        assert self._states() == memory, "the replay differs from memory"

    # -- helpers --

    def _producer(self, tid: str, stale: bool) -> tuple[int, int] | None:
        known = self.producers[tid]
        if not known:
            return None
        return known[0] if stale else known[-1]

    def _call(self, call: object, tid: str, stale: bool) -> bool:
        producer = self._producer(tid, stale)
        if producer is None:
            return False
        try:
            call(*producer)  # type: ignore[operator]
            return True
        except ApiError as e:
            assert e.code != ErrorCode.UNKNOWN_SERVER_ERROR, e
            return False

    def _states(self) -> dict[str, TxnState | None]:
        out: dict[str, TxnState | None] = {}
        for tid in IDS:
            meta = self.h.coord.runtime.read(self.h.coord.partition(tid),
                                             lambda shard, tid=tid: shard.txns.get(tid))
            out[tid] = None if meta is None else meta.state
        return out

    def _prepared_as(self, tid: str) -> tuple[int, int] | None:
        meta = self.h.coord.runtime.read(self.h.coord.partition(tid),
                                         lambda shard: shard.txns.get(tid))
        return None if meta is None else meta.prepared

    def _epochs(self) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for tid in IDS:
            meta = self.h.coord.runtime.read(self.h.coord.partition(tid),
                                             lambda shard, tid=tid: shard.txns.get(tid))
            out[tid] = None if meta is None else (meta.producer_id, meta.producer_epoch)
        return out

    # -- invariants --

    @invariant()
    def transitions_are_allowed_and_decisions_stand(self) -> None:
        after = self._states()
        for tid, old in self.before.items():
            new = after[tid]
            if old is None or new is None or old == new:
                continue
            assert can_transition(old, new) or (old in DECIDED and new == DECIDED[old]), \
                f"{tid}: {old} -> {new}"
            if old in DECIDED:
                assert new == DECIDED[old], f"{tid}: decided {old}, then {new}"
        self.before = after

    @invariant()
    def prepared_states_are_unique(self) -> None:
        for tid, states in self.prepared.items():
            assert len(set(states)) == len(states), f"{tid}: a prepared state repeats"

    @invariant()
    def epochs_never_go_back(self) -> None:
        for tid, now in self._epochs().items():
            seen = getattr(self, "_seen", {}).get(tid)
            if seen is not None and now is not None and now[0] == seen[0]:
                assert now[1] >= seen[1], f"{tid}: epoch {seen} -> {now}"
            if now is not None:
                self.__dict__.setdefault("_seen", {})[tid] = now

    def teardown(self) -> None:
        for _ in range(3):
            self.h.write_markers()
        assert not {s for s in self._states().values()} & set(DECIDED), self._states()


TestTxnCoordinator = TxnCoordinatorMachine.TestCase
TestTxnCoordinator.settings = settings(max_examples=300, stateful_step_count=50,
                                       deadline=None)
