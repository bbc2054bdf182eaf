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
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
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
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    UNACCEPTABLE_CREDENTIAL = 93
    UNKNOWN_TOPIC_ID = 100
    INCONSISTENT_TOPIC_ID = 103
    OFFSET_MOVED_TO_TIERED_STORAGE = 109
    TRANSACTION_ABORTABLE = 120


class LogstoreError(Exception):
    """Root of every error LogStore raises on purpose."""


class ConfigError(LogstoreError, ValueError):
    """A configuration file or value is wrong. Never sent over the wire."""


class ApiError(LogstoreError):
    """An error with a wire code. The message should name the topic, partition, offset or key
    at fault."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    refresh_metadata: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name)
        self.message = message or self.code.name

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.message}"


# One class per wire code (error_class maps a code back to its class). Flags follow
# Kafka's: ``retriable`` where a later attempt can succeed, ``refresh_metadata`` where the
# client's idea of who leads or coordinates is what went wrong.


class UnknownServerError(ApiError):
    """An unexpected error on the broker; see its log."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable = False
    refresh_metadata = False


class OffsetOutOfRangeError(ApiError):
    """The requested offset is outside the partition's valid range."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE
    retriable = False
    refresh_metadata = False


class CorruptRecordError(ApiError):
    """A batch failed its CRC check or could not be decoded."""

    code = ErrorCode.CORRUPT_MESSAGE
    retriable = False
    refresh_metadata = False


class UnknownTopicOrPartitionError(ApiError):
    """The topic or partition does not exist on this broker."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    retriable = True
    refresh_metadata = True


class InvalidFetchSizeError(ApiError):
    """max_bytes of a fetch must be positive."""

    code = ErrorCode.INVALID_FETCH_SIZE
    retriable = False
    refresh_metadata = False


class LeaderNotAvailableError(ApiError):
    """The partition has no leader right now (an election is in progress)."""

    code = ErrorCode.LEADER_NOT_AVAILABLE
    retriable = True
    refresh_metadata = True


class NotLeaderOrFollowerError(ApiError):
    """This broker does not lead the partition; refresh metadata and retry."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER
    retriable = True
    refresh_metadata = True


class RequestTimedOutError(ApiError):
    """The request did not complete in time."""

    code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True
    refresh_metadata = False


class BrokerNotAvailableError(ApiError):
    """The broker could not be reached."""

    code = ErrorCode.BROKER_NOT_AVAILABLE
    retriable = True
    refresh_metadata = True


class ReplicaNotAvailableError(ApiError):
    """A replica of the partition is not available on this broker; refresh metadata and retry."""

    code = ErrorCode.REPLICA_NOT_AVAILABLE
    retriable = True
    refresh_metadata = True


class MessageTooLargeError(ApiError):
    """A batch is larger than the topic's max_message_bytes."""

    code = ErrorCode.MESSAGE_TOO_LARGE
    retriable = False
    refresh_metadata = False


class StaleControllerEpochError(ApiError):
    """The request came from a controller that was replaced."""

    code = ErrorCode.STALE_CONTROLLER_EPOCH
    retriable = False
    refresh_metadata = False


class NetworkError(ApiError):
    """The connection to the broker failed."""

    code = ErrorCode.NETWORK_EXCEPTION
    retriable = True
    refresh_metadata = True


class CoordinatorLoadInProgressError(ApiError):
    """The coordinator is still loading its state."""

    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    retriable = True
    refresh_metadata = False


class CoordinatorNotAvailableError(ApiError):
    """The coordinator is not available."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    retriable = True
    refresh_metadata = True


class NotCoordinatorError(ApiError):
    """This broker is not the coordinator."""

    code = ErrorCode.NOT_COORDINATOR
    retriable = True
    refresh_metadata = True


class InvalidTopicError(ApiError):
    """The topic name is not valid."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION
    retriable = False
    refresh_metadata = False


class RecordListTooLargeError(ApiError):
    """The request is larger than the broker accepts."""

    code = ErrorCode.RECORD_LIST_TOO_LARGE
    retriable = False
    refresh_metadata = False


class NotEnoughReplicasError(ApiError):
    """Fewer in-sync replicas than min_insync_replicas."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS
    retriable = True
    refresh_metadata = False


class NotEnoughReplicasAfterAppendError(ApiError):
    """The batch was written but the ISR shrank below min_insync_replicas."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    retriable = True
    refresh_metadata = False


class InvalidRequiredAcksError(ApiError):
    """acks must be 0, 1 or -1 (all)."""

    code = ErrorCode.INVALID_REQUIRED_ACKS
    retriable = False
    refresh_metadata = False


class IllegalGenerationError(ApiError):
    """The group generation is stale."""

    code = ErrorCode.ILLEGAL_GENERATION
    retriable = False
    refresh_metadata = False


