"""``df.write.format("logstore")``: batch writes of whole Arrow batches per Spark task.

Owns: the sink's options and column checks (as Spark's Kafka sink: ``key``, ``value``,
``topic``, ``partition``, ``headers``; a typed topic's value columns in place of ``value``),
routing each batch by topic and partition without per-row Python, and the commit/abort report.
Must not: import pyspark outside the DataSourceArrowWriter it implements.

Delivery of ``df.write`` is at least once by default, as with Spark's Kafka sink: each task
flushes and checks every acknowledgement before it reports success, but records of tasks that
succeeded stay written when the job fails (``abort`` says how many). With ``transactional``
the job is atomic, and ``writeStream`` is exactly once by default (``datasource/sink.py``).

| option              | meaning                                                        |
|---------------------|----------------------------------------------------------------|
| ``bootstrap.servers`` | required                                                     |
| ``topic``           | every row goes there (overrides a ``topic`` column)            |
| ``acks``            | ``all`` (default), ``1`` or ``0`` (``all`` only with transactions) |
| ``compression``     | ``none`` (default), ``lz4`` or ``zstd``                        |
| ``lingerMs`` / ``batchSize`` | producer batching (defaults 5 ms, 1 MiB)               |
| ``kafka.security.protocol``, ``kafka.ssl.*``, ``kafka.sasl.*`` | as the source (security_options.py) |
| ``transactional``   | ``df.write``: ``false`` (default) or ``true``: all rows visible to read_committed readers, or none |
| ``exactlyOnce``     | ``writeStream``: ``true`` (default) or ``false`` (at least once, as ``df.write``) |
| ``sinkId``          | ``writeStream``: the sink's name (default: the query id in ``<checkpointLocation>/metadata``) |
| ``transactionTimeoutMs`` | a task's transaction timeout while it writes (default 600000; at most the broker's ``transaction_max_timeout_ms``) |
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from datasource.options import OptionError, boolean_option, positive_option
from datasource.security_options import SECURITY_OPTIONS, parse_security
from logstore.client.admin import Admin
from logstore.client.producer import Producer
from logstore.model import validate_topic_name
from logstore.records import HEADERS_TYPE, topic_schema, value_columns
from logstore.security.config import ClientSecurity

log = logging.getLogger(__name__)

_COMMON = {"bootstrap.servers", "topic", "acks", "compression", "lingerms", "batchsize", "path",
           "transactiontimeoutms", *SECURITY_OPTIONS}
_BATCH_ONLY = {"transactional"}
_STREAM_ONLY = {"exactlyonce", "sinkid", "checkpointlocation"}
_NAMES = {"transactional": "transactional", "exactlyonce": "exactlyOnce", "sinkid": "sinkId",
          "checkpointlocation": "checkpointLocation"}
_ROUTING = ("topic", "partition")
DEFAULT_TRANSACTION_TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class SinkSettings:
    """A sink's options, parsed (picklable: shipped to every task)."""

    bootstrap: str
    topic: str | None
    acks: str | int
    security: ClientSecurity
    producer_options: dict[str, Any]
    transactional: bool = False  # df.write: transactional; writeStream: exactlyOnce
    sink_id: str | None = None  # writeStream: the sinkId option, if given
    checkpoint_location: str | None = None
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS


def parse_sink_options(options: dict[str, str], streaming: bool) -> SinkSettings:
    """Check and parse the options of ``df.write`` (``streaming=False``) or ``writeStream``;
    each mistake is an OptionError naming the option."""
    opts = {k.lower(): v for k, v in options.items()}
    known = _COMMON | (_STREAM_ONLY if streaming else _BATCH_ONLY)
    unknown = sorted(set(opts) - known)
    if unknown:
        other = "df.write" if streaming else "writeStream"
        misplaced = [_NAMES[k] for k in unknown if k in _NAMES]
        hint = f" ({misplaced} belong to {other})" if misplaced else ""
        raise OptionError(f"unknown {'writeStream' if streaming else 'write'} option(s) "
                          f"{unknown} for format('logstore'){hint}; known options: "
                          f"{sorted(known - {'path', 'checkpointlocation'})}")
    bootstrap = opts.get("bootstrap.servers", "").strip()
    if not bootstrap:
        raise OptionError("option 'bootstrap.servers' is required")
    name = "exactlyOnce" if streaming else "transactional"
    transactional = boolean_option(opts, name, streaming)
    acks = _acks(opts.get("acks", "all"))
    if transactional and acks != "all":
        raise OptionError(f"acks={opts['acks']!r} with {name}=true: transactions need "
                          "acks=all")
    return SinkSettings(
        bootstrap, opts.get("topic"), acks, parse_security(opts), _producer_options(opts),
        transactional, _sink_id(opts), opts.get("checkpointlocation"),
        positive_option(opts, "transactionTimeoutMs", DEFAULT_TRANSACTION_TIMEOUT_MS))


