"""``writeStream.format("logstore")`` (exactly once by default) and ``df.write`` with option
``transactional``: each task stages its rows invisibly in a prepared transaction, and the
driver publishes every task's at once (``sink_commit.py``).

Owns: the Spark writer classes (``ExactlyOnceStreamWriter``, ``AtLeastOnceStreamWriter``,
``TransactionalWriter``), the sink id (option ``sinkId``, else the query id Spark keeps in
``<checkpointLocation>/metadata``), and the task side: one transaction per task, under its
reusable transactional id (``sink_commit.py`` explains the ids), prepared once every record is
acknowledged, its ``PreparedTxnState`` returned in the commit message; a task that fails aborts
it. Must not: decide a commit (the driver does, in ``sink_commit.py``) or loop over rows.

Where things run (PySpark 4.x): ``write()`` runs in executors without the batch id (the task's
``streaming.sql.batchId`` local property is read only to check the commit messages);
``commit(messages, batchId)`` and ``abort`` run on the driver in a fresh writer, with the
messages as the only state from the tasks; Spark may call ``commit`` again for a batch already
committed (after a restart), which the progress record turns into a skip.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from datasource.options import OptionError
from datasource.sink_commit import SinkCommitError, SinkCommitter, transaction_state_partitions
from datasource.writer import (
    LogStoreCommitMessage,
    LogStoreWriter,
    SinkSettings,
    check_columns,
    check_sink_id,
    parse_sink_options,
    route,
    value_schema_of,
)
from logstore.client.producer import Producer
from logstore.client.transactions import PreparedTxnState, colocated_transactional_id
from logstore.errors import ApiError, LogstoreError

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on a micro-batch's tasks


@dataclass(frozen=True)
class StagedCommitMessage(LogStoreCommitMessage):
    """A task's report: its records, and the prepared transaction holding them (None when
    the task had no row)."""

    staged: PreparedTxnState | None = None
    batch_id: int | None = None


def stage(settings: SinkSettings, transactional_id: str, batches: Iterator[pa.RecordBatch]
          ) -> tuple[int, tuple[str, ...], PreparedTxnState | None]:
    """Write ``batches`` in one transaction of ``transactional_id`` and prepare it:
    (records, topics, its state). No transaction for a task without rows; on any failure the
    transaction is aborted and the error raised."""
    producer: Producer | None = None
    futures: list[Any] = []
    topics: set[str] = set()
    try:
        for batch in batches:
            for topic, partition, data in route(batch, settings.topic):
                producer = producer or _transactional_producer(settings, transactional_id)
                topics.add(topic)
                futures.append(producer.send_batch(topic, data, partition))
        if producer is None:
            return 0, (), None
        state = producer.prepare_transaction()  # flushes: every record acknowledged
        records = sum(m.record_count for f in futures for m in f.result())
        return records, tuple(sorted(topics)), state
    except BaseException:
        if producer is not None:
            with contextlib.suppress(ApiError):
                producer.abort_transaction()
        raise
    finally:
        if producer is not None:
            producer.close()


def _transactional_producer(settings: SinkSettings, transactional_id: str) -> Producer:
    producer = Producer(settings.bootstrap, acks="all", transactional_id=transactional_id,
                        transaction_two_phase_commit=True,
                        transaction_timeout_ms=settings.transaction_timeout_ms,
                        **settings.producer_options, **settings.security.settings())
    try:
        producer.init_transactions()  # fences an earlier task on this id (aborts its staging)
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer


def task_transactional_id(owner: str, txn_partitions: int) -> str:
    """This task's id: ``<owner>-<partition>-<attempt>-<k>``, co-located with ``owner``."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SinkCommitError(f"sink {owner}: write() runs in a Spark task only")
    return colocated_transactional_id(
        owner, f"{owner}-{context.partitionId()}-{context.attemptNumber()}", txn_partitions)


def _task_batch_id() -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    text = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
    return None if text is None else int(text)


def staged_states(messages: list[WriterCommitMessage | None], batch_id: int | None
            ) -> tuple[list[PreparedTxnState], int]:
    """The prepared transactions and the records of the tasks that succeeded."""
    ours = [m for m in messages if isinstance(m, StagedCommitMessage)]
    wrong = sorted({m.batch_id for m in ours if m.batch_id is not None} - {batch_id})
    if batch_id is not None and wrong:
        raise SinkCommitError(f"commit of batch {batch_id} got messages of batch(es) {wrong}")
    return [m.staged for m in ours if m.staged is not None], sum(m.records for m in ours)


