"""datasource/options.py: parse_read_options turns Spark's string options into ReadOptions,
and every mistake is an OptionError naming the option (and the bad text). Pure: no Spark
session, no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datasource.options import (
    OffsetSpec,
    OptionError,
    ReadOptions,
    Subscription,
    parse_read_options,
)
from logstore.model import EARLIEST, LATEST, TopicPartition

BASE = {"bootstrap.servers": "h1:9092,h2:9093", "subscribe": "t"}
MODES = {"batch": False, "stream": True, "schema": None}


def parse(streaming: bool | None = False, **options: str) -> ReadOptions:
    return parse_read_options({**BASE, **options}, streaming)


def error(streaming: bool | None = False, raw: dict[str, str] | None = None, **options: str
          ) -> str:
    with pytest.raises(OptionError) as e:
        parse_read_options({**BASE, **options} if raw is None else raw, streaming)
    return str(e.value)


# -- defaults and the documented table -----------------------------------------------------


def test_defaults_are_those_of_the_docstring_table() -> None:
    """Goal: with only the required options, every field has its documented default; a batch
    read starts at earliest, a stream at latest, both end at latest.
    Method: parse the minimal options for batch, stream and schema (None)."""
    batch, stream, schema = (parse(streaming=m) for m in (False, True, None))
    assert batch.starting == OffsetSpec(EARLIEST) and batch.ending == OffsetSpec(LATEST)
    assert stream.starting == OffsetSpec(LATEST) and stream.ending == OffsetSpec(LATEST)
    assert schema.ending == OffsetSpec(LATEST)
    assert batch.bootstrap_servers == "h1:9092,h2:9093"
    assert batch.subscription == Subscription(topics=("t",))
    assert (batch.timestamp_strategy_latest, batch.min_partitions,
            batch.max_records_per_partition, batch.fail_on_data_loss, batch.include_headers,
            batch.max_offsets_per_trigger, batch.min_offsets_per_trigger,
            batch.max_trigger_delay_ms, batch.read_mode, batch.fetch_max_bytes) == (
        False, None, None, True, False, None, None, 15 * 60 * 1000, "auto", 64 * 1024 * 1024)


@pytest.mark.parametrize(("option", "text", "streaming", "field", "expected"), [
    ("startingOffsetsByTimestampStrategy", "latest", False, "timestamp_strategy_latest", True),
    ("startingOffsetsByTimestampStrategy", " ERROR ", False, "timestamp_strategy_latest", False),
    ("minPartitions", "8", False, "min_partitions", 8),
    ("maxRecordsPerPartition", " 1000 ", False, "max_records_per_partition", 1000),
    ("failOnDataLoss", "false", False, "fail_on_data_loss", False),
    ("failOnDataLoss", "TRUE", False, "fail_on_data_loss", True),
    ("includeHeaders", "true", False, "include_headers", True),
    ("maxOffsetsPerTrigger", "500", True, "max_offsets_per_trigger", 500),
    ("minOffsetsPerTrigger", "50", True, "min_offsets_per_trigger", 50),
    ("maxTriggerDelay", "30s", True, "max_trigger_delay_ms", 30_000),
    ("groupId", " etl-orders ", True, "group_id", "etl-orders"),
    ("readMode", "FETCH", False, "read_mode", "fetch"),
    ("readMode", "local", False, "read_mode", "local"),
    ("fetchMaxBytes", "1048576", False, "fetch_max_bytes", 1 << 20),
    ("kafka.isolation.level", " READ_COMMITTED ", False, "isolation_level", "read_committed"),
    ("kafka.isolation.level", "read_uncommitted", True, "isolation_level", "read_uncommitted"),
])
def test_each_documented_option_sets_its_field(option: str, text: str, streaming: bool,
                                                field: str, expected: object) -> None:
    """Goal: each option of the docstring table reaches its ReadOptions field, trimmed and
    case-insensitive where it is a word. Method: parse one option at a time."""
    assert getattr(parse(streaming, **{option: text}), field) == expected


def test_offset_options_parse_words_and_json() -> None:
    """Goal: startingOffsets/endingOffsets take earliest/latest (any case) or per-partition
    JSON; the timestamp options take a global ms value or per-partition JSON.
    Method: parse each form and compare the OffsetSpec."""
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    assert parse(True, startingOffsets=" Earliest ").starting == OffsetSpec(EARLIEST)
    assert parse(False, startingOffsets='{"t":{"0":23,"1":-2}}').starting == OffsetSpec(
        EARLIEST, offsets={tp0: 23, tp1: EARLIEST})
    assert parse(False, endingOffsets='{"t":{"0":40,"1":-1}}').ending == OffsetSpec(
        LATEST, offsets={tp0: 40, tp1: LATEST})
    assert parse(False, endingOffsets="LATEST").ending == OffsetSpec(LATEST)
    assert parse(False, startingTimestamp="1700000000000").starting == OffsetSpec(
        EARLIEST, timestamp_ms=1_700_000_000_000)
    spec = parse(False, endingOffsetsByTimestamp='{"t":{"1":5}}').ending
    assert spec == OffsetSpec(LATEST, timestamps={tp1: 5}) and spec.by_timestamp
    assert not parse().starting.by_timestamp


# -- subscriptions ----------------------------------------------------------------------------


@pytest.mark.parametrize("given_keys", [[], ["subscribe", "assign"],
                                        ["subscribePattern", "subscribe"],
                                        ["subscribe", "subscribePattern", "assign"]])
def test_exactly_one_subscription_option_is_required(given_keys: list[str]) -> None:
    """Goal: none or several of subscribe/subscribePattern/assign is an error naming the three
    options and the ones given. Method: parse with 0, 2 and 3 of them."""
    values = {"subscribe": "t", "subscribePattern": "t.*", "assign": '{"t":[0]}'}
    raw = {"bootstrap.servers": "h:1", **{k: values[k] for k in given_keys}}
    message = error(raw=raw)
    assert "exactly one of 'subscribe', 'subscribePattern' or 'assign'" in message
    for k in given_keys:
        assert repr(k) in message
    if not given_keys:
        assert "none" in message


def test_subscriptions_parse_into_topics_pattern_or_partitions() -> None:
    """Goal: subscribe is a trimmed comma list without duplicates; subscribePattern is kept as
    given; assign is JSON of topic -> partition list (duplicates dropped).
    Method: parse one of each."""
    raw = {"bootstrap.servers": "h:1"}
    assert parse_read_options({**raw, "subscribe": " a, b,,a ,c "}, False).subscription == \
        Subscription(topics=("a", "b", "c"))
    assert parse_read_options({**raw, "subscribePattern": "logs-.*"}, True).subscription == \
        Subscription(pattern="logs-.*")
    sub = parse_read_options({**raw, "assign": '{"a":[1,0,1],"b":[2]}'}, False).subscription
    assert sub.assigned == (TopicPartition("a", 1), TopicPartition("a", 0),
                            TopicPartition("b", 2))
    assert "subscribePattern 'x'" in Subscription(pattern="x").describe()


@pytest.mark.parametrize(("options", "needles"), [
    ({"subscribe": " , "}, ["subscribe", "no topic"]),
    ({"subscribe": "good,bad topic"}, ["subscribe", "'bad topic'"]),
    ({"subscribe": ".."}, ["subscribe", "'..'"]),
    ({"subscribe": "x" * 250}, ["subscribe", "250 characters"]),
    ({"subscribePattern": "(unclosed"}, ["subscribePattern", "'(unclosed'",
                                         "not a regular expression"]),
    ({"assign": '{"t":[]}'}, ["assign", "no partition"]),
    ({"assign": '{"t":[0,-1]}'}, ["assign", "'t'", "[0, -1]"]),
    ({"assign": '{"t":[true]}'}, ["assign", "'t'"]),
    ({"assign": '{"t":"0"}'}, ["assign", "'t'"]),
    ({"assign": '{"bad/topic":[0]}'}, ["assign", "'bad/topic'"]),
    ({"startingOffsets": '{"bad topic":{"0":1}}'}, ["startingOffsets", "'bad topic'"]),
])
def test_bad_subscriptions_and_topic_names_name_the_option(options: dict[str, str],
                                                           needles: list[str]) -> None:
    """Goal: an empty topic list, an invalid topic name (Kafka's rules) anywhere, a bad
    regular expression or bad partition numbers are errors naming the option and the bad
    value. Method: parse each, with subscribe swapped out where another kind is given."""
    raw = {"bootstrap.servers": "h:1", **options}
    if not {"subscribe", "subscribePattern", "assign"} & set(options):
        raw["subscribe"] = "t"
    message = error(raw=raw)
    for needle in needles:
        assert needle in message, message


# -- JSON options -----------------------------------------------------------------------------


JSON_OPTIONS = ["assign", "startingOffsets", "endingOffsets", "startingOffsetsByTimestamp",
                "endingOffsetsByTimestamp"]


@pytest.mark.parametrize("option", JSON_OPTIONS)
@pytest.mark.parametrize("text", ['{"t":', "{t: 1}", "[1, 2]", '"t"', "{'t': {'0': 1}}"])
def test_malformed_json_names_the_option_and_shows_the_text(option: str, text: str) -> None:
    """Goal: text that is not JSON, or JSON that is not an object, is an OptionError naming
    the option and quoting the text. Method: each JSON option with each bad text."""
    raw = {"bootstrap.servers": "h:1", "subscribe": "t", option: text}
    if option == "assign":
        del raw["subscribe"]
    message = error(raw=raw)
    assert message.startswith(option + ":") and repr(text) in message


@pytest.mark.parametrize("option", JSON_OPTIONS[1:])
@pytest.mark.parametrize(("text", "needle"), [
    ('{"t": [0]}', "needs an object"),
    ('{"t": {"x": 1}}', "'x' is not a partition number"),
    ('{"t": {"-1": 1}}', "'-1' is not a partition number"),
    ('{"t": {"²": 1}}', "'²' is not a partition number"),
    ('{"t": {"١": 1}}', "'١' is not a partition number"),
    ('{"t": {"0": 1.5}}', "t-0 has 1.5"),
    ('{"t": {"0": "5"}}', "t-0 has '5'"),
    ('{"t": {"0": true}}', "t-0 has True"),
    ('{"t": {"0": -3}}', "t-0 has -3"),
])
def test_per_partition_json_values_are_checked(option: str, text: str, needle: str) -> None:
    """Goal: per-partition JSON needs an object of ASCII partition numbers to integers (>= -2
    for offsets, >= 0 for timestamps); anything else is an OptionError naming the option,
    the partition and the value (never a bare ValueError from int()).
    Method: each per-partition option with each bad object."""
    message = error(**{option: text})
    assert message.startswith(option + ":") and needle in message, message


def test_timestamp_json_rejects_negative_values_that_offsets_allow() -> None:
    """Goal: -1/-2 mean latest/earliest in offset JSON but are invalid timestamps.
    Method: the same JSON for startingOffsets (accepted) and ...ByTimestamp (rejected)."""
    text = '{"t":{"0":-2}}'
    assert parse(startingOffsets=text).starting.offsets == {TopicPartition("t", 0): EARLIEST}
    assert ">= 0" in error(startingOffsetsByTimestamp=text)


# -- batch and stream rules -------------------------------------------------------------------


@pytest.mark.parametrize(("options", "needle"), [
    ({"startingOffsets": "latest"}, "startingOffsets: latest (-1) is not allowed"),
    ({"startingOffsets": '{"t":{"0":5,"1":-1}}'}, "partitions ['t-1']"),
    ({"endingOffsets": "earliest"}, "endingOffsets: earliest (-2) is not allowed"),
    ({"endingOffsets": '{"t":{"0":-2,"1":9}}'}, "partitions ['t-0']"),
])
def test_batch_cannot_start_at_latest_nor_end_at_earliest(options: dict[str, str],
                                                          needle: str) -> None:
    """Goal: Spark's Kafka rules for batch reads: startingOffsets latest (or -1 in its JSON)
    and endingOffsets earliest (or -2 in its JSON) are rejected, naming the partitions.
    Method: parse each as a batch; the starting ones are fine for a stream."""
    assert needle in error(**options)
    if "startingOffsets" in options:
        parse(True, **options)


def test_stream_and_batch_only_options_are_rejected_on_the_other_side() -> None:
    """Goal: endingOffsets/endingTimestamp/endingOffsetsByTimestamp are for batch reads,
    maxOffsetsPerTrigger/minOffsetsPerTrigger/maxTriggerDelay for streams; the wrong side is an
    'unknown option' error; the schema call (streaming=None) takes both.
    Method: parse each option on each side."""
    batch_only = {"endingOffsets": "latest", "endingTimestamp": "5",
                  "endingOffsetsByTimestamp": '{"t":{"0":5}}'}
    stream_only = {"maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "5",
                   "maxTriggerDelay": "1m", "groupId": "g"}
    for option, text in batch_only.items():
        assert f"unknown option(s) ['{option}'] for readStream" in error(True, **{option: text})
        parse(False, **{option: text})
    for option, text in stream_only.items():
        assert f"unknown option(s) ['{option}'] for a batch read" in error(False,
                                                                         **{option: text})
        parse(True, **{option: text})
    both = parse(None, **batch_only, **stream_only)
    assert both.max_offsets_per_trigger == 5 and both.ending.timestamp_ms == 5


def test_unknown_option_is_rejected_with_the_known_ones() -> None:
    """Goal: a misspelt option fails fast, listing every option the read knows; Spark's own
    'path' is tolerated. Method: parse with 'startingOffset' (no s) and with 'path'."""
    message = error(startingOffset="earliest")
    assert "unknown option(s) ['startingOffset'] for a batch read" in message
    assert "known options:" in message and "'startingOffsets'" in message
    assert "'maxOffsetsPerTrigger'" not in message and "'endingOffsets'" in message
    assert "unknown option(s)" in error(None, bogus="1")
    parse(path="/ignored")


# -- timestamps -------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["starting", "ending"])
def test_global_timestamp_wins_over_partition_timestamps_over_offsets(side: str) -> None:
    """Goal: as in Spark's Kafka source, <side>Timestamp wins over <side>OffsetsByTimestamp,
    which wins over <side>Offsets (whose value is then not even checked).
    Method: give all three, then the last two, then the offsets alone."""
    offsets = {f"{side}Offsets": '{"t":{"0":3}}'}
    by_ts = {f"{side}OffsetsByTimestamp": '{"t":{"0":77}}'}
    ts = {f"{side}Timestamp": "99"}
    spec = getattr(parse(**offsets, **by_ts, **ts), side)
    assert (spec.timestamp_ms, dict(spec.timestamps), dict(spec.offsets)) == (99, {}, {})
    spec = getattr(parse(**offsets, **by_ts), side)
    assert (spec.timestamp_ms, dict(spec.timestamps), dict(spec.offsets)) == (
        None, {TopicPartition("t", 0): 77}, {})
    assert getattr(parse(**offsets), side).offsets == {TopicPartition("t", 0): 3}
    assert getattr(parse(**{f"{side}Offsets": "not json"}, **ts), side).timestamp_ms == 99


@pytest.mark.parametrize(("text", "needle"), [("-1", "must be >= 0"), ("soon", "'soon'"),
                                              ("1.5", "'1.5'"), ("", "''")])
def test_bad_global_timestamps_are_rejected(text: str, needle: str) -> None:
    """Goal: startingTimestamp/endingTimestamp must be ms since the epoch (an integer >= 0).
    Method: parse bad values for both."""
    for option in ("startingTimestamp", "endingTimestamp"):
        message = error(**{option: text})
        assert option in message and needle in message


def test_timestamp_strategy_and_read_mode_take_only_their_words() -> None:
    """Goal: startingOffsetsByTimestampStrategy is error|latest and readMode auto|fetch|local;
    anything else names the option and the value. Method: parse bad values."""
    assert "startingOffsetsByTimestampStrategy" in error(
        startingOffsetsByTimestampStrategy="earliest")
    assert "readMode" in error(readMode="mmap") and "'mmap'" in error(readMode="mmap")


def test_isolation_level_is_read_uncommitted_unless_read_committed_is_asked() -> None:
    """Goal: kafka.isolation.level defaults to read_uncommitted (Spark's Kafka source does),
    takes Kafka's two words only, and its error names the option and the bad value. Method:
    parse the default, both words for batch and stream, and a misspelling."""
    assert parse(False).isolation_level == "read_uncommitted" and not parse(False).read_committed
    assert parse(True, **{"kafka.isolation.level": "read_committed"}).read_committed
    message = error(**{"kafka.isolation.level": "committed"})
    assert "kafka.isolation.level" in message and "'committed'" in message


# -- scalars ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ms"), [("500ms", 500), ("30s", 30_000), ("15m", 900_000),
                                          ("1h", 3_600_000), ("250", 250), (" 2 min ", 120_000),
                                          ("3 seconds", 3_000), ("1 hour", 3_600_000),
                                          ("10SEC", 10_000), ("0s", 0)])
def test_max_trigger_delay_takes_durations(text: str, ms: int) -> None:
    """Goal: maxTriggerDelay accepts a number with an optional unit (ms default), any case,
    spaces allowed. Method: parse each form."""
    assert parse(True, maxTriggerDelay=text).max_trigger_delay_ms == ms


@pytest.mark.parametrize("text", ["", "   "])
def test_a_blank_group_id_names_the_option(text: str) -> None:
    """Goal: groupId must name a group. Method: parse blank values."""
    message = error(True, groupId=text)
    assert "groupId" in message and "must not be empty" in message


@pytest.mark.parametrize("text", ["", "s", "-5s", "1.5s", "5 fortnights", "5d", "5s5", "1e3"])
def test_bad_durations_name_the_option(text: str) -> None:
    """Goal: anything but <integer>[unit] is rejected with the option and the text.
    Method: parse each bad form."""
    message = error(True, maxTriggerDelay=text)
    assert "maxTriggerDelay must be a duration" in message and repr(text) in message


@given(st.integers(0, 10**9), st.sampled_from([("ms", 1), ("s", 1000), ("sec", 1000),
                                               ("seconds", 1000), ("m", 60_000),
                                               ("minute", 60_000), ("h", 3_600_000),
                                               ("hours", 3_600_000)]),
       st.sampled_from(["", " "]))
def test_durations_scale_by_their_unit(n: int, unit: tuple[str, int], gap: str) -> None:
    """Goal: <n><unit> is n times the unit in ms, for any n. Method: hypothesis over n, unit
    and an optional space."""
    assert parse(True, maxTriggerDelay=f"{n}{gap}{unit[0]}").max_trigger_delay_ms == n * unit[1]


@pytest.mark.parametrize("option", ["minPartitions", "maxRecordsPerPartition",
                                    "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                                    "fetchMaxBytes"])
@pytest.mark.parametrize("text", ["0", "-3", "many", "2.0", ""])
def test_counts_must_be_positive_integers(option: str, text: str) -> None:
    """Goal: every count option rejects zero, negatives and non-integers, naming itself.
    Method: parse each bad value for each count option (as a stream, where all are known)."""
    message = error(None, **{option: text})
    assert message.startswith(option) and ("positive integer" in message or "integer" in message)


@pytest.mark.parametrize("option", ["failOnDataLoss", "includeHeaders"])
@pytest.mark.parametrize("text", ["yes", "1", "", "truee"])
def test_booleans_are_true_or_false_only(option: str, text: str) -> None:
    """Goal: boolean options take 'true'/'false' (any case), nothing else.
    Method: parse bad values."""
    message = error(**{option: text})
    assert option in message and repr(text) in message


@pytest.mark.parametrize(("servers", "needle"), [
    (None, "'bootstrap.servers' is required"), ("  ", "'bootstrap.servers' is required"),
    ("localhost", "'localhost' is not host:port"), (":9092", "':9092'"),
    ("h:1,h2", "'h2'"), ("h:port", "'h:port'"), ("h:1,", "''"),
])
def test_bootstrap_servers_must_be_host_port_pairs(servers: str | None, needle: str) -> None:
    """Goal: bootstrap.servers is required and each comma-separated entry is host:port.
    Method: parse missing, blank and malformed values."""
    raw = {"subscribe": "t"} if servers is None else {"subscribe": "t",
                                                      "bootstrap.servers": servers}
    assert needle in error(raw=raw)
    assert parse_read_options({"subscribe": "t", "bootstrap.servers": "[::1]:9092"},
                              False).bootstrap_servers == "[::1]:9092"


# -- case -------------------------------------------------------------------------------------


ALL_OPTIONS = {"bootstrap.servers": "h:1", "assign": '{"t":[0,1]}',
               "startingOffsets": '{"t":{"0":1,"1":-2}}', "endingOffsets": '{"t":{"0":9,"1":-1}}',
               "startingOffsetsByTimestampStrategy": "latest", "minPartitions": "3",
               "maxRecordsPerPartition": "100", "failOnDataLoss": "false",
               "includeHeaders": "true", "readMode": "fetch", "fetchMaxBytes": "4096"}


@given(st.lists(st.booleans(), min_size=400, max_size=400))
def test_option_names_are_case_insensitive(upper: list[bool]) -> None:
    """Goal: Spark may hand options lower-cased (or as the user spelt them); any casing of the
    names parses to the same ReadOptions. Method: hypothesis picks the case of every letter of
    every option name; compare with the documented spelling."""
    flips = iter(upper)
    raw = {"".join(c.upper() if next(flips) else c.lower() for c in k): v
           for k, v in ALL_OPTIONS.items()}
    assert parse_read_options(raw, False) == parse_read_options(ALL_OPTIONS, False)
    assert parse_read_options({k.lower(): v for k, v in ALL_OPTIONS.items()}, False) == \
        parse_read_options(ALL_OPTIONS, False)
