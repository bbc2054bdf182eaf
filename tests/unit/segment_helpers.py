"""Shared helpers of the storage-layer unit tests: batches, logs in tmp_path, read-back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE
from logstore.segments import format as fmt
from logstore.segments.log import Log

VALUE = b"v" * 100


def make_batch(keys: list, values: list | None = None, timestamps: list | None = None,
               clock: FakeClock | None = None) -> pa.RecordBatch:
    n = len(keys)
    values = [VALUE] * n if values is None else values
    if timestamps is None:
        timestamps = [clock.time_ms() if clock else 1_000] * n
    return pa.record_batch([
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(timestamps, pa.int64()).cast(TIMESTAMP_TYPE),
        pa.nulls(n, DEFAULT_SCHEMA.field("headers").type),
    ], schema=DEFAULT_SCHEMA)


def keyed(start: int, n: int, clock: FakeClock | None = None) -> pa.RecordBatch:
    return make_batch([b"k%d" % i for i in range(start, start + n)], clock=clock)


def open_log(path: Path, clock: FakeClock, schema: pa.Schema | None = DEFAULT_SCHEMA,
             **config) -> Log:
    return Log.open(path / "topic-0", "topic", 0, TopicConfig(**config), schema, clock)


def reopen(log: Log, clock: FakeClock, clean: bool, recovery_point: int = 0, **config) -> Log:
    config = {**log.config.to_dict(), **config}
    return Log.open(log.dir, "topic", 0, TopicConfig(**config), None, clock,
                    recovery_point=recovery_point, clean_shutdown=clean)


def records(log: Log, start: int | None = None) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from ``start`` (the log start) to the end."""
    offset = log.log_start_offset if start is None else start
    out = []
    while offset < log.log_end_offset:
        fetch = log.read(offset, 1 << 30)
        if not fetch.batches:
            break
        for batch in fetch.batches:
            rb = batch.record_batch(log.schema)
            out += [r for r in zip(batch.offsets().tolist(), rb.column("key").to_pylist(),
                                   rb.column("value").to_pylist(), strict=True) if r[0] >= offset]
        offset = fetch.batches[-1].header.next_offset
    return out


def segment_files(log: Log) -> list[Path]:
    return sorted(log.dir.glob("*" + fmt.SEGMENT_SUFFIX))


def abandon(log: Log) -> None:
    """Forget a log without closing it cleanly (as a crash would): index entries reach the
    files, nothing is fsynced, no snapshot or final time-index entry is written."""
    for seg in log._state.segments:
        seg.flush_indexes()
        seg.close()
