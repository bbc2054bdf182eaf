"""``logstore produce``: send the lines of stdin as records.

Owns: the command's arguments and how a line becomes a record: the whole line as the value, or
split at ``--key-separator`` into key and value; for a typed topic a JSON object of value
columns and an optional ``"key"`` (``json_rows`` converts them). On a bad line the lines
before it are sent and the error names it and counts them. Must not: talk to brokers except
through ``Producer`` and ``Admin``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import (
    acks,
    add_bootstrap,
    client_settings,
    describe_topic,
    non_negative,
)
from logstore.cli.json_rows import BadLine, json_chunks, lines, rows_to_table

if TYPE_CHECKING:
    import pyarrow as pa

    from logstore.client.producer import Producer

PRODUCE_FLUSH_EVERY = 10_000  # lines; bounds the futures or rows held while reading stdin


def register(commands: Any) -> None:
    produce = commands.add_parser(
        "produce", help="send lines from stdin as records",
        description="Send each line of stdin as a record. To a typed topic (created with "
                    "--value-schema) each line is a JSON object of value columns and an optional "
                    '"key" string; timestamps are ISO-8601 text or integers in the column\'s '
                    "unit, dates YYYY-MM-DD, decimals numbers or numeric text.")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", metavar="SEP", type=_separator,
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--acks", type=acks, default="all", help="all, 1 or 0 (default all)")
    produce.add_argument("--partition", type=non_negative, help="send every record here")
    add_bootstrap(produce)
    produce.set_defaults(run=_cmd_produce)


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (every line would split at its "
                                         "start, giving every record an empty key)")
    return text


def _cmd_produce(args: argparse.Namespace) -> int:
    from logstore import Producer

    value_schema = describe_topic(args, args.topic).value_schema
    if value_schema is not None and args.key_separator is not None:
        raise ValueError(f"topic {args.topic!r} has typed values: each line is a JSON object "
                         'and the key is its "key" field, so --key-separator does not apply')
    with Producer(bootstrap_servers=args.bootstrap_server, acks=args.acks,
                  **client_settings(args)) as producer:
        if value_schema is None:
            sent = _produce_lines(args, producer)
        else:
            sent = _produce_json(args, producer, value_schema)
    print(f"produced {sent} record(s) to {args.topic}", file=sys.stderr)
    return 0


def _produce_lines(args: argparse.Namespace, producer: Producer) -> int:
    sent = 0
    pending: list[Any] = []
    for number, line in enumerate(lines(sys.stdin.buffer), start=1):
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


def _split_line(line: bytes, separator: str | None, number: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator.encode())
    if not sep:
        raise ValueError(f"line {number} has no key separator {separator!r}: "
                         f"{line[:60].decode(errors='replace')!r}")
    return key, value


def _produce_json(args: argparse.Namespace, producer: Producer, value_schema: pa.Schema) -> int:
    """JSON lines to a typed topic: each chunk of lines is one Arrow table and one columnar
    ``send_batch``. On a bad line the lines before it are sent, then the error names it."""
    import pyarrow as pa

    schema = pa.schema([pa.field("key", pa.binary()), *value_schema])
    sent = 0
    try:
        for numbers, rows in json_chunks(sys.stdin.buffer, schema.names, PRODUCE_FLUSH_EVERY):
            table, problem = rows_to_table(rows, numbers, schema)
            if table.num_rows:
                producer.send_batch(args.topic, table, partition=args.partition).result()
                sent += table.num_rows
            if problem is not None:
                raise BadLine(problem)
    except BadLine as e:
        raise ValueError(f"{e}; the {sent} record(s) before it were sent") from None
    return sent


def _settle(producer: Producer, pending: list[Any]) -> int:
    """Flush, then raise the first failure among ``pending``; returns how many were sent."""
    producer.flush()
    count = len(pending)
    for future in pending:
        future.result()
    pending.clear()
    return count
