"""Handlers of the membership API of one offsets partition: join, sync, heartbeat, leave.

Owns: turning each typed request into a change of a copy of its group (``groups/state.py``
holds the rules) and the ``CoordinatorResult`` that installs it: a join or leave that ends a
generation carries the group record to append first; sync and heartbeat never append (the
group record holds no assignment). Join and sync answer with futures, which the state machine
resolves when the rebalance reaches them, and only once the change that resolves them is
installed. Must not: do I/O, take locks or read clocks.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from logstore.coordinator import CoordinatorResult
from logstore.errors import InvalidSessionTimeoutError
from logstore.groups.coordinator import GroupCoordinatorShard
from logstore.messages import error_kw
from logstore.messages.groups import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
)


def join_group(shard: GroupCoordinatorShard, req: JoinGroupRequest, now_ms: int
               ) -> CoordinatorResult[Future[JoinGroupResponse]]:
    """Join (or rejoin) a group, creating it if need be; the future completes when the
    rebalance does."""
    cfg = shard.config
    if not cfg.group_min_session_timeout_ms <= req.session_timeout_ms \
            <= cfg.group_max_session_timeout_ms:
        raise InvalidSessionTimeoutError(
            f"group {req.group_id!r}: session_timeout_ms {req.session_timeout_ms} is outside "
            f"[{cfg.group_min_session_timeout_ms}, {cfg.group_max_session_timeout_ms}]")
    draft = shard.draft(req.group_id, now_ms, create=True)
    future = draft.join(req.member_id, req.group_instance_id, req.client_id,
                        req.session_timeout_ms,
                        max(req.rebalance_timeout_ms, req.session_timeout_ms),
                        req.protocol_type, [(p.name, p.metadata) for p in req.protocols],
                        now_ms, cfg.group_initial_rebalance_delay_ms)
    return shard.changed(draft, now_ms, future)


def sync_group(shard: GroupCoordinatorShard, req: SyncGroupRequest, now_ms: int
               ) -> CoordinatorResult[Future[Any]]:
    """The leader hands out assignments; every member's future completes with its own."""
    draft = shard.draft(req.group_id, now_ms)
    future = draft.sync(req.member_id, req.generation_id, req.assignments,
                        req.group_instance_id)
    return shard.changed(draft, now_ms, future)


def heartbeat(shard: GroupCoordinatorShard, req: HeartbeatRequest, now_ms: int
              ) -> CoordinatorResult[HeartbeatResponse]:
    draft = shard.draft(req.group_id, now_ms)
    error = draft.heartbeat(req.member_id, req.generation_id, now_ms, req.group_instance_id)
    return shard.changed(draft, now_ms, HeartbeatResponse(**error_kw(error)))


def leave_group(shard: GroupCoordinatorShard, req: LeaveGroupRequest, now_ms: int
                ) -> CoordinatorResult[LeaveGroupResponse]:
    draft = shard.draft(req.group_id, now_ms)
    draft.leave(req.member_id, req.group_instance_id, now_ms)
    return shard.changed(draft, now_ms, LeaveGroupResponse())
