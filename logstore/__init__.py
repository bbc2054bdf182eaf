"""LogStore: a distributed commit log whose storage is Apache Arrow and whose first-class reader
is Spark. The public client API is exported here.

The names are resolved on first use (PEP 562), so importing one submodule (as Spark's Python
workers do, once per query plan) does not import every client.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logstore.client import (
        Admin,
        Consumer,
        ConsumerGroupMetadata,
        PreparedTxnState,
        Producer,
    )
    from logstore.errors import ApiError, ErrorCode, LogstoreError
    from logstore.model import (
        ConsumerRecord,
        NewTopic,
        OffsetAndTimestamp,
        RecordMetadata,
        TopicPartition,
    )

_EXPORTS = {
    "Admin": "logstore.client", "Consumer": "logstore.client", "NewTopic": "logstore.model",
    "Producer": "logstore.client", "ApiError": "logstore.errors", "ErrorCode": "logstore.errors",
    "LogstoreError": "logstore.errors", "ConsumerRecord": "logstore.model",
    "OffsetAndTimestamp": "logstore.model", "RecordMetadata": "logstore.model",
    "TopicPartition": "logstore.model", "PreparedTxnState": "logstore.client",
    "ConsumerGroupMetadata": "logstore.client",
}

__all__ = ["Admin", "ApiError", "Consumer", "ConsumerGroupMetadata", "ConsumerRecord",
           "ErrorCode", "LogstoreError", "NewTopic", "OffsetAndTimestamp", "PreparedTxnState",
           "Producer", "RecordMetadata", "TopicPartition"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'logstore' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
