"""Group-commit fsync of one partition's log and the recovery point it earns.

Owns: the recovery point (every batch below it is fsynced), the truncation generation, and group
commit: one thread fsyncs for everybody waiting, outside the log's lock; and the rules of a flush
plan (``flush_range``, ``take_dirty``), which the log applies under its lock. Must not: decide
when to flush (flush_ms, the log manager's background flusher and acks do) or change the
segment list.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from logstore.clock import Clock
from logstore.errors import KafkaStorageError
from logstore.segments.format import fsync_dir
from logstore.segments.segment import LogSegment, SegmentClosedError


@dataclass(frozen=True, slots=True)
class FlushPlan:
    """What one flush fsyncs and the recovery point it earns. ``segments`` are acquired (the
    flusher releases them); ``to_end`` says ``target`` was the log end offset."""

    target: int
    segments: list[LogSegment]
    dir_dirty: bool
    generation: int
    to_end: bool


def flush_range(bases: Sequence[int], offset: int, log_end_offset: int) -> tuple[int, int]:
    """How many of the segments based at ``bases`` hold offsets below ``offset`` (all of them
    when it is the log end offset), and the recovery point that fsyncing them earns: the next
    segment's base offset, or the log end offset."""
    n = len(bases) if offset >= log_end_offset else bisect_left(bases, offset)
    return n, bases[n] if n < len(bases) else log_end_offset


def take_dirty(segments: Sequence[LogSegment]) -> list[LogSegment]:
    """The dirty ones of ``segments``, marked clean, acquired, their index entries handed to
    the operating system (under the log's lock). A closed segment has nothing left to fsync."""
    taken = []
    for seg in segments:
        if not seg.dirty:
            continue
        try:
            seg.acquire()
        except SegmentClosedError:
            continue
        seg.dirty = False
        seg.flush_indexes()
        taken.append(seg)
    return taken


class LogFlusher:
    """The flush state of the log in ``dir``. ``plan(offset)`` runs under the log's lock and
    marks the segments it returns clean; it must cover every batch below ``offset``."""

    def __init__(self, dir: Path, tp: str, clock: Clock,
                 plan: Callable[[int], FlushPlan]) -> None:
        self._dir = dir
        self._tp = tp
        self._clock = clock
        self._plan = plan
        self._cond = threading.Condition()
        self._flushing = False
        self.recovery_point = 0
        self.generation = 0
        self.last_flush_ms = clock.time_ms()

    def flush_until(self, offset: int, force: bool = False) -> None:
        """Return once every batch below ``offset`` is fsynced: when an fsync is running, wait
        for it and re-check; otherwise run one. ``force`` runs a flush of our own even if
        ``offset`` is covered (to sync files that changed without new offsets)."""
        with self._cond:
            while force or self.recovery_point < offset:
                if not self._flushing:
                    self._flushing = True
                    break
                self._cond.wait()
            else:
                return
        self._run(offset)

    def truncated(self, log_end_offset: int) -> None:
        """The log was truncated to ``log_end_offset`` (the caller holds the log's lock): the
        recovery point may not exceed it and a flush planned before must not publish."""
        with self._cond:
            self.recovery_point = min(self.recovery_point, log_end_offset)
            self.generation += 1

    def _run(self, offset: int) -> None:
        plan: FlushPlan | None = None
        done = False
        try:
            plan = self._plan(offset)
            for seg in plan.segments:
                seg.fsync()
            if plan.dir_dirty:
                fsync_dir(self._dir)
            done = True
        except OSError as e:
            for seg in plan.segments if plan else ():
                seg.dirty = True
            raise KafkaStorageError(f"{self._tp}: fsync failed: {e}") from e
        finally:
            self._finish(plan, done)

    def _finish(self, plan: FlushPlan | None, done: bool) -> None:
        for seg in plan.segments if plan else ():
            seg.release()
        with self._cond:
            if plan is not None and done and plan.generation == self.generation:
                self.recovery_point = max(self.recovery_point, plan.target)
                if plan.to_end:
                    self.last_flush_ms = self._clock.time_ms()
            self._flushing = False
            self._cond.notify_all()
