"""The rules of tiered storage, as pure functions over captured state.

Owns: which local segments are copied, which local segments may go, which remote segments
retention deletes, which remote segments a new leader accepts, the log start offset that
results, orphan detection, and copy lag. Must not: do I/O, read the clock (``now_ms`` comes in)
or change anything; ``tier_manager.py`` acts on the answers.

Offsets: a local segment holds ``[base_offset, next_offset)``; a remote one ``[base_offset,
end_offset]`` (Kafka's inclusive end). Only COPY_SEGMENT_FINISHED remote segments count as
copied, are read, or count towards retention. Remote segments can overlap after a leader change
(the new leader's local segment may straddle the end of what the old one copied; it is copied
whole): coverage is the union of their ranges, and for retention_bytes each offset's bytes count
once, credited to the newest segment holding it (``effective_sizes``), so deleting the oldest
segment lowers the total by exactly its credited bytes (no double counting, KAFKA-15479/16511).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from logstore.tiering.metadata import RemoteLogSegmentMetadata, RemoteLogSegmentState
from logstore.tiering.naming import parse_object_key
from logstore.tiering.store import ObjectInfo


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """A local segment as the rules see it (``path`` is for the copier, not the rules)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int
    sealed: bool
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class Retention:
    """Retention limits; None is unlimited."""

    ms: int | None
    bytes: int | None


# -- coverage --------------------------------------------------------------------------------


def finished(remote: Sequence[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """The COPY_SEGMENT_FINISHED segments, by base offset."""
    done = [m for m in remote if m.is_finished]
    return sorted(done, key=lambda m: (m.base_offset, m.end_offset, m.segment_id))


def covered_ranges(remote: Sequence[RemoteLogSegmentMetadata]) -> list[tuple[int, int]]:
    """The union of the FINISHED segments' offsets as sorted, disjoint [start, next) ranges."""
    ranges: list[tuple[int, int]] = []
    for m in finished(remote):
        if ranges and m.base_offset <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], m.next_offset))
        else:
            ranges.append((m.base_offset, m.next_offset))
    return ranges


def is_covered(ranges: Sequence[tuple[int, int]], start: int, next_offset: int) -> bool:
    """Whether ``[start, next_offset)`` lies inside one of ``ranges`` (from covered_ranges)."""
    return any(lo <= start and next_offset <= hi for lo, hi in ranges)


def copied_next_offset(remote: Sequence[RemoteLogSegmentMetadata]) -> int:
    """One past the highest offset in a FINISHED segment (0 when none)."""
    return max((m.next_offset for m in remote if m.is_finished), default=0)


# -- copying and local deletion --------------------------------------------------------------


def copy_candidates(local: Sequence[LocalSegment], high_watermark: int,
                    last_stable_offset: int,
                    remote: Sequence[RemoteLogSegmentMetadata]) -> list[LocalSegment]:
    """Sealed local segments wholly below the high watermark and the last stable offset that
    FINISHED remote segments do not already cover, in offset order."""
    limit = min(high_watermark, last_stable_offset)
    ranges = covered_ranges(remote)
    return [s for s in sorted(local, key=lambda s: s.base_offset)
            if s.sealed and s.next_offset <= limit and s.next_offset > s.base_offset
            and not is_covered(ranges, s.base_offset, s.next_offset)]


def local_deletable(local: Sequence[LocalSegment], remote: Sequence[RemoteLogSegmentMetadata],
                    local_retention: Retention, now_ms: int) -> list[LocalSegment]:
    """The oldest local segments that may be deleted now: sealed, covered by FINISHED remote
    segments, and past local retention (time, or size counting every local segment), stopping
    at the first that is not."""
    ordered = sorted(local, key=lambda s: s.base_offset)
    ranges = covered_ranges(remote)
    excess = None
    if local_retention.bytes is not None:
        excess = sum(s.size_bytes for s in ordered) - local_retention.bytes
    doomed: list[LocalSegment] = []
    for seg in ordered:
        by_time = (local_retention.ms is not None
                   and now_ms - seg.max_timestamp_ms > local_retention.ms)
        by_size = excess is not None and excess >= seg.size_bytes
        if not (seg.sealed and is_covered(ranges, seg.base_offset, seg.next_offset)
                and (by_time or by_size)):
            break
        doomed.append(seg)
        if excess is not None:
            excess -= seg.size_bytes
    return doomed


# -- remote retention ------------------------------------------------------------------------


def effective_sizes(segments: Sequence[RemoteLogSegmentMetadata]) -> list[int]:
    """Bytes each segment (in the order given: by base offset) counts for retention_bytes: its
    size times the share of its offsets that no later segment holds."""
    out = [0] * len(segments)
    later_start: int | None = None
    for i in range(len(segments) - 1, -1, -1):
        seg = segments[i]
        span = seg.next_offset - seg.base_offset
        unique_next = seg.next_offset if later_start is None else min(seg.next_offset,
                                                                      later_start)
        unique = max(0, unique_next - seg.base_offset)
        out[i] = seg.size_bytes if unique >= span else seg.size_bytes * unique // max(span, 1)
        later_start = seg.base_offset if later_start is None else min(later_start,
                                                                      seg.base_offset)
    return out


