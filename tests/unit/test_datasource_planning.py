"""The pure parts of the Spark DataSource, without a Spark session or a broker:
planning.py (split_ranges, narrow, check_range, explicit offsets, resolve of offset words),
source.py's helpers (share_limit, the JSON offsets of micro-batches, filter pushdown into
Constraints) and schema.py (output schema, requested-schema checks, batch conversion).

Importing pyspark classes is fine here; nothing starts a JVM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from segment_helpers import make_batch, open_log

from datasource.options import OffsetSpec, OptionError, parse_read_options
from datasource.planning import (
    Constraints,
    DataLossError,
    OffsetRange,
    PartitionInfo,
    Planner,
    _covering,
    check_range,
    narrow,
    split_ranges,
)
from datasource.reader import BrokerUnavailableError
from datasource.schema import (
    BatchConverter,
    SchemaError,
    check_requested,
    constant_string,
    source_arrow_schema,
)
from datasource.source import (
    STREAM_TOPIC_IDS_KEY,
    constraints_from,
    from_json_offsets,
    share_limit,
    to_json_offsets,
    topic_ids_of_offsets,
)
from logstore.clock import FakeClock
from logstore.errors import InvalidRecordError, LogstoreError
from logstore.model import EARLIEST, LATEST, TopicPartition
from logstore.records import DEFAULT_SCHEMA, FLAG_LOG_APPEND_TIME, TIMESTAMP_TYPE, topic_schema

TPS = [TopicPartition("t", p) for p in range(4)] + [TopicPartition("u", 0)]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("cls,builtin", [(OptionError, ValueError), (SchemaError, ValueError),
                                         (DataLossError, RuntimeError),
                                         (BrokerUnavailableError, RuntimeError)])
def test_datasource_errors_are_logstore_errors_and_keep_their_builtin_base(
        cls: type[Exception], builtin: type[Exception]) -> None:
    """Goal: ``except LogstoreError`` catches every error the DataSource raises on purpose,
    while callers catching ValueError or RuntimeError still do. Method: the class bases."""
    assert issubclass(cls, LogstoreError) and issubclass(cls, builtin)


def info(tp: TopicPartition, log_start_offset: int, high_watermark: int) -> PartitionInfo:
    return PartitionInfo(tp, "h:1", log_start_offset, high_watermark)


@st.composite
def offset_ranges(draw: st.DrawFn, max_start: int = 10_000, max_size: int = 400
                  ) -> list[OffsetRange]:
    """One range per partition (as check_range makes them), some empty."""
    tps = draw(st.lists(st.sampled_from(TPS), unique=True, max_size=len(TPS)))
    out = []
    for tp in tps:
        start = draw(st.integers(0, max_start))
        out.append(OffsetRange(tp, start, start + draw(st.integers(0, max_size))))
    return out


# -- split_ranges ---------------------------------------------------------------------------


@given(offset_ranges(), st.none() | st.integers(1, 40), st.none() | st.integers(1, 150))
def test_split_ranges_cover_each_range_exactly_in_bounded_ordered_pieces(
        ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None) -> None:
    """Goal: the pieces of each range are contiguous, non-empty, cover it exactly with no
    overlap, hold at most maxRecordsPerPartition each, come ordered by partition then offset,
    and number exactly max(minPartitions, pieces after the max-records cut) when there are at
    least minPartitions records.
    Method: hypothesis over ranges (one per partition, some empty) and both options."""
    pieces = split_ranges(ranges, min_partitions, max_records)
    assert pieces == sorted(pieces, key=lambda p: (p.tp, p.start))
    assert all(p.size > 0 for p in pieces)
    if max_records is not None:
        assert all(p.size <= max_records for p in pieces)
    for r in ranges:
        mine = [p for p in pieces if p.tp == r.tp]
        if r.size == 0:
            assert mine == []
            continue
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
    assert {p.tp for p in pieces} == {r.tp for r in ranges if r.size}
    cut = sum(-(-r.size // (max_records or max(r.size, 1))) for r in ranges)
    total = sum(r.size for r in ranges)
    if min_partitions is not None and total >= min_partitions:
        assert len(pieces) == max(cut, min_partitions)
    else:
        assert len(pieces) >= cut


def test_split_ranges_does_not_cut_single_records_to_reach_min_partitions() -> None:
    """Goal: minPartitions larger than the number of records gives one piece per record.
    Method: 3 records over two partitions with minPartitions=10."""
    a, b = TPS[0], TPS[1]
    pieces = split_ranges([OffsetRange(a, 5, 7), OffsetRange(b, 0, 1)], 10, None)
    assert pieces == [OffsetRange(a, 5, 6), OffsetRange(a, 6, 7), OffsetRange(b, 0, 1)]
    assert split_ranges([OffsetRange(a, 4, 4)], 3, 2) == []


# -- narrow -----------------------------------------------------------------------------------


@st.composite
def constraints(draw: st.DrawFn) -> Constraints:
    partitions = draw(st.none() | st.frozensets(st.integers(0, 4), max_size=4))
    offset_min = draw(st.integers(0, 300))
    offset_end = draw(st.none() | st.integers(0, 300))
    return Constraints(partitions, offset_min, offset_end)


@given(offset_ranges(max_start=200, max_size=60), constraints(),
       st.dictionaries(st.sampled_from(TPS), st.integers(-1, 300)))
def test_narrow_keeps_every_offset_the_constraints_allow(
        ranges: list[OffsetRange], c: Constraints, first_at_time: dict[TopicPartition, int]
        ) -> None:
    """Goal: narrowing never drops an offset the constraints allow, and keeps nothing else:
    for partition and offset bounds it is exact; a timestamp start (the first offset at or
    after the lowest timestamp, -1 for none) drops only offsets before it.
    Method: hypothesis over ranges, constraints and timestamp starts; compare offset sets."""
    def allowed(tp: TopicPartition, o: int, with_time: bool) -> bool:
        ok = (c.partitions is None or tp.partition in c.partitions) and o >= c.offset_min and (
            c.offset_end is None or o < c.offset_end)
        if with_time and tp in first_at_time:
            ok = ok and 0 <= first_at_time[tp] <= o
        return ok

    def offsets(rs: list[OffsetRange]) -> set[tuple[TopicPartition, int]]:
        return {(r.tp, o) for r in rs for o in range(r.start, r.end)}

    everything = offsets(ranges)
    assert offsets(narrow(ranges, c)) == {x for x in everything if allowed(*x, False)}
    narrowed = narrow(ranges, c, first_at_time)
    assert offsets(narrowed) == {x for x in everything if allowed(*x, True)}
    assert all(r.size > 0 for r in narrowed)
    assert narrow(ranges, Constraints()) == [r for r in ranges if r.size]


def test_constraints_empty_when_nothing_can_match() -> None:
    """Goal: Constraints.empty is true exactly for no partitions or an empty offset interval.
    Method: a few constraints."""
    assert Constraints(partitions=frozenset()).empty
    assert Constraints(offset_min=5, offset_end=5).empty
    assert not Constraints(offset_min=5, offset_end=6).empty
    assert not Constraints(partitions=frozenset({0})).empty and not Constraints().empty


# -- check_range --------------------------------------------------------------------------------


def test_check_range_rejects_start_after_end_and_end_past_high_watermark() -> None:
    """Goal: a range that starts after it ends, or ends past the high watermark (uncommitted
    records), is an OptionError naming the partition and both offsets.
    Method: check [8, 5) and [2, 11) against a log holding [0, 10)."""
    tp = TPS[0]
    with pytest.raises(OptionError, match=r"t-0: starting offset 8 is after the ending offset 5"):
        check_range(tp, 8, 5, info(tp, 0, 10), True)
    with pytest.raises(OptionError, match=r"t-0: ending offset 11 is past the high watermark 10"):
        check_range(tp, 2, 11, info(tp, 0, 10), True)
    assert check_range(tp, 2, 10, info(tp, 0, 10), True) == OffsetRange(tp, 2, 10)
    assert check_range(tp, 10, 10, info(tp, 0, 10), True) is None


def test_read_committed_ranges_end_at_the_last_stable_offset() -> None:
    """Goal: with read_committed, latest means the last stable offset (records of an open
    transaction are never planned) and an ending offset past it is refused naming it; an
    unknown LSO (-1, an older broker) falls back to the high watermark.
    Method: PartitionInfo with LSO 6 below HW 10: its end, check_range and resolve."""
    tp = TPS[0]
    committed = PartitionInfo(tp, "h:1", 0, 10, last_stable_offset=6, read_committed=True)
    assert committed.end_offset == 6
    assert PartitionInfo(tp, "h:1", 0, 10, last_stable_offset=6).end_offset == 10
    assert PartitionInfo(tp, "h:1", 0, 10, read_committed=True).end_offset == 10
    with pytest.raises(OptionError, match=r"t-0: ending offset 8 is past the last stable "
                                          r"offset 6; read_committed reads only decided"):
        check_range(tp, 2, 8, committed, True)
    assert check_range(tp, 2, 6, committed, True) == OffsetRange(tp, 2, 6)
    options = parse_read_options({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
                                  "kafka.isolation.level": "read_committed"}, False)
    planner = Planner(options)
    try:
        assert planner.resolve(OffsetSpec(LATEST), {tp: committed}, "ending") == {tp: 6}
    finally:
        planner.close()


def test_check_range_data_loss_fails_naming_the_valid_range() -> None:
    """Goal: with failOnDataLoss=true, a start below the log start offset is a DataLossError
    naming the partition, the lost offsets and the range the log holds.
    Method: check [3, 20) against a log holding [10, 30)."""
    with pytest.raises(DataLossError) as e:
        check_range(TPS[2], 3, 20, info(TPS[2], 10, 30), True)
    message = str(e.value)
    assert "t-2" in message and "[3, 10)" in message and "[10, 30)" in message
    assert "failOnDataLoss=false" in message


def test_check_range_without_fail_on_data_loss_clamps_and_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    """Goal: with failOnDataLoss=false the lost part is skipped with a warning naming it; a
    range wholly lost is no range.
    Method: check [3, 20) and [3, 8) against a log holding [10, 30)."""
    tp = TPS[1]
    with caplog.at_level(logging.WARNING, logger="datasource.planning"):
        assert check_range(tp, 3, 20, info(tp, 10, 30), False) == OffsetRange(tp, 10, 20)
        assert check_range(tp, 3, 8, info(tp, 10, 30), False) is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2
    assert "t-1: offsets [3, 10)" in caplog.records[0].getMessage()
    assert "[3, 8)" in caplog.records[1].getMessage()


def test_check_range_empty_range_below_log_start_is_no_data_loss(
        caplog: pytest.LogCaptureFixture) -> None:
    """Goal: an empty range (start == end) below the log start offset needs no record, so it
    is neither an error nor a warning, whatever failOnDataLoss says (a stream whose partition
    had no new data while retention ran would otherwise fail).
    Method: check [3, 3) against a log holding [10, 30) both ways."""
    with caplog.at_level(logging.WARNING, logger="datasource.planning"):
        assert check_range(TPS[0], 3, 3, info(TPS[0], 10, 30), True) is None
        assert check_range(TPS[0], 3, 3, info(TPS[0], 10, 30), False) is None
    assert caplog.records == []


# -- explicit offsets and resolve -------------------------------------------------------------


def test_explicit_offsets_must_name_exactly_the_partitions_read() -> None:
    """Goal: as in Spark's Kafka source, per-partition JSON offsets must name every partition
    read and no other; the errors list the partitions at fault and those read.
    Method: _covering with JSON naming too many, too few, and exactly the partitions."""
    infos = {tp: info(tp, 0, 10) for tp in TPS[:2]}
    too_many = OffsetSpec(EARLIEST, offsets={TPS[0]: 1, TPS[1]: 2, TPS[4]: 3})
    with pytest.raises(OptionError, match=r"startingOffsets names partitions \['u-0'\] that are "
                                          r"not read .*\['t-0', 't-1'\]"):
        _covering(too_many.offsets, infos, "startingOffsets")
    with pytest.raises(OptionError, match=r"endingOffsets does not name partitions \['t-1'\]"):
        _covering({TPS[0]: 1}, infos, "endingOffsets")
    exact = OffsetSpec(EARLIEST, offsets={TPS[0]: 4, TPS[1]: LATEST})
    assert _covering(exact.offsets, infos, "startingOffsets") == {TPS[0]: 4, TPS[1]: LATEST}
    assert _covering({}, infos, "startingOffsets") == {}
    with pytest.raises(OptionError, match=r"startingOffsetsByTimestamp does not name "
                                          r"partitions \['t-1'\].*ms since the epoch"):
        _covering({TPS[0]: 1}, infos, "startingOffsetsByTimestamp")


def test_resolve_maps_earliest_latest_and_explicit_offsets() -> None:
    """Goal: resolving a spec without timestamps (no broker needed) maps -2 to the log start
    offset, -1 to the high watermark and keeps explicit offsets.
    Method: a Planner (its metadata connects lazily, and nothing here asks it) resolves a
    default and a JSON spec for two partitions."""
    options = parse_read_options({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, False)
    planner = Planner(options)
    try:
        infos = {TPS[0]: info(TPS[0], 5, 50), TPS[1]: info(TPS[1], 0, 7)}
        assert planner.resolve(OffsetSpec(EARLIEST), infos, "starting") == {TPS[0]: 5, TPS[1]: 0}
        assert planner.resolve(OffsetSpec(LATEST), infos, "ending") == {TPS[0]: 50, TPS[1]: 7}
        spec = OffsetSpec(LATEST, offsets={TPS[0]: 20, TPS[1]: EARLIEST})
        assert planner.resolve(spec, infos, "ending") == {TPS[0]: 20, TPS[1]: 0}
    finally:
        planner.close()


# -- source.py: share_limit and JSON offsets ------------------------------------------------------


@st.composite
def availability(draw: st.DrawFn) -> tuple[dict[TopicPartition, int], int]:
    """Records available per partition and a limit below their total (how latestOffset calls
    share_limit: only when the total exceeds maxOffsetsPerTrigger)."""
    available = draw(st.dictionaries(st.sampled_from(TPS), st.integers(0, 10**6), min_size=1))
    total = sum(available.values())
    if total < 2:
        available[TPS[0]] = available.get(TPS[0], 0) + 2
        total += 2
    return available, draw(st.integers(1, sum(available.values()) - 1))


@given(availability())
def test_share_limit_takes_exactly_the_limit_never_more_than_available(
        case: tuple[dict[TopicPartition, int], int]) -> None:
    """Goal: the shares add up to the limit, no partition gives more than it has, and each
    gets at least its proportional share rounded down.
    Method: hypothesis over availability and a limit below the total."""
    available, limit = case
    shares = share_limit(available, limit)
    total = sum(available.values())
    assert set(shares) == set(available) and sum(shares.values()) == limit
    for tp, n in available.items():
        assert n * limit // total <= shares[tp] <= n


def test_share_limit_above_the_total_takes_only_what_is_available() -> None:
    """Goal: the docstring's 'never more than available' also when the limit exceeds the
    total. Method: 1 record available, limit 5."""
    assert share_limit({TPS[0]: 1, TPS[1]: 0}, 5) == {TPS[0]: 1, TPS[1]: 0}


def test_share_limit_with_nothing_available_gives_nothing() -> None:
    """Goal: no records available means a share of 0 each, not a KeyError.
    Method: one partition with 0 records, limit 5."""
    assert share_limit({TPS[0]: 0}, 5) == {TPS[0]: 0}


@given(st.dictionaries(st.builds(TopicPartition, st.from_regex(r"[a-zA-Z0-9._-]{1,20}",
                                                                fullmatch=True),
                                 st.integers(0, 10_000)),
                       st.integers(0, 2**62)))
def test_json_offsets_round_trip(offsets: dict[TopicPartition, int]) -> None:
    """Goal: micro-batch offsets survive to_json_offsets -> JSON text -> from_json_offsets
    unchanged (Spark stores them as JSON in the checkpoint).
    Method: hypothesis over partition -> offset maps, through orjson."""
    text = orjson.dumps(to_json_offsets(offsets))
    assert from_json_offsets(orjson.loads(text)) == offsets


def test_json_offsets_name_the_topic_ids_they_are_of() -> None:
    """Goal: a stream's offsets carry the ids of their topics (those known) under a key no
    topic can be named, read back apart from the offsets; offsets without them (an older
    checkpoint) name none. Method: through orjson, as Spark's checkpoint does."""
    offsets = {TopicPartition("a", 0): 5, TopicPartition("a", 1): 7, TopicPartition("b", 0): 1}
    data = orjson.loads(orjson.dumps(to_json_offsets(offsets, {"a": "id-a", "b": None,
                                                               "gone": "id-x"})))
    assert data == {"a": {"0": 5, "1": 7}, "b": {"0": 1}, STREAM_TOPIC_IDS_KEY: {"a": "id-a"}}
    assert from_json_offsets(data) == offsets
    assert topic_ids_of_offsets(data) == {"a": "id-a"}
    assert topic_ids_of_offsets(to_json_offsets(offsets)) == {}


