"""datasource/packing.py: the archived part of a history read is packed into Spark tasks by
Spark's own rule for file sources. Pure logic, checked with hypothesis and by examples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from datasource.packing import (
    MAX_SPLIT_BYTES,
    OPEN_COST_BYTES,
    MiB,
    max_split_bytes,
    pack_by_size,
)

sizes_st = st.lists(st.integers(0, 400 * MiB), max_size=60)


@given(sizes_st, st.integers(1, 64))
def test_every_read_lands_in_one_task_and_no_task_overflows(sizes: list[int], cores: int
                                                             ) -> None:
    """Goal: packing loses and repeats no read, and a task holds more than the split size
    only when it is one read larger than that. Method: random sizes and core counts."""
    groups = pack_by_size(sizes, cores)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    limit = max_split_bytes(sizes, cores)
    for group in groups:
        assert group
        used = sum(sizes[i] + OPEN_COST_BYTES for i in group) - OPEN_COST_BYTES
        assert used <= limit or len(group) == 1


def test_small_files_share_tasks_one_per_core_and_large_files_keep_their_own() -> None:
    """Goal: four 26 MB files on two cores are read by two tasks (Spark's file source plans
    the same); 128 MiB files keep one task each whatever the cores; 200 tiny files of a
    stream archive are read by 7 tasks, not 200 (each costs Spark's 4 MiB open cost: 31 of
    them fill a 128 MiB task)."""
    assert sorted(map(sorted, pack_by_size([26 * MiB] * 4, 2))) == [[0, 1], [2, 3]]
    assert len(pack_by_size([MAX_SPLIT_BYTES] * 6, 2)) == 6
    assert len(pack_by_size([MiB // 4] * 200, 2)) == 7
    assert pack_by_size([], 2) == []
