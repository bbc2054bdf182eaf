"""Ingest JSON-lines files landing in a directory (local or s3://) into a topic, bad lines
to a dead-letter topic.

``spark-submit jobs/ingest.py --source-dir DIR --topic T --checkpoint CP ...``.

Owns: the structured-streaming query (``format("logstore-files")``, jobs/ingest_source.py, over
the directory: a local path or any fsspec URL such as ``s3://bucket/landing``, one micro-batch
of newly landed files per trigger), parsing lines into the topic's columns (a typed topic's
value columns and an optional ``"key"``, with the same strict JSON rules as ``logstore
produce``; an untyped topic takes each JSON line as its value), and routing bad lines, with
the reason in the ``error`` header and the file in ``source.file``, to the dead-letter topic.
Must not: parse options of the logstore sink or read topics.

Files are admitted once each, in (modification time, path) order, into a file log kept in the
checkpoint (``CP/ingest-files``); names starting with ``.`` or ``_`` are skipped, so land a file
under such a name and rename it when complete. Credentials for object stores come from the
environment (``AWS_ACCESS_KEY_ID``, ...), never from ``--source-options``.

Delivery (``--delivery``): at least once by default: the checkpoint records which files were
ingested, so a stopped and restarted query never ingests a file twice, but a crash between the
sink's writes and the checkpoint's commit replays that micro-batch. ``exactly-once`` uses the
exactly-once sink's mechanism (datasource/sink.py): each task stages its good rows and dead
letters in one prepared transaction, and the driver publishes every task's together with the
micro-batch's id as the sink's progress (group ``--sink-id``, default the checkpoint's query
id), so a replayed micro-batch is skipped: both topics get each line once, read
read_committed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from jobs.ingest_files import IngestError as IngestError  # re-exported: the job raises it
from jobs.ingest_files import list_files, storage_options_of
from logstore.cli.arguments import add_bootstrap
from logstore.cli.json_rows import rows_to_table
from logstore.client.admin import Admin
from logstore.errors import LogstoreError

if TYPE_CHECKING:
    from pyspark.sql.datasource import WriterCommitMessage

log = logging.getLogger("jobs.ingest")

DELIVERY_HELP = ("at-least-once (default: a crash between a batch's writes and its checkpoint "
                 "replays the batch) or exactly-once (each batch published once, in a "
                 "transaction: read the topics read_committed)")
META = [pa.field("_error", pa.string()), pa.field("_line", pa.binary()),
        pa.field("_file", pa.string())]


def parser() -> argparse.ArgumentParser:
    summary = __doc__.split("\n\n")[0].replace("\n", " ")
    p = argparse.ArgumentParser(prog="ingest", description=summary)
    p.add_argument("--source-dir", required=True,
                   help="directory of JSON-lines files: a local path or an fsspec URL "
                   "(s3://bucket/prefix through s3fs; credentials from AWS_* variables)")
    p.add_argument("--source-options", metavar="JSON",
                   help='fsspec options of the source directory, e.g. '
                   '\'{"endpoint_url": "http://127.0.0.1:9000"}\' (no credentials)')
    p.add_argument("--topic", required=True)
    p.add_argument("--dead-letter-topic", help="where bad lines go (default TOPIC.dlq)")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--trigger-interval", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--once", action="store_true",
                   help="ingest every file there now, then stop (Trigger.AvailableNow)")
    p.add_argument("--max-files-per-trigger", type=int, default=100)
    p.add_argument("--delivery", choices=("at-least-once", "exactly-once"),
                   default="at-least-once", help=DELIVERY_HELP)
    p.add_argument("--sink-id", help="with --delivery exactly-once: the sink's name, the same "
                   "across restarts (default: the query id in the checkpoint)")
    p.add_argument("--master", default=None)
    add_bootstrap(p)
    return p


def value_schema(bootstrap: str, topic: str) -> pa.Schema | None:
    with Admin(bootstrap) as admin:
        return admin.describe_topics([topic])[0].value_schema


def output_schema(values: pa.Schema | None) -> pa.Schema:
    """The parsed rows: the sink's columns, then why a line is bad, the line and its file."""
    columns = [pa.field("key", pa.binary())]
    columns += list(values) if values is not None else [pa.field("value", pa.binary())]
    return pa.schema(columns + META)


