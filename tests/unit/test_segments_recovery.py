"""Storage layer recovery: torn tails, bit flips above and below the recovery point, broken
indexes, torn schema messages, interrupted compaction swaps and clean reopen. The damage is done
by editing the segment files directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from segment_helpers import (
    abandon,
    keyed,
    open_log,
    records,
    reopen,
    segment_files,
)

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.records import DEFAULT_SCHEMA
from logstore.segments import format as fmt
from logstore.segments.log import Log

# -- recovery ----------------------------------------------------------------------------


def _log_with_batches(tmp_path: Path, clock: FakeClock, n: int = 5) -> tuple[Log, list[int]]:
    log = open_log(tmp_path, clock, index_interval_bytes=1)
    sizes = [log.append_as_leader(keyed(i * 10, 10)).batch_size for i in range(n)]
    return log, sizes


def test_recovery_truncates_torn_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Goal: after a crash mid-write, every complete batch survives and the torn one goes.
    Method: cut the segment file in the middle of its last batch, reopen uncleanly."""
    log, sizes = _log_with_batches(tmp_path, FakeClock())
    abandon(log)
    path = segment_files(log)[0]
    os.truncate(path, path.stat().st_size - sizes[-1] // 2)
    reopened = reopen(log, FakeClock(), clean=False)
    assert reopened.log_end_offset == 40
    assert [r[0] for r in records(reopened)] == list(range(40))
    assert "truncating segment file" in caplog.text and str(path) in caplog.text
    assert reopened.append_as_leader(keyed(0, 1)).first_offset == 40


def test_recovery_truncates_flipped_byte_in_tail(tmp_path: Path) -> None:
    """Goal: a batch whose body fails its CRC in the unflushed tail is truncated with all that
    follows, including later segment files. Method: flip a byte in the body of batch 3 of 5,
    roll once more, reopen uncleanly with recovery point 0."""
    log, sizes = _log_with_batches(tmp_path, FakeClock())
    log.roll()
    log.append_as_leader(keyed(50, 10))
    abandon(log)
    path = segment_files(log)[0]
    data = bytearray(path.read_bytes())
    data[log.segments_info()[0]["size_bytes"] - sizes[-1] - 10] ^= 0xFF  # body of batch 30
    path.write_bytes(bytes(data))
    reopened = reopen(log, FakeClock(), clean=False)
    assert reopened.log_end_offset == 30
    assert len(segment_files(reopened)) == 1
    assert [r[0] for r in records(reopened)] == list(range(30))


def test_flipped_byte_below_recovery_point_makes_read_raise(tmp_path: Path) -> None:
    """Goal: data below the recovery point is trusted at open, and a corrupt batch there is
    reported by read() naming the file and offset, never returned.
    Method: flush, roll, flip a byte in the sealed segment, reopen with the recovery point."""
    clock = FakeClock()
    log, sizes = _log_with_batches(tmp_path, clock)
    log.roll()
    log.append_as_leader(keyed(50, 10))
    log.flush()
    rp = log.recovery_point
    abandon(log)
    path = segment_files(log)[0]
    data = bytearray(path.read_bytes())
    data[len(data) - 10] ^= 0xFF  # inside the body of the batch at offset 40
    path.write_bytes(bytes(data))
    reopened = reopen(log, clock, clean=False, recovery_point=rp)
    assert reopened.log_end_offset == 60
    assert len(reopened.read(0, 1 << 20, min_one=True).batches) == 4
    with pytest.raises(errors.CorruptRecordError) as e:
        reopened.read(42, 1 << 20)
    assert str(path) in str(e.value) and "offset 40" in str(e.value)
    assert reopened.read(50, 1 << 20).batches[0].header.base_offset == 50


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate", "stale"])
def test_broken_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    """Goal: a missing, garbage, truncated or stale offset/time index is rebuilt and reads and
    time lookups still work. Method: damage the sealed segment's indexes, reopen cleanly."""
    clock = FakeClock()
    log, _ = _log_with_batches(tmp_path, clock)
    log.roll()
    log.append_as_leader(keyed(50, 10))
    log.close()
    index = log.dir / fmt.file_name(0, fmt.INDEX_SUFFIX)
    time_index = log.dir / fmt.file_name(0, fmt.TIME_INDEX_SUFFIX)
    if damage == "delete":
        index.unlink()
        time_index.unlink()
    elif damage == "garbage":
        index.write_bytes(os.urandom(64))
        time_index.write_bytes(os.urandom(36))
    elif damage == "truncate":
        index.write_bytes(index.read_bytes()[:-3])
    else:
        index.write_bytes(fmt.OFFSET_ENTRY.pack(0, 10_000_000))
    reopened = reopen(log, clock, clean=True, index_interval_bytes=1)
    assert [r[0] for r in records(reopened)] == list(range(60))
    assert reopened.read(25, 1 << 20).batches[0].header.base_offset == 20
    assert reopened.offsets_for_time(0) == (0, 1_000)
    assert len(index.read_bytes()) == 5 * fmt.OFFSET_ENTRY.size


def test_reopen_after_clean_close_keeps_everything(tmp_path: Path) -> None:
    """Goal: a clean close and reopen keeps every record, offset, segment and the log start
    offset, with no re-validation. Method: several segments, close, reopen cleanly, append."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=5_000)
    for i in range(10):
        log.append_as_leader(keyed(i * 10, 10))
    before, info = records(log), log.segments_info()
    log.close()
    with pytest.raises(errors.KafkaStorageError):
        log.append_as_leader(keyed(0, 1))
    reopened = Log.open(log.dir, "topic", 0, TopicConfig(segment_bytes=5_000), DEFAULT_SCHEMA,
                        clock, recovery_point=100, log_start_offset=5, clean_shutdown=True)
    assert reopened.log_start_offset == 5
    assert records(reopened, 0 + 5) == before[5:]
    assert [s["base_offset"] for s in reopened.segments_info()] == [s["base_offset"]
                                                                   for s in info]
    assert reopened.append_as_leader(keyed(0, 1)).first_offset == 100


def test_torn_schema_message_without_batches_is_recreated(tmp_path: Path) -> None:
    """Goal: a segment file whose schema message is torn and holds no batch is recreated
    empty, and the log works. Method: cut the active (empty) segment file to 10 bytes."""
    clock = FakeClock()
    log, _ = _log_with_batches(tmp_path, clock, n=2)
    log.roll()
    abandon(log)
    os.truncate(segment_files(log)[-1], 10)
    reopened = reopen(log, clock, clean=False)
    assert reopened.log_end_offset == 20
    assert reopened.append_as_leader(keyed(0, 1)).first_offset == 20
    assert [r[0] for r in records(reopened)] == list(range(21))


def test_interrupted_compaction_swap_is_completed(tmp_path: Path) -> None:
    """Goal: a committed swap file (crash between the cleaner's renames) replaces the segment
    and its stale indexes are rebuilt; a half-written .cleaned file is discarded.
    Method: build the on-disk state of a crash by hand, reopen."""
    clock = FakeClock()
    log, _ = _log_with_batches(tmp_path, clock, n=3)
    log.roll()
    log.append_as_leader(keyed(30, 10))
    log.close()
    path = segment_files(log)[0]
    os.rename(path, path.with_name(path.name + fmt.SWAP_SUFFIX))
    path.write_bytes(b"old junk")
    (log.dir / fmt.file_name(30, fmt.SEGMENT_SUFFIX + fmt.CLEANED_SUFFIX)).write_bytes(b"x")
    reopened = reopen(log, clock, clean=True)
    assert [r[0] for r in records(reopened)] == list(range(40))
    assert not list(log.dir.glob("*.swap")) and not list(log.dir.glob("*.cleaned"))
