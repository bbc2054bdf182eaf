"""The ``logstore`` command: run a broker, manage topics, produce and consume from a terminal.

Owns: argument parsing, the ``--value-schema`` syntax (see ``VALUE_SCHEMA_HELP``), and terminal
output, including JSON lines in and out for topics with typed values. Expected errors (an
``ApiError`` from the broker, a ``ConfigError``, a bad line on stdin) print ``error: ...`` on
stderr and exit 1, never a traceback; an argument that does not parse (a bad ``--value-schema``
among them) is a usage error, exit 2, before anything is sent. Must not: contain broker or
client logic; it calls the public client API only, and imports the clients (and pyarrow)
lazily so that ``logstore broker start`` does not load them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zoneinfo
from collections.abc import Iterable, Iterator
from contextlib import closing
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from logstore.cli_groups import add_group_commands
from logstore.errors import LogstoreError

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "LOGSTORE_BOOTSTRAP"
PRODUCE_FLUSH_EVERY = 10_000  # lines; bounds the futures or rows held while reading stdin
CONSUME_TYPED_RECORDS = 10_000  # records per poll when printing a typed topic
VALUE_SCHEMA_HELP = (
    "the value's Arrow columns, as NAME:TYPE[,NAME:TYPE...] or @FILE.json holding a JSON list "
    'of {"name": NAME, "type": TYPE}. NAME is [A-Za-z_][A-Za-z0-9_]* (any text in a file) and '
    "not key, timestamp or headers. TYPE is int8|int16|int32|int64, uint8..uint64, float32 "
    "(float), float64 (double), bool, string (utf8), binary, date32, timestamp[UNIT] or "
    "timestamp[UNIT,TZ] (UNIT s|ms|us|ns, TZ like UTC or +01:00), decimal128(P,S), list<TYPE>, "
    "struct<NAME:TYPE,...>. Example: id:int64,tags:list<string>,at:timestamp[ms,UTC]")


# -- argument parsing ------------------------------------------------------------------------


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _acks(text: str) -> str | int:
    if text == "all" or text == "-1":
        return "all"
    if text in ("0", "1"):
        return int(text)
    raise argparse.ArgumentTypeError(f"acks must be all, 1 or 0, got {text!r}")


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _add_bootstrap(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP)
    parser.add_argument("--bootstrap-server", default=default, metavar="HOST:PORT",
                        help=f"a broker to contact (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP};"
                             f" now {default})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logstore", description="LogStore: a commit log on Apache Arrow.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_broker_commands(commands)
    _add_topic_commands(commands)
    cluster = commands.add_parser("cluster", help="brokers (id, listener, rack) and the controller")
    _add_bootstrap(cluster)
    cluster.set_defaults(run=_cmd_cluster)
    _add_produce_command(commands)
    _add_consume_command(commands)
    add_group_commands(commands, _add_bootstrap)
    demo = commands.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--records", type=_non_negative, default=1_000_000,
                      help="records produced columnar, in 10k-row batches (default 1000000)")
    demo.add_argument("--per-record", type=_non_negative, default=100_000,
                      help="records produced one send() at a time (default 100000)")
    demo.add_argument("--no-spark", action="store_true",
                      help="skip the final spark.read.format('logstore') query")
    demo.set_defaults(run=_cmd_demo)
    return parser


def _add_broker_commands(commands: Any) -> None:
    broker = commands.add_parser("broker", help="run a broker")
    actions = broker.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="run a broker in the foreground until SIGTERM/SIGINT")
    start.add_argument("--config", required=True, help="broker TOML file (see conf/broker.toml)")
    start.add_argument("--listener", metavar="HOST:PORT", help="override the file's listener")
    start.add_argument("--log-dir", action="append", metavar="DIR",
                       help="override the file's log_dirs (repeatable)")
    start.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    start.set_defaults(run=_cmd_broker_start)


def _add_topic_commands(commands: Any) -> None:
    topics = commands.add_parser("topics", help="create, list, describe, alter, delete topics")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, required=True)
    create.add_argument("--replication-factor", type=int, default=1)
    create.add_argument("--config", type=_key_value, action="append", default=[],
                        metavar="KEY=VALUE", help="topic config (repeatable), e.g. retention_ms=60000")
    create.add_argument("--value-schema", type=_value_schema_arg, metavar="SPEC",
                        help=VALUE_SCHEMA_HELP)
    create.set_defaults(run=_cmd_topics_create)
    listing = actions.add_parser("list", help="list topic names")
    listing.add_argument("--include-internal", action="store_true")
    listing.set_defaults(run=_cmd_topics_list)
    describe = actions.add_parser("describe", help="partitions, leaders, replicas, ISR, offsets")
    describe.add_argument("name", nargs="?", help="a topic (default: every topic)")
    describe.set_defaults(run=_cmd_topics_describe)
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(run=_cmd_topics_delete)
    alter = actions.add_parser("alter", help="change topic configs")
    alter.add_argument("name")
    alter.add_argument("--config", type=_key_value, action="append", required=True,
                       metavar="KEY=VALUE", help="topic config to set (repeatable)")
    alter.set_defaults(run=_cmd_topics_alter)
    for sub in (create, listing, describe, delete, alter):
        _add_bootstrap(sub)


def _add_produce_command(commands: Any) -> None:
    produce = commands.add_parser(
        "produce", help="send lines from stdin as records",
        description="Send each line of stdin as a record. To a typed topic (created with "
                    "--value-schema) each line is a JSON object of value columns and an optional "
                    '"key" string; timestamps are ISO-8601 text or integers in the column\'s '
                    "unit, dates YYYY-MM-DD, decimals numbers or numeric text.")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--acks", type=_acks, default="all", help="all, 1 or 0 (default all)")
    produce.add_argument("--partition", type=_non_negative, help="send every record here")
    _add_bootstrap(produce)
    produce.set_defaults(run=_cmd_produce)


def _add_consume_command(commands: Any) -> None:
    consume = commands.add_parser(
        "consume", help="print records as offset<TAB>key<TAB>value",
        description="Print records as offset<TAB>key<TAB>value; a typed topic's value is a "
                    "JSON object, with timestamps, dates and decimals as text. Without "
                    "--from-beginning or --offset, only records produced from now on are printed.")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=_non_negative,
                         help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", type=_non_negative, help="start here (needs --partition)")
    consume.add_argument("--max-messages", type=_non_negative, help="stop after this many")
    consume.add_argument("--timeout-ms", type=_non_negative,
                         help="stop once no record arrived for this long (default: never)")
    _add_bootstrap(consume)
    consume.set_defaults(run=_cmd_consume)


# -- value schemas: the --value-schema syntax --------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\d+")
_TIME_ZONE = re.compile(r"[^\]]+")
_UTC_OFFSET = re.compile(r"[+-]\d\d:\d\d")
_SIMPLE_TYPES = {  # spec name -> pyarrow factory
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float32": "float32",
    "float": "float32", "float64": "float64", "double": "float64", "bool": "bool_",
    "string": "string", "utf8": "string", "binary": "binary", "date32": "date32"}
_TYPE_LIST = ("int8..int64, uint8..uint64, float32, float64, double, bool, string, binary, "
              "date32, timestamp[unit,tz], decimal128(p,s), list<T>, struct<name:T,...>")


class SchemaSpecError(ValueError):
    """A --value-schema that does not parse; the message names the column and the text."""


class _SpecParser:
    """Recursive descent over ``VALUE_SCHEMA_HELP``'s grammar; spaces between tokens are fine.
    Names are case-sensitive, type names and units are not."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        fields = self.fields("")
        self.end(f"after column {fields[-1].name!r}")
        return pa.schema(fields)

    def whole_type(self, column: str) -> pa.DataType:
        data_type = self.type(column)
        self.end(f"after the type of {column!r}")
        return data_type

    def fields(self, where: str) -> list[pa.Field]:
        """NAME:TYPE (',' NAME:TYPE)*: the columns, or a struct's fields when ``where`` names
        the struct's column."""
        fields = [self.field(where)]
        while self.take(","):
            fields.append(self.field(where))
        _check_unique([f.name for f in fields], where)
        return fields

    def field(self, where: str) -> pa.Field:
        import pyarrow as pa

        name = self.match(_NAME)
        if name is None:
            raise self.error(f"column {where!r}: expected a field name" if where else
                             "expected a column name")
        path = f"{where}.{name}" if where else name
        if not self.take(":"):
            raise self.error(f"column {path!r} needs ':' and a type, as in '{name}:int64'")
        return pa.field(name, self.type(path))

    def type(self, column: str) -> pa.DataType:
        import pyarrow as pa

        start = self.pos
        word = (self.match(_NAME) or "").lower()
        if word in _SIMPLE_TYPES:
            return getattr(pa, _SIMPLE_TYPES[word])()
        if word == "timestamp":
            return self.timestamp(column)
        if word == "decimal128":
            return self.decimal128(column)
        if word == "list":
            self.expect("<", column)
            item = self.type(column)
            self.expect(">", column)
            return pa.list_(item)
        if word == "struct":
            self.expect("<", column)
            fields = self.fields(column)
            self.expect(">", column)
            return pa.struct(fields)
        self.pos = start
        if not word:
            raise self.error(f"column {column!r}: expected a type")
        raise SchemaSpecError(f"column {column!r}: unknown type {word!r}; the types are "
                              f"{_TYPE_LIST}")

    def timestamp(self, column: str) -> pa.DataType:
        import pyarrow as pa

        self.expect("[", column)
        start = self.pos
        unit = (self.match(_NAME) or "").lower()
        if unit not in ("s", "ms", "us", "ns"):
            self.pos = start
            raise self.error(f"column {column!r}: the timestamp unit must be s, ms, us or ns")
        tz = None
        if self.take(","):
            start = self.pos
            tz = (self.match(_TIME_ZONE) or "").strip()
            if not _known_time_zone(tz):
                self.pos = start
                raise self.error(f"column {column!r}: unknown time zone {tz!r}")
        self.expect("]", column)
        return pa.timestamp(unit, tz=tz)

    def decimal128(self, column: str) -> pa.DataType:
        import pyarrow as pa

        self.expect("(", column)
        precision = self.number(column)
        self.expect(",", column)
        scale = self.number(column)
        self.expect(")", column)
        try:
            return pa.decimal128(precision, scale)
        except ValueError as e:
            raise SchemaSpecError(f"column {column!r}: decimal128({precision},{scale}): "
                                  f"{e}") from None

    def number(self, column: str) -> int:
        digits = self.match(_NUMBER)
        if digits is None:
            raise self.error(f"column {column!r}: expected a number")
        return int(digits)

    def expect(self, token: str, column: str) -> None:
        if not self.take(token):
            raise self.error(f"column {column!r}: expected {token!r}")

    def end(self, where: str) -> None:
        self.skip_spaces()
        if self.pos < len(self.text):
            raise self.error(f"unexpected text {where} (columns are separated by ',')")

    def take(self, token: str) -> bool:
        self.skip_spaces()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def match(self, pattern: re.Pattern[str]) -> str | None:
        self.skip_spaces()
        found = pattern.match(self.text, self.pos)
        if found is None:
            return None
        self.pos = found.end()
        return found.group()

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def error(self, message: str) -> SchemaSpecError:
        rest = self.text[self.pos:].strip()
        found = f"found {rest[:40]!r}" if rest else "found the end of the text"
        return SchemaSpecError(f"{message}; {found}")


