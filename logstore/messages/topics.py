"""Messages of cluster and topic metadata: metadata, create/delete topics, create partitions,
describe/alter configs.

Owns: the declaration of these requests and responses (fields, types, versions). Must not: do
I/O or hold rules about topics (the controller does).
"""

from __future__ import annotations

from typing import Any, ClassVar

from logstore.messages.base import (
    BrokerId,
    ErrorFields,
    LeaderEpoch,
    Message,
    PartitionId,
    Request,
)

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # TopicConfig's default

# -- metadata -------------------------------------------------------------------------------


class BrokerMetadata(Message, frozen=True, kw_only=True):
    broker_id: BrokerId
    host: str
    port: int
    rack: str | None = None


class PartitionMetadata(ErrorFields, frozen=True, kw_only=True):
    partition: PartitionId
    leader: BrokerId
    leader_epoch: LeaderEpoch
    replicas: list[int]
    isr: list[int]


class TopicMetadata(ErrorFields, frozen=True, kw_only=True):
    name: str
    internal: bool = False
    value_schema: str | None = None  # records.encode_schema of a typed topic's value schema
    partitions: list[PartitionMetadata] = []
    # What producers need to cut batches the leaders accept (client/pieces.py); the defaults
    # are the broker's defaults, for an answer that does not carry them.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    compression_type: str = "none"
    # Tells the topic from an earlier one of the same name (None: an older broker's answer).
    topic_id: str | None = None


class MetadataResponse(Message, frozen=True, kw_only=True):
    brokers: list[BrokerMetadata]
    controller_id: int | None
    topics: list[TopicMetadata]


class MetadataRequest(Request[MetadataResponse], frozen=True, kw_only=True, tag=0):
    """The brokers, the controller, and the named topics (all topics when ``topics`` is
    None, none when it is empty)."""

    ACTION: ClassVar[str] = "metadata"
    RESPONSE: ClassVar[type[Message]] = MetadataResponse
    topics: list[str] | None = None


# -- topic administration --------------------------------------------------------------------


class TopicResult(ErrorFields, frozen=True, kw_only=True):
    """The outcome for one topic of a topic request."""

    name: str


class TopicResults(Message, frozen=True, kw_only=True):
    topics: list[TopicResult]


class CreatableTopic(Message, frozen=True, kw_only=True):
    name: str
    num_partitions: int  # range rules are the controller's: INVALID_PARTITIONS, not a parse error
    replication_factor: int = 1
    config: dict[str, Any] = {}
    value_schema: str | None = None


class CreateTopicsRequest(Request[TopicResults], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "create_topics"
    RESPONSE: ClassVar[type[Message]] = TopicResults
    topics: list[CreatableTopic]


class DeleteTopicsRequest(Request[TopicResults], frozen=True, kw_only=True, tag=0):
    ACTION: ClassVar[str] = "delete_topics"
    RESPONSE: ClassVar[type[Message]] = TopicResults
    topics: list[str]


class PartitionCount(Message, frozen=True, kw_only=True):
    name: str
    count: int


class CreatePartitionsRequest(Request[TopicResults], frozen=True, kw_only=True, tag=0):
    """Grow topics to ``count`` partitions each."""

    ACTION: ClassVar[str] = "create_partitions"
    RESPONSE: ClassVar[type[Message]] = TopicResults
    topics: list[PartitionCount]


# -- configs ---------------------------------------------------------------------------------


class TopicConfigEntry(ErrorFields, frozen=True, kw_only=True):
    name: str
    config: dict[str, Any] = {}  # every key with its effective value
    overrides: list[str] = []  # the keys set on the topic itself


class DescribeConfigsResponse(Message, frozen=True, kw_only=True):
    topics: list[TopicConfigEntry]


class DescribeConfigsRequest(Request[DescribeConfigsResponse], frozen=True, kw_only=True,
                             tag=0):
    ACTION: ClassVar[str] = "describe_configs"
    RESPONSE: ClassVar[type[Message]] = DescribeConfigsResponse
    topics: list[str]


class TopicConfigChange(Message, frozen=True, kw_only=True):
    name: str
    config: dict[str, Any]


class AlterConfigsRequest(Request[TopicResults], frozen=True, kw_only=True, tag=0):
    """Set topic config keys; ``incremental`` keeps the keys not named, otherwise they return
    to the broker's defaults."""

    ACTION: ClassVar[str] = "alter_configs"
    RESPONSE: ClassVar[type[Message]] = TopicResults
    incremental: bool = True
    topics: list[TopicConfigChange]

