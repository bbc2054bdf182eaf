"""PartitionFiles (logstore/segments/file_reader.py): read-only reads of a partition directory
that a real Log wrote in tmp_path, compared with Log.read; a deleted, corrupted or compacted
segment, a garbage offset index, and reads racing appends from another thread.

Randomised tests take the ``seed`` fixture (tests/conftest.py: LOGSTORE_TEST_SEED replays one)
and name it in every assertion message.
"""

from __future__ import annotations

import random
import struct
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from segment_helpers import keyed, make_batch, open_log, segment_files

from logstore import errors
from logstore.clock import FakeClock
from logstore.records import MAGIC, StoredBatch
from logstore.segments import format as fmt
from logstore.segments.file_reader import PartitionFiles
from logstore.segments.log import Log


def _random_log(tmp_path: Path, rng: random.Random, batches: int = 60, **config) -> Log:
    """Batches of 1..20 records keyed ``k<offset>``, in several segments (small segment_bytes,
    a few explicit rolls) with a sparse offset index."""
    config = {"segment_bytes": 20_000, "index_interval_bytes": 3_000, **config}
    log = open_log(tmp_path, FakeClock(), **config)
    for _ in range(batches):
        log.append_as_leader(keyed(log.log_end_offset, rng.randint(1, 20)))
        if rng.random() < 0.05:
            log.roll()
    return log


def _file_batches(path: Path, start: int, end: int) -> list[tuple[pa.Schema, StoredBatch]]:
    return list(PartitionFiles(path).read(start, end))


def _log_batches(log: Log, start: int, end: int) -> list[StoredBatch]:
    """What the broker's own read path returns for [start, end): whole batches from the one
    holding ``start``, none starting at or after ``end``."""
    out: list[StoredBatch] = []
    offset = start
    while offset < end:
        fetch = log.read(offset, 1 << 30, max_offset=end)
        if not fetch.batches:
            break
        out += fetch.batches
        offset = fetch.batches[-1].header.next_offset
    return out


def _same(found: list[tuple[pa.Schema, StoredBatch]], expected: list[StoredBatch],
          schema: pa.Schema) -> bool:
    return [b.header for _, b in found] == [b.header for b in expected] and all(
        s.equals(schema) and f.record_batch(s).equals(e.record_batch(schema))
        for (s, f), e in zip(found, expected, strict=True))


def _offsets(found: list[tuple[pa.Schema, StoredBatch]]) -> list[int]:
    return [o for _, b in found for o in b.offsets().tolist()]


def _index_entries(log: Log, base: int) -> list[tuple[int, int]]:
    raw = (log.dir / fmt.file_name(base, fmt.INDEX_SUFFIX)).read_bytes()
    return [fmt.OFFSET_ENTRY.unpack_from(raw, i) for i in range(0, len(raw), fmt.OFFSET_ENTRY.size)]


# -- reads equal Log.read -----------------------------------------------------------------


def test_random_ranges_read_the_same_batches_as_log_read(tmp_path: Path, seed: int) -> None:
    """Goal: for any range inside the log, the files give exactly the batches Log.read gives
    (headers and decoded records), covering every offset of the range.
    Method: a seeded random log over several rolled segments; 150 random [start, end) ranges,
    each read both ways and compared."""
    rng = random.Random(seed)
    log = _random_log(tmp_path, rng)
    log.flush()
    assert len(segment_files(log)) >= 4, f"seed {seed}: the log should span several segments"
    leo = log.log_end_offset
    for _ in range(150):
        start = rng.randrange(0, leo)
        end = rng.randint(start + 1, leo)
        found = _file_batches(log.dir, start, end)
        assert _same(found, _log_batches(log, start, end), log.schema), \
            f"seed {seed}: [{start}, {end}) differs from Log.read"
        assert set(range(start, end)) <= set(_offsets(found)), f"seed {seed}: [{start}, {end})"
        assert found[-1][1].header.base_offset < end, f"seed {seed}: [{start}, {end})"


