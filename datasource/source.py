"""``format("logstore")``: the PySpark Python DataSource for batch and micro-batch reads.

Owns: adapting planning.py and reader.py to Spark's DataSource API: the output schema, filter
pushdown (only with ``pushFilters=true``: see ``LogStoreBatchReader``), input partitions, the
micro-batch offsets and read limits. Must not: contain read or planning logic of its own (so
most of it is tested without Spark).

A batch DataFrame is planned once, at its first action: pyspark 4.3 keeps the plan (offset
ranges ending at the high watermarks of then) with the DataFrame, so later actions on it read
the same records; ``load()`` again to see newer ones.

Where things run: ``schema()``, ``pushFilters()`` and ``partitions()`` run on the driver (they
talk to brokers); ``read()`` runs in executors, from a pickled reader, so everything it needs
is set in ``__init__`` or carried by the input partition, and no socket is ever pickled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeGuard

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from datasource.committed import RemoteAbortedCollector
from datasource.options import ReadOptions, parse_read_options
from datasource.planning import (
    Constraints,
    DataLossError,
    OffsetRange,
    PartitionInfo,
    Planner,
    RemoteRangeError,
    RemoteSegments,
    assign_sources,
    check_range,
    narrow,
    remote_spans,
    split_ranges,
)
from datasource.reader import ReadSettings, ReadTask, RemoteSegmentRead, read_range
from datasource.schema import check_requested, source_arrow_schema
from logstore.client.admin import Admin
from logstore.errors import LogstoreError
from logstore.model import TopicPartition
from logstore.txn_filter import AbortedTxn

log = logging.getLogger(__name__)

IDLE_POLL_INTERVAL_S = 0.1  # an idle stream asks the brokers for new data at most this often
# As Spark's Kafka source: a high watermark below offsets the stream already has is asked for
# again (a new leader's may lag the old one's for a moment) before it counts as data loss.
WENT_BACK_ATTEMPTS = 3
WENT_BACK_RETRY_S = 1.0


class LogStoreDataSource(DataSource):
    """``spark.read.format("logstore")``, ``readStream``, ``write`` and ``writeStream``
    (see README)."""

    @classmethod
    def name(cls) -> str:
        return "logstore"

    def schema(self) -> StructType:
        options = parse_read_options(self.options, streaming=None)
        planner = Planner(options)
        try:
            value_schema = planner.value_schema(planner.topics())
        finally:
            planner.close()
        return from_arrow_schema(source_arrow_schema(value_schema, options.include_headers))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        if options.push_filters:
            return LogStoreFilteringBatchReader(options, schema)
        return LogStoreBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogStoreStreamReader(parse_read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from datasource.sink import batch_writer

        return batch_writer(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        """Exactly once unless ``exactlyOnce=false`` (datasource/sink.py); every micro-batch
        appends, whatever the output mode."""
        from datasource.sink import stream_writer

        return stream_writer(dict(self.options), schema)


class RangePartition(InputPartition):
    """One Spark input partition: a ReadTask."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task

    def __repr__(self) -> str:
        return f"RangePartition({self.task.tp}, [{self.task.start}, {self.task.end}))"