# -- source.py: filter pushdown ------------------------------------------------------------------


LOCAL_TZ, LOCAL = "XST-05:30", timezone(timedelta(hours=5, minutes=30))  # naive = UTC, not this


@contextlib.contextmanager
def local_timezone(tz: str) -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = tz
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_partition_filters_intersect() -> None:
    """Goal: partition = x and partition IN (...) narrow the partition set; several intersect;
    IN () allows nothing; filters on other columns or of other kinds change nothing.
    Method: constraints_from over a few filter lists."""
    col = ("partition",)
    assert constraints_from([EqualTo(col, 2)]).partitions == {2}
    assert constraints_from([In(col, (1, 2, 3)), In(col, (2, 3, 9)), EqualTo(col, 3)]
                            ).partitions == {3}
    assert constraints_from([In(col, ())]).empty
    ignored = [GreaterThan(col, 1), EqualTo(col, "2"), EqualTo(col, True), IsNull(col),
               EqualTo(("value",), 1), EqualTo(("partition", "x"), 1),
               EqualNullSafe(col, 1), StringStartsWith(("topic",), "a")]
    assert constraints_from(ignored) == Constraints()


@pytest.mark.parametrize(("filters", "bounds"), [
    ([EqualTo(("offset",), 7)], (7, 8)),
    ([In(("offset",), (9, 3, 5))], (3, 10)),
    ([GreaterThan(("offset",), 7)], (8, None)),
    ([GreaterThanOrEqual(("offset",), 7)], (7, None)),
    ([LessThan(("offset",), 7)], (0, 7)),
    ([LessThanOrEqual(("offset",), 7)], (0, 8)),
    ([GreaterThan(("offset",), 3), LessThan(("offset",), 10), LessThanOrEqual(("offset",), 20),
      GreaterThanOrEqual(("offset",), 2)], (4, 10)),
    ([GreaterThan(("offset",), -5)], (0, None)),
    ([LessThan(("offset",), 0)], (0, 0)),
    ([In(("offset",), ()), IsNotNull(("offset",)), EqualTo(("offset",), 1.5)], (0, None)),
])
def test_offset_filters_become_an_interval(filters: list[Filter],
                                           bounds: tuple[int, int | None]) -> None:
    """Goal: comparisons, equality and IN on offset make the tightest [min, end) interval
    that holds every matching offset; non-integer values and other kinds are ignored.
    Method: constraints_from over each filter list."""
    c = constraints_from(filters)
    assert (c.offset_min, c.offset_end) == bounds


