"""Handlers of the offsets API of one offsets partition: offset commit and fetch, delete group.

Owns: validating a commit per partition (one bad partition never fails the others: a negative
offset is OFFSET_OUT_OF_RANGE, over-long metadata INVALID_COMMIT_OFFSET_SIZE, a partition the
member is not assigned ILLEGAL_GENERATION, except, in a cooperative group, one the last
assignment took from it and gives to no one before the next), the offset records it appends
(each with the id of the topic it is for: the entry's, else the coordinator's current one)
and the change that merges them into memory once durable, with their position in the log (a
merge, not a replacement of the group, so a commit in flight does not hold up the group's
heartbeats; the position lets a transaction's older offsets, decided later, lose to it);
reading committed offsets (not those recorded for an earlier incarnation of their topic;
with ``require_stable``, UNSTABLE_OFFSET_COMMIT while offsets a transaction committed for
them are pending); deleting an empty group with tombstones, for the offsets open
transactions staged too. Must not: do I/O, take locks or read clocks.
"""

from __future__ import annotations

from logstore.coordinator import CoordinatorResult
from logstore.errors import (
    ApiError,
    IllegalGenerationError,
    InvalidCommitOffsetSizeError,
    NonEmptyGroupError,
    OffsetOutOfRangeError,
    UnknownTopicIdError,
    UnstableOffsetCommitError,
)
from logstore.groups.assignors import COOPERATIVE, REBALANCE_PROTOCOL
from logstore.groups.coordinator import GroupCoordinatorShard, Rows, batch
from logstore.groups.offsets import StoredOffset, offset_key, offset_value
from logstore.groups.state import Group, Member
from logstore.messages import error_kw
from logstore.messages.groups import (
    CommittedOffset,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResult,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from logstore.model import TopicPartition


def offset_commit(shard: GroupCoordinatorShard, req: OffsetCommitRequest, now_ms: int
                  ) -> CoordinatorResult[OffsetCommitResponse]:
    """Commit what is valid; one error per partition (the whole request fails only when the
    member or generation is wrong). A partition given twice counts once, as its last entry. A
    commit to a group that does not exist creates it."""
    existing = shard.groups.get(req.group_id)
    group = existing or Group(req.group_id, now_ms)
    member = group.check_commit(req.member_id, req.generation_id, req.group_instance_id)
    owned = committable(group, member)
    entries = {TopicPartition(e.topic, e.partition): e for e in req.offsets}
    ids = shard.topic_ids(tp.topic for tp in entries)
    results, valid = [], []
    for tp, e in entries.items():
        error = commit_error(shard, group, e.offset, e.metadata, tp, owned, req.generation_id,
                             e.topic_id, ids[tp.topic])
        results.append(OffsetCommitResult(topic=e.topic, partition=e.partition,
                                          **error_kw(error)))
        if error is None:
            valid.append((tp, StoredOffset(e.offset, e.metadata, now_ms,
                                           e.topic_id or ids[tp.topic])))
    response = OffsetCommitResponse(offsets=results)
    if not valid:
        return CoordinatorResult.answer(
            response, lambda: existing.touch(req.member_id, now_ms) if existing else None)
    rows: Rows = [(offset_key(req.group_id, tp), offset_value(om)) for tp, om in valid]
    if existing is None:
        rows += shard.generation_rows(group)

    def merge(position: int) -> None:
        if existing is None:
            shard.installer(group)()
        shard.committed.commit(req.group_id, dict(valid), position)
        shard.group(req.group_id).touch(req.member_id, now_ms)
    return CoordinatorResult(batch(rows, now_ms), response, apply_at=merge)


def committable(group: Group, member: Member | None) -> set[TopicPartition] | None:
    """The partitions ``member`` may commit (None: any, for an admin commit or a group that
    is not a consumer group): its assignment, and in a cooperative group what the last
    assignment took from it (its revoke listener commits them at this generation)."""
    if member is None or group.protocol_type != "consumer":
        return None
    owned = member.owned()
    if REBALANCE_PROTOCOL.get(group.protocol or "") == COOPERATIVE:
        owned |= member.revoking
    return owned


def commit_error(shard: GroupCoordinatorShard, group: Group, offset: int, metadata: str,
                 tp: TopicPartition, owned: set[TopicPartition] | None, generation_id: int,
                 topic_id: str | None = None, current_id: str | None = None
                 ) -> ApiError | None:
    """Why one partition's offset cannot be committed, None if it can. ``topic_id``: the id
    the client committed for; ``current_id``: the topic's id here now (None: unknown)."""
    if topic_id is not None and current_id is not None and topic_id != current_id:
        # Stored, the offset would be hidden at once (offset fetch shows only the current
        # id's): acknowledging it would lose the commit silently.
        return UnknownTopicIdError(
            f"group {group.group_id}: {tp}: the offset was committed for topic id {topic_id}, "
            f"but {tp.topic!r} is now topic id {current_id} (deleted and created again); "
            "refresh the metadata")
    if offset < 0:
        return OffsetOutOfRangeError(f"group {group.group_id}: {tp}: a committed offset "
                                     f"must be >= 0, got {offset}")
    limit = shard.config.offset_metadata_max_bytes
    if len(metadata.encode()) > limit:
        return InvalidCommitOffsetSizeError(
            f"group {group.group_id}: {tp}: metadata is longer than {limit} bytes")
    if owned is not None and tp not in owned:
        return IllegalGenerationError(
            f"group {group.group_id}: {tp} is not assigned to this member in generation "
            f"{generation_id}")
    return None


def offset_fetch(shard: GroupCoordinatorShard, req: OffsetFetchRequest) -> OffsetFetchResponse:
    """The group's committed offsets (those asked for, or all), as its log has them; with
    ``require_stable``, UNSTABLE_OFFSET_COMMIT while a transaction's offsets for one of them
    are pending."""
    if req.require_stable:
        check_stable(shard, req.group_id, None if req.partitions is None else [
            TopicPartition(p.topic, p.partition) for p in req.partitions])
    committed = shard.visible_offsets(req.group_id)
    if req.partitions is None:
        found = dict(committed)
    else:
        wanted = (TopicPartition(p.topic, p.partition) for p in req.partitions)
        found = {tp: committed[tp] for tp in wanted if tp in committed}
    return OffsetFetchResponse(offsets=[
        CommittedOffset(topic=tp.topic, partition=tp.partition, offset=om.offset,
                        metadata=om.metadata, commit_timestamp=om.commit_timestamp)
        for tp, om in sorted(found.items())])


def check_stable(shard: GroupCoordinatorShard, group_id: str,
                 partitions: list[TopicPartition] | None) -> None:
    """UNSTABLE_OFFSET_COMMIT when a transaction's offsets for one of ``partitions`` (any of
    the group's when None) are pending."""
    for producer_id, batches in shard.pending_txn.items():
        pending = [tp for groups in batches.values() for tp in groups.get(group_id, {})]
        hit = next((tp for tp in pending if partitions is None or tp in partitions), None)
        if hit is not None:
            raise UnstableOffsetCommitError(
                f"group {group_id}: {hit} has offsets pending in the transaction of producer "
                f"{producer_id}; retry once it is decided")


def delete_group(shard: GroupCoordinatorShard, group_id: str, now_ms: int
                 ) -> CoordinatorResult[None]:
    """Tombstones for an empty group and all its offsets (NON_EMPTY_GROUP while it has
    members)."""
    group = shard.group(group_id)
    if group.members:
        raise NonEmptyGroupError(f"group {group_id!r} has {len(group.members)} active "
                                 "member(s); it can only be deleted when empty")
    rows, delete = shard.deletion(group_id, sorted(
        shard.offsets.get(group_id, {}).keys() | shard.committed.staged_keys(group_id)))
    return CoordinatorResult(batch(rows, now_ms), None, delete)
