"""LogStore: a distributed commit log whose storage is Apache Arrow and whose first-class reader
is Spark. The public client API is exported here."""

from logstore.client import Admin, Consumer, NewTopic, Producer
from logstore.errors import ApiError, ErrorCode, LogstoreError
from logstore.model import ConsumerRecord, OffsetAndTimestamp, RecordMetadata, TopicPartition

__all__ = ["Admin", "ApiError", "Consumer", "ConsumerRecord", "ErrorCode", "LogstoreError",
           "NewTopic", "OffsetAndTimestamp", "Producer", "RecordMetadata", "TopicPartition"]
__version__ = "0.1.0"
