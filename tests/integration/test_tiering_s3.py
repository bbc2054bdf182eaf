"""Tiering faults against a real S3 endpoint (moto's server on 127.0.0.1, through s3fs's HTTP
path) and a real ZooKeeper: an upload cut off by the store stopping, a bit flip in a remote
object, and a stale leader fenced by ZooKeeper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from logstore.controller.store import PartitionState, TopicRecord
from logstore.errors import CorruptRecordError
from logstore.tiering.fsspec_store import FsspecObjectStore
from logstore.tiering.metadata import RemoteLogSegmentState
from logstore.tiering.naming import segment_key
from logstore.tiering.remote_cache import ChunkCache, RemoteIndexCache
from logstore.tiering.remote_reader import RemoteFetchRequest, RemoteLogReader
from logstore.tiering.store import ObjectStore
from logstore.tiering.tier_manager import RemoteLogManager, RemoteLogManagerConfig
from tests.unit.tiering_helpers import TIP, TOPIC_ID, TP, CountingStore, Tiered, tiered

S = RemoteLogSegmentState
GRACE_MS = 60_000


def _on_s3(tmp_path: Path, moto: Any, s3_url: str, wrap: Any = None,
           meta: Any = None) -> Tiered:
    """A tiered partition whose object store is the moto bucket (optionally wrapped) and whose
    metadata store is ``meta`` (the embedded one by default)."""
    t = tiered(tmp_path)
    store: ObjectStore = FsspecObjectStore(s3_url, moto.options())
    t.store = wrap(store) if wrap else store
    t.meta = meta or t.meta
    t.rlm = RemoteLogManager(t.store, t.meta, t.clock, RemoteLogManagerConfig(
        task_interval_ms=1000, orphan_grace_ms=GRACE_MS, broker_id=1))
    return t


class _StopsAfterFirstUpload(CountingStore):
    """Stops the moto server right after the first object of a copy is uploaded."""

    def __init__(self, inner: ObjectStore, moto: Any) -> None:
        super().__init__(inner)
        self.moto = moto
        self.armed = True

    def put_file(self, key: str, path: Path) -> int:
        size = super().put_file(key, path)
        if self.armed:
            self.armed = False
            self.moto.stop()
        return size


def test_an_upload_cut_off_by_the_store_stopping_is_cleaned_and_redone(
        tmp_path: Path, moto_s3: Any, s3_url: str) -> None:
    """Goal: a copy that dies mid-way (the store stopped after the segment file went up)
    leaves no FINISHED entry and deletes nothing local; once the store is back the segment is
    copied again under a new id, and the dead copy's entry and object go after the grace
    period. Method: stop moto from inside the first upload; check entries and the log; start
    moto; run after the backoff and after the grace period."""
    t = _on_s3(tmp_path, moto_s3, s3_url, lambda s: _StopsAfterFirstUpload(s, moto_s3))
    t.log.update_config(t.log.config.updated({"local_retention_ms": 0}))
    t.produce_segments(1)
    t.clock.advance(1)
    t.lead()
    t.rlm.run_task(TP)
    (dead,) = t.meta.remote_log_segments(TIP)
    assert dead.state is S.COPY_SEGMENT_STARTED
    assert t.log.log_start_offset == 0 and t.rlm.stats(TP).remote_segments == 0  # type: ignore[union-attr]
    moto_s3.start()
    t.clock.advance(1000)
    t.rlm.run_task(TP)
    states = {m.segment_id: m.state for m in t.meta.remote_log_segments(TIP)}
    assert states.pop(dead.segment_id) is S.COPY_SEGMENT_STARTED
    assert list(states.values()) == [S.COPY_SEGMENT_FINISHED]
    assert t.store.exists(segment_key(dead, ".arrow"))  # inside the grace period
    assert t.log.log_start_offset == 10  # copied, so the local segment could go
    t.clock.advance(GRACE_MS + 1000)
    t.rlm.run_task(TP)
    assert [m.segment_id for m in t.meta.remote_log_segments(TIP)] == list(states)
    assert not t.store.exists(segment_key(dead, ".arrow"))


def test_a_bit_flip_in_an_s3_object_fails_the_read_naming_topic_partition_and_offset(
        tmp_path: Path, moto_s3: Any, s3_url: str) -> None:
    """Goal: corruption in the object store is caught by the CRC check, never served. Method:
    copy two segments to moto, flip one bit of the second segment's object through the S3 API,
    read offsets of both segments."""
    t = _on_s3(tmp_path, moto_s3, s3_url)
    t.produce_segments(2)
    t.lead()
    t.rlm.run_task(TP)
    second = t.rlm.find_remote_segment(TP, 10)
    assert second is not None
    bucket, prefix = s3_url[len("s3://"):].split("/", 1)
    key = f"{prefix}/{segment_key(second, '.arrow')}"
    s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint_url, region_name="us-east-1")
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[-40] ^= 0x04
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    reader = RemoteLogReader(t.store, t.rlm, RemoteIndexCache(tmp_path / "ic", 1 << 20, t.store),
                             ChunkCache(1 << 20, 1 << 16), 2)
    assert reader.submit(RemoteFetchRequest(TP, 3, 1 << 20)).result(30).batches
    with pytest.raises(CorruptRecordError, match=r"orders-0: offset 12: .*batch at offset 10: "
                                                 r"CRC32C mismatch"):
        reader.submit(RemoteFetchRequest(TP, 12, 1 << 20)).result(30)
    reader.close()


def test_zookeeper_fences_a_stale_leaders_copy(tmp_path: Path, moto_s3: Any, s3_url: str,
                                               zk_connect: str) -> None:
    """Goal: after the controller moves the leader epoch on, the old leader's tiering writes
    nothing and stops. Method: the ZooKeeper metadata store; copy one segment at epoch 0,
    bump the partition's epoch to 1 in ZooKeeper, produce and run: no new entry, the objects
    of the refused copy are gone, the task stopped."""
    from logstore.controller.zookeeper import KazooMetadataStore

    meta = KazooMetadataStore(zk_connect, 1, session_timeout_ms=6000)
    meta.start()
    try:
        meta.create_topic(TopicRecord("orders", {0: (1,)}, topic_id=TOPIC_ID),
                          {0: PartitionState(1, 0, (1,))})
        t = _on_s3(tmp_path, moto_s3, s3_url, meta=meta)
        t.produce_segments(1)
        t.lead(0)
        t.rlm.run_task(TP)
        assert [m.state for m in meta.remote_log_segments(TIP)] == [S.COPY_SEGMENT_FINISHED]
        assert meta.set_partition_state("orders", 0, PartitionState(1, 1, (1,)))
        t.produce_segments(1)
        t.rlm.run_task(TP)
        assert len(meta.remote_log_segments(TIP)) == 1
        assert t.rlm.stats(TP) is None
        assert len(t.objects()) == 6  # the first copy's objects only
    finally:
        meta.close()
