"""The RemoteLogManager over a real Log in tmp_path, the embedded metadata store and a file://
object store, on a FakeClock: copying, retention in both tiers, fencing, lineage, orphans, the
rate limit and deleted topics."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from logstore.controller.store import TopicRecord
from logstore.errors import RequestTimedOutError
from logstore.tiering.metadata import RemoteLogSegmentMetadata, RemoteLogSegmentState
from logstore.tiering.naming import parse_object_key, segment_key
from logstore.tiering.store import ObjectStore, RemoteStorageError
from logstore.tiering.tier_manager import RemoteLogManager, RemoteLogManagerConfig
from tests.unit.segment_helpers import keyed
from tests.unit.tiering_helpers import TIP, TOPIC_ID, TP, CountingStore, FailingStore, tiered

S = RemoteLogSegmentState


def test_sealed_segments_below_the_high_watermark_are_copied_with_their_sidecars(
        tmp_path: Path) -> None:
    """Goal: the leader copies each sealed segment below the HW, byte for byte, with its
    indexes, producer snapshot and epoch checkpoint, under a fresh segment id, and records it
    FINISHED. Method: three sealed segments with the HW inside the third; one run; compare
    objects with the local files; raise the HW and run again."""
    t = tiered(tmp_path)
    t.produce_segments(2)
    t.produce_segments(1, committed=False)
    t.log.append_as_leader(keyed(30, 5, t.clock))
    t.log.update_high_watermark(25)
    t.lead()
    t.rlm.run_task(TP)
    entries = t.meta.remote_log_segments(TIP)
    assert [(m.base_offset, m.end_offset, m.state) for m in entries] == [
        (0, 9, S.COPY_SEGMENT_FINISHED), (10, 19, S.COPY_SEGMENT_FINISHED)]
    first = entries[0]
    assert t.store.read_object(segment_key(first, ".arrow")) == \
        (t.log.dir / "00000000000000000000.arrow").read_bytes()
    assert t.store.read_object(segment_key(first, ".index")) == \
        (t.log.dir / "00000000000000000000.index").read_bytes()
    suffixes = {parse_object_key(k).suffix for k in t.objects()}  # type: ignore[union-attr]
    assert suffixes >= {".arrow", ".index", ".timeindex", ".leader-epoch-checkpoint",
                        ".colcrc"}
    assert t.store.read_object(segment_key(first, ".leader-epoch-checkpoint")) == b"0\n1\n0 0\n"
    stats = t.rlm.stats(TP)
    assert stats is not None and (stats.remote_segments, stats.copy_lag_segments) == (2, 1)
    t.log.update_high_watermark(35)
    t.clock.advance(1000)
    assert t.rlm.run_due() == 1
    assert len(t.meta.remote_log_segments(TIP)) == 3
    assert t.rlm.stats(TP).copy_lag_bytes == 0  # type: ignore[union-attr]


def test_local_segments_go_only_once_copied_and_past_local_retention(tmp_path: Path) -> None:
    """Goal: never delete local data that is not in the remote tier. Method: local retention
    1 s; four sealed segments, the HW after two; after the clock passes local retention only
    the two copied ones go; the partition's log start offset stays 0 and offset 0 is found
    remotely."""
    t = tiered(tmp_path, local_retention_ms=1000)
    t.produce_segments(2)
    t.produce_segments(2, committed=False)
    t.lead()
    t.rlm.run_task(TP)
    assert t.log.log_start_offset == 0  # copied, but not yet past local retention
    t.clock.advance(2000)
    t.rlm.run_task(TP)
    assert t.log.log_start_offset == 20
    assert t.rlm.log_start_offset(TP) == 0
    found = t.rlm.find_remote_segment(TP, 5)
    assert found is not None and found.base_offset == 0
    assert sorted(p.name for p in t.log.dir.glob("*.arrow"))[0] == "00000000000000000020.arrow"


def test_remote_retention_deletes_objects_and_entries_and_moves_the_log_start(
        tmp_path: Path) -> None:
    """Goal: total retention by time applies to the remote tier: entry taken through
    DELETE_SEGMENT_STARTED/FINISHED (removed), objects deleted, log start offset past them.
    Method: retention 10 s over copied, locally deleted segments; advance the clock."""
    t = tiered(tmp_path, local_retention_ms=0)
    t.log.update_config(replace(t.log.config, retention_ms=10_000))
    t.produce_segments(3)
    t.clock.advance(1)
    t.lead()
    t.rlm.run_task(TP)
    assert len(t.meta.remote_log_segments(TIP)) == 3 and t.log.log_start_offset == 30
    t.clock.advance(11_000)
    t.produce_segments(1)
    t.rlm.run_task(TP)
    assert [m.base_offset for m in t.meta.remote_log_segments(TIP)] == [30]
    assert all(parse_object_key(k).base_offset == 30 for k in t.objects())  # type: ignore[union-attr]
    assert t.rlm.log_start_offset(TP) == 30
    assert t.rlm.find_remote_segment(TP, 5) is None


def test_remote_retention_by_size_counts_local_bytes_not_yet_copied(tmp_path: Path) -> None:
    """Goal: retention_bytes spans both tiers. Method: copy two segments, then produce two
    more that stay local (HW held back); with retention_bytes of three segments the oldest
    remote segment goes."""
    t = tiered(tmp_path)
    t.produce_segments(2)
    t.lead()
    t.rlm.run_task(TP)
    size = t.meta.remote_log_segments(TIP)[0].size_bytes
    t.log.update_config(replace(t.log.config, retention_bytes=3 * size))
    t.produce_segments(2, committed=False)
    t.rlm.run_task(TP)
    assert [m.base_offset for m in t.meta.remote_log_segments(TIP)] == [10]


def test_a_failed_upload_leaves_no_objects_keeps_local_data_and_retries(tmp_path: Path) -> None:
    """Goal: a copy failing mid-way deletes what it uploaded, records nothing FINISHED, deletes
    nothing local, and retries with backoff. Method: fail the index upload of the first copy;
    check store and log; let uploads succeed and run when the backoff has passed."""
    t = tiered(tmp_path, store=FailingStore, local_retention_ms=0)
    t.produce_segments(2)
    t.store.fail_put = lambda key: key.endswith(".index")
    t.lead()
    t.rlm.run_task(TP)
    assert t.meta.remote_log_segments(TIP) == [] and t.objects() == []
    assert t.log.log_start_offset == 0 and len(list(t.log.dir.glob("*.arrow"))) == 3
    t.clock.advance(400)
    assert t.rlm.run_due() == 0  # backing off
    t.store.fail_put = lambda key: False
    t.clock.advance(200)
    assert t.rlm.run_due() == 1
    assert [m.state for m in t.meta.remote_log_segments(TIP)] == [S.COPY_SEGMENT_FINISHED] * 2


def test_a_stale_leader_is_fenced_and_its_task_stops(tmp_path: Path) -> None:
    """Goal: a broker that lost leadership (the leader epoch moved on) writes nothing and
    stops tiering the partition. Method: lead at epoch 0, bump the stored epoch to 1, run; no
    entry, no object, the task is gone; leading at epoch 1 copies."""
    t = tiered(tmp_path)
    t.produce_segments(1)
    t.lead(0)
    t.set_leader_epoch(1)
    t.rlm.run_task(TP)
    assert t.meta.remote_log_segments(TIP) == [] and t.objects() == []
    assert t.rlm.stats(TP) is None
    t.lead(1)
    t.rlm.run_task(TP)
    assert [m.leader_epoch for m in t.meta.remote_log_segments(TIP)] == [1]


def test_a_new_leader_deletes_finished_segments_outside_its_lineage(tmp_path: Path) -> None:
    """Goal: segments copied from a history the new leader does not share are deleted, never
    read. Method: an old leader's FINISHED copy of offsets 0..9 whose lineage has epoch 1 from
    offset 5, unknown to the new leader's epoch cache; on leading it is not readable, the first
    run deletes it with its objects and copies the leader's own segment."""
    t = tiered(tmp_path)
    t.produce_segments(1)
    theirs = RemoteLogSegmentMetadata(TIP, "9" * 32, 0, 9, 0, 100, 1, ((0, 0), (1, 5)),
                                      S.COPY_SEGMENT_STARTED, t.clock.time_ms())
    t.meta.put_remote_log_segment(theirs, 0)
    t.meta.put_remote_log_segment(theirs.with_state(S.COPY_SEGMENT_FINISHED, 1), 0)
    t.store.put_bytes(segment_key(theirs, ".arrow"), b"divergent")
    t.lead()
    assert t.rlm.find_remote_segment(TP, 0) is None
    t.rlm.run_task(TP)
    (ours,) = t.meta.remote_log_segments(TIP)
    assert ours.segment_id != theirs.segment_id and ours.segment_leader_epochs == ((0, 0),)
    assert all(theirs.segment_id not in key for key in t.objects())


