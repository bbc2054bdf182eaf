"""The micro-batch read limits of LogStoreStreamReader, without Spark or a broker.

``_limited`` decides each trigger's end offsets from the start offsets, what is available and
the read limit; these tests drive it with chosen numbers and an explicit clock reading.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from datasource import source
from datasource.options import parse_read_options
from datasource.planning import DataLossError, PartitionInfo
from datasource.schema import source_arrow_schema
from datasource.source import IDLE_POLL_INTERVAL_S, LogStoreStreamReader
from logstore.model import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


# The metadata of a planner stub: it knows no topic ids (as from a broker that sends none), so
# stream offsets name none and no recreate is seen.
NO_TOPIC_IDS = SimpleNamespace(known_topic_id=lambda topic: None)

def reader(**options: str) -> LogStoreStreamReader:
    opts = parse_read_options({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **options},
                              streaming=True)
    return LogStoreStreamReader(opts, from_arrow_schema(source_arrow_schema(None, False)))


def test_default_limit_follows_the_options() -> None:
    """Goal: maxOffsetsPerTrigger becomes ReadMaxRows, minOffsetsPerTrigger alone ReadMinRows,
    neither ReadAllAvailable. Method: getDefaultReadLimit for each."""
    assert reader(maxOffsetsPerTrigger="7").getDefaultReadLimit() == ReadMaxRows(7)
    assert reader(minOffsetsPerTrigger="3").getDefaultReadLimit() == ReadMinRows(3)
    assert isinstance(reader().getDefaultReadLimit(), ReadAllAvailable)


def test_max_rows_is_shared_in_proportion_and_all_available_ignores_it() -> None:
    """Goal: a ReadMaxRows trigger reads exactly that many records, split by backlog; the
    engine's ReadAllAvailable (Trigger.Once) reads everything despite the option.
    Method: 30 + 10 records available, limit 8."""
    r = reader(maxOffsetsPerTrigger="8")
    begin, latest = {A: 100, B: 0}, {A: 130, B: 10}
    end = r._limited(begin, latest, ReadMaxRows(8), now=0.0)
    assert end == {A: 106, B: 2}
    assert r._limited(begin, latest, ReadAllAvailable(), now=0.0) == latest


def test_min_rows_waits_until_enough_or_the_delay_passes() -> None:
    """Goal: with minOffsetsPerTrigger, a trigger with fewer records available reads nothing
    until maxTriggerDelay has passed since the last batch, then reads what there is.
    Method: 5 records available, minimum 10, delay 1 s; clock readings 0.5 s and 1.5 s."""
    r = reader(minOffsetsPerTrigger="10", maxTriggerDelay="1s")
    r._last_batch_at = 0.0
    begin, latest = {A: 0, B: 0}, {A: 3, B: 2}
    assert r._limited(begin, latest, ReadMinRows(10), now=0.5) == begin
    assert r._limited(begin, latest, ReadMinRows(10), now=1.5) == latest
    assert r._limited(begin, {A: 8, B: 4}, ReadMinRows(10), now=0.5) == {A: 8, B: 4}


def test_available_now_caps_at_the_target_and_ignores_the_minimum() -> None:
    """Goal: after prepareForTriggerAvailableNow, no trigger goes past the offsets recorded
    then (new partitions included), and a minimum cannot stall the query forever.
    Method: set the target by hand; cap and limit as latestOffset does."""
    r = reader(minOffsetsPerTrigger="1000")
    r._target = {A: 50}
    assert r._cap(A, 80, 10) == 50
    assert r._cap(B, 80, 0) == 0  # a partition born after the target: nothing to read
    assert r._limited({A: 10}, {A: 50}, ReadMinRows(1000), now=0.0) == {A: 50}


def test_reader_pickles_without_its_connections() -> None:
    """Goal: the reader shipped to executors carries no sockets. Method: pickle after the
    planner property was touched."""
    import pickle

    r = reader()
    r._planner = object()  # stands for a live Planner
    assert pickle.loads(pickle.dumps(r))._planner is None


def test_idle_poll_long_polls_instead_of_answering_stale_offsets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: right after an idle poll, latestOffset long-polls the leaders (bounded by
    IDLE_POLL_INTERVAL_S) and then asks for offsets, so it reports records that arrived since
    (answering the start offsets unasked made Spark's processAllAvailable return before they
    were read) without a tight loop while idle. Method: a stubbed partition listing and a
    stubbed long poll; an idle call, then 3 records, then a call at once."""
    r = reader()
    high_watermark, polls, waits = [5], [], []

    def current() -> dict[TopicPartition, PartitionInfo]:
        polls.append(time.monotonic())
        return {A: PartitionInfo(A, "127.0.0.1:1", 0, high_watermark[0])}

    class LongPoll:
        metadata = NO_TOPIC_IDS

        def await_data(self, positions: dict[TopicPartition, int], max_wait_ms: int) -> None:
            waits.append((positions, max_wait_ms))

    monkeypatch.setattr(r, "_current", current)
    r._planner = LongPoll()  # type: ignore[assignment]
    start = {"t": {"0": 5}}
    assert r.latestOffset(start, ReadAllAvailable()) == start  # idle: no long poll yet
    assert waits == []
    high_watermark[0] = 8
    assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 8}}
    assert waits == [({A: 5}, int(IDLE_POLL_INTERVAL_S * 1000))] and len(polls) == 2


