"""Reading topics as the transaction tests check them.

Owns: reading every record of some partitions up to their end offset for an isolation level
(the last stable offset for read_committed, the high watermark otherwise) with a bounded wait,
listing those end offsets, and the check of an exactly-once copy job's output (each key's
sequence once, in order); shared by the integration and fault tests. Must not: start
processes (tests/brokers.py does) or know about clusters.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import pyarrow.compute as pc

from logstore import Consumer, TopicPartition
from tests.helpers import WAIT_S


def read_values(bootstrap: str | list[str], topic: str, partitions: Iterable[int],
                isolation_level: str = "read_committed", timeout_s: float = WAIT_S,
                ends: dict[int, int] | None = None, column: str = "value"
                ) -> dict[int, list[Any]]:
    """Values of each partition from offset 0 to its end offset as listed first (the LSO for
    read_committed), or to ``ends`` (partition -> offset); fails if they are not all read
    within ``timeout_s``. ``column``: another column to return (a typed topic's)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    values: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level,
                  fetch_max_wait_ms=100) as consumer:
        consumer.assign(tps)
        stop = consumer.end_offsets(tps) if ends is None else \
            {tp: ends[tp.partition] for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < stop[tp] for tp in tps):
            assert time.monotonic() < deadline, \
                f"read {[consumer.position(tp) for tp in tps]} of {stop} in {timeout_s} s"
            for tp, table in consumer.poll_arrow(timeout_ms=200).items():
                kept = table.filter(pc.less(table.column("offset"), stop[tp]))
                values[tp.partition] += kept.column(column).to_pylist()
    return values


def end_offsets(bootstrap: str | list[str], topic: str, partitions: Iterable[int],
                isolation_level: str = "read_committed") -> dict[int, int]:
    """Each partition's end offset for the isolation level (the LSO for read_committed)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    with Consumer(bootstrap, isolation_level=isolation_level) as consumer:
        return {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}


def assert_copied_once(bootstrap: str, topic: str, partitions: Iterable[int], keys: int,
                       per_key: int, where: str) -> None:
    """``topic`` read read_committed holds, for each key ``K<k>`` (k < ``keys``), the values
    ``K<k>:0`` ... ``K<k>:<per_key - 1>`` once each and in that order (a copy job's output
    of ``k<k>:<sequence>`` records, upper-cased); AssertionError naming ``where`` if not."""
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for values in read_values(bootstrap, topic, partitions, timeout_s=60).values():
        for v in values:
            key, sequence = v.split(b":")
            by_key[key].append(int(sequence))
    expected = {b"K%d" % k: list(range(per_key)) for k in range(keys)}
    wrong = {k: (len(v), v[:5]) for k, v in by_key.items() if v != expected.get(k)}
    assert not wrong and set(by_key) == set(expected), f"{where}: {list(wrong.items())[:3]}"