def test_orphans_are_removed_after_the_grace_period(tmp_path: Path) -> None:
    """Goal: leftovers of dead copies go, but only after the grace period. Method: a previous
    leader copied one segment and died copying the next (a STARTED entry and half its objects)
    and left an object with no entry at all; a new leader removes nothing before the grace
    period and both after it."""
    t = tiered(tmp_path)
    t.produce_segments(1)
    t.lead()
    t.rlm.run_task(TP)
    (done,) = t.meta.remote_log_segments(TIP)
    dead = replace(done, segment_id="d" * 32, base_offset=10, end_offset=19,
                   state=S.COPY_SEGMENT_STARTED, state_timestamp_ms=t.clock.time_ms())
    t.meta.put_remote_log_segment(dead, 0)
    t.store.put_bytes(segment_key(dead, ".arrow"), b"half")
    t.store.put_bytes(segment_key(replace(dead, segment_id="e" * 32), ".arrow"), b"lost")
    t.lead()
    t.clock.advance(30_000)
    t.rlm.run_task(TP)
    assert len(t.objects()) == 8  # 6 of the copy (with .colcrc), 2 orphans
    t.clock.advance(61_000)
    t.rlm.run_task(TP)
    assert [m.segment_id for m in t.meta.remote_log_segments(TIP)] == [done.segment_id]
    assert all(done.segment_id in key for key in t.objects())