@dataclass(frozen=True)
class LogStoreCommitMessage(WriterCommitMessage):
    records: int
    topics: tuple[str, ...]


class LogStoreWriter(DataSourceArrowWriter):
    """``df.write``, at least once (and the at-least-once stream sink's task side)."""

    def __init__(self, options: dict[str, str], schema: StructType,
                 settings: SinkSettings | None = None) -> None:
        self.settings = settings or parse_sink_options(options, streaming=False)
        self.bootstrap = self.settings.bootstrap
        self.topic = self.settings.topic
        self.acks: str | int = self.settings.acks
        self.security = self.settings.security
        self.producer_options = self.settings.producer_options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        check_columns(self.arrow_schema, self.topic, value_schema_of(self.settings))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogStoreCommitMessage:
        producer = Producer(self.bootstrap, acks=self.acks, **self.producer_options,
                            **self.security.settings())
        futures: list[Any] = []
        topics: set[str] = set()
        try:
            for batch in iterator:
                for topic, partition, data in route(batch, self.topic):
                    topics.add(topic)
                    futures.append(producer.send_batch(topic, data, partition))
            producer.flush()
            records = sum(m.record_count for f in futures for m in f.result())
        finally:
            producer.close()
        return LogStoreCommitMessage(records, tuple(sorted(topics)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in _ours(messages))
        log.info("wrote %d records to %s", total, self.topic or "the rows' topics")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        written = sum(m.records for m in _ours(messages))
        log.warning("write to %s failed; %d records of the tasks that succeeded stay in the "
                    "log (the logstore sink delivers at least once)",
                    self.topic or "the rows' topics", written)


def value_schema_of(settings: SinkSettings) -> pa.Schema | None | bool:
    """The topic option's value schema (False when there is no topic option)."""
    if settings.topic is None:
        return False
    validate_topic_name(settings.topic)
    with Admin(settings.bootstrap, **settings.security.settings()) as admin:
        described = admin.describe_topics([settings.topic])
    return described[0].value_schema


def check_columns(schema: pa.Schema, topic: str | None, value_schema: Any) -> None:
    """Spark's Kafka sink rules, named column by column."""
    names = schema.names
    if topic is None and "topic" not in names:
        raise OptionError("the DataFrame has no 'topic' column and no 'topic' option is set")
    typed = value_schema not in (None, False)
    expected_values = value_columns(topic_schema(value_schema)) if typed else ["value"]
    allowed = {"key", "topic", "partition", "headers", *expected_values}
    extra = [n for n in names if n not in allowed]
    if extra:
        raise OptionError(f"unexpected column(s) {extra}; the logstore sink takes {sorted(allowed)}")
    missing = [n for n in expected_values if n not in names]
    if missing and value_schema is not False:
        raise OptionError(f"missing column(s) {missing} for topic {topic!r}")
    if typed:  # here: a cast parsing values (string to int) would fail in some tasks only,
        # after the others wrote their records
        for f in value_schema:
            have = schema.field(f.name).type
            if not _same_kind(have, f.type):
                raise OptionError(f"column {f.name!r} is {have}, but topic {topic!r} stores "
                                  f"{f.type}; cast it first")
    for name, accepted in (("key", "binary or string"), ("value", "binary or string")):
        if name in names and not _binary_like(schema.field(name).type):
            raise OptionError(f"column {name!r} is {schema.field(name).type}; the logstore sink "
                              f"takes {accepted} (cast it first)")
    _check_type(schema, "topic", pa.types.is_string, "string")
    _check_type(schema, "partition", pa.types.is_integer, "int")
    _check_type(schema, "headers", _headers_like, "array<struct<key: string, value: binary>>")


def _check_type(schema: pa.Schema, name: str, ok: Any, wanted: str) -> None:
    if name in schema.names and not ok(schema.field(name).type):
        raise OptionError(f"column {name!r} is {schema.field(name).type}; the logstore sink "
                          f"takes {wanted}")


_KINDS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_timestamp,
          pa.types.is_date, pa.types.is_boolean,
          lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
          lambda t: pa.types.is_string(t) or pa.types.is_large_string(t))