def test_timestamp_filters_give_only_a_lower_bound_rounded_down_to_ms() -> None:
    """Goal: timestamp >, >= and = give the lowest timestamp (ms, rounded down so no record is
    lost); < and <= give nothing (records are in offset order, not time order).
    Method: aware datetimes with microseconds, and the upper-bound kinds."""
    at = datetime(2024, 5, 1, 12, 0, 0, 123_456, tzinfo=UTC)
    ms = (at - EPOCH) // timedelta(milliseconds=1)
    for kind in (GreaterThan, GreaterThanOrEqual, EqualTo):
        low = constraints_from([kind(("timestamp",), at)]).timestamp_min_ms
        assert low is not None and ms - 1 <= low <= ms
    assert constraints_from([LessThan(("timestamp",), at), LessThanOrEqual(("timestamp",), at),
                             GreaterThan(("timestamp",), 5)]) == Constraints()
    later = at + timedelta(seconds=1)
    two = constraints_from([GreaterThan(("timestamp",), later), GreaterThan(("timestamp",), at)])
    assert two.timestamp_min_ms == constraints_from([GreaterThan(("timestamp",), later)]
                                                    ).timestamp_min_ms


def test_naive_timestamps_are_utc_wall_clock_time() -> None:
    """Goal: a naive datetime (how PySpark hands TIMESTAMP_NTZ values over; TimestampType ones
    come aware) is wall-clock time in UTC, as the reader's timestamp_ntz column is, whatever
    the process's zone: read as local time it bounded 5 h too late west of UTC and dropped
    matching rows. Method: in a +05:30 zone, the same instant naive (UTC wall time) and aware
    (UTC and +05:30)."""
    aware = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    with local_timezone(LOCAL_TZ):
        lows = {constraints_from([GreaterThanOrEqual(("timestamp",), v)]).timestamp_min_ms
                for v in (aware, aware.astimezone(LOCAL), aware.replace(tzinfo=None))}
    assert len(lows) == 1


