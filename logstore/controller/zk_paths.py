"""Every znode LogStore keeps in ZooKeeper, and the versioned JSON stored in each.

Owns: the znode layout (Kafka's, below an optional chroot), parsing ``zk_connect`` into hosts
and chroot, and encoding/decoding each znode's data. Every value is a JSON object with a
``version`` field; a reader refuses a version newer than it knows, so an old broker never
misreads a newer broker's data. Must not: import kazoo or do I/O.

| znode                                        | kind       | JSON fields (besides version)    |
|----------------------------------------------|------------|----------------------------------|
| /brokers/ids/<broker_id>                     | ephemeral  | broker_id, host, port, rack      |
| /brokers/topics/<topic>                      | persistent | name, replicas, config,          |
|                                              |            | value_schema, internal, topic_id |
| /brokers/topics/<topic>/partitions           | persistent | (no data)                        |
| /brokers/topics/<topic>/partitions/<p>       | persistent | (no data)                        |
| /brokers/topics/<topic>/partitions/<p>/state | persistent | leader, leader_epoch, isr,       |
|                                              |            | controller_epoch                 |
| /controller                                  | ephemeral  | broker_id, timestamp_ms          |
| /controller_epoch                            | persistent | epoch                            |
| /latest_producer_id_block                    | persistent | broker_id, block_start,          |
|                                              |            | block_end (inclusive)            |
| /remote_log_segments                         | persistent | (no data)                        |
| /remote_log_segments/<topic>-<topic id>/<p>  | persistent | (no data)                        |
| /remote_log_segments/<topic>-<topic id>/<p>/ | persistent | one remote segment's metadata    |
|   <segment id>                               |            | (tiering/metadata.py's table)    |
| /config/users/<user>                         | persistent | config: {mechanism: Kafka's SCRAM|
|                                              | sensitive  | credential text}                 |
| /kafka-acl/<Type>/<name>                     | persistent | acls: [{principal,               |
| /kafka-acl-extended/prefixed/<Type>/<name>   |            | permissionType, operation, host}]|

Names in the user and ACL paths are URL-quoted (a group name may hold a ``/``). ``<Type>`` and
the ACL fields use Kafka's spelling (``Topic``, ``TransactionalId``, ``Allow``,
``ClusterAction``), so the layout is Kafka's ZooKeeper ACL layout. With ``zk_set_acl`` every
znode LogStore creates is writable only by the brokers' digest identity (and world-readable,
except the sensitive ones, which only that identity can read).

Topic deletion is one ZooKeeper transaction over the topic's subtree, so Kafka's
``/admin/delete_topics`` marker is not needed (yet). Remote segment entries live outside that
subtree, under the topic's id, so they outlive the topic until its remote objects are deleted,
and a new topic of the same name never sees them.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import orjson

from logstore.controller.store import JSON_VERSION, BrokerInfo, PartitionState, TopicRecord
from logstore.errors import ConfigError
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.scram import ScramCredential
from logstore.tiering.metadata import RemoteLogSegmentMetadata, TopicIdPartition

BROKERS = "/brokers"
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
REMOTE_LOG_SEGMENTS = "/remote_log_segments"
CONFIG = "/config"
USERS = "/config/users"
ACLS_LITERAL = "/kafka-acl"
ACLS_EXTENDED = "/kafka-acl-extended"
ACLS_PREFIXED = "/kafka-acl-extended/prefixed"
_ACL_TYPE_NAMES = {"TOPIC": "Topic", "GROUP": "Group", "CLUSTER": "Cluster",
                   "TRANSACTIONAL_ID": "TransactionalId"}
ACL_TYPE_PATHS = tuple(f"{root}/{t}" for root in (ACLS_LITERAL, ACLS_PREFIXED)
                       for t in _ACL_TYPE_NAMES.values())
# Created at startup by whoever gets there first; never deleted.
PERSISTENT_PATHS = (BROKERS, BROKER_IDS, TOPICS, REMOTE_LOG_SEGMENTS, CONFIG, USERS,
                    ACLS_LITERAL, ACLS_EXTENDED, ACLS_PREFIXED, *ACL_TYPE_PATHS)
INITIAL_CONTROLLER_EPOCH = 0
EMPTY_JSON = b'{"version": 1}'  # what a missing user or ACL znode reads as


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def remote_topic_path(topic_dir: str) -> str:
    return f"{REMOTE_LOG_SEGMENTS}/{topic_dir}"


def remote_partition_path(tp: TopicIdPartition) -> str:
    return f"{REMOTE_LOG_SEGMENTS}/{tp.topic_dir}/{tp.partition}"


def remote_segment_path(tp: TopicIdPartition, segment_id: str) -> str:
    return f"{REMOTE_LOG_SEGMENTS}/{tp.topic_dir}/{tp.partition}/{segment_id}"


def user_path(user: str) -> str:
    return f"{USERS}/{quote(user, safe='')}"


def user_of(path: str) -> str:
    return unquote(path.rsplit("/", 1)[1])


def acl_path(pattern: ResourcePattern) -> str:
    root = ACLS_PREFIXED if pattern.pattern_type is PatternType.PREFIXED else ACLS_LITERAL
    kind = _ACL_TYPE_NAMES[pattern.resource_type.value]
    return f"{root}/{kind}/{quote(pattern.name, safe='')}"


def acl_pattern_of(path: str) -> ResourcePattern:
    """The resource pattern an ACL znode path names."""
    parent, name = path.rsplit("/", 1)
    root, kind = parent.rsplit("/", 1)
    resource = {v: k for k, v in _ACL_TYPE_NAMES.items()}[kind]
    return ResourcePattern(ResourceType(resource), unquote(name), PatternType.PREFIXED
                           if root == ACLS_PREFIXED else PatternType.LITERAL)


def is_security_path(path: str) -> bool:
    return any(path == root or path.startswith(root + "/")
               for root in (USERS, ACLS_LITERAL, ACLS_EXTENDED))


def topic_of(path: str) -> str | None:
    """The topic a path at or below ``/brokers/topics/<topic>`` belongs to, else None."""
    prefix = TOPICS + "/"
    if not path.startswith(prefix):
        return None
    return path[len(prefix):].split("/", 1)[0] or None


def split_zk_connect(zk_connect: str) -> tuple[str, str | None]:
    """``"h1:2181,h2:2181/logstore"`` -> ``("h1:2181,h2:2181", "/logstore")``; the chroot is
    None when absent. ConfigError for an empty host list or a malformed chroot."""
    hosts, slash, chroot = zk_connect.strip().partition("/")
    if not hosts or any(not h.strip() for h in hosts.split(",")):
        raise ConfigError(f"zk_connect must list host:port pairs, got {zk_connect!r}")
    if not slash or not chroot.strip("/"):
        return hosts, None
    path = "/" + chroot
    if posixpath.normpath(path) != path or "//" in path:
        raise ConfigError(f"zk_connect chroot {path!r} must be a plain path like /logstore")
    return hosts, path


# -- znode data ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerZNode:
    """Who is the controller: the data of the ephemeral ``/controller`` znode."""

    broker_id: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """The last block of producer ids handed out: ``block_start..block_end`` inclusive."""

    broker_id: int
    block_start: int
    block_end: int


def _dumps(d: dict[str, Any]) -> bytes:
    return orjson.dumps({"version": JSON_VERSION, **d})


def _loads(data: bytes, what: str) -> dict[str, Any]:
    d = orjson.loads(data)
    if not isinstance(d, dict) or not isinstance(d.get("version"), int):
        raise ValueError(f"{what}: znode data is not versioned JSON: {data[:80]!r}")
    if d["version"] > JSON_VERSION:
        raise ValueError(f"{what}: znode data version {d['version']} is newer than "
                         f"{JSON_VERSION}, the newest this broker reads")
    return d


def encode_broker(info: BrokerInfo) -> bytes:
    return orjson.dumps(info.to_json())


def decode_broker(data: bytes) -> BrokerInfo:
    return BrokerInfo.from_json(_loads(data, "broker"))


def encode_topic(record: TopicRecord) -> bytes:
    return orjson.dumps(record.to_json())


def decode_topic(data: bytes) -> TopicRecord:
    return TopicRecord.from_json(_loads(data, "topic"))


def encode_partition_state(state: PartitionState) -> bytes:
    return orjson.dumps(state.to_json())


def decode_partition_state(data: bytes) -> PartitionState:
    return PartitionState.from_json(_loads(data, "partition state"))


def encode_controller(node: ControllerZNode) -> bytes:
    return _dumps({"broker_id": node.broker_id, "timestamp_ms": node.timestamp_ms})


def decode_controller(data: bytes) -> ControllerZNode:
    d = _loads(data, "controller")
    return ControllerZNode(d["broker_id"], d.get("timestamp_ms", 0))


def encode_controller_epoch(epoch: int) -> bytes:
    return _dumps({"epoch": epoch})


def decode_controller_epoch(data: bytes) -> int:
    return int(_loads(data, "controller epoch")["epoch"])


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    return _dumps({"broker_id": block.broker_id, "block_start": block.block_start,
                   "block_end": block.block_end})


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    d = _loads(data, "producer id block")
    return ProducerIdBlock(d["broker_id"], d["block_start"], d["block_end"])


def encode_remote_segment(metadata: RemoteLogSegmentMetadata) -> bytes:
    return orjson.dumps(metadata.to_json())


def decode_remote_segment(data: bytes) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata.from_json(_loads(data, "remote log segment"))


def encode_user(credentials: dict[str, ScramCredential]) -> bytes:
    return _dumps({"config": {m: c.to_text() for m, c in sorted(credentials.items())}})


def decode_user(data: bytes) -> dict[str, ScramCredential]:
    config = _loads(data, "user").get("config", {})
    return {m: ScramCredential.from_text(m, text) for m, text in config.items()}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


_OPERATIONS = {_camel(o.value): o for o in Operation}
_PERMISSIONS = {_camel(p.value): p for p in Permission}


def encode_acls(entries: list[AccessControlEntry]) -> bytes:
    return _dumps({"acls": [{"principal": e.principal, "permissionType": _camel(
        e.permission.value), "operation": _camel(e.operation.value), "host": e.host}
        for e in sorted(entries, key=lambda e: (e.principal, e.host, e.operation.value,
                                                e.permission.value))]})


def decode_acls(pattern: ResourcePattern, data: bytes) -> list[AclBinding]:
    return [AclBinding(pattern, AccessControlEntry(
        a["principal"], a["host"], _OPERATIONS[a["operation"]], _PERMISSIONS[a["permissionType"]]))
        for a in _loads(data, "acls").get("acls", [])]
