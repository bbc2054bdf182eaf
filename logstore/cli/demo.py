"""``logstore demo``: the embedded end-to-end demo behind ``make demo``.

Owns: the command's arguments, and asking for the Spark step by its entry-point name (unless
``--no-spark``); a package installed without it is an error naming the fix, before anything
starts. Must not: hold the demo itself (``logstore.demo``) or import the step's module.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import non_negative

if TYPE_CHECKING:
    from logstore.demo import DemoStep


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--records", type=non_negative, default=1_000_000,
                      help="records produced columnar, in 10k-row batches (default 1000000)")
    demo.add_argument("--per-record", type=non_negative, default=100_000,
                      help="records produced one send() at a time (default 100000)")
    demo.add_argument("--no-spark", action="store_true",
                      help="skip the final spark.read.format('logstore') queries")
    demo.add_argument("--no-tiering", action="store_true",
                      help="skip the tiered topic (copied to S3 on moto, or a file:// dir)")
    demo.set_defaults(run=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from logstore.config import BrokerConfig
    from logstore.main import select_arrow_memory_pool

    # The demo's broker runs in this process: Arrow's allocator is chosen as ``broker start``
    # chooses it, before logstore.demo imports pyarrow.
    select_arrow_memory_pool(BrokerConfig().arrow_memory_pool)
    from logstore.demo import run_demo

    steps = [] if args.no_spark else [_step("spark")]
    tier_steps = [] if args.no_spark or args.no_tiering else [_step("spark_remote")]
    return run_demo(records=args.records, per_record=args.per_record, steps=steps,
                    tier_steps=tier_steps, tiered=not args.no_tiering)


def _step(name: str) -> DemoStep:
    from logstore.demo import DEMO_STEPS_GROUP, load_step

    step = load_step(name)
    if step is None:
        raise ValueError(f"the installed logstore declares no demo step {name!r} (entry point "
                         f"group {DEMO_STEPS_GROUP}): reinstall it (make install, or pip "
                         "install -e '.[spark]'), or run logstore demo --no-spark")
    return step
