"""The group coordinator on this broker: the pure group handlers (``groups/``) run by the
coordinator runtime over the ``__consumer_offsets`` partitions this broker leads.

Owns: routing a typed group request to its group's partition (``partition_for``; an empty
group id is INVALID_GROUP_ID) and choosing how the runtime runs it: join, leave and delete are
writes that replace the group's state; an offset commit is a write that merges into it (a
transactional one stages offsets under its producer's key, which the marker's completion, an
update, waits for); sync and heartbeat are updates (they never append); offset fetch,
describe and list are reads; a topic deletion is a write on every partition led here, run by
the runtime's thread, never the caller's (``on_topics_deleted``). Join
and sync return the futures of their long polls; every other request returns its typed
response or raises the ApiError of the whole request. Must not: wait on the long polls or
encode responses (``group_handlers.py`` does), or hold group rules (``groups/`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from logstore.broker.coordinator_runtime import CoordinatorRuntime
from logstore.clock import Clock
from logstore.coordinator import CoordinatorLog
from logstore.errors import InvalidGroupIdError
from logstore.groups import commits, membership, txn_offsets
from logstore.groups.coordinator import (
    GroupConfig,
    GroupCoordinatorShard,
    GroupShardLoader,
    describe_group,
    list_groups,
    no_topic_ids,
    tick,
)
from logstore.groups.deleted_topics import delete_topics_offsets
from logstore.groups.offsets import partition_for
from logstore.messages.groups import (
    GroupDescription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
)
from logstore.messages.transactions import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from logstore.model import OFFSETS_TOPIC
from logstore.segments.producer_state import VerificationGuard


@dataclass
class GroupCoordinatorStats:
    """What this coordinator did since it started (read by the metrics endpoint): offsets
    committed, and rebalances completed (one per generation, counted when its leader's join
    is answered)."""

    offset_commits: int = 0
    completed_rebalances: int = 0

    def on_join(self, future: Future[JoinGroupResponse]) -> None:
        if future.exception() is None:
            resp = future.result()
            if not resp.error_code and resp.member_id and resp.member_id == resp.leader:
                self.completed_rebalances += 1


class GroupCoordinatorService:
    """Thread-safe: the runtime serializes what must be."""

    def __init__(self, offsets_log: CoordinatorLog, config: GroupConfig, clock: Clock, *,
                 topic_id_of: Callable[[str], str | None] = no_topic_ids) -> None:
        """``topic_id_of``: a topic's current id as this broker's metadata has it (None: a
        topic it does not know, perhaps not yet); recorded with a commit that brings no id,
        and offset fetch hides an offset recorded under another id than the current one."""
        self.config = config
        self.stats = GroupCoordinatorStats()
        self.runtime: CoordinatorRuntime[GroupCoordinatorShard] = CoordinatorRuntime(
            OFFSETS_TOPIC, offsets_log, GroupShardLoader(config, topic_id_of), clock)

    def partition(self, group_id: str) -> int:
        if not group_id:
            raise InvalidGroupIdError("group id must be a non-empty string")
        return partition_for(group_id, self.runtime.num_partitions())

    # -- membership --------------------------------------------------------------------------

    def join_group(self, req: JoinGroupRequest) -> Future[JoinGroupResponse]:
        joined: Future[JoinGroupResponse] = self.runtime.write(
            self.partition(req.group_id), req.group_id,
            lambda shard, now: membership.join_group(shard, req, now))
        joined.add_done_callback(self.stats.on_join)
        return joined

    def sync_group(self, req: SyncGroupRequest) -> Future[Any]:
        return self.runtime.update(self.partition(req.group_id), req.group_id,
                                   lambda shard, now: membership.sync_group(shard, req, now))

    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return self.runtime.update(self.partition(req.group_id), req.group_id,
                                   lambda shard, now: membership.heartbeat(shard, req, now))

    def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        return self.runtime.write(self.partition(req.group_id), req.group_id,
                                  lambda shard, now: membership.leave_group(shard, req, now))

    # -- offsets -----------------------------------------------------------------------------

    def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        resp: OffsetCommitResponse = self.runtime.write(
            self.partition(req.group_id), req.group_id,
            lambda shard, now: commits.offset_commit(shard, req, now), exclusive=False)
        self.stats.offset_commits += sum(1 for o in resp.offsets if not o.error_code)
        return resp

    def txn_offset_commit(self, req: TxnOffsetCommitRequest, verify: bool = False,
                          guard: VerificationGuard | None = None) -> TxnOffsetCommitResponse:
        """Offsets staged in the producer's transaction. Written under the producer's key, so
        its marker's completion (``complete_txn``) waits until they are applied. With
        ``verify``, the batch must join the producer's transaction open on the offsets
        partition or carry ``guard``, the partition leader's verification with the
        transaction coordinator, still valid when it lands (else TRANSACTION_ABORTABLE and
        nothing is staged)."""
        return self.runtime.write(self.partition(req.group_id), ("txn", req.producer_id),
                                  lambda shard, now: txn_offsets.txn_offset_commit(
                                      shard, req, now), verify=verify, guard=guard)

    def complete_txn(self, partition: int, producer_id: int, committed: bool,
                     marker_offset: int) -> int:
        """A marker of ``producer_id`` is at ``marker_offset`` in ``partition``'s log: apply
        or drop the offsets it staged before the marker; how many were decided."""
        return self.runtime.update(partition, ("txn", producer_id),
                                   lambda shard, now: txn_offsets.complete_txn(
                                       shard, producer_id, committed, marker_offset, now))

    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return self.runtime.read(self.partition(req.group_id),
                                 lambda shard: commits.offset_fetch(shard, req))

    # -- admin -------------------------------------------------------------------------------

    def list_groups(self) -> ListGroupsResponse:
        return ListGroupsResponse(groups=self.runtime.read_all(list_groups))

    def describe_group(self, group_id: str) -> GroupDescription:
        return self.runtime.read(self.partition(group_id),
                                 lambda shard: describe_group(shard, group_id))

    def delete_group(self, group_id: str) -> None:
        self.runtime.write(self.partition(group_id), group_id,
                           lambda shard, now: commits.delete_group(shard, group_id, now))

    # -- topics ------------------------------------------------------------------------------

    def on_topics_deleted(self, topics: Mapping[str, str]) -> None:
        """``topics`` (name -> id of the incarnation deleted) are gone: tombstone their
        committed offsets on every offsets partition this broker leads. Never waits: the
        runtime appends them on a thread of its own (``delete_topics_offsets``)."""
        self.delete_topics_offsets(topics)

    def delete_topics_offsets(self, topics: Mapping[str, str]) -> Future[dict[int, int]]:
        """As ``on_topics_deleted``; the future of how many offsets each partition
        tombstoned (tests wait on it)."""
        deleted = dict(topics)
        return self.runtime.write_each(
            lambda shard, now: delete_topics_offsets(shard, deleted, now), "topic-deletion")

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> list[Future[None]]:
        """Session expiry, delayed joins and offset expiry on every loaded partition; the
        futures of the appends it started."""
        return self.runtime.tick(tick)
