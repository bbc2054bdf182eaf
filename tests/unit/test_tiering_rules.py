"""Properties of tiered storage's pure rules (tiering/rules.py) and of the remote segment
state table (tiering/metadata.py), checked with hypothesis over generated logs."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.tiering import rules
from logstore.tiering.metadata import (
    InvalidRemoteSegmentStateError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    check_transition,
    epoch_lineage_slice,
)
from logstore.tiering.naming import parse_object_key, segment_key
from logstore.tiering.rules import LocalSegment, Retention
from logstore.tiering.store import ObjectInfo

TP = TopicIdPartition("t", "0" * 32, 0)
S = RemoteLogSegmentState
NOW = 10_000_000


def _remote(base: int, next_offset: int, size: int = 100, max_ts: int = 0,
            state: S = S.COPY_SEGMENT_FINISHED, seg_id: int = 0,
            epochs: tuple[tuple[int, int], ...] = ((0, 0),)) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(TP, f"{seg_id:032x}", base, next_offset - 1, max_ts, size, 0,
                                    epochs, state, 0)


@st.composite
def local_logs(draw: st.DrawFn) -> list[LocalSegment]:
    """Contiguous local segments from a random start; the last is the active one."""
    start = draw(st.integers(0, 50))
    spans = draw(st.lists(st.integers(1, 20), min_size=1, max_size=12))
    out, base = [], start
    for i, span in enumerate(spans):
        out.append(LocalSegment(base, base + span, draw(st.integers(1, 500)),
                                draw(st.integers(0, NOW)), sealed=i < len(spans) - 1))
        base += span
    return out


def _copy_all(segments: list[LocalSegment]) -> list[RemoteLogSegmentMetadata]:
    return [_remote(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp_ms, seg_id=i)
            for i, s in enumerate(segments)]


@given(local_logs(), st.integers(0, 300), st.integers(0, 300), st.data())
def test_copy_candidates_are_sealed_below_hw_and_lso_and_not_yet_copied(
        local: list[LocalSegment], hw: int, lso: int, data: st.DataObject) -> None:
    """Goal: only committed, stable, sealed data is copied, and nothing twice. Method: copy a
    random subset first; every candidate is sealed, below min(hw, lso), uncovered; copying the
    candidates leaves none."""
    done = _copy_all(data.draw(st.lists(st.sampled_from(local[:-1]), unique=True))
                     if len(local) > 1 else [])
    candidates = rules.copy_candidates(local, hw, lso, done)
    ranges = rules.covered_ranges(done)
    for seg in local:
        eligible = seg.sealed and seg.next_offset <= min(hw, lso) and not rules.is_covered(
            ranges, seg.base_offset, seg.next_offset)
        assert (seg in candidates) == eligible
    assert rules.copy_candidates(local, hw, lso, done + _copy_all(candidates)) == []


@given(local_logs(), st.integers(0, 3000), st.integers(0, 300))
def test_local_deletion_needs_a_finished_copy_and_stays_within_local_retention(
        local: list[LocalSegment], retention_bytes: int, copied: int) -> None:
    """Goal: a local segment goes only once copied, and size retention never takes the local
    tier below its limit. Method: copy the segments ending before a random offset (some only
    STARTED); the deletable prefix is covered by FINISHED copies, sealed, and leaves at least
    retention_bytes behind."""
    done = [r if i % 2 else replace(r, state=S.COPY_SEGMENT_STARTED)
            for i, r in enumerate(_copy_all([s for s in local if s.next_offset <= copied]))]
    doomed = rules.local_deletable(local, done, Retention(None, retention_bytes), NOW)
    assert doomed == sorted(local, key=lambda s: s.base_offset)[:len(doomed)]
    ranges = rules.covered_ranges(done)
    assert all(s.sealed and rules.is_covered(ranges, s.base_offset, s.next_offset)
               for s in doomed)
    total = sum(s.size_bytes for s in local)
    assert total - sum(s.size_bytes for s in doomed) >= min(total, retention_bytes)


def test_local_deletion_by_time_keeps_recent_and_uncopied_segments() -> None:
    """Goal: local_retention_ms applies per segment, oldest first. Method: three copied
    segments, the middle one recent: only the first goes."""
    local = [LocalSegment(0, 10, 1, 0, True), LocalSegment(10, 20, 1, NOW, True),
             LocalSegment(20, 30, 1, 0, True), LocalSegment(30, 30, 0, -1, False)]
    doomed = rules.local_deletable(local, _copy_all(local[:3]), Retention(1000, None), NOW)
    assert doomed == local[:1]
    assert rules.local_deletable(local, [], Retention(0, 0), NOW) == []


@st.composite
def overlapping_remote(draw: st.DrawFn) -> list[RemoteLogSegmentMetadata]:
    """FINISHED segments by base offset, each possibly straddling the previous one's end (as
    after a leader change)."""
    out: list[RemoteLogSegmentMetadata] = []
    base = draw(st.integers(0, 10))
    for i in range(draw(st.integers(0, 10))):
        span = draw(st.integers(1, 30))
        out.append(_remote(base, base + span, draw(st.integers(1, 1000)),
                           draw(st.integers(0, NOW)), seg_id=i))
        base += span - draw(st.integers(0, span - 1)) if i % 3 == 2 else span
    return out


@given(overlapping_remote(), st.integers(0, 20))
def test_effective_sizes_count_each_offset_once_and_survive_deleting_a_prefix(
        remote: list[RemoteLogSegmentMetadata], k: int) -> None:
    """Goal: retention_bytes never double counts overlapping segments, and deleting the oldest
    lowers the total by exactly what it was credited. Method: effective sizes never exceed
    sizes, and those of a suffix are the same computed alone."""
    sizes = rules.effective_sizes(remote)
    assert all(0 <= e <= m.size_bytes for e, m in zip(sizes, remote, strict=True))
    assert rules.effective_sizes(remote[k:]) == sizes[k:]


@given(overlapping_remote(), local_logs(), st.integers(0, 5000))
@settings(max_examples=200)
def test_remote_size_retention_deletes_what_it_must_and_no_more(
        remote: list[RemoteLogSegmentMetadata], local: list[LocalSegment],
        retention_bytes: int) -> None:
    """Goal: total retention by size counts FINISHED remote bytes plus local bytes not copied,
    and deletes the oldest remote segments only while the total stays at or above the limit.
    Method: after deleting, the total is >= the limit, and deleting one more would go below."""
    local = [replace(s, base_offset=s.base_offset + 1000, next_offset=s.next_offset + 1000)
             for s in local]
    doomed = rules.remote_expired(remote, local, Retention(None, retention_bytes), NOW)
    assert doomed == remote[:len(doomed)]
    kept = remote[len(doomed):]
    local_bytes = sum(s.size_bytes for s in local)
    total = sum(rules.effective_sizes(kept)) + local_bytes
    assert total >= retention_bytes or not doomed
    if kept:
        assert total - rules.effective_sizes(kept)[0] < retention_bytes


def test_started_copies_never_count_towards_retention() -> None:
    """Goal: a crashed upload (STARTED only) cannot make retention delete readable data early
    (KAFKA-17062). Method: a huge STARTED entry beside a small FINISHED one under a limit the
    FINISHED one meets."""
    remote = [_remote(0, 10, 100), _remote(10, 20, 10**9, state=S.COPY_SEGMENT_STARTED, seg_id=1)]
    assert rules.remote_expired(remote, [], Retention(None, 100), NOW) == []


def test_remote_time_retention_and_log_start_offset() -> None:
    """Goal: time retention deletes the oldest expired segments and the log start moves past
    them, never backwards. Method: two old segments then a recent one."""
    remote = [_remote(0, 10, max_ts=0), _remote(10, 20, max_ts=0, seg_id=1),
              _remote(20, 30, max_ts=NOW, seg_id=2)]
    doomed = rules.remote_expired(remote, [], Retention(1000, None), NOW)
    assert doomed == remote[:2]
    assert rules.log_start_offset(0, remote[2:], 25, doomed) == 20
    assert rules.log_start_offset(22, remote[2:], 25, doomed) == 22
    assert rules.log_start_offset(0, [], 25) == 25


@st.composite
def epoch_caches(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int]:
    epochs = sorted(draw(st.sets(st.integers(0, 20), min_size=1, max_size=6)))
    starts = sorted(draw(st.lists(st.integers(0, 500), min_size=len(epochs),
                                  max_size=len(epochs), unique=True)))
    return list(zip(epochs, starts, strict=True)), starts[-1] + draw(st.integers(1, 100))


@given(epoch_caches(), st.data())
def test_segments_copied_from_the_leaders_own_log_are_in_its_lineage(
        cache: tuple[list[tuple[int, int]], int], data: st.DataObject) -> None:
    """Goal: a leader accepts every segment copied from a log with its own history. Method:
    any offset range below the log end, with its lineage sliced from the cache."""
    entries, leo = cache
    base = data.draw(st.integers(entries[0][1], leo - 1))
    end = data.draw(st.integers(base, leo - 1))
    seg = _remote(base, end + 1, epochs=epoch_lineage_slice(entries, base, end))
    assert rules.in_leader_lineage(seg, entries, leo)


def test_divergent_segments_are_rejected_and_older_ones_kept() -> None:
    """Goal: a new leader deletes segments from a history it does not share, but never ones
    older than its whole cache. Method: cache epochs 2@100, 4@200; check segments with an
    unknown epoch, a different epoch start, one running past its epoch's end, and an older
    one."""
    cache, leo = [(2, 100), (4, 200)], 300
    ok = _remote(150, 250, epochs=((2, 150), (4, 200)))
    unknown = _remote(150, 250, epochs=((2, 150), (3, 180)))
    moved = _remote(150, 250, epochs=((2, 150), (4, 190)))
    overrun = _remote(150, 210, epochs=((2, 150),))
    older = _remote(0, 50, epochs=((1, 0),))
    assert [rules.in_leader_lineage(s, cache, leo) for s in (ok, unknown, moved, overrun,
                                                             older)] == [True, False, False,
                                                                         False, True]
    accepted, rejected = rules.split_by_lineage([ok, unknown], cache, leo)
    assert accepted == [ok] and rejected == [unknown]


def test_orphans_are_unknown_segment_objects_past_the_grace_period() -> None:
    """Goal: cleanup removes leftovers of dead copies, never a live copy's objects. Method: one
    object per case: known segment, unknown but recent, unknown and old, foreign key; plus a
    stale STARTED entry and a fresh one."""
    known = _remote(0, 10, seg_id=1)
    stale = _remote(10, 20, seg_id=2, state=S.COPY_SEGMENT_STARTED)
    fresh = replace(_remote(20, 30, seg_id=3, state=S.COPY_SEGMENT_STARTED),
                    state_timestamp_ms=NOW)
    orphan = _remote(30, 40, seg_id=4)
    objects = [ObjectInfo(segment_key(known, ".arrow"), 1, 0),
               ObjectInfo(segment_key(orphan, ".index"), 1, NOW - 10),
               ObjectInfo(segment_key(orphan, ".arrow"), 1, 0),
               ObjectInfo("t-" + "0" * 32 + "/0/notes.txt", 1, 0)]
    assert rules.orphan_objects(objects, [known, stale, fresh], NOW, 1000) == [objects[2]]
    assert rules.stale_entries([known, stale, fresh], NOW, 1000) == [stale]
    assert parse_object_key(objects[2].key) is not None
    assert rules.copy_lag([LocalSegment(0, 10, 5, 0, True), LocalSegment(10, 20, 7, 0, True),
                           LocalSegment(20, 20, 0, 0, False)], [known]) == rules.CopyLag(1, 7)


@pytest.mark.parametrize(("before", "after", "writes"), [
    (None, S.COPY_SEGMENT_STARTED, True),
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_STARTED, True),
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, True),
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED, True),
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, True),
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED, True),
    (None, S.DELETE_SEGMENT_FINISHED, False),
])
def test_allowed_transitions(before: S | None, after: S, writes: bool) -> None:
    seg = _remote(0, 10, state=after)
    current = None if before is None else replace(seg, state=before, state_timestamp_ms=-5)
    assert check_transition(current, seg) is writes


@pytest.mark.parametrize(("before", "after"), [
    (None, S.COPY_SEGMENT_FINISHED), (None, S.DELETE_SEGMENT_STARTED),
    (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_STARTED),
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
    (S.DELETE_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED),
])
def test_refused_transitions_name_the_segment_and_states(before: S | None, after: S) -> None:
    seg = _remote(0, 10, state=after)
    current = None if before is None else replace(seg, state=before)
    with pytest.raises(InvalidRemoteSegmentStateError, match=f"t-0 remote segment.*{after.name}"):
        check_transition(current, seg)


def test_metadata_json_round_trips() -> None:
    seg = _remote(5, 10, epochs=((1, 5), (3, 8)))
    assert RemoteLogSegmentMetadata.from_json(seg.to_json()) == seg
    assert "txn_index" not in seg.to_json()  # not known: as an entry written before the field
    for has in (True, False):
        told = dataclasses.replace(seg, has_txn_index=has)
        assert told.to_json()["txn_index"] is has
        assert RemoteLogSegmentMetadata.from_json(told.to_json()) == told
    assert epoch_lineage_slice([(0, 0), (1, 4), (3, 8), (5, 20)], 5, 9) == ((1, 5), (3, 8))
