"""Property test of Log against an in-memory model.

Goal: any sequence of appends, rolls, truncations, log-start-offset moves, retention runs,
flushes and (clean or unclean) reopens leaves the log reading exactly what a plain list of
(offset, key, value) says it should. Method: a hypothesis rule-based state machine over a real
log directory with tiny segments and indexes (so rolls, index-full rolls and multi-segment reads
happen often); after every step the whole log is read back in pages of random size and compared
with the model. Hypothesis prints the failing step sequence (and its seed) on failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.records import DEFAULT_SCHEMA, TIMESTAMP_TYPE
from logstore.segments.log import Log

CONFIG = TopicConfig(segment_bytes=4_000, index_interval_bytes=700, segment_index_bytes=48,
                     retention_ms=5_000)
KEYS = st.binary(min_size=0, max_size=6)
VALUES = st.one_of(st.none(), st.binary(min_size=0, max_size=300))


def batch_of(rows: list[tuple[bytes, bytes | None]], now: int) -> pa.RecordBatch:
    n = len(rows)
    return pa.record_batch([
        pa.array([k for k, _ in rows], pa.binary()),
        pa.array([v for _, v in rows], pa.binary()),
        pa.array([now] * n, pa.int64()).cast(TIMESTAMP_TYPE),
        pa.nulls(n, DEFAULT_SCHEMA.field("headers").type),
    ], schema=DEFAULT_SCHEMA)


class Batch:
    """A batch as the model sees it: its offset range and its surviving records."""

    def __init__(self, base: int, last: int, rows: list[tuple[int, bytes, bytes | None]]) -> None:
        self.base, self.last, self.rows = base, last, rows


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="logprops-"))
        self.clock = FakeClock()
        self.log = Log.open(self.root / "t-0", "t", 0, CONFIG, DEFAULT_SCHEMA, self.clock)
        self.batches: list[Batch] = []
        self.log_start = 0
        self.log_end = 0

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def expected(self) -> list[tuple[int, bytes, bytes | None]]:
        return [row for batch in self.batches for row in batch.rows if row[0] >= self.log_start]

    # -- rules -------------------------------------------------------------------------------

    @rule(rows=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=12))
    def append(self, rows: list[tuple[bytes, bytes | None]]) -> None:
        info = self.log.append_as_leader(batch_of(rows, self.clock.time_ms()))
        assert info.first_offset == self.log_end
        base = self.log_end
        self.batches.append(Batch(base, base + len(rows) - 1,
                                  [(base + i, k, v) for i, (k, v) in enumerate(rows)]))
        self.log_end += len(rows)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.log_end))
        self.log.truncate_to(offset)
        if offset >= self.log_end:
            return
        kept = [b for b in self.batches if b.last < offset]
        dropped = self.batches[len(kept):]
        self.log_end = min(offset, dropped[0].base) if dropped else offset
        self.batches = kept
        if self.log_end < self.log_start:  # nothing readable is left: restart at the start
            self.log_end, self.batches = self.log_start, []

    @rule(data=st.data())
    def raise_log_start(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.log_end))
        self.log.maybe_increment_log_start_offset(offset)
        assert self.log.log_start_offset == max(offset, self.log_start)
        self.log.delete_old_segments()  # may also apply time retention
        assert self.log.log_start_offset >= offset
        self.log_start = self.log.log_start_offset

    @rule(ms=st.integers(0, 10_000))
    def retention(self, ms: int) -> None:
        self.clock.advance(ms)
        self.log.update_high_watermark(self.log_end)
        self.log.delete_old_segments()
        assert self.log.log_start_offset >= self.log_start
        self.log_start = self.log.log_start_offset
        first_base = self.log.segments_info()[0]["base_offset"]
        self.batches = [b for b in self.batches if b.last >= first_base]

    @rule()
    def compact(self) -> None:
        """Latest record per key among the sealed segments survives, at its offset; tombstones
        stay (delete_retention_ms is a day); emptied batches vanish."""
        self.log.update_high_watermark(self.log_end)  # compaction stops at the LSO (<= HW)
        active_base = self.log.segments_info()[-1]["base_offset"]
        sealed = [b for b in self.batches if b.base < active_base]
        latest = {key: offset for b in sealed for offset, key, _ in b.rows}
        for b in sealed:
            b.rows = [r for r in b.rows if latest[r[1]] == r[0]]
            b.base = b.rows[0][0] if b.rows else b.base
        self.batches = [b for b in self.batches if b.rows]
        self.log.compact()

    @rule()
    def flush(self) -> None:
        self.log.flush()
        assert self.log.recovery_point == self.log_end

    @rule(clean=st.booleans(), flush_first=st.booleans())
    def reopen(self, clean: bool, flush_first: bool) -> None:
        if flush_first:
            self.log.flush()
        point = self.log.recovery_point
        if clean:
            self.log.close()
        else:
            for seg in self.log._state.segments:
                seg.flush_indexes()
                seg.close()
        self.log = Log.open(self.root / "t-0", "t", 0, CONFIG, None, self.clock,
                            recovery_point=point, log_start_offset=self.log_start,
                            clean_shutdown=clean)
        # a log start offset that was inside the (now reopened) first segment is remembered only
        # through the checkpoint, which is what log_start_offset passes in
        assert self.log.log_start_offset == self.log_start

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def offsets_match(self) -> None:
        assert self.log.log_end_offset == self.log_end
        assert self.log.log_start_offset == self.log_start
        assert self.log.log_start_offset <= self.log.high_watermark <= self.log.log_end_offset

    @invariant()
    def reads_match(self) -> None:
        got, offset, page = [], self.log_start, 1 + (self.log_end * 997) % 5_000
        while offset < self.log_end:
            fetch = self.log.read(offset, page)
            if not fetch.batches:  # only a gap (compacted or truncated away) is left
                assert all(row[0] < offset for row in self.expected())
                break
            for batch in fetch.batches:
                rb = batch.record_batch(DEFAULT_SCHEMA)
                rows = zip(batch.offsets().tolist(), rb.column("key").to_pylist(),
                           rb.column("value").to_pylist(), strict=True)
                got += [r for r in rows if r[0] >= offset]
            offset = fetch.batches[-1].header.next_offset
        assert got == self.expected()


TestLogModel = LogModel.TestCase
TestLogModel.settings = settings(max_examples=int(os.environ.get("LOGSTORE_PROPERTY_EXAMPLES", "100")),
                                 stateful_step_count=30, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])