def test_timestamp_bounds_at_or_before_the_epoch_narrow_nothing() -> None:
    """Goal: a lower bound at or before 1970 keeps every record: list_offsets reads -1 as
    latest (which dropped every row of `timestamp >= '1970-01-01'`) and rejects other negative
    times (which failed the query). Method: the epoch, 1 ms after it, and 1960."""
    for at in (EPOCH, datetime(1960, 1, 1, tzinfo=UTC)):
        for kind in (GreaterThan, GreaterThanOrEqual, EqualTo):
            assert constraints_from([kind(("timestamp",), at)]).timestamp_min_ms is None
    after = EPOCH + timedelta(milliseconds=1)
    assert constraints_from([GreaterThanOrEqual(("timestamp",), after)]).timestamp_min_ms == 0


def test_negated_filters_are_ignored() -> None:
    """Goal: Not(...) filters (Spark's form of `<>` and NOT) narrow nothing and do not fail.
    Method: constraints_from over Not filters on partition and offset."""
    assert constraints_from([Not(EqualTo(("partition",), 0)),
                             Not(LessThan(("offset",), 5))]) == Constraints()


KINDS = [EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, In]
TIMESTAMPS = st.integers(1_600_000_000_000, 1_600_000_002_000)  # ms
ZONES = st.sampled_from([None, UTC, timezone(timedelta(hours=-7)),
                         timezone(timedelta(hours=5, minutes=45))])
