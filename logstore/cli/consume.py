"""``logstore consume``: print a topic's records on stdout.

Owns: the command's arguments, where reading starts, when it stops (``--max-messages``,
``--timeout-ms``, Ctrl-C) and the output layout: ``offset<TAB>key<TAB>value`` per record, a
typed topic's value as a JSON object (``json_rows``). Must not: talk to brokers except through
``Consumer`` and ``Admin``.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import closing
from typing import IO, TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, describe_topic, non_negative
from logstore.cli.json_rows import json_values

if TYPE_CHECKING:
    import pyarrow as pa

    from logstore.client.consumer import Consumer

CONSUME_TYPED_RECORDS = 10_000  # records per poll when printing a typed topic


def register(commands: Any) -> None:
    consume = commands.add_parser(
        "consume", help="print records as offset<TAB>key<TAB>value",
        description="Print records as offset<TAB>key<TAB>value; a typed topic's value is a "
                    "JSON object, with timestamps, dates and decimals as text. Without "
                    "--from-beginning or --offset, only records produced from now on are printed.")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=non_negative,
                         help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", type=non_negative, help="start here (needs --partition)")
    consume.add_argument("--max-messages", type=non_negative, help="stop after this many")
    consume.add_argument("--timeout-ms", type=non_negative,
                         help="stop once no record arrived for this long (default: never)")
    add_bootstrap(consume)
    consume.set_defaults(run=_cmd_consume, usage_problem=_usage_problem)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.offset is not None and args.partition is None:
        return "--offset needs --partition"
    return None


def _cmd_consume(args: argparse.Namespace) -> int:
    from logstore import Consumer, TopicPartition

    # An explicit --offset outside the log is an error naming the valid range, not a silent
    # jump to the beginning.
    reset = "none" if args.offset is not None else "earliest"
    topic = describe_topic(args, args.topic)
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


def _print_records(consumer: Consumer, typed: bool, max_messages: int | None,
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


def _poll_lines(consumer: Consumer, typed: bool, wait_ms: int, left: int | None) -> list[str]:
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
    # By position (key, the value columns, timestamp, headers, offset, partition), because a
    # value column may itself be called "offset" or "partition".
    values = table.select(list(range(1, table.num_columns - 4)))
    keys = table.column(0).to_pylist()
    offsets = table.column(table.num_columns - 2).to_pylist()
    return [f"{offset}\t{_text(key)}\t{value}\n"
            for offset, key, value in zip(offsets, keys, json_values(values), strict=True)]


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")
