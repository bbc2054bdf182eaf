"""``logstore broker start``: run a broker in the foreground until SIGTERM/SIGINT.

Owns: the command's arguments (a TOML file, and ``--listener``/``--log-dir`` overriding it).
Must not: build or run the broker itself; ``logstore.main`` is the composition root.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
from typing import Any


def register(commands: Any) -> None:
    broker = commands.add_parser("broker", help="run a broker")
    actions = broker.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="run a broker in the foreground until SIGTERM/SIGINT")
    start.add_argument("--config", required=True, help="broker TOML file (see conf/broker.toml)")
    start.add_argument("--listener", metavar="HOST:PORT", help="override the file's listener")
    start.add_argument("--log-dir", action="append", metavar="DIR",
                       help="override the file's log_dirs (repeatable)")
    start.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    start.set_defaults(run=_cmd_start)


def _cmd_start(args: argparse.Namespace) -> int:
    from logstore.config import load_broker_config
    from logstore.main import (
        configure_logging,
        report_arrow_memory_pool,
        run_broker,
        select_arrow_memory_pool,
        tune_malloc,
    )

    overrides: dict[str, Any] = {}
    if args.listener:
        overrides["listener"] = args.listener
    if args.log_dir:
        overrides["log_dirs"] = list(args.log_dir)
    # A crash in native code (Arrow, gRPC) prints every thread's Python stack to stderr, the
    # broker's log, before the process dies: the one clue such a crash leaves (a JVM's
    # hs_err file, for Kafka). First, so that libarrow's own start is covered too.
    faulthandler.enable()
    config = load_broker_config(args.config, overrides)
    # Before anything imports pyarrow, which makes its default pool at import.
    pool, source = select_arrow_memory_pool(config.arrow_memory_pool)
    configure_logging(args.log_level.upper())
    report_arrow_memory_pool(pool, source)
    if config.malloc_tuning:  # this process is the broker's alone
        tune_malloc()
    code = run_broker(config)
    # Storage is flushed and closed by now. Interpreter finalization would then tear down
    # Arrow Flight's and gRPC's native state while their threads may still run, which was
    # seen to end a cleanly stopped broker with SIGSEGV (a TLS cluster under load), so the
    # process ends here.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
