"""When the active segment rolls.

Owns: the roll rules, as a pure function of the active segment and the next batch. Must not:
roll anything or change the log's state (Log rolls, under its lock).

Rules, in order: roll when the batch's relative offsets would overflow int32; never roll an
empty segment otherwise; roll when the batch would take the file past segment_bytes (or the
index's 32-bit positions), when the segment is segment_ms old (from its first batch's append),
or when its offset or time index is full.
"""

from __future__ import annotations

from logstore.config import TopicConfig
from logstore.records import BatchHeader
from logstore.segments.format import MAX_POSITION, MAX_RELATIVE_OFFSET
from logstore.segments.segment import LogSegment


def roll_reason(seg: LogSegment, config: TopicConfig, size: int, header: BatchHeader,
                now_ms: int) -> str | None:
    """Why appending the batch ``header`` of ``size`` bytes at ``now_ms`` rolls ``seg``, or
    None to append to it."""
    if header.last_offset - seg.base_offset > MAX_RELATIVE_OFFSET:
        return "relative offsets would overflow int32"
    if seg.is_empty:
        return None
    if seg.size + size > min(config.segment_bytes, MAX_POSITION):
        return f"size {seg.size} + {size} > segment_bytes {config.segment_bytes}"
    age = None if seg.rolling_base_ms is None else now_ms - seg.rolling_base_ms
    if age is not None and age >= config.segment_ms:
        return f"age {age} ms >= segment_ms {config.segment_ms}"
    if seg.offset_index.is_full or seg.time_index.is_full:
        return "index full"
    return None