def parse_lines(lines: list[bytes], files: list[str], values: pa.Schema | None) -> pa.Table:
    """``lines`` (their bytes) as rows of ``output_schema(values)``: good ones with ``_error``
    null, bad ones (a line that is not UTF-8 among them) with only ``_error``, ``_line`` (the
    bytes as read) and ``_file``."""
    target = output_schema(values)
    good: list[dict[str, Any]] = []
    good_at: list[int] = []
    bad: dict[int, str] = {}
    for i, raw in enumerate(lines):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad[i] = f"not UTF-8: byte {e.start} of the line is {raw[e.start]:#04x}"
            continue
        problem, row = _json_row(line, values)
        if problem is None and row is not None:
            good.append(row)
            good_at.append(i)
        elif problem is not None:
            bad[i] = problem
    table = _typed(good, good_at, values, bad)
    kept = [i for i in good_at if i not in bad]
    meta = pa.table({"_error": pa.array([None] * len(kept), pa.string()),
                     "_line": pa.array([None] * len(kept), pa.binary()),
                     "_file": pa.array([None] * len(kept), pa.string())})
    rows = pa.Table.from_arrays([*table.columns, *meta.columns], schema=target)
    dead = sorted(bad)
    rejected = pa.Table.from_pydict(
        {f.name: [None] * len(dead) for f in target if not f.name.startswith("_")}
        | {"_error": [bad[i] for i in dead], "_line": [lines[i] for i in dead],
           "_file": [files[i] for i in dead]}, schema=target)
    return pa.concat_tables([rows, rejected])


def _json_row(line: str, values: pa.Schema | None) -> tuple[str | None, dict[str, Any] | None]:
    if not line.strip():
        return None, None
    try:
        row = json.loads(line)
    except ValueError as e:
        return f"not JSON: {e}", None
    if values is None:
        return None, {"key": None, "value": line.encode()}
    if not isinstance(row, dict):
        return "expected a JSON object of the topic's columns", None
    unknown = sorted(row.keys() - {"key", *values.names})
    if unknown:
        return f"unknown column(s) {unknown}; the topic's are {values.names}", None
    return None, row


def _typed(rows: list[dict[str, Any]], at: list[int], values: pa.Schema | None,
           bad: dict[int, str]) -> pa.Table:
    """The good rows as a table; a row whose value does not fit its column moves to ``bad``
    (``rows_to_table`` stops at the first such row: convert, set it aside, go on)."""
    if values is None:  # an untyped topic: each line, as it came, is the value
        return pa.table({"key": pa.nulls(len(rows), pa.binary()),
                         "value": pa.array([row["value"] for row in rows], pa.binary())})
    schema = pa.schema([pa.field("key", pa.binary()), *values])
    pieces: list[pa.Table] = []
    start = 0
    while start < len(rows):
        table, problem = rows_to_table(rows[start:], at[start:], schema)
        pieces.append(table)
        if problem is None:
            break
        failed = start + table.num_rows
        bad[at[failed]] = problem.split(": ", 1)[1] if ": " in problem else problem
        start = failed + 1
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


class _Parsed:
    """Good rows and dead letters of one task, as Arrow batches for the two sinks."""

    def __init__(self, values: pa.Schema | None) -> None:
        self.values = values
        self.good: list[pa.RecordBatch] = []
        self.bad: list[pa.RecordBatch] = []

    def add(self, batch: pa.RecordBatch) -> None:
        table = parse_lines(batch.column("value").to_pylist(),
                            batch.column("file").to_pylist(), self.values)
        errors = table.column("_error")
        good = table.filter(errors.is_null()).drop_columns([f.name for f in META])
        bad = table.filter(errors.is_valid())
        self.good += good.to_batches()
        self.bad += dead_letters(bad).to_batches()


HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


