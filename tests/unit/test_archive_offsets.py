"""datasource/archive_offsets.py: where an archive run resumes, what counts as lost, and how a
history read splits between table and log. Pure logic, checked with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datasource.archive_offsets import (
    ArchiveDataLossError,
    Coverage,
    coverage_of,
    decode,
    encode,
    encode_topic_ids,
    next_ranges,
    split_history,
    topic_ids_of,
)
from logstore.model import TopicPartition

TP = TopicPartition("t", 0)


def test_summary_encoding_round_trips() -> None:
    """Goal: the coverage written into a snapshot summary reads back the same. Method: encode,
    decode, and coverage_of on a summary dict."""
    spans = {TP: (3, 10), TopicPartition("u.v", 7): (0, 1)}
    assert decode(encode(spans)) == spans
    assert coverage_of({"logstore.archived": encode(spans)})[TP] == Coverage(3, 10)


def test_new_partition_starts_at_its_log_start_and_known_one_at_its_end() -> None:
    """Goal: a run resumes where the table ends, and archives a new partition from the log
    start. Method: one known and one new partition."""
    other = TopicPartition("t", 1)
    plan = next_ranges({TP: Coverage(0, 50)}, {TP: (10, 80), other: (5, 9)}, True)
    assert [(s.tp, s.start, s.end) for s in plan.ranges] == [(TP, 50, 80), (other, 5, 9)]
    assert plan.coverage == {TP: Coverage(0, 80), other: Coverage(5, 9)}


def test_offsets_deleted_before_archiving_are_data_loss_or_recorded_as_lost() -> None:
    """Goal: retention racing the job is reported, never skipped silently. Method: table end
    40, log start 60: an error, or with fail_on_data_loss off a lost span and a resume at 60."""
    with pytest.raises(ArchiveDataLossError, match=r"t-0: offsets \[40, 60\)"):
        next_ranges({TP: Coverage(0, 40)}, {TP: (60, 90)}, True)
    plan = next_ranges({TP: Coverage(0, 40)}, {TP: (60, 90)}, False)
    assert [(s.start, s.end) for s in plan.lost] == [(40, 60)]
    assert [(s.start, s.end) for s in plan.ranges] == [(60, 90)]


def test_a_log_shorter_than_the_table_is_data_loss() -> None:
    """Goal: a topic deleted and created again (or a log that lost records the table holds)
    is not taken for "nothing new": its log ends below the table's end, an error naming the
    partition and both offsets; with fail_on_data_loss off the run goes on from the table's
    end, as before. Method: table end 1000, log end 400."""
    with pytest.raises(ArchiveDataLossError, match="t-0: the log ends at offset 400, below "
                                                   "the 1000 the table already holds"):
        next_ranges({TP: Coverage(0, 1000)}, {TP: (0, 400)}, True)
    plan = next_ranges({TP: Coverage(0, 1000)}, {TP: (0, 400)}, False)
    assert plan.ranges == [] and plan.coverage == {TP: Coverage(0, 1000)}


def test_a_topic_created_again_is_data_loss_whatever_its_log_length() -> None:
    """Goal: a topic deleted and created again under its name is caught by its id even when
    its new log is longer than the table's coverage (before, it was archived on from the
    table's end, and the new topic's first offsets were never archived); a table without
    recorded ids, or a topic whose id the metadata did not give, is checked by its offsets
    only; the plan records the ids known now. Method: table end 100 with topic id A; the
    log ends at 500 under id B."""
    ids = {"t": "a" * 32}
    with pytest.raises(ArchiveDataLossError, match=f"t-0: topic 't' is not the one the table "
                                                   f"holds \\(topic id {'b' * 32}"):
        next_ranges({TP: Coverage(0, 100)}, {TP: (0, 500)}, True, ids, {"t": "b" * 32})
    plan = next_ranges({TP: Coverage(0, 100)}, {TP: (0, 500)}, False, ids, {"t": "b" * 32})
    assert [(s.start, s.end) for s in plan.ranges] == [(100, 500)]
    assert [(s.start, s.end) for s in plan.lost] == [(0, 100)]  # never archived: recorded
    assert plan.topic_ids == {"t": "b" * 32}
    for archived, now in (({}, {"t": "b" * 32}), (ids, {"t": None}), (ids, ids)):
        plan = next_ranges({TP: Coverage(0, 100)}, {TP: (0, 500)}, True, archived, now)
        assert [(s.start, s.end) for s in plan.ranges] == [(100, 500)]
    assert plan.topic_ids == ids
    assert topic_ids_of({"logstore.topic-ids": encode_topic_ids(ids)}) == ids
    assert topic_ids_of({}) == {}


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.integers(0, 50),
       st.integers(0, 50), st.booleans())
def test_history_split_covers_the_read_once(start: int, length: int, log_start: int,
                                            first: int, covered: int, archived: bool) -> None:
    """Goal: no duplicate and no gap at the boundary: the parts are disjoint, add up to the
    read, archive parts lie in the table's coverage and log parts at or above the log start.
    Method: hypothesis over reads, log starts and coverages."""
    end = start + length
    coverage = Coverage(first, first + covered) if archived else None
    split = split_history(start, end, log_start, coverage)
    parts = [p for p in [split.archive, *split.log, *split.missing] if p is not None]
    offsets = sorted(o for a, b in parts for o in range(a, b))
    assert offsets == list(range(start, end))
    if split.archive is not None:
        assert coverage is not None
        assert coverage.first <= split.archive[0] and split.archive[1] <= coverage.end
    assert all(a >= log_start for a, _ in split.log)
    for a, b in split.missing:  # missing only where neither has it
        assert all(o < log_start for o in range(a, b))
        assert coverage is None or all(not coverage.first <= o < coverage.end
                                       for o in range(a, b))