def test_read_starting_inside_a_batch_yields_that_whole_batch(tmp_path: Path) -> None:
    """Goal: a range starting mid-batch yields the batch that holds the start (whole), and a
    range ending mid-batch yields the batch that holds end - 1 but none after it.
    Method: batches of 10 records; read [15, 16), [15, 35) and [15, 30)."""
    log = open_log(tmp_path, FakeClock(), index_interval_bytes=1)
    for i in range(5):
        log.append_as_leader(keyed(i * 10, 10))
    bases = {r: [b.header.base_offset for _, b in _file_batches(log.dir, *r)]
             for r in ((15, 16), (15, 35), (15, 30))}
    assert bases == {(15, 16): [10], (15, 35): [10, 20, 30], (15, 30): [10, 20]}


def test_a_range_spanning_segments_reads_each_file_in_turn(tmp_path: Path) -> None:
    """Goal: one read goes on from one segment file into the next.
    Method: roll after every batch of 10 (four files), read [5, 35) and check bases and keys."""
    log = open_log(tmp_path, FakeClock())
    for i in range(4):
        log.append_as_leader(keyed(i * 10, 10))
        log.roll()
    assert len(segment_files(log)) == 5
    found = _file_batches(log.dir, 5, 35)
    assert [b.header.base_offset for _, b in found] == [0, 10, 20, 30]
    keys = [k for s, b in found for k in b.record_batch(s).column("key").to_pylist()]
    assert keys == [b"k%d" % i for i in range(40)]


def test_empty_range_reads_nothing_and_a_range_past_the_files_raises(tmp_path: Path) -> None:
    """Goal: start >= end yields nothing without touching the files; a range the files end
    before, or a vanished directory, is OffsetOutOfRangeError naming where the files end.
    Method: a 20-record log; read [7, 7), [25, 3), [10, 30), and a missing directory."""
    log = open_log(tmp_path, FakeClock())
    log.append_as_leader(keyed(0, 20))
    assert _file_batches(log.dir, 7, 7) == [] and _file_batches(log.dir, 25, 3) == []
    with pytest.raises(errors.OffsetOutOfRangeError, match="end at offset 20, before 30"):
        _file_batches(log.dir, 10, 30)
    with pytest.raises(errors.OffsetOutOfRangeError, match="gone"):
        _file_batches(tmp_path / "nothing-0", 0, 1)


# -- deleted segments -----------------------------------------------------------------------


def test_range_below_the_oldest_segment_raises_naming_the_directory(tmp_path: Path) -> None:
    """Goal: once retention deleted the oldest segment, reading its offsets raises
    OffsetOutOfRangeError naming the partition directory, the offset and the oldest base.
    Method: three segments; move the log start offset to 20 and run retention; read [5, 25)."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10, clock))
        log.roll()
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(20)
    assert log.delete_old_segments() == 2
    with pytest.raises(errors.OffsetOutOfRangeError) as e:
        _file_batches(log.dir, 5, 25)
    assert str(log.dir) in str(e.value) and "offset 5" in str(e.value)
    assert "base offset 20" in str(e.value)
    assert [b.header.base_offset for _, b in _file_batches(log.dir, 20, 25)] == [20]


def test_segment_deleted_before_it_is_opened_raises_naming_the_file(tmp_path: Path) -> None:
    """Goal: a segment listed at the start of a read but deleted before it is opened raises
    OffsetOutOfRangeError naming that file (not a bare FileNotFoundError).
    Method: start reading [0, 30) over three segments, take the first batch, unlink the second
    segment's file, go on."""
    log = open_log(tmp_path, FakeClock())
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10))
        log.roll()
    reads = PartitionFiles(log.dir).read(0, 30)
    next(reads)
    doomed = log.dir / fmt.file_name(10, fmt.SEGMENT_SUFFIX)
    doomed.unlink()
    with pytest.raises(errors.OffsetOutOfRangeError, match=str(doomed)):
        next(reads)


def test_segment_deleted_after_it_was_opened_is_still_read_whole(tmp_path: Path) -> None:
    """Goal: deleting a segment file that a read has opened does not disturb that read (the
    open inode keeps the bytes). Method: three batches in one segment; take the first batch,
    unlink the file, read the other two."""
    log = open_log(tmp_path, FakeClock())
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10))
    reads = PartitionFiles(log.dir).read(0, 30)
    first = next(reads)
    segment_files(log)[0].unlink()
    rest = list(reads)
    assert [b.header.base_offset for _, b in [first, *rest]] == [0, 10, 20]
    assert rest[-1][1].record_batch(rest[-1][0]).column("key")[9].as_py() == b"k29"


