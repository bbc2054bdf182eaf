"""``logstore archive``: archive topics into an Iceberg table (the job in ``jobs/archive.py``).

Owns: the job's options (``add_archive_arguments``: ``jobs/archive.py`` builds its own parser
from it, so ``spark-submit jobs/archive.py`` and ``logstore archive`` take the same options),
and running the job. Must not: import ``jobs/`` or pyspark (the core never imports an edge).

The command checks the options, then runs the job as a child process (``python -m
jobs.archive`` with the same options) and returns its exit status: the job's Spark driver and
JVM live in that process, not in the CLI's, and the job is found as an installed module, with no
entry-point metadata to keep in step. ``--spark-submit`` runs it through ``spark-submit`` instead
(for a cluster: pass Spark's own flags in ``$LOGSTORE_SPARK_SUBMIT_ARGS``).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from typing import Any

from logstore.cli.arguments import add_bootstrap

MiB = 1024 * 1024
JOB_MODULE = "jobs.archive"
ARCHIVE_HELP = "archive topics into an Iceberg table, exactly once (a Spark job)"


def positive_size(text: str) -> int:
    """Bytes, with an optional k/m/g (KiB/MiB/GiB) suffix."""
    units = {"k": 1024, "m": MiB, "g": 1024 * MiB}
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = units.get(raw[-1:], 1)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = int(float(number) * scale)  # inf: OverflowError, nan: ValueError
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a size such as 128m, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:  # nan compares false to everything
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_archive_arguments(parser: Any) -> None:
    """The archive job's options (shared by ``logstore archive`` and ``jobs/archive.py``)."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", action="append", metavar="TOPIC",
                       help="a topic to archive (repeat for several)")
    which.add_argument("--topic-pattern", metavar="REGEX",
                       help="archive every topic whose whole name matches REGEX")
    parser.add_argument("--table", required=True, metavar="NAMESPACE.NAME",
                        help="the Iceberg table (created on first use)")
    parser.add_argument("--catalog", action="append", default=[], metavar="KEY=VALUE|@FILE",
                        help="pyiceberg catalog properties (repeat), or @FILE with a JSON object "
                             "or key=value lines; default: type=sql on SQLite at "
                             "WAREHOUSE/catalog.db (local warehouses only)")
    parser.add_argument("--warehouse", metavar="URL",
                        help="where tables live: a local path or s3://bucket/path (fsspec)")
    parser.add_argument("--mode", choices=("batch", "stream"), default="batch",
                        help="batch: archive what is committed now, then stop; stream: a "
                             "micro-batch every --trigger-interval until stopped")
    parser.add_argument("--trigger-interval", type=seconds, default=10.0, metavar="SECONDS",
                        help="stream mode: seconds between micro-batches (default 10)")
    parser.add_argument("--target-file-size", type=positive_size, default=128 * MiB,
                        metavar="SIZE", help="Parquet file size to aim for (default 128m)")
    parser.add_argument("--partition-by", choices=("date", "partition", "none"), default="none",
                        help="table partitioning: day of the record timestamp, topic and "
                             "partition, or none (default)")
    loss = parser.add_mutually_exclusive_group()
    loss.add_argument("--fail-on-data-loss", dest="fail_on_data_loss", action="store_true",
                      default=True, help="stop when offsets were deleted before being "
                                         "archived (default)")
    loss.add_argument("--no-fail-on-data-loss", dest="fail_on_data_loss", action="store_false",
                      help="skip such offsets, recording them in the snapshot summary")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted",
                        help="read_committed: archive committed records only (below the "
                             "last stable offset, aborted transactions dropped)")
    parser.add_argument("--master", default=None,
                        help="Spark master when not run by spark-submit (default local[2])")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_bootstrap(parser)


def register(commands: Any) -> None:
    archive = commands.add_parser("archive", help=ARCHIVE_HELP, description=ARCHIVE_HELP)
    add_archive_arguments(archive)
    archive.add_argument("--spark-submit", action="store_true",
                         help="run the job with spark-submit rather than python -m jobs.archive")
    archive.set_defaults(run=_cmd_archive)


def job_argv(args: argparse.Namespace) -> list[str]:
    """The parsed options back as the job's command line."""
    out: list[str] = []
    for topic in args.topic or ():
        out += ["--topic", topic]
    if args.topic_pattern is not None:
        out += ["--topic-pattern", args.topic_pattern]
    out += ["--table", args.table]
    for item in args.catalog:
        out += ["--catalog", item]
    if args.warehouse is not None:
        out += ["--warehouse", args.warehouse]
    out += ["--mode", args.mode, "--trigger-interval", repr(args.trigger_interval),
            "--target-file-size", str(args.target_file_size), "--partition-by",
            args.partition_by, "--isolation-level", args.isolation_level,
            "--bootstrap-server", args.bootstrap_server]
    out.append("--fail-on-data-loss" if args.fail_on_data_loss else "--no-fail-on-data-loss")
    if args.master is not None:
        out += ["--master", args.master]
    if args.no_progress:
        out.append("--no-progress")
    return out


def _cmd_archive(args: argparse.Namespace) -> int:
    if args.spark_submit:
        import importlib.util

        spec = importlib.util.find_spec("jobs")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"the {JOB_MODULE} module is not installed (pip install "
                             "'logstore[spark,archive]')")
        script = os.path.join(list(spec.submodule_search_locations)[0], "archive.py")
        extra = shlex.split(os.environ.get("LOGSTORE_SPARK_SUBMIT_ARGS", ""))
        command = ["spark-submit", *extra, script, *job_argv(args)]
    else:
        command = [sys.executable, "-m", JOB_MODULE, *job_argv(args)]
    return subprocess.run(command, check=False).returncode