def _known_time_zone(tz: str) -> bool:
    if _UTC_OFFSET.fullmatch(tz):
        return True
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _check_unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SchemaSpecError(f"column {where!r}: duplicate field {name!r}" if where else
                                  f"duplicate column {name!r}")
        seen.add(name)


def _value_schema_arg(text: str) -> pa.Schema:
    """argparse type of --value-schema: a spec, or ``@path`` of a JSON list of columns."""
    from logstore.records import RESERVED_COLUMNS

    try:
        schema = _schema_file(text[1:]) if text.startswith("@") else _SpecParser(text).schema()
    except SchemaSpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    for name in schema.names:
        if name in RESERVED_COLUMNS:
            raise argparse.ArgumentTypeError(
                f"column {name!r} is reserved: every record has {', '.join(RESERVED_COLUMNS)} "
                "(produce takes a typed record's key from its \"key\" field)")
    return schema


def _schema_file(path: str) -> pa.Schema:
    import pyarrow as pa

    try:
        entries = json.loads(Path(path).read_text())
    except OSError as e:
        raise SchemaSpecError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SchemaSpecError(f"{path} is not JSON: {e}") from None
    if not isinstance(entries, list) or not entries:
        raise SchemaSpecError(f'{path}: expected a non-empty list of {{"name": ..., "type": ...}}')
    fields = []
    for number, entry in enumerate(entries, start=1):
        if not (isinstance(entry, dict) and entry.keys() == {"name", "type"}
                and all(isinstance(v, str) and v for v in entry.values())):
            raise SchemaSpecError(f'{path}: entry {number} must be {{"name": NAME, "type": '
                                  f"TYPE}} with two non-empty strings, got {_brief(entry)}")
        try:
            fields.append(pa.field(entry["name"], _SpecParser(entry["type"]).whole_type(
                entry["name"])))
        except SchemaSpecError as e:
            raise SchemaSpecError(f"{path}: {e}") from None
    _check_unique([f.name for f in fields], "")
    return pa.schema(fields)


