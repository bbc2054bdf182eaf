"""Messages between brokers and the controller: leader_and_isr, alter_isr,
controlled_shutdown, offsets_for_leader_epoch, leader_epochs.

Owns: the declaration of these requests and responses. Topic ids (KIP-516): a leader_and_isr
state carries the id of the topic incarnation it is for, and a follower's epoch requests the id
of its replica, so that neither side applies or answers for another incarnation of a topic
deleted and created again under its name (INCONSISTENT_TOPIC_ID). The fields are optional
(None: unchecked), so peers of either version read each other. Must not: do I/O.
"""

from __future__ import annotations

from typing import ClassVar

from logstore.messages.base import (
    BrokerId,
    ErrorFields,
    Int32,
    LeaderEpoch,
    Message,
    PartitionId,
    Request,
)

# -- leader_and_isr --------------------------------------------------------------------------


class LeaderAndIsrPartition(Message, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId
    leader: BrokerId
    leader_epoch: LeaderEpoch
    isr: list[int]
    controller_epoch: Int32 = 0
    replicas: list[int]
    # The topic id the controller decided this state for (None: from a controller that
    # predates the field, unchecked). A broker whose metadata gives the topic another id
    # ignores the state (INCONSISTENT_TOPIC_ID): it is of another incarnation of the topic.
    topic_id: str | None = None


class PartitionResult(ErrorFields, frozen=True, kw_only=True):
    topic: str
    partition: PartitionId


class LeaderAndIsrResponse(Message, frozen=True, kw_only=True):
    partitions: list[PartitionResult]


class LeaderAndIsrRequest(Request[LeaderAndIsrResponse], frozen=True, kw_only=True, tag=0):
    """The controller's word on partitions the receiving broker hosts."""

    ACTION: ClassVar[str] = "leader_and_isr"
    RESPONSE: ClassVar[type[Message]] = LeaderAndIsrResponse
    controller_id: BrokerId = -1
    controller_epoch: Int32
    partitions: list[LeaderAndIsrPartition]


# -- alter_isr -------------------------------------------------------------------------------


class AlterIsrResponse(ErrorFields, frozen=True, kw_only=True):
    leader_epoch: int = -1
    isr: list[int] = []


class AlterIsrRequest(Request[AlterIsrResponse], frozen=True, kw_only=True, tag=0):
    """A leader's proposal of a new ISR, answered by the controller."""

    ACTION: ClassVar[str] = "alter_isr"
    RESPONSE: ClassVar[type[Message]] = AlterIsrResponse
    broker_id: BrokerId
    topic: str
    partition: PartitionId
    leader_epoch: LeaderEpoch
    isr: list[int]
    # The topic id of the leader's replica (None: unchecked, from a leader that predates the
    # field): a leader still holding a deleted topic's replica must not change the ISR of the
    # topic created again under its name, both at leader epoch 0 (INCONSISTENT_TOPIC_ID).
    topic_id: str | None = None


# -- controlled_shutdown ---------------------------------------------------------------------


class ControlledShutdownResponse(ErrorFields, frozen=True, kw_only=True):
    remaining: list[str] = []  # partitions ("topic-p") the broker still leads


class ControlledShutdownRequest(Request[ControlledShutdownResponse], frozen=True,
                                kw_only=True, tag=0):
    """A stopping broker asks the controller to move its leaderships away."""

    ACTION: ClassVar[str] = "controlled_shutdown"
    RESPONSE: ClassVar[type[Message]] = ControlledShutdownResponse
    broker_id: BrokerId


# -- offsets_for_leader_epoch ----------------------------------------------------------------


class EpochRequestPartition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    leader_epoch: LeaderEpoch
    current_leader_epoch: LeaderEpoch = -1
    # The follower replica's topic id (None: unchecked): another incarnation's epochs say
    # nothing of this one's, as both start at epoch 0 (INCONSISTENT_TOPIC_ID).
    topic_id: str | None = None


class EpochEndOffset(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    leader_epoch: int = -1
    end_offset: int = -1


class OffsetsForLeaderEpochResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[EpochEndOffset]


class OffsetsForLeaderEpochRequest(Request[OffsetsForLeaderEpochResponse], frozen=True,
                                   kw_only=True, tag=0):
    """Where an epoch ends in the leader's log: a recovering follower truncates to it."""

    ACTION: ClassVar[str] = "offsets_for_leader_epoch"
    RESPONSE: ClassVar[type[Message]] = OffsetsForLeaderEpochResponse
    topic: str
    partitions: list[EpochRequestPartition]


# -- leader_epochs ---------------------------------------------------------------------------


class LeaderEpochsPartition(Message, frozen=True, kw_only=True):
    partition: PartitionId
    current_leader_epoch: LeaderEpoch = -1
    topic_id: str | None = None  # the follower replica's, as in EpochRequestPartition


class EpochStart(Message, frozen=True, kw_only=True):
    leader_epoch: int
    start_offset: int


class LeaderEpochsResult(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    entries: list[EpochStart] = []


class LeaderEpochsResponse(Message, frozen=True, kw_only=True):
    topic: str
    partitions: list[LeaderEpochsResult]


class LeaderEpochsRequest(Request[LeaderEpochsResponse], frozen=True, kw_only=True, tag=0):
    """The leader's whole leader-epoch cache: a follower that restarts its log at the leader's
    local log start offset (OFFSET_MOVED_TO_TIERED_STORAGE) rebuilds its own from it."""

    ACTION: ClassVar[str] = "leader_epochs"
    RESPONSE: ClassVar[type[Message]] = LeaderEpochsResponse
    topic: str
    partitions: list[LeaderEpochsPartition]