NUDGES_MS = st.sampled_from([0, 0, 0.001, -0.001, 0.999, 1, -1])  # sub-ms parts, neighbours


@st.composite
def records_and_filters(draw: st.DrawFn) -> tuple[list[list[int]], list[Filter]]:
    """Partitions of record timestamps (offset = position, timestamps in no order) and one to
    three filters whose values lie on or next to those records' values, so that boundaries
    are hit often."""
    partitions = draw(st.lists(st.lists(TIMESTAMPS, min_size=1, max_size=30), min_size=1,
                               max_size=4))
    stamps = [t for p in partitions for t in p]

    def value(column: str) -> object:
        if column == "partition":
            return draw(st.integers(-1, len(partitions)))
        if column == "offset":
            return draw(st.integers(-2, max(map(len, partitions)) + 1))
        at = EPOCH + timedelta(milliseconds=draw(st.sampled_from(stamps)) + draw(NUDGES_MS))
        zone = draw(ZONES)
        return at.replace(tzinfo=None) if zone is None else at.astimezone(zone)

    pushed: list[Filter] = []
    for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):
        column = draw(st.sampled_from(["partition", "offset", "timestamp"]))
        kind = draw(st.sampled_from(KINDS))
        if kind is In:
            pushed.append(In((column,), tuple(value(column)
                                              for _ in range(draw(st.integers(0, 3))))))
        else:
            pushed.append(kind((column,), value(column)))
    return partitions, pushed


