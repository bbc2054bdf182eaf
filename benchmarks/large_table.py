"""One ``send_batch`` of a table far larger than ``max_message_bytes`` and ``buffer_memory``.

    .venv/bin/python benchmarks/large_table.py [--gib 1] [--width 1000] [--buffer-mib 64] [--json]

Issue 14 §1 at full size (the test suite runs the same path at 384 MiB,
tests/integration/test_large_tables.py). The table holds ``--gib`` GiB of ``--width``-byte
values whose chunks share one reused buffer, each row keyed by its row number, so the
benchmark process itself holds a few MB: the growth of its resident size while the table is
sent is what the producer holds (``buffer_memory`` plus a window of pieces being cut). Then
every key is read back to check each row arrived exactly once. The broker runs in its own
process. Figures are printed, never asserted.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from common import Brokers, bench_parser, report

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.helpers import PeakRss

MiB = 1024 * 1024
CHUNK_ROWS = 1000


def reused_table(total_bytes: int, width: int) -> pa.Table:
    """``total_bytes`` of ``width``-byte values sharing one buffer; keys are row numbers."""
    data = pa.py_buffer(np.full(width * CHUNK_ROWS, 7, dtype=np.uint8))
    offsets = pa.py_buffer(np.arange(0, width * CHUNK_ROWS + 1, width, dtype=np.int32))
    value = pa.Array.from_buffers(pa.binary(), CHUNK_ROWS, [None, offsets, data])
    key_offsets = pa.py_buffer(np.arange(0, 8 * CHUNK_ROWS + 1, 8, dtype=np.int32))
    batches = []
    for i in range(total_bytes // (width * CHUNK_ROWS)):
        ids = np.arange(i * CHUNK_ROWS, (i + 1) * CHUNK_ROWS, dtype=">i8").tobytes()
        key = pa.Array.from_buffers(pa.binary(), CHUNK_ROWS, [None, key_offsets,
                                                              pa.py_buffer(ids)])
        batches.append(pa.record_batch({"key": key, "value": value}))
    return pa.Table.from_batches(batches)


def read_back(bootstrap: str, topic: str, rows: int, timeout_s: float = 600) -> int:
    """Rows read back whose keys are exactly 0..rows-1, each once (else -1)."""
    seen = np.zeros(rows, dtype=np.int32)
    got, deadline = 0, time.monotonic() + timeout_s
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        while got < rows and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                keys = table.column("key").combine_chunks()
                ids = np.frombuffer(keys.buffers()[2], dtype=">i8", count=len(keys),
                                    offset=keys.offset * 8 if keys.offset else 0)
                np.add.at(seen, ids.astype(np.int64), 1)
                got += len(keys)
    return got if bool((seen == 1).all()) else -1


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--buffer-mib", type=int, default=64)
    args = parser.parse_args()
    table = reused_table(int(args.gib * 1024 * MiB), args.width)
    rows = table.num_rows
    results: dict[str, float] = {"table_mib": table.nbytes / MiB, "rows": rows,
                                 "buffer_memory_mib": args.buffer_mib}
    with tempfile.TemporaryDirectory() as tmp, Brokers(Path(tmp)) as brokers:
        broker = brokers()
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("large", 1)])
        with Producer(broker.bootstrap, acks=1,
                      buffer_memory=args.buffer_mib * MiB) as producer, PeakRss() as rss:
            start = time.perf_counter()
            future = producer.send_batch("large", table, partition=0)
            producer.flush(600)
            elapsed = time.perf_counter() - start
            pieces = future.result(0)
        results["produce_mib_s"] = table.nbytes / MiB / elapsed
        results["pieces"] = len(pieces)
        results["producer_rss_growth_mib"] = (rss.peak - rss.start) / MiB
        results["rows_read_back_exactly_once"] = read_back(broker.bootstrap, "large", rows)
    report(results, args.json, lambda k, v: f"{k:32} {v:>14,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
