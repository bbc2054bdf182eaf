"""Which sealed segments retention deletes.

Owns: the retention rules, as a pure function over a captured segment list. Must not: delete
anything or change the log's state (Log.delete_old_segments does, under its lock).

Rules, applied oldest first and stopping at the first segment that is kept:
- a segment wholly below the log start offset is always deleted;
- with cleanup policy "delete", a segment whose max timestamp is more than retention_ms old, or
  while the log exceeds retention_bytes by at least the segment's size, is deleted, but only if
  it lies wholly below the last stable offset (unreplicated data and undecided transactions are
  never deleted; the LSO is at most the high watermark);
- the active (last) segment is never deleted.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore.config import TopicConfig
from logstore.segments.segment import LogSegment


def deletable_segments(segments: Sequence[LogSegment], config: TopicConfig,
                       log_start_offset: int, last_stable_offset: int,
                       now_ms: int) -> list[LogSegment]:
    """The prefix of ``segments`` that retention deletes now."""
    excess = None
    if config.delete and config.retention_bytes is not None:
        excess = sum(s.size for s in segments) - config.retention_bytes
    doomed: list[LogSegment] = []
    for seg, following in zip(segments, segments[1:], strict=False):
        if following.base_offset > log_start_offset:
            if not config.delete or following.base_offset > last_stable_offset:
                break
            by_time = (config.retention_ms is not None
                       and now_ms - seg.max_timestamp > config.retention_ms)
            by_size = excess is not None and excess >= seg.size
            if not (by_time or by_size):
                break
        doomed.append(seg)
        if excess is not None:
            excess -= seg.size
    return doomed
