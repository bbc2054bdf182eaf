"""What tiering needs from one partition's local log, and that view over ``segments.Log``.

Owns: the ``TieredLog`` protocol (sealed segments with their files, high watermark, last
stable offset, leader-epoch entries, local deletion) and ``LogTierView``, its implementation
over a ``segments.Log``. Must not: change the log except through ``delete_local_segments_below``,
or import replication (the epoch entries and the last stable offset come in as callables).

Local deletion goes through the Log's own API: raising its log start offset (which for a
tiered partition is the *local* log start offset; the partition's log start offset, over both
tiers, is the RemoteLogManager's) and deleting the segments wholly below it. The LogManager
must therefore not apply the total retention (retention_ms/bytes) to a tiered partition's
Log itself: give it a config without them (``local_log_config``), so that only tiering deletes
its segments, and give the view the topic's whole config (``config``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from logstore.config import TopicConfig
from logstore.segments.format import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    file_name,
)
from logstore.segments.log import Log
from logstore.tiering.rules import LocalSegment


class TieredLog(Protocol):
    """One partition's local log as the RemoteLogManager sees it."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def config(self) -> TopicConfig: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def last_stable_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def local_log_start_offset(self) -> int: ...

    def local_segments(self) -> list[LocalSegment]:
        """Every local segment, oldest first; the last one is the active segment."""
        ...

    def segment_files(self, segment: LocalSegment) -> dict[str, Path]:
        """The files of a sealed segment that exist, by suffix (naming.SUFFIXES), the segment
        file first: it and the indexes always, the transaction index and producer snapshot
        when kept."""
        ...

    def epoch_entries(self) -> list[tuple[int, int]]:
        """The leader-epoch cache: (epoch, start offset), ascending."""
        ...

    def delete_local_segments_below(self, offset: int) -> None:
        """Make ``offset`` the local log start offset and delete the segments below it."""
        ...


def local_log_config(config: TopicConfig) -> TopicConfig:
    """The config a tiered partition's ``segments.Log`` runs with: no total retention, which
    only the RemoteLogManager applies (over both tiers, deleting local segments only once they
    are copied). Other topics' configs are returned as they are."""
    if not config.remote_storage_enable:
        return config
    return replace(config, retention_ms=None, retention_bytes=None)


class LogTierView:
    """``TieredLog`` over a ``segments.Log``; ``config`` gives the topic's whole config (the
    Log's own lacks the total retention, see ``local_log_config``), default the Log's."""

    def __init__(self, log: Log, epoch_entries: Callable[[], Sequence[tuple[int, int]]],
                 last_stable_offset: Callable[[], int] | None = None,
                 config: Callable[[], TopicConfig] | None = None) -> None:
        self._log = log
        self._epoch_entries = epoch_entries
        self._last_stable_offset = last_stable_offset
        self._config = config

    @property
    def topic(self) -> str:
        return self._log.topic

    @property
    def partition(self) -> int:
        return self._log.partition

    @property
    def config(self) -> TopicConfig:
        return self._log.config if self._config is None else self._config()

    @property
    def high_watermark(self) -> int:
        return self._log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """Until transactions keep one, the high watermark is the last stable offset."""
        if self._last_stable_offset is None:
            return self._log.high_watermark
        return self._last_stable_offset()

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def local_log_start_offset(self) -> int:
        return self._log.log_start_offset

    def local_segments(self) -> list[LocalSegment]:
        return [LocalSegment(info["base_offset"], info["next_offset"], info["size_bytes"],
                             info["max_timestamp"], info["sealed"], info["path"])
                for info in self._log.segments_info()]

    def segment_files(self, segment: LocalSegment) -> dict[str, Path]:
        dir, base = self._log.dir, segment.base_offset
        files = {SEGMENT_SUFFIX: dir / file_name(base, SEGMENT_SUFFIX),
                 INDEX_SUFFIX: dir / file_name(base, INDEX_SUFFIX),
                 TIME_INDEX_SUFFIX: dir / file_name(base, TIME_INDEX_SUFFIX)}
        optional = {TXN_INDEX_SUFFIX: dir / file_name(base, TXN_INDEX_SUFFIX),
                    SNAPSHOT_SUFFIX: dir / file_name(segment.next_offset, SNAPSHOT_SUFFIX)}
        files.update({suffix: path for suffix, path in optional.items() if path.exists()})
        return files

    def epoch_entries(self) -> list[tuple[int, int]]:
        return list(self._epoch_entries())

    def delete_local_segments_below(self, offset: int) -> None:
        self._log.maybe_increment_log_start_offset(offset)
        self._log.delete_old_segments()
