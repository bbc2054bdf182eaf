"""The cluster metadata the controller keeps, and the seam to where it is stored.

Owns: the value types of cluster metadata (brokers, topics with their ids, partition leader
state) with their versioned JSON form, the ``MetadataStore`` protocol that the embedded file
store (``local.py``) and the ZooKeeper store implement (security metadata included: users'
SCRAM credentials and ACL bindings, whose value types are ``security/``'s), and the fencing rule of remote log
segment metadata writes that both apply (the entries' value type and transition rules are
``tiering/metadata.py``'s). Must not: import kazoo or do network I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from logstore.errors import ApiError, FencedLeaderEpochError
from logstore.records import decode_schema, encode_schema
from logstore.security.acl import AclBinding
from logstore.security.scram import ScramCredential
from logstore.tiering.metadata import RemoteLogSegmentMetadata, TopicIdPartition

JSON_VERSION = 1
# Topics recorded before topic ids existed get a stable id derived from their name, so every
# broker reading the same old record agrees on it without anyone rewriting the record.
_LEGACY_TOPIC_ID_NAMESPACE = uuid.UUID("5d6f0e2a-1c4b-4f8e-9a57-3f0c2b7d9e11")


def new_topic_id() -> str:
    """A fresh topic id (32 hex digits), given to a topic when it is created."""
    return uuid.uuid4().hex


def legacy_topic_id(name: str) -> str:
    """The stable id of a topic recorded without one."""
    return uuid.uuid5(_LEGACY_TOPIC_ID_NAMESPACE, name).hex


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
    """A topic: its replica assignment per partition, config overrides, value schema and id.

    The topic id tells a topic from an earlier one of the same name (remote segments are
    named by it). The controller gives each new topic a fresh one; a record made without one
    (older JSON, tests) gets ``legacy_topic_id(name)``. Changes to a topic keep its id
    (``dataclasses.replace``)."""

    name: str
    replicas: dict[int, tuple[int, ...]]
    config: dict[str, Any] = field(default_factory=dict)
    value_schema: pa.Schema | None = None
    internal: bool = False
    topic_id: str = ""

    def __post_init__(self) -> None:
        if not self.topic_id:
            object.__setattr__(self, "topic_id", legacy_topic_id(self.name))

    @property
    def num_partitions(self) -> int:
        return len(self.replicas)

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "name": self.name,
                "replicas": {str(p): list(r) for p, r in self.replicas.items()},
                "config": self.config, "value_schema": encode_schema(self.value_schema),
                "internal": self.internal, "topic_id": self.topic_id}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicRecord:
        return cls(d["name"], {int(p): tuple(r) for p, r in d["replicas"].items()},
                   dict(d.get("config", {})), decode_schema(d.get("value_schema")),
                   d.get("internal", False), d.get("topic_id") or "")


def remote_write_fence(tp: TopicIdPartition, leader_epoch: int | None,
                       record: TopicRecord | None,
                       state: PartitionState | None) -> ApiError | None:
    """Why a remote segment metadata write by the leader at ``leader_epoch`` (None: the cleanup
    of a deleted topic) must be refused, given the topic's record and the partition's state as
    stored now (a FencedLeaderEpochError); None when it may go ahead. Both stores apply this
    same rule."""
    live = record is not None and record.topic_id == tp.topic_id
    if leader_epoch is None:
        if live:
            return FencedLeaderEpochError(
                f"{tp}: topic id {tp.topic_id} still exists; only its leader, at the current "
                "leader epoch, may write its remote segment metadata")
        return None
    if not live:
        return FencedLeaderEpochError(
            f"{tp}: topic id {tp.topic_id} no longer exists (deleted or recreated); the write "
            f"at leader epoch {leader_epoch} is refused")
    if state is None or state.leader_epoch != leader_epoch:
        current = "none" if state is None else state.leader_epoch
        return FencedLeaderEpochError(
            f"{tp}: remote segment metadata write at leader epoch {leader_epoch} refused; the "
            f"partition's leader epoch is {current}")
    return None


MetadataListener = Callable[[], None]
# user -> mechanism -> credential
Credentials = dict[str, dict[str, ScramCredential]]
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

    def create_topics(self, topics: list[tuple[TopicRecord, dict[int, PartitionState]]]
                      ) -> list[ApiError | None]:
        """Create each topic that does not exist yet, with its partitions' states, in as few
        writes as the store allows; per topic, in order, None or TopicAlreadyExistsError. An
        error raised instead means none of them was created."""
        ...

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

    # -- remote log segment metadata (tiered storage; see tiering/metadata.py) ----------------

    def remote_log_segments(self, partition: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """Every entry of the partition (any state), read from the store itself: a new leader
        calls this once and has the partition's whole remote state."""
        ...

    def remote_log_partitions(self) -> list[TopicIdPartition]:
        """The partitions that have entries, deleted topics' included (for their cleanup)."""
        ...

    def put_remote_log_segment(self, metadata: RemoteLogSegmentMetadata,
                               leader_epoch: int | None) -> None:
        """Record ``metadata``'s state after checking the transition from the stored one
        (``tiering.metadata.check_transition``); DELETE_SEGMENT_FINISHED removes the entry.

        Fenced, atomically with the write: ``leader_epoch`` must be the partition's current
        leader epoch and the topic must still have ``metadata``'s topic id, else
        FencedLeaderEpochError. ``leader_epoch`` None is the cleanup of a deleted topic, allowed
        only once no topic has that id. An impossible transition raises
        InvalidRemoteSegmentStateError and writes nothing."""
        ...

    # -- security: users' SCRAM credentials and ACL bindings ----------------------------------
    # Security listeners hear of every change to either, as metadata listeners do of theirs
    # (another broker's change through a watch).

    def scram_credentials(self) -> Credentials: ...

    def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        """Add or replace ``user``'s credential for its mechanism."""
        ...

    def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        """Remove it; False if the user had no credential for ``mechanism``."""
        ...

    def acls(self) -> frozenset[AclBinding]: ...

    def add_acls(self, bindings: list[AclBinding]) -> None: ...

    def remove_acls(self, bindings: list[AclBinding]) -> None:
        """Remove these bindings (those already gone are ignored)."""
        ...

    def add_security_listener(self, listener: MetadataListener) -> None: ...