class _ScanBase:
    """What batch and stream readers share: settings, schema checks, tasks from ranges."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.spark_schema = schema
        self.settings = ReadSettings(options.bootstrap_servers,
                                     to_arrow_schema(schema, timezone="UTC"),
                                     options.read_mode, options.fail_on_data_loss,
                                     options.fetch_max_bytes, options.security,
                                     options.isolation_level)
        self._collector: RemoteAbortedCollector | None = None  # driver only

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_collector"] = None  # its connections and stores stay on the driver
        return state

    def _check_schema(self, planner: Planner, topics: list[str]) -> None:
        value_schema = planner.value_schema(topics)
        available = to_arrow_schema(from_arrow_schema(
            source_arrow_schema(value_schema, include_headers=True)), timezone="UTC")
        check_requested(self.settings.target, available, topics)
        if "headers" in self.settings.target.names and not self.options.include_headers:
            log.info("the schema names 'headers': reading them although includeHeaders=false")

    def _tasks(self, planner: Planner, ranges: list[OffsetRange],
               infos: dict[TopicPartition, PartitionInfo]) -> list[RangePartition]:
        """Input partitions, each read from one source: the remote segment holding it (see
        planning.assign_sources), or the leader's files or fetches."""
        pieces = split_ranges(ranges, self.options.min_partitions,
                              self.options.max_records_per_partition)
        mode = self.options.read_mode
        spans = remote_spans(pieces, infos, mode)
        remote = planner.remote_segments(self._listed(spans, infos), strict=mode == "remote") \
            if spans else RemoteSegments(None, {})
        if mode == "remote" and remote.store is None and spans:
            raise RemoteRangeError("readMode=remote, but no remote store is known: set the "
                                   "remoteStorageUri option")
        assigned = [(r, None if segment is None or remote.store is None else
                     RemoteSegmentRead(segment, remote.store))
                    for r, segment in assign_sources(pieces, infos, remote.segments, mode)]
        aborted = self._remote_aborted(planner, assigned, remote)
        out = []
        for (r, read), txns in zip(assigned, aborted, strict=True):
            info = infos[r.tp]
            out.append(RangePartition(ReadTask(r.tp, r.start, r.end, info.leader, info.path,
                                               info.incarnation, read, txns,
                                               topic_id=info.topic_id)))
        return out

    def _listed(self, spans: dict[TopicPartition, tuple[int, int]],
                infos: dict[TopicPartition, PartitionInfo]
                ) -> dict[TopicPartition, tuple[int, int]]:
        """The spans whose remote segments to list: with read_committed, up to the last
        stable offset, since an abort's entry sits with its marker, in any later segment."""
        if not self.options.read_committed:
            return spans
        return {tp: (lo, max(hi, infos[tp].end_offset)) for tp, (lo, hi) in spans.items()}

    def _remote_aborted(self, planner: Planner,
                        assigned: list[tuple[OffsetRange, RemoteSegmentRead | None]],
                        remote: RemoteSegments) -> list[tuple[AbortedTxn, ...]]:
        """Per task, what a read_committed read of a remote segment drops (committed.py)."""
        out: list[tuple[AbortedTxn, ...]] = [() for _ in assigned]
        at = [i for i, (_, read) in enumerate(assigned) if read is not None]
        if not self.options.read_committed or not at or remote.store is None:
            return out
        if self._collector is None or self._collector.metadata is not planner.metadata:
            self._collector = RemoteAbortedCollector(planner.metadata)
        found = self._collector.per_task([assigned[i][0] for i in at], remote.store,
                                         remote.segments)
        for i, txns in zip(at, found, strict=True):
            out[i] = txns
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if type(partition).__name__ == "ArchivePartition":  # a history read's archived ranges
            from datasource.archive_read import read_archive_partition

            return read_archive_partition(partition, self.settings.target)  # type: ignore[arg-type]
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when a scan has no ranges at all
        return read_range(partition.task, self.settings)


class LogStoreBatchReader(_ScanBase, DataSourceReader):
    """A batch read of the offset ranges the options name. It takes no filters: pyspark 4.3
    keeps the reader a filtered query planned (its pushed filters, its offset ranges) with
    the DataFrame, and every later query of that DataFrame reuses it, even one with other
    filters or none, so narrowed ranges would silently drop rows. (Without a ``pushFilters``
    of its own, reads also work in sessions that leave
    ``spark.sql.python.filterPushdown.enabled`` off, Spark's default.)"""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.constraints = Constraints()

    def partitions(self) -> Sequence[InputPartition]:
        planner = Planner(self.options)
        try:
            return self._plan(planner)
        finally:
            planner.close()

    def _plan(self, planner: Planner) -> list[RangePartition]:
        tps = planner.partitions()
        self._check_schema(planner, sorted({tp.topic for tp in tps}))
        if not tps:
            return []
        # Offsets are resolved (and checked) for every partition the options name, and only
        # then narrowed by the filters, so filters never change what counts as an error.
        infos = planner.describe(tps)
        if self.options.archive_table is not None:  # history: the archive below the log
            from datasource.archive import plan_history

            return plan_history(self, planner, infos)  # type: ignore[return-value]
        starts = planner.resolve(self.options.starting, infos, "starting")
        ends = planner.resolve(self.options.ending, infos, "ending")
        ranges = [r for tp in tps if (r := check_range(
            tp, starts[tp], ends[tp], infos[tp], self.options.fail_on_data_loss)) is not None]
        if self.constraints.empty:
            return []
        ranges = narrow(ranges, self.constraints)
        ranges = narrow(ranges, self.constraints, self._timestamp_starts(planner, ranges))
        return self._tasks(planner, ranges, infos)

    def _timestamp_starts(self, planner: Planner, ranges: list[OffsetRange]
                          ) -> dict[TopicPartition, int] | None:
        ts = self.constraints.timestamp_min_ms
        if ts is None or not ranges:
            return None
        return planner.offsets_for_times({r.tp: ts for r in ranges})