# -- the offset index is only a hint --------------------------------------------------------


def test_garbage_offset_index_still_reads_correctly(tmp_path: Path, seed: int) -> None:
    """Goal: whatever the .index files hold, reads give the same batches as Log.read (the
    index is a hint, checked against the batch it points at).
    Method: a seeded log with an index entry per batch; replace each .index with random bytes
    (odd lengths too), with entries whose keys are right but positions wrong, or whose
    positions point at the schema, into a batch, past the end or at negative offsets; then
    compare 40 random ranges with Log.read."""
    rng = random.Random(seed)
    log = _random_log(tmp_path, rng, index_interval_bytes=1)
    log.flush()
    leo = log.log_end_offset
    for path in log.dir.glob("*" + fmt.INDEX_SUFFIX):
        entries = [fmt.OFFSET_ENTRY.unpack_from(path.read_bytes(), i)
                   for i in range(0, path.stat().st_size, fmt.OFFSET_ENTRY.size)]
        size = path.with_suffix(fmt.SEGMENT_SUFFIX).stat().st_size
        kind = rng.choice(["random", "shifted", "wild"])
        if kind == "random":
            data = rng.randbytes(rng.randrange(0, 200))
        elif kind == "shifted":
            data = b"".join(fmt.OFFSET_ENTRY.pack(k, v + rng.choice([-9, -1, 1, 7, 200]))
                            for k, v in entries)
        else:
            data = b"".join(fmt.OFFSET_ENTRY.pack(k, rng.choice([0, -v, v + 3, size, 2**31 - 1]))
                            for k, v in entries)
        path.write_bytes(data)
    for _ in range(40):
        start = rng.randrange(0, leo)
        end = rng.randint(start + 1, leo)
        assert _same(_file_batches(log.dir, start, end), _log_batches(log, start, end),
                     log.schema), f"seed {seed}: [{start}, {end}) differs from Log.read"


def test_index_entry_with_a_negative_position_is_ignored(tmp_path: Path) -> None:
    """Goal: an index entry with a negative position is not followed, even when Python's
    negative indexing would make the bytes there look like the right batch header.
    Method: one segment of three batches; write an index whose only entry is (0, data_start -
    file size), which wraps around to the first batch; read [0, 30)."""
    log = open_log(tmp_path, FakeClock())
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10))
    log.flush()
    (_, data_start), = _index_entries(log, 0)
    size = segment_files(log)[0].stat().st_size
    (log.dir / fmt.file_name(0, fmt.INDEX_SUFFIX)).write_bytes(
        fmt.OFFSET_ENTRY.pack(0, data_start - size))
    assert [b.header.base_offset for _, b in _file_batches(log.dir, 0, 30)] == [0, 10, 20]


# -- corruption -----------------------------------------------------------------------------


def _flip(path: Path, position: int, mask: int = 0x40) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["body", "record_count", "metadata_length", "continuation"])
def test_flipped_bit_in_a_sealed_segment_raises_naming_file_and_position(
        tmp_path: Path, where: str) -> None:
    """Goal: a flipped bit in a batch of a sealed segment is CorruptRecordError naming the file
    and the batch's byte position, wherever the bit is: in the body or a CRC-covered header
    field (CRC mismatch) or in the IPC framing (the message cannot be read). It must never
    read as the end of the segment, which would silently skip the rest of it.
    Method: two sealed segments of two batches each plus an active one; flip one bit in the
    second batch of the first segment; read [0, 40)."""
    log = open_log(tmp_path, FakeClock(), index_interval_bytes=1)
    for i in range(4):
        log.append_as_leader(keyed(i * 10, 10))
        if i % 2:
            log.roll()
    log.flush()
    path = segment_files(log)[0]
    (_, _), (_, position) = _index_entries(log, 0)
    header_at = path.read_bytes().find(MAGIC, position)
    target = {"body": path.stat().st_size - 1, "record_count": header_at + struct.calcsize("<6sqi"),
              "metadata_length": position + 4, "continuation": position}[where]
    _flip(path, target)
    with pytest.raises(errors.CorruptRecordError) as e:
        _file_batches(log.dir, 0, 40)
    assert str(path) in str(e.value) and f"position {position}" in str(e.value)


