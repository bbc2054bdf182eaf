"""Exactly-once copy of a topic with Spark structured streaming: the Spark version of
``jobs/exactly_once_copy.py``.

    python -m jobs.exactly_once_copy_spark --bootstrap-server 127.0.0.1:9092 \\
        --input events --output events-upper --checkpoint /tmp/copy-ckpt

(or ``spark-submit jobs/exactly_once_copy_spark.py ...``). The query reads the input with the
logstore source (``kafka.isolation.level=read_committed``: aborted or open transactions are
never copied), transforms each value (``--transform``: ``upper`` upper-cases UTF-8 values,
``identity`` copies), and writes key and value to the output with the exactly-once sink
(``writeStream.format("logstore")``, datasource/sink.py): each micro-batch's records become
visible to read_committed readers all at once, together with the sink's progress record, and a
micro-batch Spark replays after a crash is never published twice. A key's records stay in one
output partition, in input order. After a crash at any point, run the same command again: the
checkpoint says where to resume, and the sink aborts whatever the dead run left staged.

Prints one line per published micro-batch (``committed batch <id> <records> <total>``); with
``--once`` it copies what the input holds now and exits (Trigger.AvailableNow), else it runs
until stopped, one micro-batch every ``--trigger-interval`` seconds.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from logstore.cli.arguments import add_bootstrap

log = logging.getLogger("jobs.exactly_once_copy_spark")

TRANSFORMS = {"upper": "CAST(upper(CAST(value AS STRING)) AS BINARY)", "identity": "value"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exactly_once_copy_spark",
                                description=__doc__.split("\n")[0])
    add_bootstrap(p)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--sink-id", help="the sink's name (default: the checkpoint's query id)")
    p.add_argument("--transform", choices=sorted(TRANSFORMS), default="upper")
    p.add_argument("--max-records-per-batch", type=int, default=10_000)
    p.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--once", action="store_true",
                   help="copy what the input holds now, then stop (Trigger.AvailableNow)")
    p.add_argument("--master", default=None, help="default local[2] (ignored by spark-submit)")
    return p


def start(spark: Any, args: argparse.Namespace) -> Any:
    """The copy query, started."""
    writer = (spark.readStream.format("logstore")
              .option("bootstrap.servers", args.bootstrap_server)
              .option("subscribe", args.input).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(args.max_records_per_batch))
              .option("kafka.isolation.level", "read_committed").load()
              .selectExpr("key", f"{TRANSFORMS[args.transform]} AS value")
              .writeStream.format("logstore")
              .option("bootstrap.servers", args.bootstrap_server)
              .option("topic", args.output).option("checkpointLocation", args.checkpoint))
    if args.sink_id:
        writer = writer.option("sinkId", args.sink_id)
    if args.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_interval} seconds")
    return writer.start()


def report(query: Any) -> None:
    """Print each published micro-batch until the query ends (raises its error)."""
    printed, total = -1, 0
    while True:
        ended = query.awaitTermination(0.2)
        for progress in query.recentProgress:
            if progress["batchId"] > printed:
                printed = progress["batchId"]
                if progress["numInputRows"]:
                    total += progress["numInputRows"]
                    print(f"committed batch {printed} {progress['numInputRows']} {total}",
                          flush=True)
        if ended:
            return


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parser().parse_args(argv)
    from jobs.session import job_session

    spark = job_session("logstore-exactly-once-copy", args.master)
    query = start(spark, args)
    try:
        report(query)
    except KeyboardInterrupt:
        query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