class LogStoreFilteringBatchReader(LogStoreBatchReader):
    """``pushFilters=true``: the batch read narrowed by the query's filters on partition,
    offset and lower bounds on timestamp. Safe only for a DataFrame used by one query (see
    ``LogStoreBatchReader``); needs ``spark.sql.python.filterPushdown.enabled``."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Narrow the offset ranges by filters on partition, offset and timestamp; every
        filter is still given back to Spark, which applies it to the rows read."""
        self.constraints = constraints_from(filters)
        yield from filters


class LogStoreStreamReader(_ScanBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches; offsets are ``{"topic": {"partition": next offset}}``."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self._planner: Planner | None = None
        self._looked_up = False
        self._target: dict[TopicPartition, int] | None = None
        self._last_batch_at = time.monotonic()
        self._idle_since: float | None = None
        self._checked_topics: frozenset[str] = frozenset()
        self._group_committed: dict[TopicPartition, int] = {}
        self._high_watermarks: dict[TopicPartition, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_planner"] = None  # sockets stay on the driver
        return state

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        infos = self._current()
        return to_json_offsets(self.planner.resolve(self.options.starting, infos, "starting"),
                               self._topic_ids(infos))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: i.end_offset for tp, i in self._current().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # An idle stream long-polls the leaders for up to IDLE_POLL_INTERVAL_S before asking
        # for offsets again: no tight loop while idle, no delay when a record arrives, and
        # never ``start`` answered unasked (Spark would take it as "no new data", and
        # processAllAvailable would return before records produced ahead of it were read).
        if self._idle_since is not None and self._target is None:
            self.planner.await_data(self._await_positions(from_json_offsets(start)),
                                    int(IDLE_POLL_INTERVAL_S * 1000))
        infos = self._settled(self._current, from_json_offsets(start))
        self._high_watermarks = {tp: info.high_watermark for tp, info in infos.items()}
        now = time.monotonic()
        ids = self._topic_ids(infos)
        begin = self._begin(from_json_offsets(start), infos)
        # A topic deleted and created again since ``start``: its offsets were of the old one,
        # so the new one is read from its start (partitions() reports the loss), up to its
        # end now for AvailableNow (the run's target was the old one's), and the old offsets
        # are not committed to the group as the new topic's.
        recreated = _recreated(topic_ids_of_offsets(start), ids)
        begin = {tp: infos[tp].log_start_offset if tp.topic in recreated else o
                 for tp, o in begin.items()}
        for tp in [tp for tp in self._group_committed if tp.topic in recreated]:
            del self._group_committed[tp]
        if self._target is not None:
            self._target.update({tp: info.end_offset for tp, info in infos.items()
                                 if tp.topic in recreated})
        # The batch that ended at ``start`` is in Spark's commit log.
        self._commit_group({t: parts for t, parts in start.items() if t not in recreated})
        latest = {tp: self._cap(tp, info.end_offset, begin[tp]) for tp, info in infos.items()}
        end = self._limited(begin, latest, limit, now)
        # A partition whose high watermark went back below the stream's position (topic
        # recreated, log truncated) ends there, so that partitions() reports the data loss
        # instead of the stream waiting, unasked, until the log grows past its old position.
        end = {**end, **{tp: n for tp, n in latest.items() if n < begin[tp]}}
        self._idle_since = now if end == begin else None
        if end != begin:
            self._last_batch_at = now
        return to_json_offsets(end, ids)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = from_json_offsets(start), from_json_offsets(end)
        infos = self._settled(lambda: self.planner.describe(stop), stop)
        recreated = _recreated(topic_ids_of_offsets(start), topic_ids_of_offsets(end))
        for topic, (was, now) in sorted(recreated.items()):
            self._data_loss(f"topic {topic!r} was deleted and created again (topic id {was}, "
                            f"now {now}): the records of the old one after the stream's "
                            "offsets are lost, and the new one is read from its start")
        ranges = []
        for tp, e in sorted(stop.items()):
            s = begin.get(tp, infos[tp].log_start_offset)  # a new partition: from its start
            if tp.topic in recreated:
                s = infos[tp].log_start_offset
            if s > e:
                self._data_loss(f"{tp}: offsets went back from {s} to {e} (the topic was "
                                "recreated or the log truncated); records may have been missed")
                continue
            hw = infos[tp].end_offset
            if e > hw:  # e.g. a batch planned before a restart, replayed from the checkpoint
                self._data_loss(f"{tp}: offsets [{max(s, hw)}, {e}) of this micro-batch are no "
                                f"longer in the log (its {infos[tp].end_name()} went back to "
                                f"{hw}: the topic was recreated or the log truncated)")
                e = max(s, hw)
            r = check_range(tp, s, e, infos[tp], self.options.fail_on_data_loss)
            if r is not None:
                ranges.append(r)
        return self._tasks(self.planner, ranges, infos)

    def commit(self, end: dict[str, Any]) -> None:
        """Progress lives in the checkpoint (as with Spark's Kafka source); with ``groupId``,
        the batch's end offsets are also committed to that group, so its lag shows."""
        self._commit_group(end)

    def _commit_group(self, offsets: dict[str, Any]) -> None:
        """With ``groupId``: commit ``offsets`` to the group unless already there or behind.
        Spark calls ``commit(end)`` only when it starts the batch after (so the last batch of
        a caught-up query would wait); ``latestOffset(start)`` is asked once the batch ending
        at ``start`` is in the commit log, so it commits too, and the lag reaches 0."""
        if self.options.group_id is None:
            return
        wanted = from_json_offsets(offsets)
        if all(self._group_committed.get(tp, -1) >= o for tp, o in wanted.items()):
            return
        if commit_group_offsets(self.options.bootstrap_servers, self.options.group_id, wanted):
            self._group_committed.update(wanted)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None

    # -- helpers -------------------------------------------------------------------------------

    def _current(self) -> dict[TopicPartition, PartitionInfo]:
        # Unknown topics fail the query's first look-up; later, a topic deleted under the
        # query is left out here, and _begin reports its partitions as lost.
        tps = self.planner.partitions(missing_ok=self._looked_up)
        self._looked_up = True
        topics = frozenset(tp.topic for tp in tps)
        if not topics <= self._checked_topics:  # first call, or subscribePattern found more
            self._check_schema(self.planner, sorted(topics))
            self._checked_topics = topics
        return self.planner.describe(tps)

    def _settled(self, describe: Callable[[], dict[TopicPartition, PartitionInfo]],
                 known: dict[TopicPartition, int]) -> dict[TopicPartition, PartitionInfo]:
        """``describe()``, asked again (up to WENT_BACK_ATTEMPTS times in all) while a
        partition's high watermark is below the offset ``known`` for it."""
        infos = describe()
        for _ in range(WENT_BACK_ATTEMPTS - 1):
            back = sorted(str(tp) for tp, offset in known.items()
                          if tp in infos and infos[tp].end_offset < offset)
            if not back:
                break
            log.warning("%s: high watermark below the stream's offsets; asking again in %.1f s",
                        back, WENT_BACK_RETRY_S)
            time.sleep(WENT_BACK_RETRY_S)
            infos = describe()
        return infos

    def _await_positions(self, start: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Where an idle stream waits for the high watermark to pass: its position or, with
        read_committed, the high watermark seen last (an open transaction keeps the last
        stable offset below it; the marker that ends it moves the high watermark on)."""
        if not self.options.read_committed:
            return start
        return {tp: max(o, self._high_watermarks.get(tp, o)) for tp, o in start.items()}

    def _begin(self, start: dict[TopicPartition, int], infos: dict[TopicPartition, PartitionInfo]
               ) -> dict[TopicPartition, int]:
        gone = sorted(str(tp) for tp in start if tp not in infos)
        if gone:
            self._data_loss(f"partitions {gone} are gone (topic deleted?); their unread "
                            "records are lost")
        return {tp: start.get(tp, info.log_start_offset) for tp, info in infos.items()}

    def _cap(self, tp: TopicPartition, high_watermark: int, begin: int) -> int:
        if self._target is None:
            return high_watermark
        return min(high_watermark, max(self._target.get(tp, begin), begin))

    def _limited(self, begin: dict[TopicPartition, int], latest: dict[TopicPartition, int],
                 limit: ReadLimit, now: float) -> dict[TopicPartition, int]:
        available = {tp: max(latest[tp] - begin[tp], 0) for tp in begin}
        total = sum(available.values())
        if not isinstance(limit, ReadAllAvailable) and self._target is None:
            wanted = limit.min_rows if isinstance(limit, ReadMinRows) else \
                self.options.min_offsets_per_trigger
            waited_ms = (now - self._last_batch_at) * 1000
            if wanted is not None and total < wanted and \
                    waited_ms < self.options.max_trigger_delay_ms:
                return begin
        if isinstance(limit, ReadMaxRows) and total > limit.max_rows:
            return {tp: begin[tp] + n for tp, n in
                    share_limit(available, limit.max_rows).items()}
        return {tp: begin[tp] + available[tp] for tp in begin}

    def _topic_ids(self, infos: Mapping[TopicPartition, PartitionInfo]
                   ) -> dict[str, str | None]:
        """The id of each topic of ``infos``: the one its leaders' replicas are of, which the
        offsets in ``infos`` are of too, when they agree; else (leaders that do not tell, or
        in the middle of a recreate) as the planner's metadata knows it now."""
        told: dict[str, set[str | None]] = {}
        for tp, info in infos.items():
            told.setdefault(tp.topic, set()).add(info.topic_id)
        return {t: next(iter(ids)) if len(ids) == 1 and None not in ids
                else self.planner.metadata.known_topic_id(t) for t, ids in told.items()}

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message}; set failOnDataLoss=false to go on")
        log.warning("%s (failOnDataLoss=false)", message)


def _recreated(was: Mapping[str, str], now: Mapping[str, str | None]
               ) -> dict[str, tuple[str, str]]:
    """Topics whose id ``now`` is not the one ``was`` recorded: topic -> (was, now)."""
    return {t: (i, n) for t, i in was.items() if (n := now.get(t)) and n != i}


def commit_group_offsets(bootstrap: str, group_id: str, offsets: dict[TopicPartition, int]
                         ) -> bool:
    """Offsets for ``logstore groups describe`` only: a failure is logged, never fails the
    query (its checkpoint is the source of truth). True when committed."""
    try:
        with Admin(bootstrap) as admin:
            admin.alter_group_offsets(group_id, dict(offsets))
    except LogstoreError as e:
        log.warning("groupId %s: committing offsets %s failed: %s", group_id,
                    to_json_offsets(offsets), e)
        return False
    return True


def share_limit(available: dict[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Split ``limit`` records over partitions in proportion to what each has available (as
    Spark's Kafka source does), never more than available, adding up to ``limit``."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    shares = {tp: n * limit // total for tp, n in available.items()}
    left = limit - sum(shares.values())
    for tp in sorted(available, key=lambda t: available[t] - shares[t], reverse=True):
        if left <= 0:
            break
        extra = min(left, available[tp] - shares[tp])
        shares[tp] += extra
        left -= extra
    return shares


# A stream's offsets name the topic id they belong to under this key, which no topic name can
# be (``@`` is not allowed in one): a topic deleted and created again under its name is told
# from the one the checkpoint's offsets are of. Offsets without it (older checkpoints, a user's
# startingOffsets) are not checked.
STREAM_TOPIC_IDS_KEY = "@topic_ids"


def to_json_offsets(offsets: dict[TopicPartition, int],
                    topic_ids: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """``{topic: {partition: offset}}``, and the topics' ids under ``STREAM_TOPIC_IDS_KEY`` when
    given (those known)."""
    out: dict[str, Any] = {}
    for tp, offset in sorted(offsets.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
    ids = {t: i for t, i in sorted((topic_ids or {}).items()) if i and t in out}
    if ids:
        out[STREAM_TOPIC_IDS_KEY] = ids
    return out


def from_json_offsets(offsets: dict[str, Any]) -> dict[TopicPartition, int]:
    return {TopicPartition(t, int(p)): int(o) for t, parts in offsets.items()
            if t != STREAM_TOPIC_IDS_KEY for p, o in parts.items()}


def topic_ids_of_offsets(offsets: Mapping[str, Any]) -> dict[str, str]:
    """The topic ids ``offsets`` were taken for (empty: none recorded)."""
    ids = offsets.get(STREAM_TOPIC_IDS_KEY)
    return {str(t): str(i) for t, i in ids.items()} if isinstance(ids, dict) else {}


# -- filter pushdown ---------------------------------------------------------------------------

def constraints_from(filters: list[Filter]) -> Constraints:
    """The conjunction of the filters on partition, offset and timestamp (others ignored)."""
    c = Constraints()
    for f in filters:
        attribute: tuple[str, ...] = getattr(f, "attribute", ())  # Not(...) has none
        column = attribute[0] if len(attribute) == 1 else None
        if column == "partition":
            c = _partition_filter(c, f)
        elif column == "offset":
            c = _offset_filter(c, f)
        elif column == "timestamp":
            c = _timestamp_filter(c, f)
    return c


def _partition_filter(c: Constraints, f: Filter) -> Constraints:
    if isinstance(f, EqualTo) and _int(f.value):
        allowed = {f.value}
    elif isinstance(f, In) and all(_int(v) for v in f.value):
        allowed = set(f.value)
    else:
        return c
    current = allowed if c.partitions is None else set(c.partitions) & allowed
    return _replace(c, partitions=frozenset(current))


def _offset_filter(c: Constraints, f: Filter) -> Constraints:
    raw = list(f.value) if isinstance(f, In) else [getattr(f, "value", None)]
    values = [v for v in raw if _int(v)]
    if not values or len(values) != len(raw):
        return c
    lo, hi = min(values), max(values)
    bounds = {EqualTo: (lo, hi + 1), In: (lo, hi + 1), GreaterThan: (lo + 1, None),
              GreaterThanOrEqual: (lo, None), LessThan: (0, lo), LessThanOrEqual: (0, lo + 1)}
    pair = bounds.get(type(f))
    if pair is None:
        return c
    end = pair[1] if c.offset_end is None else (c.offset_end if pair[1] is None
                                                 else min(c.offset_end, pair[1]))
    return _replace(c, offset_min=max(c.offset_min, pair[0]), offset_end=end)


def _timestamp_filter(c: Constraints, f: Filter) -> Constraints:
    """Only lower bounds: records are in offset order, not timestamp order, so an upper bound
    cannot end a range early; the time index finds where a lower bound starts one."""
    if not isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
        return c
    ms = _epoch_ms(f.value)
    if ms is None:
        return c
    return _replace(c, timestamp_min_ms=ms if c.timestamp_min_ms is None
                    else max(c.timestamp_min_ms, ms))


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # Spark hands TIMESTAMP_NTZ values over naive, as wall-clock time in UTC (and the
            # reader's timestamp_ntz column is the UTC wall clock): not this process's local time
            value = value.replace(tzinfo=UTC)
        ms = int(value.astimezone(UTC).timestamp() * 1000) - 1  # round down
        # list_offsets reads -1 and -2 as latest and earliest and rejects other negative
        # times, so a bound at or before the epoch narrows nothing.
        return ms if ms >= 0 else None
    return None


def _int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _replace(c: Constraints, **changes: Any) -> Constraints:
    return replace(c, **changes)
