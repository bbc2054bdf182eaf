"""Reading topics as the transaction tests check them.

Owns: reading every record of some partitions up to their end offset for an isolation level
(the last stable offset for read_committed, the high watermark otherwise) with a bounded wait,
and listing those end offsets; shared by the integration and fault tests. Must not: start
processes (tests/brokers.py does) or know about clusters.
"""

from __future__ import annotations

import time
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