def _type_spec(data_type: pa.DataType) -> str:
    """``data_type`` in the --value-schema syntax (Arrow's own text for a type outside it)."""
    import pyarrow as pa

    if pa.types.is_timestamp(data_type):
        return f"timestamp[{data_type.unit}{',' + data_type.tz if data_type.tz else ''}]"
    if pa.types.is_decimal128(data_type):
        return f"decimal128({data_type.precision},{data_type.scale})"
    if pa.types.is_list(data_type):
        return f"list<{_type_spec(data_type.value_type)}>"
    if pa.types.is_struct(data_type):
        return "struct<" + ",".join(f"{f.name}:{_type_spec(f.type)}"
                                    for f in _struct_fields(data_type)) + ">"
    return {"float": "float32", "date32[day]": "date32"}.get(str(data_type), str(data_type))


def _struct_fields(data_type: pa.DataType) -> list[pa.Field]:
    return [data_type.field(i) for i in range(data_type.num_fields)]


def _brief(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


# -- entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "offset", None) is not None and args.partition is None:
        parser.error("--offset needs --partition")
    try:
        return int(args.run(args))
    except (LogstoreError, ValueError) as e:
        # ConfigError is a ValueError; so is a malformed --bootstrap-server in the clients.
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`); not an error
        return 0


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


# -- broker ----------------------------------------------------------------------------------


def _cmd_broker_start(args: argparse.Namespace) -> int:
    from logstore.config import load_broker_config
    from logstore.main import configure_logging, run_broker

    overrides: dict[str, Any] = {}
    if args.listener:
        overrides["listener"] = args.listener
    if args.log_dir:
        overrides["log_dirs"] = list(args.log_dir)
    config = load_broker_config(args.config, overrides)
    configure_logging(args.log_level.upper())
    return run_broker(config)


# -- cluster ---------------------------------------------------------------------------------


def _cmd_cluster(args: argparse.Namespace) -> int:
    with closing(_admin(args)) as admin:
        cluster = admin.describe_cluster()
    controller = "-" if cluster.controller_id is None else cluster.controller_id
    print(f"Brokers: {len(cluster.brokers)}\tController: {controller}")
    for b in cluster.brokers:
        mark = "\t(controller)" if b.broker_id == cluster.controller_id else ""
        print(f"\tBroker: {b.broker_id}\tListener: {b.host}:{b.port}\t"
              f"Rack: {b.rack or '-'}{mark}")
    return 0


# -- topics ----------------------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> Any:
    from logstore import Admin

    return Admin(bootstrap_servers=args.bootstrap_server)


def _describe(args: argparse.Namespace, name: str) -> Any:
    with closing(_admin(args)) as admin:
        (topic,) = admin.describe_topics([name])
    return topic


def _cmd_topics_create(args: argparse.Namespace) -> int:
    from logstore import NewTopic

    topic = NewTopic(args.name, args.partitions, replication_factor=args.replication_factor,
                     config=dict(args.config), value_schema=args.value_schema)
    with closing(_admin(args)) as admin:
        admin.create_topics([topic])
    typed = "" if args.value_schema is None else f" and {len(args.value_schema)} value column(s)"
    print(f"created topic {args.name} with {args.partitions} partition(s){typed}")
    return 0


def _cmd_topics_list(args: argparse.Namespace) -> int:
    with closing(_admin(args)) as admin:
        for name in admin.list_topics(include_internal=args.include_internal):
            print(name)
    return 0


def _cmd_topics_delete(args: argparse.Namespace) -> int:
    with closing(_admin(args)) as admin:
        admin.delete_topics([args.name])
    print(f"deleted topic {args.name}")
    return 0


def _cmd_topics_alter(args: argparse.Namespace) -> int:
    with closing(_admin(args)) as admin:
        admin.alter_configs({args.name: dict(args.config)})
    print(f"altered topic {args.name}: " + ", ".join(f"{k}={v}" for k, v in args.config))
    return 0


def _cmd_topics_describe(args: argparse.Namespace) -> int:
    with closing(_admin(args)) as admin:
        topics = admin.describe_topics([args.name] if args.name else None)
        configs = admin.describe_configs([t.name for t in topics]) if topics else {}
    offsets = _log_offsets(args.bootstrap_server, topics)
    for topic in topics:
        _print_topic(topic, configs.get(topic.name, {}), offsets)
    return 0


def _print_topic(topic: Any, config: dict[str, Any], offsets: dict[Any, tuple[int, int]]
                 ) -> None:
    overrides = ", ".join(f"{k}={v}" for k, v in _non_default(config).items()) or "-"
    print(f"Topic: {topic.name}\tPartitionCount: {len(topic.partitions)}\tConfigs: {overrides}")
    if topic.value_schema is not None:
        print("\tValueColumns:")
        for f in topic.value_schema:
            print(f"\t\t{f.name}: {_type_spec(f.type)}")
    for p in sorted(topic.partitions, key=lambda p: p.partition):
        start, end = offsets.get((topic.name, p.partition), ("-", "-"))
        print(f"\tPartition: {p.partition}\tLeader: {p.leader}\t"
              f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t"
              f"LogStartOffset: {start}\tLogEndOffset: {end}")


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _non_default(config: dict[str, Any]) -> dict[str, Any]:
    from logstore.config import TopicConfig

    defaults = TopicConfig().to_dict()
    return {k: v for k, v in sorted(config.items()) if defaults.get(k, object()) != v}


def _log_offsets(bootstrap: str, topics: list[Any]) -> dict[Any, tuple[int, int]]:
    """Log start and end offset per partition; empty when the leaders cannot tell (describe
    still prints the rest, with '-' for offsets)."""
    from logstore import Consumer, TopicPartition

    tps = [TopicPartition(t.name, p.partition) for t in topics for p in t.partitions]
    if not tps:
        return {}
    try:
        with closing(Consumer(bootstrap_servers=bootstrap)) as consumer:
            start, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
    except LogstoreError as e:
        print(f"warning: log offsets unavailable: {e}", file=sys.stderr)
        return {}
    return {tuple(tp): (start[tp], end[tp]) for tp in tps}


# -- produce ---------------------------------------------------------------------------------


def _cmd_produce(args: argparse.Namespace) -> int:
    from logstore import Producer

    value_schema = _describe(args, args.topic).value_schema
    if value_schema is not None and args.key_separator is not None:
        raise ValueError(f"topic {args.topic!r} has typed values: each line is a JSON object "
                         'and the key is its "key" field, so --key-separator does not apply')
    with Producer(bootstrap_servers=args.bootstrap_server, acks=args.acks) as producer:
        if value_schema is None:
            sent = _produce_lines(args, producer)
        else:
            sent = _produce_json(args, producer, value_schema)
    print(f"produced {sent} record(s) to {args.topic}", file=sys.stderr)
    return 0


def _produce_lines(args: argparse.Namespace, producer: Any) -> int:
    sent = 0
    pending: list[Any] = []
    for number, line in enumerate(_lines(sys.stdin.buffer), start=1):
        try:
            key, value = _split_line(line, args.key_separator, number)
        except ValueError as e:
            sent += _settle(producer, pending)
            raise ValueError(f"{e}; the {sent} record(s) before it were sent") from None
        pending.append(producer.send(args.topic, value=value, key=key,
                                     partition=args.partition))
        if len(pending) >= PRODUCE_FLUSH_EVERY:
            sent += _settle(producer, pending)
    return sent + _settle(producer, pending)


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        yield line.rstrip(b"\r\n") if line.endswith(b"\n") else line


def _split_line(line: bytes, separator: str | None, number: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator.encode())
    if not sep:
        raise ValueError(f"line {number} has no key separator {separator!r}: "
                         f"{line[:60].decode(errors='replace')!r}")
    return key, value


def _produce_json(args: argparse.Namespace, producer: Any, value_schema: pa.Schema) -> int:
    """JSON lines to a typed topic: each chunk of lines is one Arrow table and one columnar
    ``send_batch``. On a bad line the lines before it are sent, then the error names it."""
    import pyarrow as pa

    schema = pa.schema([pa.field("key", pa.binary()), *value_schema])
    sent = 0
    try:
        for numbers, rows in _json_chunks(sys.stdin.buffer, schema.names):
            table, problem = _rows_to_table(rows, numbers, schema)
            if table.num_rows:
                producer.send_batch(args.topic, table, partition=args.partition).result()
                sent += table.num_rows
            if problem is not None:
                raise _BadLine(problem)
    except _BadLine as e:
        raise ValueError(f"{e}; the {sent} record(s) before it were sent") from None
    return sent


class _BadLine(ValueError):
    """A line of stdin that cannot become a record; the message names it."""


class _Mismatch(ValueError):
    """JSON values that cannot become an Arrow type; the message says why."""


def _json_chunks(stream: IO[bytes], columns: list[str]
                 ) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    """(line numbers, objects) per PRODUCE_FLUSH_EVERY non-blank lines. A line that is not an
    object of known columns ends the last chunk early, then raises _BadLine."""
    allowed = set(columns)
    numbers: list[int] = []
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(_lines(stream), start=1):
        if not line.strip():
            continue
        problem = None
        try:
            row = json.loads(line)
        except ValueError as e:
            problem = f"line {number} is not JSON ({e})"
        else:
            problem = _object_problem(row, number, allowed, columns)
        if problem is not None:
            yield numbers, rows
            raise _BadLine(problem)
        numbers.append(number)
        rows.append(row)
        if len(rows) >= PRODUCE_FLUSH_EVERY:
            yield numbers, rows
            numbers, rows = [], []
    yield numbers, rows


def _object_problem(row: Any, number: int, allowed: set[str], columns: list[str]
                    ) -> str | None:
    if not isinstance(row, dict):
        return f"line {number}: expected a JSON object of columns, got {_brief(row)}"
    unknown = row.keys() - allowed
    if unknown:
        return (f"line {number}: unknown column(s) {sorted(unknown)}; the topic's are "
                f"{columns}")
    return None


def _rows_to_table(rows: list[dict[str, Any]], numbers: list[int], schema: pa.Schema
                   ) -> tuple[pa.Table, str | None]:
    """``rows`` as a table of ``schema``, built column by column; on a bad value, the table of
    the rows before it and a message naming its line and column."""
    import pyarrow as pa

    columns = []
    first_bad: tuple[int, str] | None = None
    for field in schema:
        values = [row.get(field.name) for row in rows]
        try:
            columns.append(_json_column(values, field.type))
        except _BadValue as e:
            if first_bad is None or e.index < first_bad[0]:
                first_bad = (e.index, f"line {numbers[e.index]}: column {field.name!r}: {e}")
    if first_bad is None:
        return pa.Table.from_arrays(columns, schema=schema), None
    table, _ = _rows_to_table(rows[:first_bad[0]], numbers, schema)
    return table, first_bad[1]


class _BadValue(ValueError):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def _json_column(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """One column of JSON values as Arrow, in one conversion when it can be. Otherwise value
    by value: that finds the bad one, and also converts a column that mixes accepted forms
    (integer and text timestamps), which Arrow cannot infer as one type."""
    import pyarrow as pa

    try:
        return _json_array(values, data_type)
    except _Mismatch:
        pass
    pieces = []
    for index, value in enumerate(values):
        try:
            pieces.append(_json_array([value], data_type))
        except _Mismatch as e:
            raise _BadValue(index, f"{_brief(value)} is not a valid {_type_spec(data_type)} "
                                   f"({e})") from None
    return pa.concat_arrays(pieces) if pieces else pa.array([], data_type)


def _json_array(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """Arrow infers the values' type, which must be a kind ``data_type`` accepts, and then
    casts safely. Converting straight to ``data_type`` would truncate 1.5 to an integer, split
    a string into a list of characters and drop unknown struct fields without a word."""
    import pyarrow as pa

    try:
        inferred = pa.array(values)
    except OverflowError:
        return _big_integers(values, data_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise _Mismatch(_arrow_reason(e)) from None
    problem = _kind_problem(inferred.type, data_type)
    if problem is not None:
        raise _Mismatch(problem)
    try:
        staging = _staging_type(inferred.type, data_type)
        if staging != inferred.type:
            inferred = inferred.cast(staging)
        return inferred.cast(data_type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _Mismatch(_arrow_reason(e)) from None


def _big_integers(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """Integers past int64, which Arrow cannot infer; only uint64 holds them."""
    import pyarrow as pa

    if not pa.types.is_uint64(data_type) or any(
            type(v) is not int for v in values if v is not None):
        raise _Mismatch("an integer out of range")
    try:
        return pa.array(values, data_type)
    except (OverflowError, pa.ArrowInvalid) as e:
        raise _Mismatch(str(e)) from None


def _kind_problem(source: pa.DataType, target: pa.DataType) -> str | None:
    """Why JSON values Arrow inferred as ``source`` may not fill a ``target`` column, or None.
    Stricter than Arrow's casts, which also turn numbers into text and text into numbers."""
    import pyarrow.types as t

    if t.is_null(source):
        return None
    if t.is_struct(target):
        return _struct_problem(source, target)
    if t.is_list(target):
        if not t.is_list(source):
            return f"expected a list, got {_json_kind(source)}"
        return _kind_problem(source.value_type, target.value_type)
    number, text = (t.is_integer, t.is_floating), (t.is_string,)
    accepts = ((t.is_integer, number, "an integer"), (t.is_floating, number, "a number"),
               (t.is_boolean, (t.is_boolean,), "true or false"),
               (t.is_string, text, "a string"), (t.is_binary, text, "a string"),
               (t.is_timestamp, (t.is_integer, t.is_string), "ISO-8601 text or an integer"),
               (t.is_date32, text, "YYYY-MM-DD text"),
               (t.is_decimal, (*number, t.is_string), "a number or numeric text"))
    for is_target, sources, wanted in accepts:
        if is_target(target):
            return None if any(ok(source) for ok in sources) else \
                f"expected {wanted}, got {_json_kind(source)}"
    return None  # a type outside the --value-schema syntax: Arrow's cast decides


def _struct_problem(source: pa.DataType, target: pa.DataType) -> str | None:
    import pyarrow.types as t

    if not t.is_struct(source):
        return f"expected an object, got {_json_kind(source)}"
    for field in _struct_fields(source):
        index = target.get_field_index(field.name)
        if index < 0:
            return f"unknown field {field.name!r}"
        problem = _kind_problem(field.type, target.field(index).type)
        if problem is not None:
            return f"field {field.name!r}: {problem}"
    return None


def _staging_type(source: pa.DataType, target: pa.DataType) -> pa.DataType:
    """``source`` with numbers bound for decimal columns turned to text: Arrow's number to
    decimal casts round floats silently and need more precision than the column for integers,
    while a cast from text is exact or fails."""
    import pyarrow as pa

    if pa.types.is_struct(source) and pa.types.is_struct(target):
        return pa.struct([f.with_type(_staging_type(f.type, target.field(f.name).type))
                          for f in _struct_fields(source)])
    if pa.types.is_list(source) and pa.types.is_list(target):
        return pa.list_(source.value_field.with_type(
            _staging_type(source.value_type, target.value_type)))
    if pa.types.is_decimal(target) and (pa.types.is_integer(source)
                                         or pa.types.is_floating(source)):
        return pa.string()
    return source


def _json_kind(data_type: pa.DataType) -> str:
    import pyarrow.types as t

    kinds = ((t.is_string, "a string"), (t.is_integer, "an integer"),
             (t.is_floating, "a fractional number"), (t.is_boolean, "true/false"),
             (t.is_list, "a list"), (t.is_struct, "an object"))
    return next((kind for test, kind in kinds if test(data_type)), str(data_type))


def _arrow_reason(error: Exception) -> str:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return reason if len(reason) <= 120 else reason[:117] + "..."


def _settle(producer: Any, pending: list[Any]) -> int:
    """Flush, then raise the first failure among ``pending``; returns how many were sent."""
    producer.flush()
    count = len(pending)
    for future in pending:
        future.result()
    pending.clear()
    return count


# -- consume ---------------------------------------------------------------------------------


def _cmd_consume(args: argparse.Namespace) -> int:
    from logstore import Consumer, TopicPartition

    # An explicit --offset outside the log is an error naming the valid range, not a silent
    # jump to the beginning.
    reset = "none" if args.offset is not None else "earliest"
    topic = _describe(args, args.topic)
    partitions = [p.partition for p in topic.partitions] if args.partition is None else \
        [args.partition]
    with closing(Consumer(bootstrap_servers=args.bootstrap_server,
                          auto_offset_reset=reset)) as consumer:
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if args.offset is not None:
            consumer.seek(tps[0], args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
        count = _print_records(consumer, topic.value_schema is not None, args.max_messages,
                               args.timeout_ms, sys.stdout)
    print(f"consumed {count} record(s)", file=sys.stderr)
    return 0


def _print_records(consumer: Any, typed: bool, max_messages: int | None,
                   timeout_ms: int | None, out: IO[str]) -> int:
    """Poll and print until ``max_messages`` were printed or nothing came for ``timeout_ms``.
    Ctrl-C ends a consume that has neither, so it counts as a normal end."""
    count = 0
    last = time.monotonic()
    try:
        while max_messages is None or count < max_messages:
            wait_ms = 500 if timeout_ms is None else max(1, min(500, timeout_ms))
            left = None if max_messages is None else max_messages - count
            lines = _poll_lines(consumer, typed, wait_ms, left)
            if lines:
                out.write("".join(lines))
                out.flush()
                count += len(lines)
                last = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last) * 1000 >= timeout_ms:
                break
    except KeyboardInterrupt:
        pass
    return count


def _poll_lines(consumer: Any, typed: bool, wait_ms: int, left: int | None) -> list[str]:
    """One poll's records as output lines, at most ``left`` of them."""
    if typed:
        limit = CONSUME_TYPED_RECORDS if left is None else min(left, CONSUME_TYPED_RECORDS)
        tables = consumer.poll_arrow(timeout_ms=wait_ms, max_records=limit)
        lines = [line for table in tables.values() for line in _typed_lines(table)]
    else:
        lines = [f"{r.offset}\t{_text(r.key)}\t{_text(r.value)}\n"
                 for records in consumer.poll(timeout_ms=wait_ms).values() for r in records]
    return lines if left is None else lines[:left]


def _typed_lines(table: pa.Table) -> list[str]:
    """offset<TAB>key<TAB>value as a JSON object, per row of a ``poll_arrow`` table."""
    import pyarrow as pa

    # By position (key, the value columns, timestamp, headers, offset, partition), because a
    # value column may itself be called "offset" or "partition".
    values = table.select(list(range(1, table.num_columns - 4)))
    values = values.cast(pa.schema([f.with_type(_json_type(f.type)) for f in values.schema]))
    keys = table.column(0).to_pylist()
    offsets = table.column(table.num_columns - 2).to_pylist()
    return [f"{offset}\t{_text(key)}\t{_json_text(value)}\n"
            for offset, key, value in zip(offsets, keys, values.to_pylist(), strict=True)]


def _json_type(data_type: pa.DataType) -> pa.DataType:
    """The type a column is printed as: timestamps, dates and decimals as Arrow's text, which
    produce reads back (and which needs no time-zone database or pandas, unlike to_pylist)."""
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(_json_type(f.type)) for f in _struct_fields(data_type)])
    if pa.types.is_list(data_type):
        return pa.list_(data_type.value_field.with_type(_json_type(data_type.value_type)))
    if (pa.types.is_timestamp(data_type) or pa.types.is_date(data_type)
            or pa.types.is_decimal(data_type)):
        return pa.string()
    return data_type


def _json_text(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> str:
    if isinstance(value, bytes):  # a binary column: UTF-8 text, as untyped values print
        return value.decode("utf-8", errors="replace")
    return str(value)


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


# -- demo ------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from logstore.demo import run_demo

    return run_demo(records=args.records, per_record=args.per_record,
                    with_spark=not args.no_spark)
