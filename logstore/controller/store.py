"""The cluster metadata the controller keeps, and the seam to where it is stored.

Owns: the value types of cluster metadata (brokers, topics, partition leader state) with their
versioned JSON form, and the ``MetadataStore`` protocol that the embedded file store
(``local.py``) and the ZooKeeper store implement. Must not: import kazoo or do network I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from logstore.records import decode_schema, encode_schema

JSON_VERSION = 1


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "broker_id": self.broker_id, "host": self.host,
                "port": self.port, "rack": self.rack}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BrokerInfo:
        return cls(d["broker_id"], d["host"], d["port"], d.get("rack"))


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader and ISR of one partition, as the controller last decided them."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "leader": self.leader, "leader_epoch": self.leader_epoch,
                "isr": list(self.isr), "controller_epoch": self.controller_epoch}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionState:
        return cls(d["leader"], d["leader_epoch"], tuple(d["isr"]), d.get("controller_epoch", 0))


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic: its replica assignment per partition, config overrides and value schema."""

    name: str
    replicas: dict[int, tuple[int, ...]]
    config: dict[str, Any] = field(default_factory=dict)
    value_schema: pa.Schema | None = None
    internal: bool = False

    @property
    def num_partitions(self) -> int:
        return len(self.replicas)

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "name": self.name,
                "replicas": {str(p): list(r) for p, r in self.replicas.items()},
                "config": self.config, "value_schema": encode_schema(self.value_schema),
                "internal": self.internal}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicRecord:
        return cls(d["name"], {int(p): tuple(r) for p, r in d["replicas"].items()},
                   dict(d.get("config", {})), decode_schema(d.get("value_schema")),
                   d.get("internal", False))


MetadataListener = Callable[[], None]
ElectedCallback = Callable[[int], None]
ResignedCallback = Callable[[], None]


class MetadataStore(Protocol):
    """Where brokers, topics and partition states live (a local file, or ZooKeeper).

    Listeners are called after a change is visible to this store's readers: at once for the
    store's own writes, and soon after for other brokers' writes (ZooKeeper watches). They may
    be called from any thread, more than once per change, and must be idempotent.

    ``set_partition_state`` is the controller's conditional write: it is refused (False) when
    ``expected_epoch`` is given and differs from the stored leader epoch, when another writer
    changed the state concurrently, or when ``state.controller_epoch`` is not the current
    controller epoch, so a controller that was replaced cannot overwrite its successor.
    """

    def start(self) -> None: ...

    def close(self) -> None: ...

    def register_broker(self, info: BrokerInfo) -> None: ...

    def brokers(self) -> dict[int, BrokerInfo]: ...

    def topics(self) -> dict[str, TopicRecord]: ...

    def partition_states(self, topic: str) -> dict[int, PartitionState]: ...

    def create_topic(self, record: TopicRecord, states: dict[int, PartitionState]) -> None: ...

    def update_topic(self, record: TopicRecord, new_states: dict[int, PartitionState]) -> None: ...

    def delete_topic(self, name: str) -> None: ...

    def set_partition_state(self, topic: str, partition: int, state: PartitionState,
                            expected_epoch: int | None = None) -> bool: ...

    def controller_id(self) -> int | None: ...

    def elect_controller(self, on_elected: ElectedCallback,
                         on_resigned: ResignedCallback | None = None) -> None:
        """Stand for controller now and whenever the post falls vacant; ``on_elected(epoch)``
        runs on each win (maybe before this returns), ``on_resigned()`` when it is lost."""
        ...

    def is_controller(self) -> bool: ...

    @property
    def controller_epoch(self) -> int:
        """The epoch this store last won the controller election at (0: never)."""
        ...

    def next_producer_id_block(self, size: int) -> int:
        """The first id of a block of ``size`` producer ids no other caller ever gets."""
        ...

    def add_listener(self, listener: MetadataListener) -> None: ...