def matches(f: Filter, partition: int, offset: int, ts_ms: int) -> bool:
    """Spark's meaning of ``f`` for one record (naive datetimes are UTC wall-clock time)."""
    column = f.attribute[0]
    have: object = {"partition": partition, "offset": offset,
                    "timestamp": EPOCH + timedelta(milliseconds=ts_ms)}[column]

    def norm(v: object) -> object:
        return v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v

    if isinstance(f, In):
        return any(have == norm(v) for v in f.value)
    v = norm(f.value)
    return {EqualTo: have == v, GreaterThan: have > v, GreaterThanOrEqual: have >= v,
            LessThan: have < v, LessThanOrEqual: have <= v}[type(f)]


@settings(max_examples=300, deadline=None)
@given(records_and_filters())
def test_pushed_filters_never_exclude_a_matching_record(
        case: tuple[list[list[int]], list[Filter]]) -> None:
    """Goal: narrowing by the Constraints made from pushed filters is conservative: every
    record that satisfies all the filters is still in a range read.
    Method: hypothesis over partitions of records (offset = position, random timestamps in
    no order) and filters of every kind on partition, offset and timestamp (aware datetimes in
    several zones, naive ones as UTC wall clock in a +05:30 zone, sub-ms parts); ranges
    narrowed as the batch reader does, with the first offset at or after the lowest timestamp
    per partition standing in for the broker's list_offsets."""
    partitions, pushed = case
    with local_timezone(LOCAL_TZ):
        c = constraints_from(pushed)
        ranges = [OffsetRange(TopicPartition("t", p), 0, len(ts))
                  for p, ts in enumerate(partitions)]
        starts = None
        if c.timestamp_min_ms is not None:
            starts = {r.tp: next((o for o, t in enumerate(partitions[r.tp.partition])
                                  if t >= c.timestamp_min_ms), -1) for r in ranges}
        kept = narrow(ranges, c, starts) if not c.empty else []
        for p, stamps in enumerate(partitions):
            for o, ts in enumerate(stamps):
                if all(matches(f, p, o, ts) for f in pushed):
                    assert any(r.tp.partition == p and r.start <= o < r.end for r in kept), \
                        (p, o, ts, c)


# -- schema.py ---------------------------------------------------------------------------------


TYPED = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
META = ["topic", "partition", "offset", "timestamp", "timestampType"]


def test_source_schema_untyped_typed_and_with_headers() -> None:
    """Goal: the output schema is Spark's Kafka columns (typed topics: value columns in place
    of value), all nullable, headers last and only when asked.
    Method: source_arrow_schema for an untyped and a typed topic, with and without headers."""
    untyped = source_arrow_schema(None, False)
    assert untyped.names == ["key", "value", *META]
    assert [f.type for f in untyped] == [pa.binary(), pa.binary(), pa.string(), pa.int32(),
                                         pa.int64(), pa.timestamp("us", tz="UTC"), pa.int32()]
    typed = source_arrow_schema(TYPED, True)
    assert typed.names == ["key", "a", "b", *META, "headers"]
    assert typed.field("a").type == pa.int64() and typed.field("headers").type == \
        DEFAULT_SCHEMA.field("headers").type
    assert all(f.nullable for s in (untyped, typed) for f in s)


@pytest.mark.parametrize("name", ["topic", "partition", "offset", "timestampType", "OFFSET",
                                  "Key", "TimeStamp"])
def test_typed_topic_with_a_value_column_named_like_a_metadata_column_is_rejected(
        name: str) -> None:
    """Goal: a value column that would share its name (case-insensitively, as Spark resolves
    columns) with a column readers add is refused when the topic's schema is built, naming
    it, rather than a DataFrame with two 'offset' columns where the value is shadowed.
    Method: topic_schema (used at topic creation) and source_arrow_schema for each name."""
    value = pa.schema([pa.field("a", pa.int64()), pa.field(name, pa.int64())])
    for build in (topic_schema, lambda v: source_arrow_schema(v, False)):
        with pytest.raises(InvalidRecordError, match=repr(name)):
            build(value)


def test_check_requested_accepts_subsets_and_names_bad_columns() -> None:
    """Goal: a user schema may name any subset of the columns in any order, timestamps in any
    unit; an unknown column or a wrong type is a SchemaError naming the column, the topics
    and what is available (or the type to use).
    Method: check_requested with good and bad schemas against a typed topic's columns."""
    available = source_arrow_schema(TYPED, True)
    check_requested(pa.schema([("offset", pa.int64()), ("b", pa.string()),
                               ("timestamp", pa.timestamp("ms", tz="UTC"))]), available, ["t"])
    with pytest.raises(SchemaError, match=r"column 'c' is not in topic\(s\) \['t'\].*'key', 'a'"):
        check_requested(pa.schema([("c", pa.int64())]), available, ["t"])
    with pytest.raises(SchemaError, match=r"column 'a' of topic\(s\) \['t'\] is int64.*string"):
        check_requested(pa.schema([("a", pa.string())]), available, ["t"])
    with pytest.raises(SchemaError, match="includeHeaders"):
        check_requested(pa.schema([("headers", available.field("headers").type)]),
                        source_arrow_schema(TYPED, False), ["t"])