class InconsistentGroupProtocolError(ApiError):
    """The member's protocols do not match the group's."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    retriable = False
    refresh_metadata = False


class InvalidGroupIdError(ApiError):
    """The group id is not valid."""

    code = ErrorCode.INVALID_GROUP_ID
    retriable = False
    refresh_metadata = False


class UnknownMemberIdError(ApiError):
    """The member id is not known to the group."""

    code = ErrorCode.UNKNOWN_MEMBER_ID
    retriable = False
    refresh_metadata = False


class InvalidSessionTimeoutError(ApiError):
    """The session timeout is out of the allowed range."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT
    retriable = False
    refresh_metadata = False


class RebalanceInProgressError(ApiError):
    """The group is rebalancing; rejoin."""

    code = ErrorCode.REBALANCE_IN_PROGRESS
    retriable = False
    refresh_metadata = False


class InvalidCommitOffsetSizeError(ApiError):
    """The offset commit's metadata is larger than offset_metadata_max_bytes."""

    code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    retriable = False
    refresh_metadata = False


class InvalidTimestampError(ApiError):
    """A record timestamp is not acceptable."""

    code = ErrorCode.INVALID_TIMESTAMP
    retriable = False
    refresh_metadata = False


class UnsupportedVersionError(ApiError):
    """The broker does not support this request."""

    code = ErrorCode.UNSUPPORTED_VERSION
    retriable = False
    refresh_metadata = False


class TopicAlreadyExistsError(ApiError):
    """The topic already exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS
    retriable = False
    refresh_metadata = False


class InvalidPartitionsError(ApiError):
    """The partition count is not valid."""

    code = ErrorCode.INVALID_PARTITIONS
    retriable = False
    refresh_metadata = False


class InvalidReplicationFactorError(ApiError):
    """The replication factor is not valid for this cluster."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR
    retriable = False
    refresh_metadata = False


class InvalidReplicaAssignmentError(ApiError):
    """The replica assignment is not valid."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    retriable = False
    refresh_metadata = False


class InvalidConfigError(ApiError):
    """A topic config key or value is not valid."""

    code = ErrorCode.INVALID_CONFIG
    retriable = False
    refresh_metadata = False


class NotControllerError(ApiError):
    """This broker is not the controller."""

    code = ErrorCode.NOT_CONTROLLER
    retriable = True
    refresh_metadata = True


class InvalidRequestError(ApiError):
    """The request is malformed."""

    code = ErrorCode.INVALID_REQUEST
    retriable = False
    refresh_metadata = False


class OutOfOrderSequenceError(ApiError):
    """A producer batch arrived with a sequence gap; the producer resends in order."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    retriable = True
    refresh_metadata = False


class DuplicateSequenceError(ApiError):
    """The batch was already written."""

    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    retriable = False
    refresh_metadata = False


class InvalidProducerEpochError(ApiError):
    """The producer was fenced by a newer epoch."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH
    retriable = False
    refresh_metadata = False


class InvalidTxnStateError(ApiError):
    """The transaction is not in a state that allows this."""

    code = ErrorCode.INVALID_TXN_STATE
    retriable = False
    refresh_metadata = False


class InvalidProducerIdMappingError(ApiError):
    """The producer id is not known."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
    retriable = False
    refresh_metadata = False


class InvalidTransactionTimeoutError(ApiError):
    """The producer's transaction_timeout_ms is above the broker's transaction_max_timeout_ms
    (or not positive)."""

    code = ErrorCode.INVALID_TRANSACTION_TIMEOUT
    retriable = False
    refresh_metadata = False


class ConcurrentTransactionsError(ApiError):
    """Another transaction for this id is completing."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS
    retriable = True
    refresh_metadata = False


class TransactionCoordinatorFencedError(ApiError):
    """A transaction marker came from a coordinator older than one that already wrote to this
    partition: a newer coordinator owns the transaction."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED
    retriable = False
    refresh_metadata = False


class KafkaStorageError(ApiError):
    """The broker's disk failed for this partition."""

    code = ErrorCode.KAFKA_STORAGE_ERROR
    retriable = True
    refresh_metadata = True


class NonEmptyGroupError(ApiError):
    """The group has active members."""

    code = ErrorCode.NON_EMPTY_GROUP
    retriable = False
    refresh_metadata = False


class GroupIdNotFoundError(ApiError):
    """The group does not exist."""

    code = ErrorCode.GROUP_ID_NOT_FOUND
    retriable = False
    refresh_metadata = False


class FencedLeaderEpochError(ApiError):
    """The request's leader epoch is older than the broker's."""

    code = ErrorCode.FENCED_LEADER_EPOCH
    retriable = True
    refresh_metadata = True


