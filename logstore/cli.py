"""The ``logstore`` command: run a broker, manage topics, produce and consume from a terminal.

Owns: argument parsing and terminal output. Expected errors (an ``ApiError`` from the broker, a
``ConfigError``, a bad argument value) print ``error: ...`` on stderr and exit 1, never a
traceback. Must not: contain broker or client logic; it calls the public client API only, and
imports the clients lazily so that ``logstore broker start`` does not load them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import closing
from typing import IO, Any

from logstore.errors import LogstoreError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "LOGSTORE_BOOTSTRAP"
PRODUCE_FLUSH_EVERY = 10_000  # lines; bounds the futures held while reading a long stdin


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
    _add_produce_command(commands)
    _add_consume_command(commands)
    demo = commands.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--records", type=_non_negative, default=1_000_000,
                      help="records produced columnar, in 10k-row batches (default 1000000)")
    demo.add_argument("--per-record", type=_non_negative, default=100_000,
                      help="records produced one send() at a time (default 100000)")
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
    produce = commands.add_parser("produce", help="send lines from stdin as records")
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
        description="Print records as offset<TAB>key<TAB>value. Without --from-beginning or "
                    "--offset, only records produced from now on are printed.")
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


# -- topics ----------------------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> Any:
    from logstore import Admin

    return Admin(bootstrap_servers=args.bootstrap_server)


def _cmd_topics_create(args: argparse.Namespace) -> int:
    from logstore import NewTopic

    topic = NewTopic(args.name, args.partitions, replication_factor=args.replication_factor,
                     config=dict(args.config))
    with closing(_admin(args)) as admin:
        admin.create_topics([topic])
    print(f"created topic {args.name} with {args.partitions} partition(s)")
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

    sent = 0
    with Producer(bootstrap_servers=args.bootstrap_server, acks=args.acks) as producer:
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
        sent += _settle(producer, pending)
    print(f"produced {sent} record(s) to {args.topic}", file=sys.stderr)
    return 0


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
    with closing(Consumer(bootstrap_servers=args.bootstrap_server,
                          auto_offset_reset=reset)) as consumer:
        tps = [TopicPartition(args.topic, p) for p in _partitions(args)]
        consumer.assign(tps)
        if args.offset is not None:
            consumer.seek(tps[0], args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
        count = _print_records(consumer, args.max_messages, args.timeout_ms, sys.stdout)
    print(f"consumed {count} record(s)", file=sys.stderr)
    return 0


def _partitions(args: argparse.Namespace) -> list[int]:
    if args.partition is not None:
        return [args.partition]
    with closing(_admin(args)) as admin:
        (topic,) = admin.describe_topics([args.topic])
    return [p.partition for p in topic.partitions]


def _print_records(consumer: Any, max_messages: int | None, timeout_ms: int | None,
                   out: IO[str]) -> int:
    """Poll and print until ``max_messages`` were printed or nothing came for ``timeout_ms``.
    Ctrl-C ends a consume that has neither, so it counts as a normal end."""
    count = 0
    last = time.monotonic()
    try:
        while max_messages is None or count < max_messages:
            wait_ms = 500 if timeout_ms is None else max(1, min(500, timeout_ms))
            lines = _format_batch(consumer.poll(timeout_ms=wait_ms), max_messages, count)
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


def _format_batch(polled: dict[Any, list[Any]], max_messages: int | None, done: int
                  ) -> list[str]:
    lines = [f"{r.offset}\t{_text(r.key)}\t{_text(r.value)}\n"
             for records in polled.values() for r in records]
    return lines if max_messages is None else lines[:max_messages - done]


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


# -- demo ------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from logstore.demo import run_demo

    return run_demo(records=args.records, per_record=args.per_record)
