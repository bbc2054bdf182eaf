"""Packing the archived part of a history read into Spark tasks, as Spark packs files.

Owns: the rule that groups (file, offset range) reads into input partitions by size. It is
Spark's own rule for file sources (``FilePartition.maxSplitBytes`` and
``getFilePartitions``): each read costs its file's size plus an open cost; a task holds at
most ``max_split_bytes = min(128 MiB, max(open cost, total / min_partitions))``; reads are
taken largest first and a task is closed when the next read would overflow it. So a table of
many small files (a stream archive commits a few per trigger) is read by a few tasks, one per
core, instead of one task each, and a table of large files keeps one task per file. Must not:
do I/O or import pyspark.

A Python data source's planner cannot see Spark's default parallelism, so ``min_partitions``
comes from the ``minPartitions`` option, or else from the cores the driver may run on (its
CPU affinity): right for a ``local[*]`` session, high for ``local[N]`` on a larger machine,
low on a cluster; there, set ``minPartitions`` to the cluster's cores (it also splits the
log's ranges into at least that many pieces, as it does for any read).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

MiB = 1024 * 1024
MAX_SPLIT_BYTES = 128 * MiB  # spark.sql.files.maxPartitionBytes
OPEN_COST_BYTES = 4 * MiB  # spark.sql.files.openCostInBytes


def default_min_partitions(option: int | None) -> int:
    """The ``minPartitions`` option, else the cores the driver may run on."""
    if option is not None:
        return option
    affinity = getattr(os, "sched_getaffinity", None)
    return max(len(affinity(0)) if affinity is not None else os.cpu_count() or 1, 1)


def max_split_bytes(sizes: Sequence[int], min_partitions: int) -> int:
    """Spark's ``maxSplitBytes`` for reads of ``sizes`` bytes."""
    total = sum(size + OPEN_COST_BYTES for size in sizes)
    return min(MAX_SPLIT_BYTES, max(OPEN_COST_BYTES, total // max(min_partitions, 1)))


def pack_by_size(sizes: Sequence[int], min_partitions: int) -> list[list[int]]:
    """Indexes of ``sizes`` grouped into tasks (every index exactly once, in no group twice):
    largest first, a group closed when the next read would pass ``max_split_bytes``; a read
    larger than that has a group of its own. Ties keep the input order, so a plan is the same
    every time for the same reads."""
    limit = max_split_bytes(sizes, min_partitions)
    groups: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if current and filled + sizes[i] > limit:
            groups.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes[i] + OPEN_COST_BYTES
    if current:
        groups.append(current)
    return groups
