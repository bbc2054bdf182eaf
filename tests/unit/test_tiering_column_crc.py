"""Projected reads detect corruption (issue 11 §4): the copy uploads a ``.colcrc`` sidecar with
a CRC32C per top-level column per batch, and a projected read (what Spark executors run,
without ``verify``) checks exactly the bytes it fetched against it; a segment copied without
one is read whole with its batch CRCs checked.

Method: real segments copied by the RemoteLogManager to a file:// object store (the
tiering_helpers harness), bytes flipped in the uploaded objects on disk, and the bytes read
counted at the ObjectStore seam."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from logstore.errors import CorruptRecordError
from logstore.tiering.naming import segment_key
from logstore.tiering.projection import (
    ProjectedSegmentReader,
    column_checksums,
    parse_column_checksums,
)
from tests.unit.test_tiering_projection import NESTED, WIDE, _read, _typed
from tests.unit.tiering_helpers import TP, Tiered


def _flip_value(t: Tiered, column: str) -> Path:
    """Flip the lowest mantissa bit of the first value of float64 ``column`` in the first
    remote segment object; its path."""
    segment = t.rlm.remote_segments(TP)[0]
    (first, *_) = list(ProjectedSegmentReader(t.store, segment).read([column]))
    value = first.batch.column(column)[0].as_py()
    path = t.root / "remote" / segment_key(segment, ".arrow")
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<d", value))
    assert at > 0
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def test_a_flipped_bit_in_a_projected_column_is_detected(tmp_path: Path) -> None:
    t = _typed(tmp_path, WIDE, rows=100)
    _flip_value(t, "c0")
    segment = t.rlm.remote_segments(TP)[0]
    with pytest.raises(CorruptRecordError,
                       match=r"orders-0 remote segment .*position \d+: column 'c0' does not "
                             r"match its CRC32C"):
        list(ProjectedSegmentReader(t.store, segment).read(["c0"]))
    # A column the flip did not touch still reads (only the fetched bytes are judged).
    assert sum(b.batch.num_rows for b in
               ProjectedSegmentReader(t.store, segment).read(["c5"])) == 303


def test_a_flipped_bit_in_the_batch_metadata_is_detected(tmp_path: Path) -> None:
    t = _typed(tmp_path, WIDE, rows=100)
    segment = t.rlm.remote_segments(TP)[0]
    path = t.root / "remote" / segment_key(segment, ".arrow")
    positions = sorted(parse_column_checksums(
        t.store.read_object(segment_key(segment, ".colcrc")), len(t.log.schema)))
    data = bytearray(path.read_bytes())
    data[positions[1] + 8 + 100] ^= 0x01  # inside the second batch's flatbuffer
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"position \d+: the batch's metadata does not "
                                                 r"match its CRC32C"):
        list(ProjectedSegmentReader(t.store, segment).read(["c3"]))


def test_a_segment_copied_without_checksums_is_verified_whole(tmp_path: Path) -> None:
    """An older copy (no .colcrc): each batch is read whole, so a flip is still caught by the
    batch CRC, at the cost of reading the whole batch."""
    t = _typed(tmp_path, WIDE, rows=100)
    segment = t.rlm.remote_segments(TP)[0]
    (t.root / "remote" / segment_key(segment, ".colcrc")).unlink()
    clean, clean_bytes = _read(t, ["c0"])
    assert clean_bytes >= sum(m.size_bytes for m in t.rlm.remote_segments(TP)[:1]) * 0.9
    _flip_value(t, "c0")
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch"):
        list(ProjectedSegmentReader(t.store, segment).read(["c0"]))


def test_checksums_keep_projected_reads_small(tmp_path: Path) -> None:
    """The sidecar costs little: 2 of 20 columns still fetch at most a fifth of the bytes of
    all 20, sidecar included."""
    t = _typed(tmp_path, WIDE)
    _, two_bytes = _read(t, ["c3", "c17"])
    _, all_bytes = _read(t, WIDE.names)
    assert two_bytes <= 0.2 * all_bytes, (two_bytes, all_bytes)
    assert any(k.endswith(".colcrc") for k in t.store.keys_read)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_nested_and_compressed_columns_verify_as_stored(tmp_path: Path, compression: str
                                                        ) -> None:
    """Every column type's buffers (nested ones, compressed bodies) match their sidecar
    entry: every batch has one, and each column reads alone without error."""
    t = _typed(tmp_path, NESTED, batches=2, rows=300, compression_type=compression)
    for segment in t.rlm.remote_segments(TP):
        sidecar = t.store.read_object(segment_key(segment, ".colcrc"))
        local = column_checksums(t.root / "remote" / segment_key(segment, ".arrow"))
        assert sidecar == local
        crcs = parse_column_checksums(sidecar, len(t.log.schema))
        assert len(crcs) == 2
    for name in t.log.schema.names:
        assert len(_read(t, [name])[0]) == 4


def test_a_damaged_sidecar_is_reported_not_trusted(tmp_path: Path) -> None:
    t = _typed(tmp_path, WIDE, rows=10)
    segment = t.rlm.remote_segments(TP)[0]
    path = t.root / "remote" / segment_key(segment, ".colcrc")
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"\.colcrc: column checksums do not match"):
        list(ProjectedSegmentReader(t.store, segment).read(["c1"]))
    with pytest.raises(ValueError, match="1 column"):
        parse_column_checksums(column_checksums(
            t.root / "remote" / segment_key(segment, ".arrow")), 1)
