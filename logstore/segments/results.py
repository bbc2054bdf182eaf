"""What the log hands back to its callers: the outcome of an append and the data of a fetch
(Kafka's LogAppendInfo and FetchDataInfo).

Owns: these value types. Must not: do I/O or hold references to the log's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from logstore.records import StoredBatch
from logstore.txn_filter import AbortedTxn


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did. ``log_append_time`` is -1 unless the topic uses LogAppendTime."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time: int
    batch_size: int
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchData:
    """Whole CRC-checked batches in offset order, and the log's offsets when they were read.
    A read_committed read also carries the aborted transactions that overlap the batches
    (Kafka's FetchResponse.AbortedTransactions; empty for read_uncommitted). Control batches
    are among ``batches`` in both modes: tell them apart by ``header.is_control``."""

    batches: list[StoredBatch]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int = -1
    aborted_transactions: list[AbortedTxn] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(b.header.batch_size for b in self.batches)
