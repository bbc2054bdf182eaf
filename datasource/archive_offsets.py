"""What an archive table says it holds, and the offset arithmetic around it.

Owns: the per-partition coverage an archive commit records in its snapshot summary (encoded as
JSON under ``logstore.archived``), the ranges a run archives next, and the split of a history
read between the table and the log. Must not: do I/O (pure, tested with hypothesis).

Each commit's summary holds the coverage of the whole table after it, so the current snapshot
alone says where to resume: ``{"topic": {"0": [first, end], ...}}``, every offset in
``[first, end)`` of that partition archived once (``end``: the next offset to archive). It
also holds the id of each topic it archived (``logstore.topic-ids``, ``{"topic": "<32 hex>"}``),
which tells the topic from one deleted and created again under its name (tables written
before the ids were recorded have none, and are checked by their offsets only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from logstore.errors import LogstoreError
from logstore.model import TopicPartition

ARCHIVED_KEY = "logstore.archived"   # coverage after the commit
RANGES_KEY = "logstore.ranges"       # what this commit added: {"t": {"0": [start, end]}}
LOST_KEY = "logstore.lost"           # ranges skipped as lost (failOnDataLoss=false)
TOPIC_IDS_KEY = "logstore.topic-ids"  # the id of each archived topic: {"t": "<32 hex>"}
RUN_KEY = "logstore.run-id"


class ArchiveDataLossError(LogstoreError, RuntimeError):
    """Offsets that were never archived are no longer in the log."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """Offsets ``[first, end)`` of one partition are in the table."""

    first: int
    end: int


@dataclass(frozen=True, slots=True)
class Span:
    tp: TopicPartition
    start: int
    end: int


def encode(spans: Mapping[TopicPartition, tuple[int, int]]) -> str:
    out: dict[str, dict[str, list[int]]] = {}
    for tp, (a, b) in sorted(spans.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = [int(a), int(b)]
    return orjson.dumps(out).decode()


def decode(text: str | None) -> dict[TopicPartition, tuple[int, int]]:
    if not text:
        return {}
    parsed = orjson.loads(text)
    return {TopicPartition(t, int(p)): (int(v[0]), int(v[1]))
            for t, parts in parsed.items() for p, v in parts.items()}


def coverage_of(summary: Mapping[str, str]) -> dict[TopicPartition, Coverage]:
    return {tp: Coverage(a, b) for tp, (a, b) in decode(summary.get(ARCHIVED_KEY)).items()}


def topic_ids_of(summary: Mapping[str, str]) -> dict[str, str]:
    text = summary.get(TOPIC_IDS_KEY)
    return {str(t): str(i) for t, i in orjson.loads(text).items()} if text else {}


def encode_topic_ids(ids: Mapping[str, str]) -> str:
    return orjson.dumps(dict(sorted(ids.items()))).decode()


@dataclass(frozen=True, slots=True)
class NextRanges:
    """A run's plan: the ranges to archive, those lost (skipped), the coverage after both,
    and the topic ids to record (the table's, updated with those known now)."""

    ranges: list[Span]
    lost: list[Span]
    coverage: dict[TopicPartition, Coverage]
    topic_ids: dict[str, str] = field(default_factory=dict)


def next_ranges(coverage: Mapping[TopicPartition, Coverage],
                logs: Mapping[TopicPartition, tuple[int, int]], fail_on_data_loss: bool,
                archived_ids: Mapping[str, str] | None = None,
                topic_ids: Mapping[str, str | None] | None = None) -> NextRanges:
    """From the table's ``coverage`` and each partition's (log start, end to archive up to):
    a partition the table knows resumes at its end; a new one starts at its log start. Offsets
    between the end and a later log start are lost: an error, or skipped and recorded. A topic
    whose id (``topic_ids``, now) is not the one the table recorded (``archived_ids``), or a
    log that ends below the table's end, is not the log the table holds (a topic created
    again): an error, or, with ``fail_on_data_loss`` off, archived on from the table's end
    (a new id's offsets below it recorded as lost). (Without recorded ids, only the second
    is seen.)"""
    ranges: list[Span] = []
    lost: list[Span] = []
    after = dict(coverage)
    archived_ids, topic_ids = archived_ids or {}, topic_ids or {}
    for tp, (log_start, end) in sorted(logs.items()):
        known = coverage.get(tp)
        was, now = archived_ids.get(tp.topic), topic_ids.get(tp.topic)
        recreated = known is not None and bool(was and now and was != now)
        if recreated and not fail_on_data_loss and known is not None and \
                log_start < known.end:
            # The new topic's offsets below the table's end are never archived: recorded.
            lost.append(Span(tp, log_start, known.end))
        if recreated and fail_on_data_loss and known is not None:
            raise ArchiveDataLossError(
                f"{tp}: topic {tp.topic!r} is not the one the table holds (topic id {now}, "
                f"the table's {was}): it was deleted and created again. The table's offsets "
                "would no longer name the log's records: archive the topic into a new table, "
                f"or rerun with --no-fail-on-data-loss to go on after offset {known.end}")
        if known is not None and end < known.end and fail_on_data_loss:
            raise ArchiveDataLossError(
                f"{tp}: the log ends at offset {end}, below the {known.end} the table already "
                "holds: the topic was deleted and created again, or its log lost records the "
                "table has (an unclean leader election). The table's offsets would no longer "
                "name the log's records: archive the topic into a new table, or rerun with "
                f"--no-fail-on-data-loss to go on after offset {known.end}")
        start = log_start if known is None else known.end
        if known is not None and start < log_start:
            gone = Span(tp, start, min(log_start, end))
            if fail_on_data_loss:
                raise ArchiveDataLossError(
                    f"{tp}: offsets [{gone.start}, {gone.end}) were never archived and are no "
                    f"longer in the log (log start offset {log_start}; retention deleted them "
                    "first); rerun with --no-fail-on-data-loss to skip them")
            lost.append(gone)
            start = gone.end
        if end > start:
            ranges.append(Span(tp, start, end))
        first = known.first if known is not None else start
        after[tp] = Coverage(first, max(end, start))
    ids = {**archived_ids, **{t: i for t, i in topic_ids.items() if i}}
    return NextRanges(ranges, lost, after, ids)


@dataclass(frozen=True, slots=True)
class HistorySplit:
    """A read of ``[start, end)``: ``archive`` from the table, ``log`` ranges from the log, and
    ``missing`` ranges in neither (data loss)."""

    archive: tuple[int, int] | None
    log: list[tuple[int, int]]
    missing: list[tuple[int, int]]


def split_history(start: int, end: int, log_start: int, covered: Coverage | None
                  ) -> HistorySplit:
    """Offsets in the table come from the table (up to its end, even where the log still has
    them: retention moving the log start during the read cannot touch them), the rest from the
    log where it still has them. No offset is in two parts, and the parts add up to
    ``[start, end)``."""
    archive = None
    left, right = (start, start), (start, end)
    if covered is not None:
        a, b = max(start, covered.first), min(end, covered.end)
        if a < b:
            archive, left, right = (a, b), (start, a), (b, end)
    log: list[tuple[int, int]] = []
    missing: list[tuple[int, int]] = []
    for lo, hi in (left, right):
        if hi <= lo:
            continue
        cut = min(max(log_start, lo), hi)
        if cut > lo:
            missing.append((lo, cut))
        if hi > cut:
            log.append((cut, hi))
    return HistorySplit(archive, log, missing)


def earliest(covered: Coverage | None, log_start: int) -> int:
    """The first offset a history read can give: the table's first, else the log start."""
    if covered is not None and covered.first < log_start and covered.end > covered.first:
        return covered.first
    return log_start
