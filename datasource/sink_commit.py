"""The driver's half of the transactional sinks: staged transactions published at once, or
aborted.

Owns: the sink's progress record (the last committed batch id, as the committed offset of group
``<sinkId>`` on the pseudo-partition ``__logstore_sink_progress-0``, read with require_stable),
the one atomic decision that publishes a micro-batch (the driver's transaction under
transactional id ``<sinkId>`` records the batch id with ``send_offsets_to_transaction`` and
commits every task's prepared transaction with it: ``commit_transaction(with_prepared=...)``),
skipping a batch at or below the recorded one, aborting the staged transactions of a skipped or
failed batch, and aborting what earlier attempts or a dead run left Prepared or Ongoing under
the sink's task ids. ``df.write`` with ``transactional`` uses the same decision without the
progress record. Must not: import pyspark (``sink.py`` adapts this to Spark) or write records.

Task ids. Task ``p``, attempt ``a`` of a sink stages under
``colocated_transactional_id(sinkId, f"{sinkId}-{p}-{a}", N)``, i.e. ``<sinkId>-<p>-<a>-<k>``
with ``k`` chosen so that the id shares ``<sinkId>``'s ``__transaction_state`` partition (one
coordinator decides them all in one append); ids are reused by every batch. Leftovers are
found with ``list_transactions`` (prefix ``<sinkId>-``, states Prepared and Ongoing) and kept
to exactly that shape, so another sink whose id merely starts with this one is never touched.
Aborting is fencing (``fence_producers``): a Prepared or Ongoing transaction is aborted; one
whose commit was decided (PrepareCommit) is completed first and never aborted.

Why this is exactly once. The progress record and the batch's data commit in one decision, so
a batch is either published and recorded, or neither. Spark re-runs a batch whose commit it did
not record with the same batch id (its offsets are in the offset log before it runs); the
re-run is published if the record is below it, else skipped, its new staging aborted. Leftovers
are aborted at every commit and abort: at the first commit of a restarted run at the latest,
so no transaction lingers and the last stable offset moves on.

A new checkpoint is not a re-run. The progress record also names the query that wrote it (the
query id in ``<checkpointLocation>/metadata``, when the sink can read it). A query whose
checkpoint was deleted, or a second query given the same ``sinkId``, starts again at batch 0;
its batches would all look published and be skipped, writing nothing. So a batch below the
recorded one (Spark re-runs only the latest), or at it from another query, fails with
SinkCommitError saying so, its staging aborted.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from datasource.writer import SinkSettings
from logstore.client.admin import Admin
from logstore.client.consumer import Consumer
from logstore.client.producer import Producer
from logstore.client.transactions import (
    WITH_PREPARED,
    ConsumerGroupMetadata,
    PreparedTxnState,
)
from logstore.errors import ApiError, LogstoreError, ProducerFencedError
from logstore.model import SINK_PROGRESS_TOPIC, OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

PROGRESS = TopicPartition(SINK_PROGRESS_TOPIC, 0)  # the sink group's pseudo-partition
LEFTOVER_STATES = ["Prepared", "Ongoing"]
_txn_partitions: dict[str, int] = {}  # bootstrap -> __transaction_state partitions


class SinkCommitError(LogstoreError, RuntimeError):
    """A batch could not be published; the message names the sink and the batch."""


def transaction_state_partitions(settings: SinkSettings) -> int:
    """``__transaction_state``'s partition count (it never changes: kept per process)."""
    if settings.bootstrap not in _txn_partitions:
        with Admin(settings.bootstrap, **settings.security.settings()) as admin:
            _txn_partitions[settings.bootstrap] = admin.transaction_state_partitions()
    return _txn_partitions[settings.bootstrap]


def task_id_pattern(owner: str) -> re.Pattern[str]:
    """The transactional ids of ``owner``'s tasks: ``<owner>-<partition>-<attempt>-<k>``."""
    return re.compile(re.escape(owner) + r"-\d+-\d+-\d+")


@dataclass(frozen=True, slots=True)
class Progress:
    """The sink's progress record: its last published batch, and the query that published it
    (None: not known, or a record written before queries were named)."""

    batch_id: int
    query_id: str | None = None


def progress_metadata(records: int, query_id: str | None) -> str:
    return f"{records} records" + ("" if query_id is None else f", query {query_id}")


def query_of(metadata: str | None) -> str | None:
    """The query id ``progress_metadata`` wrote, if any."""
    found = re.search(r", query (\S+)$", metadata or "")
    return None if found is None else found.group(1)