def remote_expired(remote: Sequence[RemoteLogSegmentMetadata], local: Sequence[LocalSegment],
                   retention: Retention, now_ms: int) -> list[RemoteLogSegmentMetadata]:
    """The oldest FINISHED segments past total retention, stopping at the first that is not:
    by time (max timestamp older than retention.ms), or by size (the FINISHED remote bytes plus
    the local bytes not yet copied exceed retention.bytes by at least the segment's bytes)."""
    done = finished(remote)
    sizes = effective_sizes(done)
    excess = None
    if retention.bytes is not None:
        ranges = covered_ranges(done)
        local_only = sum(s.size_bytes for s in local
                         if not is_covered(ranges, s.base_offset, s.next_offset))
        excess = sum(sizes) + local_only - retention.bytes
    doomed: list[RemoteLogSegmentMetadata] = []
    for seg, size in zip(done, sizes, strict=True):
        by_time = retention.ms is not None and now_ms - seg.max_timestamp_ms > retention.ms
        by_size = excess is not None and excess >= size
        if not (by_time or by_size):
            break
        doomed.append(seg)
        if excess is not None:
            excess -= size
    return doomed


def log_start_offset(previous: int, remote: Sequence[RemoteLogSegmentMetadata],
                     local_log_start_offset: int,
                     deleted: Sequence[RemoteLogSegmentMetadata] = ()) -> int:
    """The partition's log start offset after remote retention deleted ``deleted``: the
    lowest offset either tier still holds, but past everything retention deleted, and never
    lower than before."""
    lowest = min([m.base_offset for m in remote if m.is_finished] + [local_log_start_offset])
    past_deleted = max((m.next_offset for m in deleted), default=lowest)
    return max(previous, lowest, past_deleted)


# -- leadership ------------------------------------------------------------------------------


def in_leader_lineage(segment: RemoteLogSegmentMetadata, epochs: Sequence[tuple[int, int]],
                      log_end_offset: int) -> bool:
    """Kafka's ``isRemoteSegmentWithinLeaderEpochs``: whether ``segment``'s epoch lineage agrees
    with the leader's epoch cache ``epochs`` ((epoch, start offset), ascending). Every epoch of
    the segment must be in the cache, start where the cache says (the first may start later,
    mid-epoch, or earlier if it is the cache's first epoch), the epoch following each must be the cache's next one, and the segment must end
    before the cache's next epoch (or the log end) begins.

    Deliberate differences from Kafka, both to never delete committed data on a guess: a
    segment whose epochs all precede the cache's first epoch is accepted (the cache cannot judge
    it; a replica that restarted from a leader's log start has such a cache), and so is every
    segment when the cache is empty."""
    lineage = list(segment.segment_leader_epochs)
    if not epochs:
        return True
    if not lineage:
        return False
    if lineage[-1][0] < epochs[0][0]:
        return True
    order = [e for e, _ in epochs]
    for i, (epoch, start) in enumerate(lineage):
        if epoch not in order:
            return False
        at = order.index(epoch)
        epoch_start = epochs[at][1]
        epoch_next = epochs[at + 1][1] if at + 1 < len(epochs) else log_end_offset
        # The first epoch may start mid-epoch, or before the cache's first entry when the cache
        # lost its older part (Kafka's case 1).
        if i == 0 and not ((at == 0 or epoch_start <= start) and start < epoch_next):
            return False
        if i > 0 and start != epoch_start:
            return False
        if i + 1 < len(lineage):
            if at + 1 >= len(epochs) or epochs[at + 1] != lineage[i + 1]:
                return False
        elif segment.end_offset >= epoch_next:
            return False
    return True


def split_by_lineage(remote: Sequence[RemoteLogSegmentMetadata],
                     epochs: Sequence[tuple[int, int]], log_end_offset: int
                     ) -> tuple[list[RemoteLogSegmentMetadata], list[RemoteLogSegmentMetadata]]:
    """(accepted, rejected) FINISHED segments for a new leader; it deletes the rejected."""
    accepted: list[RemoteLogSegmentMetadata] = []
    rejected: list[RemoteLogSegmentMetadata] = []
    for seg in finished(remote):
        (accepted if in_leader_lineage(seg, epochs, log_end_offset) else rejected).append(seg)
    return accepted, rejected


# -- orphans and lag -------------------------------------------------------------------------


def stale_entries(remote: Sequence[RemoteLogSegmentMetadata], now_ms: int,
                  grace_ms: int) -> list[RemoteLogSegmentMetadata]:
    """Entries whose objects are to be deleted outside retention: copies that never finished
    (COPY_SEGMENT_STARTED for longer than the grace period: the copier died or lost its
    leadership) and deletions that never finished (DELETE_SEGMENT_STARTED, resumed at once)."""
    return [m for m in remote
            if (m.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED
                and now_ms - m.state_timestamp_ms > grace_ms)
            or m.state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED]


def orphan_objects(objects: Sequence[ObjectInfo], remote: Sequence[RemoteLogSegmentMetadata],
                   now_ms: int, grace_ms: int) -> list[ObjectInfo]:
    """Segment objects under a partition's prefix whose segment id has no entry at all, older
    than the grace period. (Objects of stale entries go with their entries.) Keys that are not
    segment objects are left alone."""
    known = {m.segment_id for m in remote}
    out = []
    for info in objects:
        name = parse_object_key(info.key)
        if name is not None and name.segment_id not in known and now_ms - info.mtime_ms > grace_ms:
            out.append(info)
    return out


@dataclass(frozen=True, slots=True)
class CopyLag:
    """Sealed local segments not yet copied: how many, and their bytes."""

    segments: int
    bytes: int


def copy_lag(local: Sequence[LocalSegment], remote: Sequence[RemoteLogSegmentMetadata]) -> CopyLag:
    ranges = covered_ranges(remote)
    waiting = [s for s in local if s.sealed and s.next_offset > s.base_offset
               and not is_covered(ranges, s.base_offset, s.next_offset)]
    return CopyLag(len(waiting), sum(s.size_bytes for s in waiting))