def test_user_schema_may_make_nested_fields_nullable() -> None:
    """Goal: a user schema written as DDL (every nested field nullable) reads a typed topic
    whose struct fields, list items or map values are non-null: Spark takes nullable columns
    for non-null data, and the converter casts. It was a SchemaError ("read it as
    struct<x: int32 not null> and cast in Spark"), which DDL cannot say for list items.
    Method: check_requested, then convert a stored batch to the requested schema."""
    strict = pa.schema([
        ("s", pa.struct([pa.field("x", pa.int32(), nullable=False), ("y", pa.string())])),
        ("l", pa.list_(pa.field("item", pa.int64(), nullable=False))),
        ("m", pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)))])
    available = to_arrow_schema(from_arrow_schema(source_arrow_schema(strict, False)),
                                timezone="UTC")
    requested = to_arrow_schema(from_arrow_schema(pa.schema([
        ("m", pa.map_(pa.string(), pa.int64())), ("offset", pa.int64()),
        ("s", pa.struct([("x", pa.int32()), ("y", pa.string())])),
        ("l", pa.list_(pa.int64()))])), timezone="UTC")
    check_requested(requested, available, ["t"])
    with pytest.raises(SchemaError, match="'s'"):
        check_requested(pa.schema([("s", pa.struct([("x", pa.int64())]))]), available, ["t"])
    values = pa.record_batch([
        pa.array([{"x": 1, "y": "a"}], strict.field("s").type),
        pa.array([[1, 2]], strict.field("l").type),
        pa.array([[("k", 3)]], strict.field("m").type)], schema=strict)
    out = BatchConverter(requested, "t", 0).convert(values, np.array([7]), False, 0, 10)
    assert out is not None and out.schema.equals(requested)
    assert out.to_pylist() == [{"m": [("k", 3)], "offset": 7, "s": {"x": 1, "y": "a"},
                                "l": [1, 2]}]


def stored_batch(keys: list[bytes], offsets: list[int], timestamps_ms: list[int]
                 ) -> tuple[pa.RecordBatch, np.ndarray]:
    batch = make_batch(keys, timestamps=timestamps_ms)
    return batch, np.asarray(offsets, dtype=np.int64)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=40), st.integers(0, 200),
       st.integers(0, 200))
def test_convert_keeps_exactly_the_rows_in_range(gaps: list[int], a: int, b: int) -> None:
    """Goal: convert keeps exactly the rows whose offsets are in [start, end), contiguous or
    with gaps (compaction), with their own offsets and keys; None when there are none.
    Method: hypothesis over offset gaps (1 = contiguous) and the range; compare with a filter
    over the offsets."""
    offsets = list(np.cumsum(gaps) + 10)
    keys = [b"k%d" % o for o in offsets]
    batch, array = stored_batch(keys, offsets, [1_000] * len(keys))
    start, end = min(a, b), max(a, b)
    out = BatchConverter(source_arrow_schema(None, False), "t", 3).convert(
        batch, array, False, start, end)
    wanted = [o for o in offsets if start <= o < end]
    if not wanted:
        assert out is None
        return
    assert out.column("offset").to_pylist() == wanted
    assert out.column("key").to_pylist() == [b"k%d" % o for o in wanted]
    assert out.column("partition").to_pylist() == [3] * len(wanted)


def test_convert_fills_constant_columns_and_casts_timestamps() -> None:
    """Goal: topic, partition and timestampType are constants (1 under LogAppendTime), the ms
    timestamps become Spark's us timestamps at the same instants, and the batch has exactly
    the target schema (any subset, any order).
    Method: convert a three-row batch to the full schema and to a reordered subset."""
    batch, offsets = stored_batch([b"a", b"b", b"c"], [5, 6, 7], [1_000, 2_500, 1])
    full = source_arrow_schema(None, True)
    out = BatchConverter(full, "topic.x", 2).convert(batch, offsets, True, 0, 100)
    assert out.schema.equals(full)
    assert out.column("topic").to_pylist() == ["topic.x"] * 3
    assert out.column("timestampType").to_pylist() == [1, 1, 1]
    assert out.column("timestamp").to_pylist() == [EPOCH + timedelta(milliseconds=ms)
                                                   for ms in (1_000, 2_500, 1)]
    subset = pa.schema([("timestampType", pa.int32()), ("offset", pa.int64()),
                        ("value", pa.binary())])
    out = BatchConverter(subset, "t", 0).convert(batch, offsets, False, 6, 7)
    assert out.schema.equals(subset) and out.to_pydict() == {
        "timestampType": [0], "offset": [6], "value": [b"v" * 100]}


