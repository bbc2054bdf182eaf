"""Messages of consumer groups: find_coordinator, join/sync/heartbeat/leave, offset
commit/fetch, list/describe/delete groups.

Owns: the declaration of these requests and responses, and of the consumer protocol's payloads.
The member metadata a member sends in ``join_group`` and the assignment the leader sends in
``sync_group`` belong to the group's protocol type, so they travel as any JSON value; for
``"consumer"`` groups they are ``ConsumerProtocolSubscription`` and
``ConsumerProtocolAssignment`` (the broker reads only an assignment's ``partitions``, to refuse
commits of partitions a member does not own). Must not: do I/O or hold group rules (``groups/``
does).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from logstore.messages.base import (
    ErrorFields,
    Int32,
    Int64,
    Message,
    PartitionId,
    Request,
    TimeoutMs,
)

# -- coordinator lookup ----------------------------------------------------------------------

# FindCoordinator's key types, Kafka's numbers: a group id, or a transactional id.
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KeyType = Annotated[int, msgspec.Meta(ge=KEY_TYPE_GROUP, le=KEY_TYPE_TRANSACTION)]


class FindCoordinatorResponse(ErrorFields, frozen=True, kw_only=True):
    node_id: int = -1
    host: str = ""
    port: int = -1
    partition: int = -1  # the partition of the internal topic that holds the key's state


class FindCoordinatorRequest(Request[FindCoordinatorResponse], frozen=True, kw_only=True,
                             tag=0):
    """The broker coordinating a key: with ``key_type`` GROUP (0) the group ``group_id``, the
    leader of its ``__consumer_offsets`` partition; with TRANSACTION (1) the transactional id
    ``group_id``, the leader of its ``__transaction_state`` partition."""

    ACTION: ClassVar[str] = "find_coordinator"
    RESPONSE: ClassVar[type[Message]] = FindCoordinatorResponse
    group_id: str  # the key: a group id or a transactional id, as key_type says
    key_type: KeyType = KEY_TYPE_GROUP


# -- membership ------------------------------------------------------------------------------


class ConsumerProtocolSubscription(Message, frozen=True, kw_only=True):
    """A consumer's member metadata: the topics it subscribes to and the partitions it owns
    (cooperative assignors keep them where they can)."""

    topics: list[str]
    owned: list[tuple[str, PartitionId]] = []


class ConsumerProtocolAssignment(Message, frozen=True, kw_only=True):
    """The partitions the leader assigns one consumer."""

    partitions: list[tuple[str, PartitionId]] = []


class GroupProtocol(Message, frozen=True, kw_only=True):
    name: str
    metadata: Any = None


class JoinGroupMember(Message, frozen=True, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    metadata: Any = None


class JoinGroupResponse(ErrorFields, frozen=True, kw_only=True):
    generation_id: int = -1
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[JoinGroupMember] = []  # the leader's view only


class JoinGroupRequest(Request[JoinGroupResponse], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "join_group"
    RESPONSE: ClassVar[type[Message]] = JoinGroupResponse
    group_id: str
    member_id: str = ""
    group_instance_id: str | None = None
    client_id: str = ""
    session_timeout_ms: TimeoutMs
    rebalance_timeout_ms: TimeoutMs = 300_000
    protocol_type: str = "consumer"
    protocols: list[GroupProtocol]


class SyncGroupResponse(ErrorFields, frozen=True, kw_only=True):
    assignment: Any = None


class SyncGroupRequest(Request[SyncGroupResponse], frozen=True, kw_only=True, tag=0):
    """The leader sends every member's assignment; the others wait for theirs."""

    ACTION: ClassVar[str] = "sync_group"
    RESPONSE: ClassVar[type[Message]] = SyncGroupResponse
    group_id: str
    member_id: str
    generation_id: Int32
    assignments: dict[str, Any] | None = None
    timeout_ms: TimeoutMs = 300_000
    group_instance_id: str | None = None  # a static member's: FENCED_INSTANCE_ID once replaced


class HeartbeatResponse(ErrorFields, frozen=True, kw_only=True):
    pass


