"""``logstore demo``: the embedded end-to-end demo behind ``make demo``.

Owns: the command's arguments, and asking for the Spark step by its entry-point name (unless
``--no-spark``); a package installed without it is an error naming the fix, before anything
starts. Must not: hold the demo itself (``logstore.demo``) or import the step's module.
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
    from logstore.demo import DEMO_STEPS_GROUP, DemoStep, load_step, run_demo

    steps: list[DemoStep] = []
    if not args.no_spark:
        step = load_step("spark")
        if step is None:
            raise ValueError(f"the installed logstore declares no demo step 'spark' (entry point "
                             f"group {DEMO_STEPS_GROUP}): reinstall it (make install, or pip "
                             "install -e '.[spark]'), or run logstore demo --no-spark")
        steps.append(step)
    return run_demo(records=args.records, per_record=args.per_record, steps=steps)
