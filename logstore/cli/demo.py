"""``logstore demo``: the embedded end-to-end demo behind ``make demo``.

Owns: the command's arguments. Must not: hold the demo itself (``logstore.demo``).
"""

from __future__ import annotations

import argparse
from typing import Any

from logstore.cli.arguments import non_negative


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--records", type=non_negative, default=1_000_000,
                      help="records produced columnar, in 10k-row batches (default 1000000)")
    demo.add_argument("--per-record", type=non_negative, default=100_000,
                      help="records produced one send() at a time (default 100000)")
    demo.add_argument("--no-spark", action="store_true",
                      help="skip the final spark.read.format('logstore') query")
    demo.set_defaults(run=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from logstore.demo import run_demo

    return run_demo(records=args.records, per_record=args.per_record,
                    with_spark=not args.no_spark)