def test_offsets_that_went_back_are_data_loss(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Goal: when a partition's high watermark is below the stream's position (the topic was
    recreated or the log truncated), the stream reports data loss (an error, or with
    failOnDataLoss=false a warning and reading on from the new end) instead of waiting
    silently until the log grows past the old position and then skipping what came before;
    and a batch replayed from the checkpoint past the high watermark is data loss too, not
    an option error. Method: stubbed partition listings with the high watermark at 20."""
    monkeypatch.setattr(source, "WENT_BACK_RETRY_S", 0.0)
    info = {A: PartitionInfo(A, "127.0.0.1:1", 0, 20)}
    for fail in (True, False):
        r = reader(failOnDataLoss=str(fail).lower())
        monkeypatch.setattr(r, "_current", lambda: dict(info))
        r._planner = SimpleNamespace(describe=lambda tps: dict(info), close=lambda: None,
                                     metadata=NO_TOPIC_IDS)
        at_50, at_0 = {"t": {"0": 50}}, {"t": {"0": 0}}
        end = r.latestOffset(at_50, ReadAllAvailable())
        assert end == {"t": {"0": 20}}
        if fail:
            with pytest.raises(DataLossError, match="t-0: offsets went back from 50 to 20"):
                r.partitions(at_50, end)
            with pytest.raises(DataLossError, match=r"t-0: offsets \[20, 50\)"):
                r.partitions(at_0, at_50)
        else:
            with caplog.at_level(logging.WARNING, logger="datasource.source"):
                assert r.partitions(at_50, end) == []
                tasks = r.partitions(at_0, at_50)
            assert [(t.task.start, t.task.end) for t in tasks] == [(0, 20)]
            assert "went back to 20" in caplog.text


def test_a_high_watermark_that_lags_for_a_moment_is_asked_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: a high watermark below the stream's offsets is asked for again before it counts
    as data loss, as Spark's Kafka source does (a newly elected leader's may lag the old
    one's until its followers fetch): no error when it comes back. Method: a stubbed listing
    that answers 20 once, then 60."""
    monkeypatch.setattr(source, "WENT_BACK_RETRY_S", 0.0)
    answers = iter([20, 60])
    r = reader()
    r._planner = SimpleNamespace(
        describe=lambda tps: {A: PartitionInfo(A, "127.0.0.1:1", 0, next(answers))},
        close=lambda: None, metadata=NO_TOPIC_IDS)
    at_50 = {"t": {"0": 50}}
    assert [(t.task.start, t.task.end) for t in r.partitions({"t": {"0": 0}}, at_50)] == \
        [(0, 50)]
    answers = iter([20, 60])
    monkeypatch.setattr(r, "_current", lambda: r.planner.describe([A]))
    assert r.latestOffset(at_50, ReadAllAvailable()) == {"t": {"0": 60}}