class HeartbeatRequest(Request[HeartbeatResponse], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "heartbeat"
    RESPONSE: ClassVar[type[Message]] = HeartbeatResponse
    group_id: str
    member_id: str
    generation_id: Int32
    group_instance_id: str | None = None  # a static member's: FENCED_INSTANCE_ID once replaced


class LeaveGroupResponse(ErrorFields, frozen=True, kw_only=True):
    pass


class LeaveGroupRequest(Request[LeaveGroupResponse], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "leave_group"
    RESPONSE: ClassVar[type[Message]] = LeaveGroupResponse
    group_id: str
    member_id: str = ""
    group_instance_id: str | None = None


# -- offsets ---------------------------------------------------------------------------------


class OffsetCommitEntry(Message, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId
    offset: Int64  # negative is OFFSET_OUT_OF_RANGE for that partition
    metadata: str = ""
    # The id of the topic the offset is for (its metadata's ``topic_id``), recorded with it
    # so the offsets of a deleted topic are told from those of one recreated under its name;
    # None (a client that does not send it): the coordinator's current id of the topic.
    topic_id: str | None = None


class OffsetCommitResult(ErrorFields, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId


class OffsetCommitResponse(ErrorFields, frozen=True, kw_only=True):
    offsets: list[OffsetCommitResult] = []


class OffsetCommitRequest(Request[OffsetCommitResponse], frozen=True, kw_only=True, tag=0):
    """Commit offsets as a member of a generation (``member_id`` "" and ``generation_id`` -1:
    as an admin, allowed only while the group has no members)."""

    ACTION: ClassVar[str] = "offset_commit"
    RESPONSE: ClassVar[type[Message]] = OffsetCommitResponse
    group_id: str
    member_id: str = ""
    generation_id: Int32 = -1
    offsets: list[OffsetCommitEntry]
    group_instance_id: str | None = None  # a static member's: FENCED_INSTANCE_ID once replaced


class GroupPartition(Message, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId


class CommittedOffset(Message, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1


class OffsetFetchResponse(ErrorFields, frozen=True, kw_only=True):
    offsets: list[CommittedOffset] = []


class OffsetFetchRequest(Request[OffsetFetchResponse], frozen=True, kw_only=True, tag=0):
    """A group's committed offsets (all of them when ``partitions`` is None). With
    ``require_stable`` (KIP-447), UNSTABLE_OFFSET_COMMIT while transactional offsets of an
    asked partition are pending, so a read_committed consumer never starts from an offset its
    predecessor's open transaction is about to replace."""

    ACTION: ClassVar[str] = "offset_fetch"
    RESPONSE: ClassVar[type[Message]] = OffsetFetchResponse
    group_id: str
    partitions: list[GroupPartition] | None = None
    require_stable: bool = False


# -- administration --------------------------------------------------------------------------


class GroupListing(Message, frozen=True, kw_only=True):
    group_id: str
    state: str
    protocol_type: str


class ListGroupsResponse(ErrorFields, frozen=True, kw_only=True):
    groups: list[GroupListing] = []


class ListGroupsRequest(Request[ListGroupsResponse], frozen=True, kw_only=True, tag=0):
    """The groups this broker coordinates."""

    ACTION: ClassVar[str] = "list_groups"
    RESPONSE: ClassVar[type[Message]] = ListGroupsResponse


class MemberDescription(Message, frozen=True, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    assignment: Any = None


class GroupDescription(ErrorFields, frozen=True, kw_only=True):
    group_id: str
    state: str = ""
    protocol_type: str = ""
    protocol: str = ""
    generation_id: int = -1
    leader: str = ""
    members: list[MemberDescription] = []


class DescribeGroupsResponse(Message, frozen=True, kw_only=True):
    groups: list[GroupDescription]


class DescribeGroupsRequest(Request[DescribeGroupsResponse], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "describe_groups"
    RESPONSE: ClassVar[type[Message]] = DescribeGroupsResponse
    group_ids: list[str]


class GroupResult(ErrorFields, frozen=True, kw_only=True):
    group_id: str


class DeleteGroupsResponse(Message, frozen=True, kw_only=True):
    groups: list[GroupResult]


class DeleteGroupsRequest(Request[DeleteGroupsResponse], frozen=True, kw_only=True, tag=0):
    """Delete empty groups and their offsets (NON_EMPTY_GROUP while a group has members)."""

    ACTION: ClassVar[str] = "delete_groups"
    RESPONSE: ClassVar[type[Message]] = DeleteGroupsResponse
    group_ids: list[str]
