"""The options of ``spark.read/readStream.format("logstore")``, parsed and checked.

Owns: turning Spark's string options (named as in Spark's Kafka source) into a frozen
``ReadOptions``, with an error naming the option and the bad text for every mistake. Must not:
talk to a broker (planning.py does) or import pyspark, so it is tested as pure logic.

| option                                  | meaning                                                |
|-----------------------------------------|--------------------------------------------------------|
| ``bootstrap.servers``                   | required, ``host:port[,host:port...]``                 |
| ``subscribe`` / ``subscribePattern`` / ``assign`` | exactly one: comma list, regex (full match), JSON ``{"t":[0,1]}`` |
| ``startingOffsets``                     | ``earliest`` (batch default), ``latest`` (stream default) or JSON ``{"t":{"0":23,"1":-2}}`` |
| ``endingOffsets``                       | batch only: ``latest`` (default) or JSON (-1 latest)   |
| ``startingTimestamp`` / ``endingTimestamp`` | ms since the epoch, for every partition; wins over the two below |
| ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` | JSON ``{"t":{"0":ms}}``     |
| ``startingOffsetsByTimestampStrategy``  | ``error`` (default) or ``latest``: no record that late |
| ``minPartitions`` / ``maxRecordsPerPartition`` | split offset ranges into more Spark partitions  |
| ``failOnDataLoss``                      | ``true`` (default): offsets gone from the log are an error; ``false``: skipped |
| ``includeHeaders``                      | ``false`` (default): add the ``headers`` column        |
| ``maxOffsetsPerTrigger``                | stream: records per micro-batch at most                |
| ``minOffsetsPerTrigger`` / ``maxTriggerDelay`` | stream: wait for that many, but no longer than the delay (default ``15m``) |
| ``readMode``                            | LogStore: ``auto`` (default: ranges below a tiered partition's local log start from object storage, the rest from files when on the broker's disk, else fetched), ``fetch``, ``local``, ``remote`` (object storage only) |
| ``fetchMaxBytes``                       | LogStore: bytes per fetch request (default 64 MiB)     |
| ``remoteStorageUri``                    | LogStore: the fsspec URL executors read remote segments from (default: the leader's ``remote_storage_uri``) |
| ``remoteStorageOptions``                | LogStore: JSON object of fsspec options for it (default: the leader's ``remote_storage_options``); credentials are refused here: executors take them from their environment (``AWS_*``) or the provider's chain |
| ``kafka.security.protocol``, ``kafka.ssl.*``, ``kafka.sasl.*`` | TLS and SASL, as Spark's Kafka connector (security_options.py) |
| ``kafka.isolation.level``               | ``read_uncommitted`` (default, as Spark's Kafka source) or ``read_committed`` (ranges end at the last stable offset; aborted records dropped) |
| ``groupId``                             | stream: commit each finished batch's end offsets to this consumer group (lag shows in ``logstore groups describe``) |
| ``archiveTable``                        | batch: ``namespace.name`` of the topic's Iceberg archive; offsets below the log start are read from it |
| ``pushFilters``                         | batch: ``false`` (default); ``true`` narrows the offset ranges by the query's filters (needs ``spark.sql.python.filterPushdown.enabled``; see the README for Spark 4.3's caveat) |
| ``archiveWarehouse`` / ``archive.catalog.<key>`` | the archive's warehouse URL and pyiceberg catalog properties (as ``logstore archive --warehouse/--catalog``) |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from datasource.security_options import SECURITY_OPTIONS, parse_security
from logstore.config import credential_keys
from logstore.errors import InvalidTopicError, LogstoreError
from logstore.model import EARLIEST, LATEST, TopicPartition, validate_topic_name
from logstore.security.config import PLAINTEXT, ClientSecurity

READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)


class OptionError(LogstoreError, ValueError):
    """A bad ``logstore`` source or sink option; the message names the option."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: ``topics`` (subscribe), ``pattern`` or ``assigned``."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned:
            return f"assign {[str(tp) for tp in self.assigned]}"
        return f"subscribe {list(self.topics)}"


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a range starts or ends: ``EARLIEST``/``LATEST`` for every partition (``default``),
    per-partition offsets (-2 earliest, -1 latest), or timestamps (global or per partition)."""

    default: int
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp_ms: int | None = None
    timestamps: Mapping[TopicPartition, int] = field(default_factory=dict)

    @property
    def by_timestamp(self) -> bool:
        return self.timestamp_ms is not None or bool(self.timestamps)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy_latest: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    read_mode: str = "auto"
    fetch_max_bytes: int = 64 * 1024 * 1024
    remote_storage_uri: str | None = None
    remote_storage_options: dict[str, Any] | None = None
    security: ClientSecurity = PLAINTEXT
    group_id: str | None = None
    archive_table: str | None = None
    archive_warehouse: str | None = None
    archive_catalog: tuple[tuple[str, str], ...] = ()
    isolation_level: str = READ_UNCOMMITTED
    push_filters: bool = False

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED


READ_MODES = ("auto", "fetch", "local", "remote")
ISOLATION_LEVEL = "kafka.isolation.level"
_COMMON = ("bootstrap.servers", "subscribe", "subscribePattern", "assign", "startingOffsets",
           "startingTimestamp", "startingOffsetsByTimestamp",
           "startingOffsetsByTimestampStrategy", "minPartitions", "maxRecordsPerPartition",
           "failOnDataLoss", "includeHeaders", "readMode", "fetchMaxBytes",
           "remoteStorageUri", "remoteStorageOptions", ISOLATION_LEVEL, *SECURITY_OPTIONS)
_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp", "archiveTable",
               "archiveWarehouse", "pushFilters")
_STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "groupId")
ARCHIVE_CATALOG_PREFIX = "archive.catalog."
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|sec|seconds?|m|min|minutes?|h|hours?)?\s*$")
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
                "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
                "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000}


def parse_read_options(raw: Mapping[str, str], streaming: bool | None) -> ReadOptions:
    """Check and parse the options of a batch (``streaming=False``) or streaming read;
    ``None`` (for the schema, which Spark asks before it says which) accepts either's."""
    opts = {k.lower(): v for k, v in raw.items()}
    known = _COMMON + {True: _STREAM_ONLY, False: _BATCH_ONLY,
                       None: _STREAM_ONLY + _BATCH_ONLY}[streaming]
    where = {True: "for readStream", False: "for a batch read", None: ""}[streaming]
    _reject_unknown(raw, known, where)
    bootstrap = _bootstrap(opts)
    stream = streaming is not False
    starting = _offset_spec(opts, "starting", LATEST if streaming else EARLIEST, stream)
    ending = OffsetSpec(LATEST) if streaming else _offset_spec(opts, "ending", LATEST, stream)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', "
                          f"got {strategy!r}")
    read_mode = opts.get("readmode", "auto").strip().lower()
    if read_mode not in READ_MODES:
        raise OptionError(f"readMode must be one of {READ_MODES}, got {read_mode!r}")
    return ReadOptions(
        bootstrap_servers=bootstrap, subscription=_subscription(opts), starting=starting,
        ending=ending, timestamp_strategy_latest=strategy == "latest",
        min_partitions=_positive_int(opts, "minPartitions"),
        max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition"),
        fail_on_data_loss=boolean_option(opts, "failOnDataLoss", True),
        include_headers=boolean_option(opts, "includeHeaders", False),
        max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger"),
        min_offsets_per_trigger=_positive_int(opts, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", 15 * 60 * 1000),
        read_mode=read_mode,
        fetch_max_bytes=_positive_int(opts, "fetchMaxBytes") or 64 * 1024 * 1024,
        remote_storage_uri=_remote_storage_uri(opts),
        remote_storage_options=_remote_storage_options(opts),
        security=parse_security(opts), group_id=_non_empty(opts, "groupId"),
        isolation_level=parse_isolation_level(opts),
        push_filters=boolean_option(opts, "pushFilters", False), **_archive_options(raw, opts))


def parse_isolation_level(opts: Mapping[str, str]) -> str:
    """``kafka.isolation.level`` of lower-cased options (Spark's name for the Kafka setting)."""
    text = opts.get(ISOLATION_LEVEL, READ_UNCOMMITTED).strip().lower()
    if text not in ISOLATION_LEVELS:
        raise OptionError(f"{ISOLATION_LEVEL} must be one of {ISOLATION_LEVELS}, got {text!r}")
    return text


def _remote_storage_uri(opts: Mapping[str, str]) -> str | None:
    text = opts.get("remotestorageuri", "").strip()
    if not text:
        return None
    scheme, sep, path = text.partition("://")
    if not sep or not scheme or not path.strip("/"):
        raise OptionError(f"remoteStorageUri must be an fsspec URL with a path, like "
                          f"'s3://bucket/logstore' or 'file:///var/tier'; got {text!r}")
    return text


def _remote_storage_options(opts: Mapping[str, str]) -> dict[str, Any] | None:
    """fsspec options as JSON; credentials are refused (Spark options show up in plans and
    logs): executors find them in their environment or the provider's chain."""
    text = opts.get("remotestorageoptions")
    if text is None:
        return None
    try:  # the text is not echoed in errors: it might hold what must not be logged
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise OptionError(f"remoteStorageOptions is not JSON ({e.msg}); expected an object "
                          'such as {"endpoint_url": "http://127.0.0.1:9000"}') from None
    if not isinstance(parsed, dict):
        raise OptionError("remoteStorageOptions must be a JSON object")
    found = credential_keys(parsed, "remoteStorageOptions")
    if found:
        raise OptionError(f"{', '.join(found)} looks like a credential; credentials for remote "
                          "storage come from the executors' environment (AWS_ACCESS_KEY_ID, "
                          "...) or the provider's credential chain, never from options")
    return parsed


def _non_empty(opts: Mapping[str, str], name: str) -> str | None:
    text = opts.get(name.lower())
    if text is not None and not text.strip():
        raise OptionError(f"{name} must not be empty")
    return None if text is None else text.strip()


def _archive_options(raw: Mapping[str, str], opts: Mapping[str, str]) -> dict[str, Any]:
    """``archiveTable``, ``archiveWarehouse`` and the ``archive.catalog.*`` properties (their
    keys keep their case: pyiceberg's property names are case-sensitive)."""
    catalog = tuple(sorted((k[len(ARCHIVE_CATALOG_PREFIX):], v) for k, v in raw.items()
                           if k.lower().startswith(ARCHIVE_CATALOG_PREFIX)))
    table = _non_empty(opts, "archiveTable")
    warehouse = _non_empty(opts, "archiveWarehouse")
    if table is None and (catalog or warehouse):
        raise OptionError("archiveWarehouse and archive.catalog.* need archiveTable")
    if table is not None and "." not in table.strip("."):
        raise OptionError(f"archiveTable must be namespace.name, got {table!r}")
    return {"archive_table": table, "archive_warehouse": warehouse, "archive_catalog": catalog}


def _reject_unknown(raw: Mapping[str, str], known: tuple[str, ...], where: str) -> None:
    """Option names are case-insensitive (as in Spark); a typo is an error, not a default."""
    lowered = {k.lower() for k in known} | {"path"}
    unknown = sorted(k for k in raw if k.lower() not in lowered
                     and not k.lower().startswith(ARCHIVE_CATALOG_PREFIX))
    if unknown:
        raise OptionError(f"unknown option(s) {unknown} {where + ' ' if where else ''}of "
                          f"format('logstore'); known options: {list(known)}")


def _bootstrap(opts: Mapping[str, str]) -> str:
    servers = opts.get("bootstrap.servers", "").strip()
    if not servers:
        raise OptionError("option 'bootstrap.servers' is required "
                          "(host:port of one or more brokers, comma separated)")
    for s in servers.split(","):
        host, sep, port = s.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(f"bootstrap.servers: {s.strip()!r} is not host:port")
    return servers


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    names = {"subscribe": "subscribe", "subscribepattern": "subscribePattern", "assign": "assign"}
    if len(given) != 1:
        raise OptionError("exactly one of 'subscribe', 'subscribePattern' or 'assign' must be "
                          f"set, got {[names[k] for k in given] or 'none'}")
    kind, text = given[0], opts[given[0]]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"subscribe: no topic named in {text!r}")
        for t in topics:
            _check_topic(t, "subscribe")
        return Subscription(topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(text)
        except re.error as e:
            raise OptionError(f"subscribePattern: {text!r} is not a regular expression ({e})"
                              ) from None
        return Subscription(pattern=text)
    return Subscription(assigned=_assignment(text))


def _assignment(text: str) -> tuple[TopicPartition, ...]:
    parsed = _json(text, "assign", 'a JSON object such as {"t":[0,1]}')
    out: list[TopicPartition] = []
    for topic, parts in parsed.items():
        _check_topic(topic, "assign")
        if not isinstance(parts, list) or not all(_is_int(p) and p >= 0 for p in parts):
            raise OptionError(f"assign: topic {topic!r} needs a list of partition numbers "
                              f"(>= 0), got {parts!r}")
        out.extend(TopicPartition(topic, p) for p in dict.fromkeys(parts))
    if not out:
        raise OptionError(f"assign: no partition named in {text!r}")
    return tuple(out)


def _offset_spec(opts: Mapping[str, str], side: str, default: int, streaming: bool
                 ) -> OffsetSpec:
    """``side`` is 'starting' or 'ending'. As in Spark's Kafka source, the global timestamp
    wins over the per-partition timestamps, which win over the offsets."""
    name = f"{side}Offsets"
    if f"{side}timestamp" in opts:
        ts = _int_text(opts[f"{side}timestamp"], f"{side}Timestamp")
        if ts < 0:
            raise OptionError(f"{side}Timestamp must be >= 0 (ms since the epoch), got {ts}")
        return OffsetSpec(default, timestamp_ms=ts)
    if f"{side}offsetsbytimestamp" in opts:
        return OffsetSpec(default, timestamps=_partition_json(
            opts[f"{side}offsetsbytimestamp"], f"{name}ByTimestamp", minimum=0))
    text = opts.get(f"{side}offsets", "").strip()
    if not text:
        return OffsetSpec(default)
    if text.lower() in ("earliest", "latest"):
        spec = OffsetSpec(EARLIEST if text.lower() == "earliest" else LATEST)
    else:
        spec = OffsetSpec(default, offsets=_partition_json(text, name, minimum=-2))
    _check_direction(spec, side, streaming)
    return spec


def _check_direction(spec: OffsetSpec, side: str, streaming: bool) -> None:
    """Spark's Kafka source rules: a batch read cannot start at latest nor end at earliest."""
    if streaming:
        return
    bad = LATEST if side == "starting" else EARLIEST
    word = {LATEST: "latest (-1)", EARLIEST: "earliest (-2)"}[bad]
    if spec.default == bad and not spec.offsets:
        raise OptionError(f"{side}Offsets: {word} is not allowed for a batch read")
    wrong = [str(tp) for tp, o in spec.offsets.items() if o == bad]
    if wrong:
        raise OptionError(f"{side}Offsets: {word} is not allowed for a batch read "
                          f"(partitions {wrong})")


def _partition_json(text: str, name: str, minimum: int) -> dict[TopicPartition, int]:
    parsed = _json(text, name, 'a JSON object such as {"t":{"0":23,"1":-2}}')
    out: dict[TopicPartition, int] = {}
    for topic, parts in parsed.items():
        _check_topic(topic, name)
        if not isinstance(parts, dict):
            raise OptionError(f"{name}: topic {topic!r} needs an object of partition -> "
                              f"value, got {parts!r}")
        for p, value in parts.items():
            if not (isinstance(p, str) and p.isascii() and p.isdigit()):  # not '²' or '١'
                raise OptionError(f"{name}: {topic!r} partition {p!r} is not a partition number")
            if not _is_int(value) or value < minimum:
                raise OptionError(f"{name}: {topic}-{p} has {value!r}; expected an integer "
                                  f">= {minimum}")
            out[TopicPartition(topic, int(p))] = value
    return out


def _json(text: str, name: str, example: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise OptionError(f"{name}: {text!r} is not JSON ({e}); expected {example}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"{name}: expected {example}, got {text!r}")
    return parsed


def _check_topic(name: str, option: str) -> None:
    try:
        validate_topic_name(name)
    except InvalidTopicError as e:
        raise OptionError(f"{option}: {e.message}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_text(text: str, name: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise OptionError(f"{name} must be an integer, got {text!r}") from None


def positive_option(opts: Mapping[str, str], name: str, default: int) -> int:
    """``name`` of lower-cased ``opts`` as a positive integer, ``default`` when absent."""
    value = _positive_int(opts, name)
    return default if value is None else value


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    if name.lower() not in opts:
        return None
    value = _int_text(opts[name.lower()], name)
    if value <= 0:
        raise OptionError(f"{name} must be a positive integer, got {value}")
    return value


def boolean_option(opts: Mapping[str, str], name: str, default: bool) -> bool:
    """``name`` of lower-cased ``opts`` as true/false (any case), ``default`` when absent."""
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} must be 'true' or 'false', got {text!r}")
    return text.strip().lower() == "true"


def _duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    text = opts.get(name.lower())
    if text is None:
        return default
    match = _DURATION.match(text.lower())
    if match is None:
        raise OptionError(f"{name} must be a duration such as '500ms', '30s', '15m' or '1h', "
                          f"got {text!r}")
    return int(match.group(1)) * _DURATION_MS[match.group(2)]
