"""Messages between brokers and the controller: leader_and_isr, alter_isr,
controlled_shutdown, offsets_for_leader_epoch.

Owns: the declaration of these requests and responses. Must not: do I/O.
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