def test_copy_rate_limit_defers_the_next_copy(tmp_path: Path) -> None:
    """Goal: remote_log_manager_copy_max_bytes_per_second holds copying to that rate without
    sleeping. Method: a rate of one segment per second; one run copies one segment (the next
    would go into debt) and asks to run again after about a second."""
    probe = tiered(tmp_path / "probe")
    probe.produce_segments(1)
    size = probe.log.segments_info()[0]["size_bytes"]
    t = tiered(tmp_path, rlm_config=RemoteLogManagerConfig(
        task_interval_ms=60_000, copy_max_bytes_per_second=size))
    t.produce_segments(3)
    t.lead()
    t.rlm.run_task(TP)
    assert len(t.meta.remote_log_segments(TIP)) == 1
    t.clock.advance(1100)
    assert t.rlm.run_due() == 1
    assert len(t.meta.remote_log_segments(TIP)) == 2


def test_deleted_topics_remote_segments_are_cleaned_up(tmp_path: Path) -> None:
    """Goal: deleting a topic removes its remote objects and entries. Method: copy, delete the
    topic, recreate the name with another id, clean up with the live ids."""
    t = tiered(tmp_path)
    t.produce_segments(2)
    t.lead()
    t.rlm.run_task(TP)
    t.rlm.on_stop_leading(TP)
    t.meta.delete_topic("orders")
    t.meta.create_topic(TopicRecord("orders", {0: (1,)}, topic_id="1" * 32), {})
    assert t.rlm.cleanup_deleted_topics({"1" * 32}) == 2
    assert t.meta.remote_log_partitions() == [] and t.objects() == []
    assert t.rlm.cleanup_deleted_topics({"1" * 32}) == 0


