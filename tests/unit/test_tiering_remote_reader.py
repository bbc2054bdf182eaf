"""Remote reads (tiering/remote_reader.py, remote_cache.py) of segments copied by the
RemoteLogManager from a real Log: the same batches as local reads, corruption and loss
reported with topic, partition and offset, bounded caches, and the reader thread pool."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from logstore.errors import CorruptRecordError, OffsetOutOfRangeError
from logstore.model import TopicPartition
from logstore.tiering.naming import segment_key
from logstore.tiering.remote_cache import ChunkCache, RemoteIndexCache
from logstore.tiering.remote_reader import RemoteFetchRequest, RemoteLogReader
from logstore.tiering.store import ObjectStore, RemoteStorageError
from tests.unit.segment_helpers import keyed
from tests.unit.tiering_helpers import TP, CountingStore, Tiered, tiered


def _copied(tmp_path: Path, segments: int = 3, batches: int = 4, **config: object) -> Tiered:
    """``segments`` sealed segments of ``batches`` batches of 5 records, copied."""
    t = tiered(tmp_path, store=CountingStore, index_interval_bytes=1, **config)
    for _ in range(segments):
        for _ in range(batches):
            t.log.append_as_leader(keyed(t.log.log_end_offset, 5, t.clock))
        t.log.roll()
    t.log.update_high_watermark(t.log.log_end_offset)
    t.lead()
    t.rlm.run_task(TP)
    return t


def _reader(t: Tiered, chunk_bytes: int = 700, index_bytes: int = 1 << 20,
            cache_bytes: int = 1 << 20, threads: int = 2) -> RemoteLogReader:
    return RemoteLogReader(t.store, t.rlm, RemoteIndexCache(t.root / "index-cache", index_bytes,
                                                            t.store),
                           ChunkCache(cache_bytes, chunk_bytes), threads)


@pytest.mark.parametrize("max_bytes", [1, 600, 2000, 1 << 20])
def test_remote_reads_return_the_batches_a_local_read_returns(tmp_path: Path,
                                                              max_bytes: int) -> None:
    """Goal: a fetch served remotely is indistinguishable from a local one. Method: for every
    offset of three copied segments (index entry per batch, 700-byte chunks so batches span
    chunks), compare the remote batches' headers and message bytes with Log.read's, up to the
    end of the segment holding the offset."""
    t = _copied(tmp_path)
    reader = _reader(t)
    for offset in range(0, t.log.log_end_offset):
        remote = reader.read(RemoteFetchRequest(TP, offset, max_bytes))
        end = remote.segment.next_offset
        local = t.log.read(offset, max_bytes, max_offset=end).batches
        assert [b.header for b in remote.batches] == [b.header for b in local], offset
        assert [b.message.serialize() for b in remote.batches] == \
            [b.message.serialize() for b in local]
    reader.close()


def _flip(t: Tiered, offset: int, at_from_end: int) -> None:
    segment = t.rlm.find_remote_segment(TP, offset)
    assert segment is not None
    path = t.root / "remote" / segment_key(segment, ".arrow")
    data = bytearray(path.read_bytes())
    data[len(data) - at_from_end] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_remote_segment_fails_the_read_naming_the_batch(
        tmp_path: Path) -> None:
    """Goal: corruption in the remote tier is detected by the CRC and reported with topic,
    partition and offset, never skipped. Method: flip one body bit in the last batch of the
    first remote segment; a read from the start stops before it (as a local read does), and
    reads of it fail."""
    t = _copied(tmp_path)
    _flip(t, 0, 20)
    reader = _reader(t)
    good = reader.read(RemoteFetchRequest(TP, 0, 1 << 20)).batches
    assert [b.header.base_offset for b in good] == [0, 5, 10]
    with pytest.raises(CorruptRecordError,
                       match=r"orders-0: offset 15: .*position \d+: batch at offset 15: CRC"):
        reader.read(RemoteFetchRequest(TP, 15, 1 << 20))
    with pytest.raises(CorruptRecordError, match="offset 17: .*batch at offset 15"):
        reader.read(RemoteFetchRequest(TP, 17, 1))
    reader.close()


def test_a_remote_object_deleted_behind_the_brokers_back_is_data_loss(tmp_path: Path) -> None:
    """Goal: a FINISHED segment whose object is gone fails loudly; one deleted by retention is
    out of range. Method: delete the second segment's object in the store; read it; then a
    read below the log start."""
    t = _copied(tmp_path)
    segment = t.rlm.find_remote_segment(TP, 25)
    assert segment is not None
    t.store.delete(segment_key(segment, ".arrow"))
    reader = _reader(t)
    with pytest.raises(CorruptRecordError, match="orders-0: offset 25: .*is missing"):
        reader.read(RemoteFetchRequest(TP, 25, 100))
    with pytest.raises(OffsetOutOfRangeError, match="orders-0: offset 999"):
        reader.read(RemoteFetchRequest(TP, 999, 100))
    reader.close()


def test_the_index_cache_downloads_once_and_evicts_the_least_recently_used(
        tmp_path: Path) -> None:
    """Goal: remote offset indexes are fetched once and kept on disk within their budget.
    Method: a budget of two index files; read three segments, re-read the third (no download),
    then the first (downloaded again: it was evicted)."""
    t = _copied(tmp_path)
    index_size = (t.log.dir / "00000000000000000000.index").stat().st_size
    reader = _reader(t, index_bytes=2 * index_size)
    cache_dir = t.root / "index-cache"

    def downloads(offset: int) -> int:
        before = len(t.store.keys_read)
        reader.read(RemoteFetchRequest(TP, offset, 1))
        return sum(k.endswith(".index") for k in t.store.keys_read[before:])

    assert [downloads(o) for o in (0, 20, 40, 45)] == [1, 1, 1, 0]
    assert len(list(cache_dir.glob("*.index"))) == 2
    assert downloads(0) == 1  # evicted, so fetched again
    reader.close()


def test_the_chunk_cache_stays_within_its_budget_and_serves_repeats(tmp_path: Path) -> None:
    """Goal: chunks are bounded and reused. Method: read everything with a 4-chunk budget (the
    cache never holds more), then read the same batch twice: the second read fetches
    nothing."""
    t = _copied(tmp_path)
    chunks = ChunkCache(2800, 700)
    reader = RemoteLogReader(t.store, t.rlm, RemoteIndexCache(t.root / "ic", 1 << 20, t.store),
                             chunks, 1)
    for offset in range(0, 60, 5):
        reader.read(RemoteFetchRequest(TP, offset, 1 << 20))
        assert chunks.size_bytes <= 2800
    reader.read(RemoteFetchRequest(TP, 5, 1))
    before = t.store.bytes_read
    reader.read(RemoteFetchRequest(TP, 5, 1))
    assert t.store.bytes_read == before
    reader.close()


class _BlockingStore(CountingStore):
    """Holds range reads of keys containing ``blocked`` until ``release`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.blocked = "-"
        self.release = threading.Event()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if self.blocked in key and not self.release.wait(30):
            raise RemoteStorageError(f"{key}: released too late")
        return super().read_range(key, start, length)


def test_a_slow_object_store_read_does_not_hold_up_other_remote_reads(tmp_path: Path) -> None:
    """Goal: remote reads run on their own pool and concurrently, so one slow read does not
    hold the others. Method: block reads of the first segment's object; submit reads of it and
    of the third segment together; the second completes while the first waits."""
    t = tiered(tmp_path, store=_BlockingStore)
    t.produce_segments(3)
    t.lead()
    t.rlm.run_task(TP)
    first = t.rlm.find_remote_segment(TP, 0)
    assert first is not None
    t.store.blocked = first.segment_id
    reader = _reader(t)
    slow, fast = reader.read_many([RemoteFetchRequest(TP, 0, 100),
                                   RemoteFetchRequest(TP, 25, 100)])
    assert fast.result(20).batches[0].header.base_offset == 20
    assert not slow.done()
    t.store.release.set()
    assert slow.result(20).batches[0].header.base_offset == 0
    reader.close()


def test_reads_of_other_partitions_are_refused_as_out_of_range(tmp_path: Path) -> None:
    t = _copied(tmp_path, segments=1)
    reader = _reader(t)
    with pytest.raises(OffsetOutOfRangeError, match="orders-1: offset 0"):
        reader.read(RemoteFetchRequest(TopicPartition("orders", 1), 0, 100))
    reader.close()