class UnknownLeaderEpochError(ApiError):
    """The request's leader epoch is newer than the broker's."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH
    retriable = True
    refresh_metadata = True


class OffsetNotAvailableError(ApiError):
    """A new leader cannot answer for its end yet: its high watermark is still below the
    start of its leader epoch (it learns the old leader's from its followers), and an older
    end would show a consumer the log going backwards (Kafka's KAFKA-2334)."""

    code = ErrorCode.OFFSET_NOT_AVAILABLE
    retriable = True
    refresh_metadata = False


class MemberIdRequiredError(ApiError):
    """Rejoin with the member id given."""

    code = ErrorCode.MEMBER_ID_REQUIRED
    retriable = False
    refresh_metadata = False


class FencedInstanceIdError(ApiError):
    """Another member with this group_instance_id joined."""

    code = ErrorCode.FENCED_INSTANCE_ID
    retriable = False
    refresh_metadata = False


class InvalidRecordError(ApiError):
    """A record or batch does not match the topic's schema."""

    code = ErrorCode.INVALID_RECORD
    retriable = False
    refresh_metadata = False


class UnknownTopicIdError(ApiError):
    """The request names a topic id that is not its topic's (the topic was deleted, or deleted
    and recreated under the same name): refresh the metadata, and what was built for the old
    topic (a batch encoded under its value schema, a fetch session decoding with it) must not
    go on under the new one."""

    code = ErrorCode.UNKNOWN_TOPIC_ID
    retriable = True
    refresh_metadata = True


class InconsistentTopicIdError(ApiError):
    """The topic id a replica request carries is not the id of the log it would read (one
    side hosts, or its metadata knows, another incarnation of the topic than the other: the
    topic was deleted and created again under its name). Kafka's INCONSISTENT_TOPIC_ID: the
    side behind refreshes its metadata and replaces its replica, then the request is retried."""

    code = ErrorCode.INCONSISTENT_TOPIC_ID
    retriable = True
    refresh_metadata = True


class OffsetMovedToTieredStorageError(ApiError):
    """A replica fetch asked for an offset below the leader's local log start offset of a
    tiered partition: the follower restarts its log at the leader's local log start offset
    instead of replicating the remote tier (Kafka's OFFSET_MOVED_TO_TIERED_STORAGE)."""

    code = ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE


class UnstableOffsetCommitError(ApiError):
    """Transactional offsets of the partition are pending (their transaction is not decided
    yet); retry once it is."""

    code = ErrorCode.UNSTABLE_OFFSET_COMMIT
    retriable = True
    refresh_metadata = False


class ProducerFencedError(ApiError):
    """A newer producer with the same transactional id (a newer epoch) exists, or the
    transaction was aborted for its timeout: this producer is a zombie and must be closed."""

    code = ErrorCode.PRODUCER_FENCED
    retriable = False
    refresh_metadata = False


# -- security: authentication and authorization (none is retriable: trying again with the same
# credentials or ACLs gives the same answer) ------------------------------------------------


class TopicAuthorizationFailedError(ApiError):
    """The principal may not perform the operation on the topic (the message names both)."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(ApiError):
    """The principal may not perform the operation on the consumer group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(ApiError):
    """The principal may not perform the operation on the cluster."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class UnsupportedSaslMechanismError(ApiError):
    """The broker does not enable the SASL mechanism the client asked for."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class IllegalSaslStateError(ApiError):
    """A request arrived outside an authenticated session (none yet, or one the broker no
    longer knows, e.g. after a restart): authenticate again."""

    code = ErrorCode.ILLEGAL_SASL_STATE


class TransactionalIdAuthorizationFailedError(ApiError):
    """The principal may not perform the operation on the transactional id."""

    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class SecurityDisabledError(ApiError):
    """The request needs a security feature this broker does not run (ACLs without
    ``authorizer_enable``)."""

    code = ErrorCode.SECURITY_DISABLED


class OperationNotAttemptedError(ApiError):
    """Not attempted, because another part of the same request failed (Kafka's answer for the
    authorized partitions of an AddPartitionsToTxn that names one it may not write)."""

    code = ErrorCode.OPERATION_NOT_ATTEMPTED


class SaslAuthenticationFailedError(ApiError):
    """Authentication failed; the message names the mechanism, never the reason."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class ResourceNotFoundError(ApiError):
    """The named user or credential does not exist."""

    code = ErrorCode.RESOURCE_NOT_FOUND


class UnacceptableCredentialError(ApiError):
    """A credential the broker will not store (unknown mechanism, too few iterations)."""

    code = ErrorCode.UNACCEPTABLE_CREDENTIAL


class TransactionAbortableError(ApiError):
    """The transaction cannot go on (a write failed, or the transaction is ending): abort it
    and start a new one."""

    code = ErrorCode.TRANSACTION_ABORTABLE
    retriable = False
    refresh_metadata = False


_BY_CODE: dict[int, type[ApiError]] = {
    cls.code: cls for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, ApiError) and cls is not ApiError
}


def error_class(code: int) -> type[ApiError]:
    """The exception class for a wire code (unknown codes map to UnknownServerError)."""
    return _BY_CODE.get(code, UnknownServerError)