def test_convert_gives_spark_the_schema_it_derives(tmp_path: Path) -> None:
    """Goal: batches stored by a real log (typed topic, LogAppendTime, headers) convert to the
    Arrow schema Spark derives from the DataFrame schema (its list field is 'element', not
    'item'), and the rows are the stored ones.
    Method: append to a typed LogAppendTime log in tmp_path, read the stored batch back and
    convert it to to_arrow_schema(from_arrow_schema(source schema))."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, schema=topic_schema(TYPED),
                   message_timestamp_type="LogAppendTime")
    headers = pa.array([[{"key": "h", "value": b"1"}], None], DEFAULT_SCHEMA.field("headers").type)
    log.append_as_leader(pa.record_batch(
        [pa.array([b"k0", b"k1"]), pa.array([1, 2]), pa.array(["x", None]),
         pa.array([0, 0]).cast(TIMESTAMP_TYPE), headers], schema=topic_schema(TYPED)))
    stored = log.read(0, 1 << 20).batches[0]
    assert stored.header.flags & FLAG_LOG_APPEND_TIME
    target = to_arrow_schema(from_arrow_schema(source_arrow_schema(TYPED, True)), timezone="UTC")
    out = BatchConverter(target, "topic", 0).convert(
        stored.record_batch(log.schema), stored.offsets(),
        bool(stored.header.flags & FLAG_LOG_APPEND_TIME), 0, 2)
    assert out.schema.equals(target)
    rows = out.to_pylist()
    assert [(r["key"], r["a"], r["b"], r["offset"], r["timestampType"]) for r in rows] == [
        (b"k0", 1, "x", 0, 1), (b"k1", 2, None, 1, 1)]
    assert rows[0]["timestamp"] == EPOCH + timedelta(milliseconds=clock.time_ms())
    assert rows[0]["headers"] == [{"key": "h", "value": b"1"}] and rows[1]["headers"] is None


@given(st.from_regex(r"[a-zA-Z0-9._-]{0,30}", fullmatch=True) | st.text(max_size=5),
       st.integers(0, 3000))
def test_constant_string_is_n_copies(value: str, n: int) -> None:
    """Goal: constant_string(value, n) is a valid string array equal to n copies of value,
    including the empty string and n = 0. Method: hypothesis; full validation and equality
    with pa.array."""
    out = constant_string(value, n)
    out.validate(full=True)
    assert out.equals(pa.array([value] * n, pa.string()))


def test_constant_string_of_an_empty_topic_has_zero_offsets() -> None:
    """Goal: the empty-string edge gives n empty strings, not a wrong-length offsets buffer.
    Method: n = 0, 1 and 5 copies of ''."""
    for n in (0, 1, 5):
        out = constant_string("", n)
        out.validate(full=True)
        assert out.to_pylist() == [""] * n


def test_the_planner_asks_leaders_again_across_a_failover(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Goal: a plan made while a partition's leadership moves waits for the new leader, as
    the consumer's lookups do: NOT_LEADER_OR_FOLLOWER refreshes the metadata and asks again,
    OFFSET_NOT_AVAILABLE (a new leader that does not know its high watermark yet, whose
    answer would look like the log went back) asks again as it is; an error that is not
    retriable raises at once, naming the action and topic.
    Method: a Planner whose metadata is a stand-in; its leader answers describe_log_dirs
    with the errors in turn, then with the partition."""
    from logstore.client import lookups
    from logstore.errors import (
        InvalidRequestError,
        NotLeaderOrFollowerError,
        OffsetNotAvailableError,
    )
    from logstore.messages import error_kw
    from logstore.messages.log import DescribeLogDirsResponse, LogDirPartition

    monkeypatch.setattr(lookups, "LOOKUP_BACKOFF_MAX_S", 0.0)
    tp = TPS[0]

    class Leader:
        def __init__(self, errors: list[Exception]) -> None:
            self.errors = errors
            self.address = "127.0.0.1:1"
            self.calls = 0

        def call(self, request: object) -> DescribeLogDirsResponse:
            self.calls += 1
            entry = LogDirPartition(partition=0, path="/x", incarnation="i",
                                    log_start_offset=0, high_watermark=9)
            if self.errors:
                entry = LogDirPartition(partition=0, **error_kw(self.errors.pop(0)))
            return DescribeLogDirsResponse(topic="t", partitions=[entry])

    class Metadata:
        def __init__(self, leader: Leader) -> None:
            self.conn = leader
            self.refreshes = 0

        def leader(self, tp: TopicPartition) -> int:
            return 1

        def broker_connection(self, broker_id: int) -> Leader:
            return self.conn

        def refresh(self, topics: list[str] | None = None) -> None:
            self.refreshes += 1

        def close(self) -> None:
            pass

    options = parse_read_options({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, False)
    planner = Planner(options)
    planner.metadata.close()
    leader = Leader([NotLeaderOrFollowerError("broker 1 does not lead t-0"),
                     OffsetNotAvailableError("t-0: high watermark not yet known")])
    planner.metadata = metadata = Metadata(leader)  # type: ignore[assignment]
    assert planner.describe([tp])[tp].high_watermark == 9
    assert (leader.calls, metadata.refreshes) == (3, 1)
    planner.metadata = Metadata(Leader([InvalidRequestError("bad")]))  # type: ignore[assignment]
    with pytest.raises(InvalidRequestError, match="describe_log_dirs for 't'"):
        planner.describe([tp])