class _Staging:
    """What the two transactional writers share: options, the column check, the ids."""

    def __init__(self, settings: SinkSettings, schema: StructType, owner: str) -> None:
        self.settings = settings
        self.owner = owner
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        check_columns(self.arrow_schema, settings.topic, value_schema_of(settings))

    @property
    def committer(self) -> SinkCommitter:
        return SinkCommitter(self.settings, self.owner)

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> StagedCommitMessage:
        # asked in the task (cached per worker process), not in the driver's commit
        tid = task_transactional_id(self.owner, transaction_state_partitions(self.settings))
        records, topics, state = stage(self.settings, tid, iterator)
        return StagedCommitMessage(records, topics, state, _task_batch_id())

    def _abort(self, messages: list[WriterCommitMessage | None], what: str) -> None:
        """Best effort (Spark's abort is): abort the staged transactions of ``messages``
        and whatever else the sink's tasks left open; a failure is logged."""
        staged = [m.staged for m in messages
                  if isinstance(m, StagedCommitMessage) and m.staged is not None]
        try:
            self.committer.abort(s.transactional_id for s in staged)
            self.committer.abort_leftovers(every_id=True)
        except LogstoreError as e:
            log.warning("sink %s: aborting %s failed (%s); its staged transactions are "
                        "aborted at the next commit, or by the broker's timeout", self.owner,
                        what, e)
        log.warning("sink %s: %s aborted; none of its %d staged transaction(s) is visible",
                    self.owner, what, len(staged))


class ExactlyOnceStreamWriter(_Staging, DataSourceStreamArrowWriter):
    """``writeStream`` with ``exactlyOnce=true`` (the default)."""

    def __init__(self, settings: SinkSettings, schema: StructType) -> None:
        super().__init__(settings, schema, resolve_sink_id(settings))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged, records = staged_states(messages, batchId)
        self.committer.commit_batch(batchId, staged, records, checkpoint_query_id(self.settings))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages, f"batch {batchId}")


class TransactionalWriter(_Staging, DataSourceArrowWriter):
    """``df.write`` with ``transactional=true``: the job's rows all become visible or none.
    The job's id (its tasks' prefix) is fresh per write."""

    def __init__(self, settings: SinkSettings, schema: StructType) -> None:
        super().__init__(settings, schema, f"logstore-write-{uuid.uuid4().hex[:16]}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedCommitMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged, records = staged_states(messages, None)
        committer = self.committer
        committer.abort_leftovers(keep={s.transactional_id for s in staged})
        if staged:
            committer.publish(staged, f"the write of {records} records")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages, "the write")


class AtLeastOnceStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream`` with ``exactlyOnce=false``: the batch writer's path per task; a batch
    Spark re-runs after a failure is written again."""

    def __init__(self, settings: SinkSettings, schema: StructType) -> None:
        self.inner = LogStoreWriter({}, schema, settings)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogStoreCommitMessage:
        return self.inner.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("batch %d: written (at least once)", batchId)
        self.inner.commit(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.inner.abort(messages)


def stream_writer(options: dict[str, str], schema: StructType) -> DataSourceStreamArrowWriter:
    settings = parse_sink_options(options, streaming=True)
    if settings.transactional:
        return ExactlyOnceStreamWriter(settings, schema)
    return AtLeastOnceStreamWriter(settings, schema)


def batch_writer(options: dict[str, str], schema: StructType) -> DataSourceArrowWriter:
    settings = parse_sink_options(options, streaming=False)
    if settings.transactional:
        return TransactionalWriter(settings, schema)
    return LogStoreWriter(options, schema, settings)


def checkpoint_query_id(settings: SinkSettings) -> str | None:
    """The query id in ``<checkpointLocation>/metadata`` (the same across restarts of a query,
    new with a new checkpoint), or None when it cannot be read here."""
    path = None if settings.checkpoint_location is None else _local_path(
        settings.checkpoint_location)
    try:
        return None if path is None else str(orjson.loads((path / "metadata").read_bytes())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_sink_id(settings: SinkSettings) -> str:
    """The ``sinkId`` option, else the query id in ``<checkpointLocation>/metadata`` (the
    same across restarts of the query, as it must be)."""
    if settings.sink_id is not None:
        return settings.sink_id
    location = settings.checkpoint_location
    hint = "set the sinkId option (a name for the sink, the same across restarts)"
    if location is None:
        raise OptionError(f"exactlyOnce=true needs the sink's id, and no checkpointLocation "
                          f"option names the query's checkpoint: {hint}")
    path = _local_path(location)
    if path is None:
        raise OptionError(f"exactlyOnce=true: checkpointLocation {location!r} is not a local "
                          f"path, so its query id cannot be read here: {hint}")
    try:
        query_id = orjson.loads((path / "metadata").read_bytes())["id"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OptionError(f"exactlyOnce=true: the query id could not be read from "
                          f"{path / 'metadata'} ({e}): {hint}") from None
    return check_sink_id(str(query_id), f"the query id in {path / 'metadata'}")


def _local_path(location: str) -> Path | None:
    if location.startswith("file://"):
        return Path(location[len("file://"):])
    if location.startswith("file:"):
        return Path(location[len("file:"):])
    return None if "://" in location else Path(location)


__all__ = ["AtLeastOnceStreamWriter", "ExactlyOnceStreamWriter", "StagedCommitMessage",
           "staged_states", "task_transactional_id",
           "TransactionalWriter", "batch_writer", "resolve_sink_id", "stage", "stream_writer"]