@dataclass
class SinkCommitter:
    """The decisions of one sink (``owner``: the sink id, or a batch job's id)."""

    settings: SinkSettings
    owner: str

    def recorded(self) -> Progress | None:
        """The sink's progress record (None: no batch published yet); waits while a decision
        about it is being completed (require_stable)."""
        with Consumer(self.settings.bootstrap, group_id=self.owner, enable_auto_commit=False,
                      isolation_level="read_committed",
                      **self.settings.security.settings()) as consumer:
            committed = consumer.committed(PROGRESS)
        return None if committed is None else Progress(committed.offset,
                                                       query_of(committed.metadata))

    def recorded_batch(self) -> int | None:
        """The last batch id the sink published (None: none yet)."""
        progress = self.recorded()
        return None if progress is None else progress.batch_id

    def commit_batch(self, batch_id: int, staged: list[PreparedTxnState], records: int,
                     query_id: str | None = None) -> bool:
        """Publish micro-batch ``batch_id`` of query ``query_id`` (None: not known) (True), or
        skip it as already published (False: its staged transactions are aborted). A batch
        of another query, or below the recorded one, raises (module docstring)."""
        self.abort_leftovers(keep={s.transactional_id for s in staged})
        recorded = self.recorded()
        if recorded is not None and batch_id <= recorded.batch_id:
            other = query_id is not None and recorded.query_id not in (None, query_id)
            if other or batch_id < recorded.batch_id:
                self.abort(s.transactional_id for s in staged)
                by = "" if recorded.query_id is None else f" by query {recorded.query_id}"
                raise SinkCommitError(
                    f"sink {self.owner}: batch {batch_id}"
                    f"{'' if query_id is None else f' of query {query_id}'} is not a re-run: "
                    f"the sink was last committed{by} at batch {recorded.batch_id}, so this "
                    "is a new checkpoint (deleted or replaced) or another query using the "
                    "same sinkId, and its batches would be skipped as already written. "
                    "Give the new checkpoint a new sinkId, or delete the sink's progress "
                    f"record to start it over (logstore groups delete {self.owner}); nothing "
                    "of this batch was written")
            log.info("sink %s: batch %d is already committed (the sink is at batch %d); "
                     "skipping it and aborting its %d staged transaction(s)", self.owner,
                     batch_id, recorded.batch_id, len(staged))
            self.abort(s.transactional_id for s in staged)
            return False
        self.publish(staged, f"batch {batch_id}", (batch_id, records), query_id)
        return True

    def publish(self, staged: list[PreparedTxnState], what: str,
                progress: tuple[int, int] | None = None, query_id: str | None = None) -> None:
        """One decision: the staged transactions (and ``(batch id, records)`` as the sink's
        progress, naming ``query_id``) commit together, or nothing does."""
        producer = Producer(self.settings.bootstrap, transactional_id=self.owner,
                            **self.settings.security.settings())
        try:
            producer.init_transactions()  # fences an earlier driver of this sink
            producer.begin_transaction()
            if progress is not None:
                producer.send_offsets_to_transaction(
                    {PROGRESS: OffsetAndMetadata(progress[0],
                                                 progress_metadata(progress[1], query_id))},
                    ConsumerGroupMetadata(self.owner))
            producer.commit_transaction(with_prepared=staged)
        except ApiError as e:
            with contextlib.suppress(ApiError):
                producer.abort_transaction()
            if isinstance(e, ProducerFencedError) and WITH_PREPARED not in e.message:
                raise SinkCommitError(f"sink {self.owner}: {what} was not committed: another "
                                      f"writer uses the same sink id ({e})") from e
            raise SinkCommitError(f"sink {self.owner}: {what} was not committed ({e}); its "
                                  f"{len(staged)} staged transaction(s) stay invisible and "
                                  "are aborted") from e
        finally:
            producer.close()
        log.info("sink %s: %s committed (%d staged transaction(s))", self.owner, what,
                 len(staged))

    def abort(self, transactional_ids: Iterable[str]) -> None:
        """Abort the transactions of these ids, unless their commit was decided (then they
        are completed)."""
        ids = sorted(set(transactional_ids))
        if ids:
            with Admin(self.settings.bootstrap, **self.settings.security.settings()) as admin:
                admin.fence_producers(ids)

    def abort_leftovers(self, keep: AbstractSet[str] = frozenset(), every_id: bool = False
                        ) -> list[str]:
        """Abort every Prepared or Ongoing transaction of the sink's tasks but ``keep``'s
        (``every_id``: fence every task id the coordinators know, whatever its state, so that
        a task still writing when Spark gave up on it cannot prepare afterwards); the ids
        fenced."""
        pattern = task_id_pattern(self.owner)
        with Admin(self.settings.bootstrap, **self.settings.security.settings()) as admin:
            listed = admin.list_transactions([] if every_id else LEFTOVER_STATES,
                                             transactional_id_prefix=f"{self.owner}-")
            ids = sorted(t.transactional_id for t in listed
                         if pattern.fullmatch(t.transactional_id)
                         and t.transactional_id not in keep)
            if ids:
                log.warning("sink %s: fencing %d task id(s) left by earlier attempts or a "
                            "stopped run: %s", self.owner, len(ids), ids)
                admin.fence_producers(ids)
        return ids


__all__ = ["PROGRESS", "SinkCommitError", "SinkCommitter", "task_id_pattern",
           "transaction_state_partitions"]