def _same_kind(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a DataFrame column of type ``have`` can go to a stored column of type ``want``
    by a cast within one kind of value (int to int64, timestamp units, decimal precision),
    never by parsing or reinterpreting values (string to int)."""
    if have.equals(want):
        return True
    if pa.types.is_struct(have) and pa.types.is_struct(want):
        return [f.name for f in have] == [f.name for f in want] and all(
            _same_kind(a.type, b.type) for a, b in zip(have, want, strict=True))
    if (pa.types.is_list(have) or pa.types.is_large_list(have)) and \
            (pa.types.is_list(want) or pa.types.is_large_list(want)):
        return _same_kind(have.value_type, want.value_type)
    if pa.types.is_map(have) and pa.types.is_map(want):
        return _same_kind(have.key_type, want.key_type) and \
            _same_kind(have.item_type, want.item_type)
    return any(kind(have) and kind(want) for kind in _KINDS)


def _headers_like(t: pa.DataType) -> bool:
    """array<struct<key string, value binary or string>>, whatever the nullability."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return bool(pa.types.is_struct(item) and [f.name for f in item] == ["key", "value"]
                and pa.types.is_string(item.field("key").type)
                and _binary_like(item.field("value").type))


def _binary_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
                or pa.types.is_large_string(t))


def _ours(messages: list[WriterCommitMessage | None]) -> list[LogStoreCommitMessage]:
    """The commit messages of the tasks that succeeded (Spark passes None for the others)."""
    return [m for m in messages if isinstance(m, LogStoreCommitMessage)]


def route(batch: pa.RecordBatch, topic: str | None
          ) -> Iterator[tuple[str, int | None, pa.RecordBatch]]:
    """(topic, partition or None, rows) groups of ``batch``, with the routing columns removed
    and string keys/values as binary; grouping is vectorised (one filter per distinct value)."""
    if batch.num_rows == 0:
        return
    data = _as_binary(batch)
    if topic is not None:
        groups: Iterator[tuple[str, pa.RecordBatch]] = iter([(topic, data)])
    else:
        groups = _group_by(data, "topic")
    for name, rows in groups:
        if name is None:
            raise OptionError("a row has a null 'topic' and no 'topic' option is set")
        if "partition" not in rows.schema.names:
            yield name, None, _drop_routing(rows)
            continue
        for partition, part_rows in _group_by(rows, "partition"):
            yield name, partition, _drop_routing(part_rows)


def _group_by(batch: pa.RecordBatch, column: str) -> Iterator[tuple[Any, pa.RecordBatch]]:
    values = batch.column(column)
    bounds = pc.min_max(values)
    if values.null_count == 0 and bounds["min"] == bounds["max"]:
        yield values[0].as_py(), batch
        return
    for value in pc.unique(values).to_pylist():
        mask = pc.is_null(values) if value is None else pc.equal(values, value)
        yield value, batch.filter(mask)


def _drop_routing(batch: pa.RecordBatch) -> pa.RecordBatch:
    keep = [i for i, n in enumerate(batch.schema.names) if n not in _ROUTING]
    return batch.select(keep)


def _as_binary(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Keys and values as binary, headers as the stored headers type (casts, no row loop)."""
    for name, target in (("key", pa.binary()), ("value", pa.binary()), ("headers", HEADERS_TYPE)):
        i = batch.schema.get_field_index(name)
        if i >= 0 and not batch.column(i).type.equals(target):
            batch = batch.set_column(i, pa.field(name, target), batch.column(i).cast(target))
    return batch


def _acks(text: str) -> str | int:
    value = text.strip().lower()
    if value in ("all", "-1"):
        return "all"
    if value in ("0", "1"):
        return int(value)
    raise OptionError(f"acks must be 'all', '1' or '0', got {text!r}")


MAX_SINK_ID_LENGTH = 200  # its tasks' transactional ids add "-<partition>-<attempt>-<k>"
_SINK_ID = re.compile(r"[A-Za-z0-9._-]+")


def _sink_id(opts: dict[str, str]) -> str | None:
    text = opts.get("sinkid")
    if text is None:
        return None
    return check_sink_id(text.strip(), "sinkId")


def check_sink_id(sink_id: str, source: str) -> str:
    """A sink id (from ``source``) usable as a transactional id and a group id, with room
    for its tasks' suffixes."""
    if not sink_id or len(sink_id) > MAX_SINK_ID_LENGTH or not _SINK_ID.fullmatch(sink_id):
        raise OptionError(f"{source}: sink id {sink_id!r} must be 1 to {MAX_SINK_ID_LENGTH} "
                          "letters, digits, '.', '_' or '-'")
    return sink_id


def _producer_options(opts: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    compression = opts.get("compression", "none").strip().lower()
    if compression not in ("none", "lz4", "zstd"):
        raise OptionError(f"compression must be none, lz4 or zstd, got {compression!r}")
    out["compression_type"] = None if compression == "none" else compression
    for key, name, arg in (("lingerms", "lingerMs", "linger_ms"),
                           ("batchsize", "batchSize", "batch_size")):
        if key in opts:
            try:
                out[arg] = int(opts[key])
            except ValueError:
                raise OptionError(f"{name} must be an integer, got {opts[key]!r}") from None
    return out
