"""Python clients: Producer, Consumer, Admin (resolved on first use, so that importing one
client module does not import the others)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from logstore.model import NewTopic

if TYPE_CHECKING:
    from logstore.client.admin import (
        Admin,
        BrokerDescription,
        ClusterDescription,
        PartitionDescription,
        TopicDescription,
    )
    from logstore.client.consumer import Consumer
    from logstore.client.producer import Producer
    from logstore.client.transactions import ConsumerGroupMetadata, PreparedTxnState

_EXPORTS = {"Admin": "admin", "BrokerDescription": "admin", "ClusterDescription": "admin",
            "PartitionDescription": "admin", "TopicDescription": "admin",
            "Consumer": "consumer", "Producer": "producer",
            "ConsumerGroupMetadata": "transactions", "PreparedTxnState": "transactions"}

__all__ = ["Admin", "BrokerDescription", "ClusterDescription", "Consumer",
           "ConsumerGroupMetadata", "NewTopic", "PartitionDescription", "PreparedTxnState",
           "Producer", "TopicDescription"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'logstore.client' has no attribute {name!r}")
    value = getattr(import_module(f"logstore.client.{module}"), name)
    globals()[name] = value
    return value
