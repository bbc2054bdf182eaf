"""Typed handlers of the group protocol, and the coordinator's access to the offsets log.

Owns: the Routes of find_coordinator, join_group, sync_group, heartbeat, leave_group,
offset_commit, offset_fetch, list_groups, describe_groups and delete_groups, each taking its
typed request (``messages/groups.py``) and answering its typed response, with an error code per
entry (one bad partition or group never fails the others); creating ``__consumer_offsets`` on
first use (compacted; ``offsets_topic_num_partitions``; replication factor
``offsets_topic_replication_factor`` capped to the live brokers, see coordinator_log.py); and
``ReplicaOffsetsLog``, the ``CoordinatorLog`` seam over its partitions. find_coordinator with
key_type TRANSACTION is answered by the transaction coordinator's lookup. The join and sync "long polls" wait here on the coordinator's futures. Must not: hold
group state (``group_coordinator.py`` and ``groups/`` do) or touch the transport.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from logstore.broker import acl_rules as rules
from logstore.broker.coordinator_log import (
    InternalTopic,
    InternalTopicSpec,
    ReplicaCoordinatorLog,
)
from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.store import MetadataStore
from logstore.controller.topics import TopicController
from logstore.errors import (
    ApiError,
    CoordinatorNotAvailableError,
    RebalanceInProgressError,
    UnknownServerError,
)
from logstore.groups.offsets import partition_for
from logstore.messages import ErrorFields, Route, error_kw
from logstore.messages.groups import (
    KEY_TYPE_TRANSACTION,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupDescription,
    GroupResult,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from logstore.model import OFFSETS_TOPIC

log = logging.getLogger(__name__)

WAIT_SLACK_S = 5.0

E = TypeVar("E", bound=ErrorFields)
T = TypeVar("T")


class ReplicaOffsetsLog(ReplicaCoordinatorLog):
    """``CoordinatorLog`` over the partitions of ``__consumer_offsets`` this broker hosts."""

    def __init__(self, replicas: ReplicaManager, store: MetadataStore) -> None:
        super().__init__(replicas, store, OFFSETS_TOPIC)


class GroupHandlers:
    def __init__(self, coordinator: GroupCoordinatorService, store: MetadataStore,
                 controller: TopicController, num_partitions: int,
                 replication_factor: int, segment_bytes: int) -> None:
        self.coordinator = coordinator
        self.offsets_topic = InternalTopic(store, controller, InternalTopicSpec(
            OFFSETS_TOPIC, num_partitions, replication_factor, segment_bytes))
        # find_coordinator with key_type TRANSACTION: set by the broker when it runs a
        # transaction coordinator.
        self.transaction_lookup: Callable[[str], FindCoordinatorResponse] | None = None

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(FindCoordinatorRequest, self.find_coordinator, rules.FIND_COORDINATOR),
                Route(JoinGroupRequest, self.join_group, rules.GROUP_MEMBERSHIP),
                Route(SyncGroupRequest, self.sync_group, rules.GROUP_MEMBERSHIP),
                Route(HeartbeatRequest, self.heartbeat, rules.GROUP_MEMBERSHIP),
                Route(LeaveGroupRequest, self.leave_group, rules.GROUP_MEMBERSHIP),
                Route(OffsetCommitRequest, self.offset_commit, rules.OFFSET_COMMIT),
                Route(OffsetFetchRequest, self.offset_fetch, rules.OFFSET_FETCH),
                Route(ListGroupsRequest, self.list_groups, rules.LIST_GROUPS),
                Route(DescribeGroupsRequest, self.describe_groups, rules.DESCRIBE_GROUPS),
                Route(DeleteGroupsRequest, self.delete_groups, rules.DELETE_GROUPS)]

    # -- coordinator lookup ------------------------------------------------------------------

    def find_coordinator(self, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
        return _answer(FindCoordinatorResponse, lambda: self._find(req))

    def _find(self, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
        if req.key_type == KEY_TYPE_TRANSACTION:
            if self.transaction_lookup is None:
                raise CoordinatorNotAvailableError("this broker runs no transaction coordinator")
            return self.transaction_lookup(req.group_id)
        return self.offsets_topic.coordinator(req.group_id, partition_for)

    def ensure_offsets_topic(self) -> int:
        """The partition count of ``__consumer_offsets``, created first if need be."""
        return self.offsets_topic.ensure()

    # -- membership --------------------------------------------------------------------------

    def join_group(self, req: JoinGroupRequest) -> JoinGroupResponse:
        return _answer(JoinGroupResponse, lambda: _wait(self.coordinator.join_group(req),
                                                        req.rebalance_timeout_ms))

    def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        return _answer(SyncGroupResponse, lambda: SyncGroupResponse(
            assignment=_wait(self.coordinator.sync_group(req), req.timeout_ms)))

    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return _answer(HeartbeatResponse, lambda: self.coordinator.heartbeat(req))

    def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        return _answer(LeaveGroupResponse, lambda: self.coordinator.leave_group(req))

    # -- offsets -----------------------------------------------------------------------------

    def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return _answer(OffsetCommitResponse, lambda: self.coordinator.offset_commit(req))

    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return _answer(OffsetFetchResponse, lambda: self.coordinator.offset_fetch(req))

    # -- admin -------------------------------------------------------------------------------

    def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        return _answer(ListGroupsResponse, self.coordinator.list_groups)

    def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return DescribeGroupsResponse(groups=[self._describe(g) for g in req.group_ids])

    def _describe(self, group_id: str) -> GroupDescription:
        return _answer(GroupDescription, lambda: self.coordinator.describe_group(group_id),
                       group_id=group_id)

    def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        return DeleteGroupsResponse(groups=[self._delete(g) for g in req.group_ids])

    def _delete(self, group_id: str) -> GroupResult:
        def delete() -> GroupResult:
            self.coordinator.delete_group(group_id)
            return GroupResult(group_id=group_id)
        return _answer(GroupResult, delete, group_id=group_id)


def _wait(future: Future[T], timeout_ms: int) -> T:
    try:
        return future.result(timeout=max(timeout_ms / 1000.0 + WAIT_SLACK_S, 0.0))
    except FutureTimeout:
        raise RebalanceInProgressError("the rebalance did not complete in time; rejoin") \
            from None


def _answer(response_type: type[E], fn: Callable[[], E], **fields: Any) -> E:
    """``fn``'s response; an ApiError becomes this entry's code (``fields`` fill the entry's
    required fields)."""
    try:
        return fn()
    except ApiError as e:
        return response_type(**fields, **error_kw(e))
    except Exception as e:  # boundary: report, never crash the broker
        log.exception("group request failed")
        return response_type(**fields, **error_kw(UnknownServerError(f"{type(e).__name__}: {e}")))
