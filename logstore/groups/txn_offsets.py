"""Offsets committed inside a transaction (KIP-98, with KIP-447's fencing), on one offsets
partition.

Owns: ``txn_offset_commit`` (validated as an offset commit is, per partition; the member and
generation, when given, must be the group's current ones, so a zombie of an older generation
is fenced; its records are appended as the producer's transactional batch, and the offsets wait
in ``pending_txn`` until the transaction's marker reaches this partition), ``complete_txn``
(the marker arrived: COMMIT makes the pending offsets the group's committed offsets, ABORT
drops them; the marker itself is already in the log, so this changes memory only). An offset
fetch with ``require_stable`` checks ``pending_txn`` (commits.py). Must not: do I/O, take locks or read clocks.
"""

from __future__ import annotations

from logstore.coordinator import CoordinatorResult, TxnProducer
from logstore.groups.commits import commit_error
from logstore.groups.coordinator import GroupCoordinatorShard, Rows, batch
from logstore.groups.offsets import offset_key, offset_value
from logstore.groups.state import Group
from logstore.messages import error_kw
from logstore.messages.transactions import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnPartitionResult,
)
from logstore.model import OffsetAndMetadata, TopicPartition


def txn_offset_commit(shard: GroupCoordinatorShard, req: TxnOffsetCommitRequest, now_ms: int
                      ) -> CoordinatorResult[TxnOffsetCommitResponse]:
    """Stage the valid offsets of the request in the producer's transaction; one error per
    partition (the whole request fails when the member or generation is wrong)."""
    group = shard.groups.get(req.group_id) or Group(req.group_id, now_ms)
    member = group.check_commit(req.member_id, req.generation_id)
    owned = member.owned() if member is not None and group.protocol_type == "consumer" \
        else None
    results, valid = [], []
    for tp, e in {TopicPartition(e.topic, e.partition): e for e in req.offsets}.items():
        error = commit_error(shard, group, e.offset, e.metadata, tp, owned, req.generation_id)
        results.append(TxnPartitionResult(topic=e.topic, partition=e.partition,
                                          **error_kw(error)))
        if error is None:
            valid.append((tp, OffsetAndMetadata(e.offset, e.metadata, now_ms)))
    response = TxnOffsetCommitResponse(results=results)
    if not valid:
        return CoordinatorResult.answer(response)
    rows: Rows = [(offset_key(req.group_id, tp), offset_value(om)) for tp, om in valid]

    def stage() -> None:
        pending = shard.pending_txn.setdefault(req.producer_id, {})
        pending.setdefault(req.group_id, {}).update(valid)
        known = shard.groups.get(req.group_id)
        if known is not None:
            known.touch(req.member_id, now_ms)
    return CoordinatorResult(batch(rows, now_ms), response, stage,
                             TxnProducer(req.producer_id, req.producer_epoch))


def complete_txn(shard: GroupCoordinatorShard, producer_id: int, committed: bool,
                 now_ms: int) -> CoordinatorResult[int]:
    """The producer's marker is in the log: apply (COMMIT) or drop (ABORT) its pending
    offsets; the response is how many offsets were decided."""
    decided = shard.pending_txn.get(producer_id, {})
    count = sum(len(offsets) for offsets in decided.values())

    def apply() -> None:
        shard.pending_txn.pop(producer_id, None)
        if not committed:
            return
        for group_id, offsets in decided.items():
            if group_id not in shard.groups:
                shard.installer(Group(group_id, now_ms))()
            shard.offsets.setdefault(group_id, {}).update(offsets)
    return CoordinatorResult.answer(count, apply)
