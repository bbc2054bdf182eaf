"""The ``logstore`` command: run a broker, manage topics, produce and consume from a terminal.

Owns: the argparse tree, built from each noun module's ``register(commands)`` (``broker``,
``topics``, ``cluster``, ``produce``, ``consume``, ``groups``, ``top``, ``transactions``,
``users``, ``acls``, ``demo``, ``archive``), and the exit status.
Expected errors (an ``ApiError`` from the broker, a ``ConfigError``, a bad line on stdin) print
``error: ...`` on stderr and exit 1, never a traceback; an argument that does not parse (a bad
``--value-schema`` among them) or a combination a command refuses is a usage error, exit 2,
before anything is sent. Must not: contain broker or client logic; the commands call the public
client API only, and import the clients (and pyarrow) lazily so that ``logstore broker start``
does not load them.
"""

from __future__ import annotations

import argparse
import os
import sys

from logstore.cli import (
    acls,
    archive,
    broker,
    cluster,
    consume,
    demo,
    groups,
    produce,
    top,
    topics,
    transactions,
    users,
)
from logstore.errors import LogstoreError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logstore", description="LogStore: a commit log on Apache Arrow.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for noun in (broker, topics, cluster, produce, consume, groups, top, transactions, users,
                 acls, demo, archive):
        noun.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check = getattr(args, "usage_problem", None)
    problem = check(args) if check is not None else None
    if problem is not None:
        parser.error(problem)
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
