"""``logstore consume``: print a topic's records on stdout.

Owns: the command's arguments (``--isolation-level read_committed`` reads committed
transactions only), where reading starts (the log end, ``--from-beginning``,
``--offset``, or with ``--group`` the group's committed offsets), when it stops
(``--max-messages``, ``--timeout-ms``, Ctrl-C), committing a group's positions on the way out,
and the output layout: ``[partition<TAB>]offset<TAB>[timestamp<TAB>]key<TAB>value`` per
record, a typed topic's value as a JSON object (``json_rows``). Must not: talk to brokers
except through ``Consumer`` and ``Admin``.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from logstore.cli.arguments import (
    add_bootstrap,
    client_settings,
    describe_topic,
    non_negative,
)
from logstore.cli.json_rows import json_values

if TYPE_CHECKING:
    import pyarrow as pa

    from logstore.client.admin import TopicDescription
    from logstore.client.consumer import Consumer

CONSUME_TYPED_RECORDS = 10_000  # records per poll when printing a typed topic
DESCRIPTION = (
    "Print records as [PARTITION<TAB>]OFFSET<TAB>[TIMESTAMP<TAB>]KEY<TAB>VALUE, one per line: "
    "the bracketed columns only with --print-partition and --print-timestamp (TIMESTAMP in "
    "milliseconds since the epoch), a missing key as null. A typed topic's value is a JSON "
    "object, with timestamps, dates and decimals as text. Without --from-beginning or --offset, "
    "only records produced from now on are printed. With --group G the consumer is a member of "
    "consumer group G: it reads the partitions the group assigns it from the group's committed "
    "offsets (--from-beginning applies only where G has none) and commits its positions "
    "periodically and on exit; the time to join the group counts towards --timeout-ms.")


def register(commands: Any) -> None:
    consume = commands.add_parser(
        "consume", help="print records as offset<TAB>key<TAB>value", description=DESCRIPTION)
    consume.add_argument("topic")
    consume.add_argument("--partition", type=non_negative,
                         help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", type=non_negative, help="start here (needs --partition)")
    consume.add_argument("--group", metavar="GROUP",
                         help="consume as a member of this consumer group and commit the "
                              "consumed offsets (not with --partition or --offset)")
    consume.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                         default="read_uncommitted",
                         help="read_committed: only committed transactions' records, up to "
                              "the last stable offset")
    consume.add_argument("--max-messages", type=non_negative, help="stop after this many")
    consume.add_argument("--timeout-ms", type=non_negative,
                         help="stop once no record arrived for this long (default: never)")
    consume.add_argument("--print-partition", action="store_true",
                         help="start each line with the record's partition")
    consume.add_argument("--print-timestamp", action="store_true",
                         help="print the record's timestamp (ms since the epoch) after its offset")
    add_bootstrap(consume)
    consume.set_defaults(run=_cmd_consume, usage_problem=_usage_problem)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.group is not None and (args.partition is not None or args.offset is not None):
        return ("--group cannot be combined with --partition or --offset: the group assigns "
                "the partitions, and its committed offsets say where each one starts")
    if args.offset is not None and args.partition is None:
        return "--offset needs --partition"
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    """Which optional columns a line has."""

    partition: bool = False
    timestamp: bool = False

    def line(self, partition: int, offset: int, timestamp: int | None, key: bytes | None,
             value: str) -> str:
        head = f"{partition}\t{offset}" if self.partition else str(offset)
        if self.timestamp:
            head += f"\t{'null' if timestamp is None else timestamp}"
        return f"{head}\t{_text(key)}\t{value}\n"


def _cmd_consume(args: argparse.Namespace) -> int:
    topic = describe_topic(args, args.topic)
    layout = Layout(args.print_partition, args.print_timestamp)
    with closing(_new_consumer(args)) as consumer:
        _start(consumer, args, topic)
        count = _print_records(consumer, topic.value_schema is not None, layout,
                               args.max_messages, args.timeout_ms, sys.stdout)
        if args.group is not None:
            consumer.commit()  # the printed records' positions; close() only logs a failure
    print(f"consumed {count} record(s)", file=sys.stderr)
    return 0


def _new_consumer(args: argparse.Namespace) -> Consumer:
    from logstore import Consumer

    if args.group is not None:  # auto-commit (the default) commits every 5 s while it runs
        return Consumer(bootstrap_servers=args.bootstrap_server, group_id=args.group,
                        auto_offset_reset="earliest" if args.from_beginning else "latest",
                        isolation_level=args.isolation_level, **client_settings(args))
    # An explicit --offset outside the log is an error naming the valid range, not a silent
    # jump to the beginning.
    return Consumer(bootstrap_servers=args.bootstrap_server,
                    auto_offset_reset="none" if args.offset is not None else "earliest",
                    isolation_level=args.isolation_level, **client_settings(args))


def _start(consumer: Consumer, args: argparse.Namespace, topic: TopicDescription) -> None:
    """Subscribe a group member to the topic, or assign the partitions and seek."""
    from logstore import TopicPartition

    if args.group is not None:
        consumer.subscribe([args.topic])
        return
    partitions = [p.partition for p in topic.partitions] if args.partition is None else \
        [args.partition]
    tps = [TopicPartition(args.topic, p) for p in partitions]
    consumer.assign(tps)
    if args.offset is not None:
        consumer.seek(tps[0], args.offset)
    elif args.from_beginning:
        consumer.seek_to_beginning(*tps)
    else:
        consumer.seek_to_end(*tps)


def _print_records(consumer: Consumer, typed: bool, layout: Layout, max_messages: int | None,
                   timeout_ms: int | None, out: IO[str]) -> int:
    """Poll and print until ``max_messages`` were printed or nothing came for ``timeout_ms``.
    Ctrl-C ends a consume that has neither, so it counts as a normal end."""
    count = 0
    last = time.monotonic()
    try:
        while max_messages is None or count < max_messages:
            wait_ms = 500 if timeout_ms is None else max(1, min(500, timeout_ms))
            left = None if max_messages is None else max_messages - count
            lines = _poll_lines(consumer, typed, layout, wait_ms, left)
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


def _poll_lines(consumer: Consumer, typed: bool, layout: Layout, wait_ms: int,
                left: int | None) -> list[str]:
    """One poll's records as output lines: at most ``left``, and no more records are taken
    from the consumer than are printed, so a group commits only what was printed."""
    if typed:
        limit = CONSUME_TYPED_RECORDS if left is None else min(left, CONSUME_TYPED_RECORDS)
        tables = consumer.poll_arrow(timeout_ms=wait_ms, max_records=limit)
        return [line for table in tables.values() for line in _typed_lines(table, layout)]
    polled = consumer.poll(timeout_ms=wait_ms, max_records=left)
    return [layout.line(r.partition, r.offset, r.timestamp, r.key, _text(r.value))
            for records in polled.values() for r in records]


def _typed_lines(table: pa.Table, layout: Layout) -> list[str]:
    """One line per row of a ``poll_arrow`` table, the value as a JSON object."""
    import pyarrow as pa

    # By position (key, the value columns, timestamp, headers, offset, partition), because a
    # value column may itself be called "offset" or "partition".
    n = table.num_columns
    values = json_values(table.select(list(range(1, n - 4))))
    keys = table.column(0).to_pylist()
    stamps = table.column(n - 4).cast(pa.int64()).to_pylist()
    offsets = table.column(n - 2).to_pylist()
    partitions = table.column(n - 1).to_pylist()
    return [layout.line(*row) for row in zip(partitions, offsets, stamps, keys, values,
                                             strict=True)]


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")