def test_corruption_past_the_end_of_the_range_is_not_read(tmp_path: Path) -> None:
    """Goal: a read stops at the batch holding end - 1 and never parses what follows it, so
    damage after the range (e.g. a torn tail being written) does not fail it.
    Method: three batches in the active segment; cut the file in the middle of the third;
    read [0, 20) and [5, 15)."""
    log = open_log(tmp_path, FakeClock(), index_interval_bytes=1)
    for i in range(3):
        log.append_as_leader(keyed(i * 10, 10))
    log.flush()
    path = segment_files(log)[0]
    (_, _), (_, _), (_, third) = _index_entries(log, 0)
    with open(path, "r+b") as f:
        f.truncate(third + 20)
    assert [b.header.base_offset for _, b in _file_batches(log.dir, 0, 20)] == [0, 10]
    assert [b.header.base_offset for _, b in _file_batches(log.dir, 5, 15)] == [0, 10]


# -- compaction -------------------------------------------------------------------------------


def test_compacted_log_reads_the_surviving_records(tmp_path: Path, seed: int) -> None:
    """Goal: after compaction (gaps inside batches, between batches and between segments) the
    files give what Log.read gives, and a range wholly inside a gap gives nothing, no error.
    Method: a seeded log of keys from a small key space over several segments, compacted;
    80 random ranges compared with Log.read; every surviving offset of a range is yielded."""
    rng = random.Random(seed)
    clock = FakeClock()
    log = open_log(tmp_path, clock, cleanup_policy="compact", segment_bytes=6_000,
                   index_interval_bytes=500)
    for _ in range(50):
        n = rng.randint(1, 12)
        log.append_as_leader(make_batch([b"k%d" % rng.randrange(15) for _ in range(n)],
                                        clock=clock))
        if rng.random() < 0.1:
            log.roll()
    log.roll()
    log.append_as_leader(make_batch([b"last"], clock=clock))
    log.update_high_watermark(log.log_end_offset)  # compaction stops at the LSO (<= HW)
    stats = log.compact()
    assert stats.records_kept < stats.records_read, f"seed {seed}: nothing was compacted"
    leo = log.log_end_offset
    surviving = {o for b in _log_batches(log, 0, leo) for o in b.offsets().tolist()}
    for _ in range(80):
        start = rng.randrange(0, leo)
        end = rng.randint(start + 1, leo)
        found = _file_batches(log.dir, start, end)
        assert _same(found, _log_batches(log, start, end), log.schema), \
            f"seed {seed}: [{start}, {end}) differs from Log.read"
        wanted = {o for o in surviving if start <= o < end}
        assert wanted <= set(_offsets(found)), f"seed {seed}: [{start}, {end}) lost records"


# -- concurrent appends -------------------------------------------------------------------------


def test_reads_racing_appends_never_go_past_the_end_given(tmp_path: Path, seed: int) -> None:
    """Goal: while another thread appends (and rolls), a read of [start, end) with end at most
    the log end offset learnt before the read yields every offset of the range, right keys, no
    batch starting at or after end and no record at or after that log end offset.
    Method: a writer thread appends 400 small batches to a log with tiny segments; the main
    thread meanwhile reads seeded random ranges below the log end offset it just read (at most
    3000 reads), checking each."""
    rng = random.Random(seed)
    log = open_log(tmp_path, FakeClock(), segment_bytes=8_000, index_interval_bytes=1_000)
    log.append_as_leader(keyed(0, 5))
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(400):
                log.append_as_leader(keyed(log.log_end_offset, rng.randint(1, 8)))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            failures.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while thread.is_alive() and reads < 3000:
        leo = log.log_end_offset
        end = rng.randint(1, leo)
        start = rng.randrange(max(0, end - 200), end)
        found = _file_batches(log.dir, start, end)
        offsets = _offsets(found)
        keys = [k for s, b in found for k in b.record_batch(s).column("key").to_pylist()]
        assert keys == [b"k%d" % o for o in offsets], f"seed {seed}: [{start}, {end})"
        assert set(range(start, end)) <= set(offsets), f"seed {seed}: [{start}, {end})"
        assert all(b.header.base_offset < end for _, b in found), f"seed {seed}"
        assert max(offsets) < leo, f"seed {seed}: a record at or past {leo}"
        reads += 1
    thread.join()
    assert failures == [] and reads > 0
    assert len(segment_files(log)) > 3, f"seed {seed}: the writer should have rolled"