def dead_letters(bad: pa.Table) -> pa.Table:
    """Bad lines as dead-letter records: the line as the value, headers ``error`` (why) and
    ``source.file``."""
    headers = [[{"key": "error", "value": e.encode()}, {"key": "source.file", "value": f.encode()}]
               for e, f in zip(bad.column("_error").to_pylist(), bad.column("_file").to_pylist(),
                               strict=True)]
    return pa.table({"value": bad.column("_line").cast(pa.binary()),
                     "headers": pa.array(headers, pa.list_(HEADER))})


def ingest_source() -> Any:
    """``format("logstore-ingest")``: a writer that parses the lines in each task and hands
    the good rows to the logstore sink of the topic and the bad ones to the logstore sink of
    the dead-letter topic (Arrow batches all the way: no pandas, no per-row Spark rows)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter
    from pyspark.sql.pandas.types import from_arrow_schema

    from datasource.writer import LogStoreWriter

    class IngestWriter(DataSourceArrowWriter):
        def __init__(self, options: dict[str, str]) -> None:
            bootstrap = options["bootstrap.servers"]
            self.values = value_schema(bootstrap, options["topic"])
            meta = {m.name for m in META}
            sink = pa.schema([f for f in output_schema(self.values) if f.name not in meta])
            dead = pa.schema([pa.field("value", pa.binary()), pa.field("headers",
                                                                       pa.list_(HEADER))])
            self.topic = LogStoreWriter({"bootstrap.servers": bootstrap,
                                         "topic": options["topic"]}, from_arrow_schema(sink))
            self.dead = LogStoreWriter({"bootstrap.servers": bootstrap,
                                        "topic": options["deadlettertopic"]},
                                       from_arrow_schema(dead))

            self.exactly_once = ExactlyOnce(options) if "batchid" in options else None

        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            parsed = _Parsed(self.values)
            for batch in iterator:
                parsed.add(batch)
            if self.exactly_once is not None:
                return self.exactly_once.stage(parsed, self.topic.topic, self.dead.topic)
            good = self.topic.write(iter(parsed.good))
            self.dead.write(iter(parsed.bad))
            return good

        def commit(self, messages: list[WriterCommitMessage | None]) -> None:
            if self.exactly_once is not None:
                self.exactly_once.commit(messages)

        def abort(self, messages: list[WriterCommitMessage | None]) -> None:
            if self.exactly_once is not None:
                self.exactly_once.abort(messages)

    class IngestSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "logstore-ingest"

        def writer(self, schema: Any, overwrite: bool) -> IngestWriter:
            return IngestWriter({k.lower(): v for k, v in self.options.items()})

    return IngestSource


class ExactlyOnce:
    """``--delivery exactly-once`` in the ingest writer: a task stages its good rows and dead
    letters in one prepared transaction; the driver's commit publishes the micro-batch
    (``options["batchid"]``) with the sink's progress, or skips it if already published."""

    def __init__(self, options: dict[str, str]) -> None:
        from datasource.sink_commit import transaction_state_partitions
        from datasource.writer import parse_sink_options

        self.settings = parse_sink_options({"bootstrap.servers": options["bootstrap.servers"]},
                                           streaming=False)
        self.batch_id = int(options["batchid"])
        self.sink_id = options["sinkid"]
        self.query_id = options.get("queryid")  # the streaming query's, when known
        self.txn_partitions = transaction_state_partitions(self.settings)

    def stage(self, parsed: _Parsed, topic: str | None, dead_letter: str | None
              ) -> WriterCommitMessage:
        from datasource.sink import StagedCommitMessage, stage, task_transactional_id

        routed = [_routed(b, topic) for b in parsed.good] + \
            [_routed(b, dead_letter) for b in parsed.bad]
        tid = task_transactional_id(self.sink_id, self.txn_partitions)
        records, topics, state = stage(self.settings, tid, iter(routed))
        return StagedCommitMessage(records, topics, state, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from datasource.sink import staged_states
        from datasource.sink_commit import SinkCommitter

        staged, records = staged_states(messages, None)
        SinkCommitter(self.settings, self.sink_id).commit_batch(self.batch_id, staged, records,
                                                                self.query_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        from datasource.sink import StagedCommitMessage
        from datasource.sink_commit import SinkCommitter

        committer = SinkCommitter(self.settings, self.sink_id)
        committer.abort(m.staged.transactional_id for m in messages
                        if isinstance(m, StagedCommitMessage) and m.staged is not None)
        committer.abort_leftovers(every_id=True)


def _routed(batch: pa.RecordBatch, topic: str | None) -> pa.RecordBatch:
    """``batch`` with a ``topic`` column, for the sink's routing."""
    return batch.append_column("topic", pa.array([topic] * batch.num_rows, pa.string()))


def write_batch(bootstrap: str, topic: str, dead_letter: str, sink_id: Any = None) -> Any:
    """foreachBatch: the micro-batch's lines and their files (``format("logstore-files")``)
    to ``format("logstore-ingest")``; ``sink_id`` (a function giving it and the query id,
    ``sink_id_of``) makes the write exactly once."""
    def write(batch: Any, batch_id: int) -> None:
        writer = (batch.select("value", "file").write
                  .format("logstore-ingest").option("bootstrap.servers", bootstrap)
                  .option("topic", topic).option("deadLetterTopic", dead_letter))
        if sink_id is not None:
            sink, query = sink_id()
            writer = writer.option("sinkId", sink).option("batchId", str(batch_id))
            if query is not None:  # a new checkpoint under the same sink id is refused
                writer = writer.option("queryId", query)
        writer.mode("append").save()
        log.info("batch %d ingested", batch_id)
    return write


def sink_id_of(args: argparse.Namespace) -> Any:
    """With --delivery exactly-once, a function giving the sink id (``--sink-id``, else the
    query id in the checkpoint) and the query id (None when it cannot be read), both read at
    the first batch (the query writes its checkpoint when it starts)."""
    if args.delivery != "exactly-once":
        return None
    from datasource.sink import checkpoint_query_id, resolve_sink_id
    from datasource.writer import check_sink_id, parse_sink_options

    if args.sink_id is not None:
        check_sink_id(args.sink_id, "--sink-id")
    settings = parse_sink_options({"bootstrap.servers": args.bootstrap_server,
                                   "checkpointLocation": args.checkpoint,
                                   **({"sinkId": args.sink_id} if args.sink_id else {})},
                                  streaming=True)
    found: list[tuple[str, str | None]] = []

    def sink_id() -> tuple[str, str | None]:
        if not found:
            found.append((resolve_sink_id(settings), checkpoint_query_id(settings)))
        return found[0]
    return sink_id


def start(spark: Any, args: argparse.Namespace) -> Any:
    """Start the query (checks first: delivery, source directory, topics)."""
    from jobs.ingest_source import FilesDataSource

    storage = storage_options_of(args.source_options, "--source-options")
    list_files(args.source_dir, storage)  # fails naming the directory: missing, unreachable
    dead_letter = args.dead_letter_topic or f"{args.topic}.dlq"
    value_schema(args.bootstrap_server, args.topic)  # both must exist: fails naming them
    value_schema(args.bootstrap_server, dead_letter)
    spark.dataSource.register(ingest_source())
    spark.dataSource.register(FilesDataSource)
    lines = (spark.readStream.format("logstore-files")
             .option("maxFilesPerTrigger", args.max_files_per_trigger)
             .option("storageOptions", json.dumps(storage))
             .option("fileLog", f"{args.checkpoint.rstrip('/')}/ingest-files")
             .load(args.source_dir))
    trigger = {"availableNow": True} if args.once else \
        {"processingTime": f"{args.trigger_interval} seconds"}
    return (lines.writeStream.foreachBatch(
        write_batch(args.bootstrap_server, args.topic, dead_letter, sink_id_of(args)))
        .option("checkpointLocation", args.checkpoint).trigger(**trigger).start())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from jobs.session import job_session

    try:
        query = start(job_session("logstore-ingest", args.master), args)
        query.awaitTermination()
    except (LogstoreError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
