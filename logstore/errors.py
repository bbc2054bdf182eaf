"""Error codes and exceptions.

Owns: the wire error-code table (Kafka's numbers where the meaning matches) and one exception
class per code. Only ``ApiError`` subclasses cross the wire; configuration and programming
errors (``ConfigError``, ``ValueError``) never do. Clients decide whether to retry from the
``retriable`` and ``refresh_metadata`` flags, never from lists of classes.

Must not: do I/O or import anything above the base layer.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ErrorCode(IntEnum):
    """Wire codes. Names may change, numbers never do; Kafka's numbers where the meaning matches."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    CONCURRENT_TRANSACTIONS = 51
    KAFKA_STORAGE_ERROR = 56
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82
    INVALID_RECORD = 87


class LogstoreError(Exception):
    """Root of every error LogStore raises on purpose."""


class ConfigError(LogstoreError, ValueError):
    """A configuration file or value is wrong. Never sent over the wire."""


class ApiError(LogstoreError):
    """An error with a wire code. The message should name the topic, partition or offset at fault."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    refresh_metadata: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name)
        self.message = message or self.code.name

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.message}"


def _api_error(
    name: str, code: ErrorCode, doc: str, retriable: bool = False, refresh: bool = False
) -> type[ApiError]:
    cls = type(name, (ApiError,), {"code": code, "retriable": retriable, "refresh_metadata": refresh,
                                   "__doc__": doc})
    return cls


# One class per wire code. Defined by a table so that the flags sit next to the code.
UnknownServerError = _api_error("UnknownServerError", ErrorCode.UNKNOWN_SERVER_ERROR,
                                "An unexpected error on the broker; see its log.")
OffsetOutOfRangeError = _api_error("OffsetOutOfRangeError", ErrorCode.OFFSET_OUT_OF_RANGE,
                                   "The requested offset is outside the partition's valid range.")
CorruptRecordError = _api_error("CorruptRecordError", ErrorCode.CORRUPT_MESSAGE,
                                "A batch failed its CRC check or could not be decoded.")
UnknownTopicOrPartitionError = _api_error(
    "UnknownTopicOrPartitionError", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    "The topic or partition does not exist on this broker.", retriable=True, refresh=True)
InvalidFetchSizeError = _api_error("InvalidFetchSizeError", ErrorCode.INVALID_FETCH_SIZE,
                                   "max_bytes of a fetch must be positive.")
LeaderNotAvailableError = _api_error(
    "LeaderNotAvailableError", ErrorCode.LEADER_NOT_AVAILABLE,
    "The partition has no leader right now (an election is in progress).", retriable=True,
    refresh=True)
NotLeaderOrFollowerError = _api_error(
    "NotLeaderOrFollowerError", ErrorCode.NOT_LEADER_OR_FOLLOWER,
    "This broker does not lead the partition; refresh metadata and retry.", retriable=True,
    refresh=True)
RequestTimedOutError = _api_error("RequestTimedOutError", ErrorCode.REQUEST_TIMED_OUT,
                                  "The request did not complete in time.", retriable=True)
BrokerNotAvailableError = _api_error("BrokerNotAvailableError", ErrorCode.BROKER_NOT_AVAILABLE,
                                     "The broker could not be reached.", retriable=True,
                                     refresh=True)
MessageTooLargeError = _api_error("MessageTooLargeError", ErrorCode.MESSAGE_TOO_LARGE,
                                  "A batch is larger than the topic's max_message_bytes.")
StaleControllerEpochError = _api_error("StaleControllerEpochError",
                                       ErrorCode.STALE_CONTROLLER_EPOCH,
                                       "The request came from a controller that was replaced.")
NetworkError = _api_error("NetworkError", ErrorCode.NETWORK_EXCEPTION,
                          "The connection to the broker failed.", retriable=True, refresh=True)
CoordinatorLoadInProgressError = _api_error(
    "CoordinatorLoadInProgressError", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    "The coordinator is still loading its state.", retriable=True)
CoordinatorNotAvailableError = _api_error(
    "CoordinatorNotAvailableError", ErrorCode.COORDINATOR_NOT_AVAILABLE,
    "The coordinator is not available.", retriable=True, refresh=True)
NotCoordinatorError = _api_error("NotCoordinatorError", ErrorCode.NOT_COORDINATOR,
                                 "This broker is not the coordinator.", retriable=True,
                                 refresh=True)
InvalidTopicError = _api_error("InvalidTopicError", ErrorCode.INVALID_TOPIC_EXCEPTION,
                               "The topic name is not valid.")
RecordListTooLargeError = _api_error("RecordListTooLargeError", ErrorCode.RECORD_LIST_TOO_LARGE,
                                     "The request is larger than the broker accepts.")
NotEnoughReplicasError = _api_error(
    "NotEnoughReplicasError", ErrorCode.NOT_ENOUGH_REPLICAS,
    "Fewer in-sync replicas than min_insync_replicas.", retriable=True)
NotEnoughReplicasAfterAppendError = _api_error(
    "NotEnoughReplicasAfterAppendError", ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    "The batch was written but the ISR shrank below min_insync_replicas.", retriable=True)
InvalidRequiredAcksError = _api_error("InvalidRequiredAcksError", ErrorCode.INVALID_REQUIRED_ACKS,
                                      "acks must be 0, 1 or -1 (all).")
IllegalGenerationError = _api_error("IllegalGenerationError", ErrorCode.ILLEGAL_GENERATION,
                                    "The group generation is stale.")
InconsistentGroupProtocolError = _api_error(
    "InconsistentGroupProtocolError", ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    "The member's protocols do not match the group's.")
InvalidGroupIdError = _api_error("InvalidGroupIdError", ErrorCode.INVALID_GROUP_ID,
                                 "The group id is not valid.")
UnknownMemberIdError = _api_error("UnknownMemberIdError", ErrorCode.UNKNOWN_MEMBER_ID,
                                  "The member id is not known to the group.")
InvalidSessionTimeoutError = _api_error("InvalidSessionTimeoutError",
                                        ErrorCode.INVALID_SESSION_TIMEOUT,
                                        "The session timeout is out of the allowed range.")
RebalanceInProgressError = _api_error("RebalanceInProgressError", ErrorCode.REBALANCE_IN_PROGRESS,
                                      "The group is rebalancing; rejoin.")
InvalidCommitOffsetSizeError = _api_error(
    "InvalidCommitOffsetSizeError", ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    "The offset commit's metadata is larger than offset_metadata_max_bytes.")
InvalidTimestampError = _api_error("InvalidTimestampError", ErrorCode.INVALID_TIMESTAMP,
                                   "A record timestamp is not acceptable.")
UnsupportedVersionError = _api_error("UnsupportedVersionError", ErrorCode.UNSUPPORTED_VERSION,
                                     "The broker does not support this request.")
TopicAlreadyExistsError = _api_error("TopicAlreadyExistsError", ErrorCode.TOPIC_ALREADY_EXISTS,
                                     "The topic already exists.")
InvalidPartitionsError = _api_error("InvalidPartitionsError", ErrorCode.INVALID_PARTITIONS,
                                    "The partition count is not valid.")
InvalidReplicationFactorError = _api_error(
    "InvalidReplicationFactorError", ErrorCode.INVALID_REPLICATION_FACTOR,
    "The replication factor is not valid for this cluster.")
InvalidReplicaAssignmentError = _api_error(
    "InvalidReplicaAssignmentError", ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    "The replica assignment is not valid.")
InvalidConfigError = _api_error("InvalidConfigError", ErrorCode.INVALID_CONFIG,
                                "A topic config key or value is not valid.")
NotControllerError = _api_error("NotControllerError", ErrorCode.NOT_CONTROLLER,
                                "This broker is not the controller.", retriable=True, refresh=True)
InvalidRequestError = _api_error("InvalidRequestError", ErrorCode.INVALID_REQUEST,
                                 "The request is malformed.")
OutOfOrderSequenceError = _api_error(
    "OutOfOrderSequenceError", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    "A producer batch arrived with a sequence gap; the producer resends in order.",
    retriable=True)
DuplicateSequenceError = _api_error("DuplicateSequenceError", ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                                    "The batch was already written.")
InvalidProducerEpochError = _api_error("InvalidProducerEpochError",
                                       ErrorCode.INVALID_PRODUCER_EPOCH,
                                       "The producer was fenced by a newer epoch.")
InvalidTxnStateError = _api_error("InvalidTxnStateError", ErrorCode.INVALID_TXN_STATE,
                                  "The transaction is not in a state that allows this.")
InvalidProducerIdMappingError = _api_error(
    "InvalidProducerIdMappingError", ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    "The producer id is not known.")
ConcurrentTransactionsError = _api_error(
    "ConcurrentTransactionsError", ErrorCode.CONCURRENT_TRANSACTIONS,
    "Another transaction for this id is completing.", retriable=True)
KafkaStorageError = _api_error("KafkaStorageError", ErrorCode.KAFKA_STORAGE_ERROR,
                               "The broker's disk failed for this partition.", retriable=True,
                               refresh=True)
NonEmptyGroupError = _api_error("NonEmptyGroupError", ErrorCode.NON_EMPTY_GROUP,
                                "The group has active members.")
GroupIdNotFoundError = _api_error("GroupIdNotFoundError", ErrorCode.GROUP_ID_NOT_FOUND,
                                  "The group does not exist.")
FencedLeaderEpochError = _api_error("FencedLeaderEpochError", ErrorCode.FENCED_LEADER_EPOCH,
                                    "The request's leader epoch is older than the broker's.",
                                    retriable=True, refresh=True)
UnknownLeaderEpochError = _api_error("UnknownLeaderEpochError", ErrorCode.UNKNOWN_LEADER_EPOCH,
                                     "The request's leader epoch is newer than the broker's.",
                                     retriable=True, refresh=True)
MemberIdRequiredError = _api_error("MemberIdRequiredError", ErrorCode.MEMBER_ID_REQUIRED,
                                   "Rejoin with the member id given.")
FencedInstanceIdError = _api_error("FencedInstanceIdError", ErrorCode.FENCED_INSTANCE_ID,
                                   "Another member with this group_instance_id joined.")
InvalidRecordError = _api_error("InvalidRecordError", ErrorCode.INVALID_RECORD,
                                "A record or batch does not match the topic's schema.")

_BY_CODE: dict[int, type[ApiError]] = {
    cls.code: cls for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, ApiError) and cls is not ApiError
}


def error_class(code: int) -> type[ApiError]:
    """The exception class for a wire code (unknown codes map to UnknownServerError)."""
    return _BY_CODE.get(code, UnknownServerError)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the exception for ``code`` unless it is NONE."""
    if code != ErrorCode.NONE:
        raise error_class(code)(message)
