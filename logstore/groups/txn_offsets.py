"""Offsets committed inside a transaction (KIP-98, with KIP-447's fencing), on one offsets
partition.

Owns: ``txn_offset_commit`` (validated as an offset commit is, per partition; the member and
generation, when given, must be the group's current ones, so a zombie of an older generation
is fenced; its records are appended as the producer's transactional batch, and the offsets wait
in ``pending_txn``, under the offset of the batch that staged them, until the transaction's
marker reaches this partition), ``complete_txn`` (the marker arrived: COMMIT makes the pending
offsets staged before the marker's offset the group's committed offsets, except where a plain
commit was appended after the staging batch, which stays, as in Kafka; ABORT drops them; the
marker itself is already in the log, so this changes memory only, and a late completion never
touches what the producer's next transaction staged after the marker). An offset
fetch with ``require_stable`` checks ``pending_txn`` (commits.py). Must not: do I/O, take locks or read clocks.
"""

from __future__ import annotations

from logstore.coordinator import CoordinatorResult, TxnProducer
from logstore.groups.commits import commit_error, committable
from logstore.groups.coordinator import GroupCoordinatorShard, Rows, batch
from logstore.groups.offsets import StoredOffset, offset_key, offset_value
from logstore.groups.state import Group
from logstore.messages import error_kw
from logstore.messages.transactions import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnPartitionResult,
)
from logstore.model import TopicPartition


def txn_offset_commit(shard: GroupCoordinatorShard, req: TxnOffsetCommitRequest, now_ms: int
                      ) -> CoordinatorResult[TxnOffsetCommitResponse]:
    """Stage the valid offsets of the request in the producer's transaction; one error per
    partition (the whole request fails when the member or generation is wrong)."""
    group = shard.groups.get(req.group_id) or Group(req.group_id, now_ms)
    member = group.check_commit(req.member_id, req.generation_id)
    owned = committable(group, member)
    entries = {TopicPartition(e.topic, e.partition): e for e in req.offsets}
    ids = shard.topic_ids(tp.topic for tp in entries)
    results, valid = [], []
    for tp, e in entries.items():
        error = commit_error(shard, group, e.offset, e.metadata, tp, owned, req.generation_id,
                             e.topic_id, ids[tp.topic])
        results.append(TxnPartitionResult(topic=e.topic, partition=e.partition,
                                          **error_kw(error)))
        if error is None:
            valid.append((tp, StoredOffset(e.offset, e.metadata, now_ms,
                                           e.topic_id or ids[tp.topic])))
    response = TxnOffsetCommitResponse(results=results)
    if not valid:
        return CoordinatorResult.answer(response)
    rows: Rows = [(offset_key(req.group_id, tp), offset_value(om)) for tp, om in valid]

    def stage(batch_offset: int) -> None:
        shard.committed.stage(req.producer_id, batch_offset, {req.group_id: dict(valid)})
        known = shard.groups.get(req.group_id)
        if known is not None:
            known.touch(req.member_id, now_ms)
    return CoordinatorResult(batch(rows, now_ms), response,
                             producer=TxnProducer(req.producer_id, req.producer_epoch),
                             apply_at=stage)


def complete_txn(shard: GroupCoordinatorShard, producer_id: int, committed: bool,
                 marker_offset: int, now_ms: int) -> CoordinatorResult[int]:
    """The producer's marker at ``marker_offset`` is in the log: apply (COMMIT) or drop
    (ABORT) the offsets its batches staged before it; the response is how many offsets were
    decided. A committed offset replaces the group's only where no plain commit was appended
    after the batch that staged it (``CommittedOffsets.commit_txn``). Offsets staged after the marker
    (the producer's next transaction) stay pending for their own marker, however late this
    completion runs."""
    before = shard.pending_txn.get(producer_id, {})
    count = sum(len(offsets) for o, staged in before.items() if o < marker_offset
                for offsets in staged.values())

    def apply() -> None:
        decided = shard.committed.take_decided(producer_id, marker_offset)
        if not committed:
            return
        for group_id in {g for _, staged in decided for g in staged}:
            if group_id not in shard.groups:
                shard.installer(Group(group_id, now_ms))()
        shard.committed.commit_txn(decided)
    return CoordinatorResult.answer(count, apply)
