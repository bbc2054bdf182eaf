"""Embedded coordination: the MetadataStore backed by one JSON file, for a broker that runs
alone with no ZooKeeper. Writes go to a temporary file that is fsynced and renamed, so a crash
leaves either the old or the new state. The broker is always its own controller; each election
(one per start) still takes a new controller epoch, so the fencing rules are the same as with
ZooKeeper. Remote log segment entries sit in the same file, fenced in-process by the same rule
as in ZooKeeper (``store.remote_write_fence``), and so do users' SCRAM credentials (salted keys
only) and ACL bindings. The file may sit in any of a broker's log dirs (``metadata_path``
finds it; a new one goes in the first). With ``exclusive`` the store holds an advisory lock on
``<file>.lock`` while started: the broker takes it, so ``logstore users add --log-dir`` (which
edits the file of a stopped broker) is refused while the broker runs. Must not: know about the
network.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import IO, Any

import orjson

from logstore.controller.store import (
    BrokerInfo,
    Credentials,
    ElectedCallback,
    MetadataListener,
    PartitionState,
    ResignedCallback,
    TopicRecord,
    remote_write_fence,
)
from logstore.errors import (
    ApiError,
    ConfigError,
    KafkaStorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from logstore.security.acl import AclBinding
from logstore.security.scram import ScramCredential
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    check_transition,
)

METADATA_FILE = "__cluster_metadata.json"


def metadata_path(log_dirs: list[Path]) -> Path:
    """The embedded metadata file of a broker with ``log_dirs``: the one log dir holding it
    (whatever their order), else a new one in the first. ConfigError when several hold one
    or a log dir cannot be looked into."""
    found: list[Path] = []
    for d in log_dirs:
        path = Path(d) / METADATA_FILE
        try:
            if path.exists():
                found.append(path)
        except OSError as e:
            raise ConfigError(f"log_dirs entry {str(d)!r} cannot be used as a log directory: "
                              f"{e.strerror or e}") from None
    if len(found) > 1:
        raise ConfigError(f"several log_dirs hold an embedded metadata file: "
                          f"{', '.join(str(p) for p in found)}; a broker has one. Keep the one "
                          "its topics are in and move the other away")
    return found[0] if found else Path(log_dirs[0]) / METADATA_FILE


class LocalMetadataStore:
    """All cluster metadata of a single embedded broker in ``<log_dir>/__cluster_metadata.json``."""

    def __init__(self, path: Path, broker_id: int, exclusive: bool = False) -> None:
        self._path = Path(path)
        self._broker_id = broker_id
        self._exclusive = exclusive
        self._lock_file: IO[bytes] | None = None
        self._users: Credentials = {}
        self._acls: set[AclBinding] = set()
        self._security_listeners: list[MetadataListener] = []
        self._lock = threading.RLock()
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._states: dict[str, dict[int, PartitionState]] = {}
        self._next_producer_id = 0
        self._latest_controller_epoch = 0  # persisted: the newest epoch ever taken
        self._won_epoch = 0
        self._listeners: list[MetadataListener] = []
        self._remote: dict[TopicIdPartition, dict[str, RemoteLogSegmentMetadata]] = {}

    @property
    def path(self) -> Path:
        return self._path

    @property
    def is_new(self) -> bool:
        """True until a broker has used the file (no file, or one only the users command
        wrote): no controller epoch was ever taken in it."""
        with self._lock:
            return self._latest_controller_epoch == 0

    def start(self) -> None:
        if self._exclusive:
            self._take_lock()
        if not self._path.exists():
            return
        try:
            self._load(orjson.loads(self._path.read_bytes()))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"{self._path}: not a valid metadata file ({e}); restore it from "
                              "a backup (the broker's topics, ACLs and users are in it)") from None

    def _load(self, data: Any) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        self._users = {u: {m: ScramCredential.from_text(m, t) for m, t in creds.items()}
                       for u, creds in data.get("scram_users", {}).items()}
        self._acls = {AclBinding.from_json(b) for b in data.get("acls", [])}
        self._topics = {n: TopicRecord.from_json(t) for n, t in data.get("topics", {}).items()}
        self._states = {n: {int(p): PartitionState.from_json(s) for p, s in states.items()}
                        for n, states in data.get("states", {}).items()}
        self._next_producer_id = data.get("next_producer_id", 0)
        self._latest_controller_epoch = data.get("controller_epoch", 0)
        for raw in data.get("remote_log_segments", []):
            entry = RemoteLogSegmentMetadata.from_json(raw)
            self._remote.setdefault(entry.partition, {})[entry.segment_id] = entry

    def _take_lock(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(self._path.with_suffix(".lock"), "ab")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise ConfigError(f"{self._path} is in use by a running broker; change it through "
                              "that broker (--bootstrap-server) instead") from None
        self._lock_file = lock_file

    def close(self) -> None:
        """Every change was written through to the file already; only the lock is let go."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def register_broker(self, info: BrokerInfo) -> None:
        with self._lock:
            self._brokers = {info.broker_id: info}

    def brokers(self) -> dict[int, BrokerInfo]:
        with self._lock:
            return dict(self._brokers)

    def controller_id(self) -> int | None:
        return self._broker_id

    def elect_controller(self, on_elected: ElectedCallback,
                         on_resigned: ResignedCallback | None = None) -> None:
        with self._lock:
            self._latest_controller_epoch += 1
            self._won_epoch = self._latest_controller_epoch
            self._save()
        on_elected(self._won_epoch)

    def is_controller(self) -> bool:
        return self._won_epoch > 0

    @property
    def controller_epoch(self) -> int:
        return self._won_epoch

    def topics(self) -> dict[str, TopicRecord]:
        with self._lock:
            return dict(self._topics)

    def partition_states(self, topic: str) -> dict[int, PartitionState]:
        with self._lock:
            return dict(self._states.get(topic, {}))

    def create_topic(self, record: TopicRecord, states: dict[int, PartitionState]) -> None:
        error = self.create_topics([(record, states)])[0]
        if error is not None:
            raise error

    def create_topics(self, topics: list[tuple[TopicRecord, dict[int, PartitionState]]]
                      ) -> list[ApiError | None]:
        """One write of the file for the whole batch."""
        outcomes: list[ApiError | None] = []
        with self._lock:
            for record, states in topics:
                if record.name in self._topics:
                    outcomes.append(TopicAlreadyExistsError(
                        f"topic {record.name!r} already exists"))
                    continue
                self._topics[record.name] = record
                self._states[record.name] = dict(states)
                outcomes.append(None)
            if any(o is None for o in outcomes):
                self._save_or_undo([r.name for (r, _), o in zip(topics, outcomes, strict=True)
                                    if o is None])
        if any(o is None for o in outcomes):
            self._notify()
        return outcomes

    def _save_or_undo(self, added: list[str]) -> None:
        """Save; if that fails, forget the topics just added (none of them exists)."""
        try:
            self._save()
        except OSError as e:
            for name in added:
                del self._topics[name]
                self._states.pop(name, None)
            raise KafkaStorageError(f"cannot write {self._path}: {e}") from e

    def update_topic(self, record: TopicRecord, new_states: dict[int, PartitionState]) -> None:
        with self._lock:
            self._require(record.name)
            self._topics[record.name] = record
            self._states[record.name].update(new_states)
            self._save()
        self._notify()

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._require(name)
            del self._topics[name]
            self._states.pop(name, None)
            self._save()
        self._notify()

    def set_partition_state(self, topic: str, partition: int, state: PartitionState,
                            expected_epoch: int | None = None) -> bool:
        with self._lock:
            self._require(topic)
            if partition not in self._topics[topic].replicas:
                raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} does not exist")
            current = self._states[topic].get(partition)
            if expected_epoch is not None and current and current.leader_epoch != expected_epoch:
                return False
            if state.controller_epoch != self._latest_controller_epoch:
                return False
            self._states[topic][partition] = state
            self._save()
        self._notify()
        return True

    def next_producer_id_block(self, size: int) -> int:
        with self._lock:
            start = self._next_producer_id
            self._next_producer_id += size
            self._save()
            return start

    def add_listener(self, listener: MetadataListener) -> None:
        self._listeners.append(listener)

    # -- remote log segment metadata ---------------------------------------------------------

    def remote_log_segments(self, partition: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        with self._lock:
            entries = self._remote.get(partition, {})
            return sorted(entries.values(), key=lambda m: (m.base_offset, m.segment_id))

    def remote_log_partitions(self) -> list[TopicIdPartition]:
        with self._lock:
            return sorted(self._remote)

    def put_remote_log_segment(self, metadata: RemoteLogSegmentMetadata,
                               leader_epoch: int | None) -> None:
        tp = metadata.partition
        with self._lock:
            record = self._topics.get(tp.topic)
            state = self._states.get(tp.topic, {}).get(tp.partition)
            fenced = remote_write_fence(tp, leader_epoch, record, state)
            if fenced is not None:
                raise fenced
            entries = self._remote.get(tp, {})
            if not check_transition(entries.get(metadata.segment_id), metadata):
                return
            if metadata.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
                del entries[metadata.segment_id]
            else:
                entries[metadata.segment_id] = metadata
            if entries:
                self._remote[tp] = entries
            else:
                self._remote.pop(tp, None)
            self._save()

    # -- security ----------------------------------------------------------------------------

    def scram_credentials(self) -> Credentials:
        with self._lock:
            return {u: dict(c) for u, c in self._users.items()}

    def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        with self._lock:
            self._users.setdefault(user, {})[credential.mechanism] = credential
            self._save()
        self._notify_security()

    def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        with self._lock:
            if mechanism not in self._users.get(user, {}):
                return False
            del self._users[user][mechanism]
            if not self._users[user]:
                del self._users[user]
            self._save()
        self._notify_security()
        return True

    def acls(self) -> frozenset[AclBinding]:
        with self._lock:
            return frozenset(self._acls)

    def add_acls(self, bindings: list[AclBinding]) -> None:
        with self._lock:
            self._acls.update(bindings)
            self._save()
        self._notify_security()

    def remove_acls(self, bindings: list[AclBinding]) -> None:
        with self._lock:
            self._acls.difference_update(bindings)
            self._save()
        self._notify_security()

    def add_security_listener(self, listener: MetadataListener) -> None:
        self._security_listeners.append(listener)

    def _notify_security(self) -> None:
        for listener in self._security_listeners:
            listener()

    def _require(self, name: str) -> None:
        if name not in self._topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def _save(self) -> None:
        data: dict[str, Any] = {
            "version": 1,
            "topics": {n: t.to_json() for n, t in self._topics.items()},
            "states": {n: {str(p): s.to_json() for p, s in st.items()}
                       for n, st in self._states.items()},
            "next_producer_id": self._next_producer_id,
            "controller_epoch": self._latest_controller_epoch,
            "remote_log_segments": [m.to_json() for entries in self._remote.values()
                                    for m in entries.values()],
            "scram_users": {u: {m: c.to_text() for m, c in creds.items()}
                            for u, creds in self._users.items()},
            "acls": [b.to_json() for b in sorted(self._acls, key=AclBinding.sort_key)],
        }
        tmp = self._path.with_suffix(".tmp")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Owner only: it holds every SCRAM user's salted keys (what ZooKeeper's znode ACLs
        # guard in cluster mode).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # a stale .tmp keeps the mode it was made with
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