class _SignallingStore(CountingStore):
    """Sets ``uploaded`` when the last object of a copy (the epoch checkpoint) is stored."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.uploaded = threading.Event()

    def put_bytes(self, key: str, data: bytes) -> None:
        super().put_bytes(key, data)
        self.uploaded.set()


def test_background_thread_copies_on_its_own(tmp_path: Path) -> None:
    """Goal: start() runs due tasks without being driven. Method: start the manager (the first
    run is due at once), wait (bounded) for the copy's last upload, then close, which waits for
    the run to finish; the copy is FINISHED."""
    t = tiered(tmp_path, store=_SignallingStore)
    t.produce_segments(1)
    t.lead()
    t.rlm.start()
    try:
        assert t.store.uploaded.wait(20)
    finally:
        t.rlm.close()
    assert [m.state for m in t.meta.remote_log_segments(TIP)] == [S.COPY_SEGMENT_FINISHED]
    assert TOPIC_ID in t.objects()[0]


class _UnreachableMetadata:
    """The embedded store, with reads of remote entries failing while ``down``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = True

    def remote_log_segments(self, partition: Any) -> Any:
        if self.down:
            raise RequestTimedOutError("ZooKeeper did not list the entries: not connected")
        return self.inner.remote_log_segments(partition)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_reads_before_the_entries_are_loaded_are_retriable_not_out_of_range(
        tmp_path: Path) -> None:
    """Goal: a new leader that could not read its entries yet never answers "out of range"
    (which could make consumers reset their offsets). Method: the metadata store fails the
    read at leadership; a lookup raises a retriable error; once it answers, the first run loads
    and the lookup finds the segment."""
    t = tiered(tmp_path)
    t.produce_segments(1)
    t.lead()
    t.rlm.run_task(TP)
    meta = _UnreachableMetadata(t.meta)
    t.rlm = RemoteLogManager(t.store, meta, t.clock)
    t.lead()
    with pytest.raises(RemoteStorageError, match="orders-0: offset 0: .*not loaded") as raised:
        t.rlm.find_remote_segment(TP, 0)
    assert raised.value.retriable
    meta.down = False
    t.rlm.run_task(TP)
    assert t.rlm.find_remote_segment(TP, 0) is not None


def test_log_start_before_the_entries_are_loaded_is_retriable_not_the_local_start(
        tmp_path: Path) -> None:
    """Goal: a new leader that could not read its entries yet never reports its local log
    start offset as the log start over both tiers (ListOffsets EARLIEST, describe_log_dirs
    and timestamp lookups would then skip the whole remote tier). Method: three segments
    tiered and deleted locally; a new leadership whose metadata store fails the read; the log
    start raises a retriable error until the first run loads the entries."""
    t = tiered(tmp_path, local_retention_ms=0)
    t.produce_segments(3)
    t.clock.advance(1)
    t.lead()
    t.rlm.run_task(TP)
    assert t.log.log_start_offset == 30 and t.rlm.log_start_offset(TP) == 0
    meta = _UnreachableMetadata(t.meta)
    t.rlm = RemoteLogManager(t.store, meta, t.clock)  # a new leadership
    t.lead()
    with pytest.raises(RemoteStorageError, match="orders-0: .*not loaded") as raised:
        t.rlm.log_start_offset(TP)
    assert raised.value.retriable
    meta.down = False
    t.rlm.run_task(TP)
    assert t.rlm.log_start_offset(TP) == 0
