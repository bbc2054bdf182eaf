"""Remote reads in the Spark DataSource's pure parts: which spans the driver asks leaders
about (remote_spans), how planned pieces are cut between remote segments and the leader
(assign_sources, a hypothesis property over overlapping copies), and the remote options."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datasource.options import OptionError, parse_read_options
from datasource.planning import (
    OffsetRange,
    PartitionInfo,
    RemoteRangeError,
    assign_sources,
    remote_spans,
)
from logstore.model import TopicPartition
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)

TP = TopicPartition("t", 0)
BASE = {"bootstrap.servers": "h:1", "subscribe": "t"}


def segment(base: int, end: int, sid: str = "a") -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        TopicIdPartition("t", "0" * 32, 0), sid * 32, base, end, 0, 100, 0, ((0, base),),
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)


def info(log_start: int, local_start: int, hw: int) -> dict[TopicPartition, PartitionInfo]:
    return {TP: PartitionInfo(TP, "h:1", log_start, hw, local_log_start_offset=local_start)}


def test_auto_asks_only_below_the_local_log_start_and_remote_asks_everything() -> None:
    """Goal: the driver asks leaders only about what it may read remotely. Method: pieces
    straddling the local log start 50, each mode."""
    pieces = [OffsetRange(TP, 10, 30), OffsetRange(TP, 30, 70)]
    infos = info(0, 50, 100)
    assert remote_spans(pieces, infos, "auto") == {TP: (10, 50)}
    assert remote_spans(pieces, infos, "remote") == {TP: (10, 70)}
    assert remote_spans(pieces, infos, "fetch") == {}
    assert remote_spans([OffsetRange(TP, 60, 70)], infos, "auto") == {}


def test_auto_cuts_pieces_at_segment_boundaries_and_leaves_the_local_part_to_the_leader() -> None:
    """Goal: each input partition reads from one source. Method: segments [0,19], [20,39];
    local log start 40; a piece [5, 60)."""
    out = assign_sources([OffsetRange(TP, 5, 60)], info(0, 40, 60),
                         {TP: [segment(0, 19), segment(20, 39, "b")]}, "auto")
    assert [(r.start, r.end, s.base_offset if s else None) for r, s in out] == [
        (5, 20, 0), (20, 40, 20), (40, 60, None)]


def test_remote_mode_names_the_partition_and_offsets_no_segment_holds() -> None:
    """Goal: readMode=remote never falls back to the broker. Method: a gap [20, 30) between
    segments; the active segment after 40."""
    segments = {TP: [segment(0, 19), segment(30, 39, "b")]}
    with pytest.raises(RemoteRangeError, match=r"t-0: readMode=remote, but offsets \[20, 30\)"):
        assign_sources([OffsetRange(TP, 0, 40)], info(0, 40, 50), segments, "remote")
    with pytest.raises(RemoteRangeError, match=r"offsets \[40, 45\)"):
        assign_sources([OffsetRange(TP, 30, 45)], info(0, 40, 50), segments, "remote")


@st.composite
def copies(draw: st.DrawFn) -> tuple[list[RemoteLogSegmentMetadata], int, int, int]:
    """Overlapping FINISHED copies (a leader change re-copies a straddling segment), a local
    log start, and a piece."""
    bounds = sorted(draw(st.sets(st.integers(0, 200), min_size=2, max_size=12)))
    segments = [segment(lo, hi - 1, f"{i:x}") for i, (lo, hi) in
                enumerate(zip(bounds, bounds[1:], strict=False))]
    for i, s in enumerate(draw(st.lists(st.sampled_from(segments), max_size=3))):
        extra = draw(st.integers(1, 30))
        segments.append(segment(s.base_offset, s.end_offset + extra, f"e{i}"))
    local = draw(st.integers(bounds[0], 230))
    start = draw(st.integers(bounds[0], 230))
    end = draw(st.integers(start, 240))
    return segments, local, start, end


@given(copies())
def test_auto_pieces_cover_the_range_once_and_each_lies_in_its_segment(
        case: tuple[list[RemoteLogSegmentMetadata], int, int, int]) -> None:
    """Goal: whatever the copies, the cut pieces tile the planned range exactly (no gap, no
    overlap, in order), a remote piece lies inside its segment and below the local log start,
    and the newest copy holding an offset serves it. Method: hypothesis over overlapping
    copies, local log starts and pieces."""
    segments, local, start, end = case
    out = assign_sources([OffsetRange(TP, start, end)], info(0, local, 240), {TP: segments},
                         "auto")
    pos = start
    for r, s in out:
        assert r.start == pos and r.end > r.start
        pos = r.end
        if s is not None:
            assert s.base_offset <= r.start and r.end <= s.next_offset and r.end <= local
            holding = [m for m in segments if m.base_offset <= r.start <= m.end_offset]
            assert s.base_offset == max(m.base_offset for m in holding)
    assert pos == end or (start == end and not out)


def test_remote_storage_options_refuse_credentials_without_echoing_them() -> None:
    """Goal: credentials never travel in Spark options (plans and logs show them); a bad
    value is not echoed. Method: a key that names a secret, nested; invalid JSON."""
    parsed = parse_read_options({**BASE, "readMode": "remote", "remoteStorageUri": "s3://b/p",
                                 "remoteStorageOptions": '{"endpoint_url": "http://h:1"}'},
                                False)
    assert parsed.read_mode == "remote" and parsed.remote_storage_uri == "s3://b/p"
    assert parsed.remote_storage_options == {"endpoint_url": "http://h:1"}
    with pytest.raises(OptionError, match=r"remoteStorageOptions.client_kwargs."
                                          r"aws_secret_access_key looks like a credential"):
        parse_read_options({**BASE, "remoteStorageOptions": '{"client_kwargs": '
                            '{"aws_secret_access_key": "s3cr3t"}}'}, False)
    with pytest.raises(OptionError) as bad:
        parse_read_options({**BASE, "remoteStorageOptions": '{"secret": s3cr3t'}, False)
    assert "s3cr3t" not in str(bad.value)
    with pytest.raises(OptionError, match="remoteStorageUri must be an fsspec URL"):
        parse_read_options({**BASE, "remoteStorageUri": "bucket"}, False)


def test_a_lost_remote_txn_index_fails_a_spark_read_committed_plan(tmp_path: Any) -> None:
    """Goal: Spark's driver collects aborted transactions from the remote .txnindex objects
    itself; a segment whose metadata (as list_remote_segments carries it) says it was copied
    with one, now missing, is CORRUPT_MESSAGE naming the segment, not "no aborted
    transaction" (its aborted records would read as committed); a segment copied without one
    reads as before. Method: the planner's metadata from a wire entry, and the collector over
    an empty local store."""
    from datasource.committed import RemoteAbortedCollector
    from datasource.planning import RemoteStore, _segment_metadata
    from logstore.errors import CorruptRecordError
    from logstore.messages.tiering import RemoteSegmentEntry

    entry = RemoteSegmentEntry(topic_id="ab" * 16, segment_id="s" * 32, base_offset=0,
                               end_offset=9, max_timestamp=0, size_bytes=1, leader_epoch=0,
                               epochs=[[0, 0]], key="k", txn_index=True)
    lost = _segment_metadata("t", 0, entry)
    assert lost.has_txn_index is True
    store = RemoteStore(f"file://{tmp_path}", {})
    collector = RemoteAbortedCollector(metadata=None)  # type: ignore[arg-type]
    with pytest.raises(CorruptRecordError, match="t-0 remote segment s+ .*transaction index"):
        collector.collect(TP, 0, 10, [lost], store)
    for told in (False, None):
        plain = _segment_metadata("t", 0, msgspec.structs.replace(entry, txn_index=told))
        assert collector._entries(store, plain) == []
