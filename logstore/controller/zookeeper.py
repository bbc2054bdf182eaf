"""Cluster coordination: the MetadataStore on ZooKeeper, through kazoo.

Owns: one broker's ZooKeeper session (``zk_session.py`` holds its kazoo client), its ephemeral
registration (made again after the session expires), conditional partition-state writes fenced
by the controller epoch, and a cache of what it read, kept fresh by watches (remote segment
entries are not cached: a new leader reads its partition's once). It composes the store's other
parts, one module each: the controller election (ephemeral ``/controller`` plus a conditional
increment of ``/controller_epoch`` in one transaction; ``zk_election.py``), topic creation,
update and deletion (``zk_topic_writes.py``; the znodes of new topics and their grouping into
transactions are ``zk_topic_txn.py``'s), producer-id blocks (compare-and-set;
``zk_producer_ids.py``) and remote log segment entries written in transactions that check the
topic and partition-state znodes (leader-epoch fencing; ``zk_remote_log.py``). Users'
credentials and ACLs are ``zk_security.py``'s, through the ``ZNodes`` seam that ``zk_znodes.py``
implements; with ``zk_set_acl`` (a ``ZkDigest``) every znode this store creates is writable only
by that digest identity. The znode layout is ``zk_paths.py``'s. Must not: be imported by
anything but the composition root, or let kazoo exceptions out (connection trouble becomes the
retriable ``RequestTimedOutError``). kazoo is imported only by this module and the parts above
that talk to ZooKeeper (``zk_session.py``, ``zk_election.py``, ``zk_topic_writes.py``,
``zk_producer_ids.py``, ``zk_remote_log.py``, ``zk_znodes.py``); ``zk_paths.py``,
``zk_cache.py``, ``zk_events.py``, ``zk_security.py`` and ``zk_topic_txn.py`` stay free of it.

Threads: kazoo calls watches and the connection-state listener on its own threads, which must
not block, so they only drop cache entries and queue an event. The events thread
(``zk_events.py``) then reads again what changed (which re-arms the watches; kazoo forgets
every watch when the connection drops), registers again after a session expiry, stands in
controller elections and calls the metadata listeners. Reads are served from the cache and go
to ZooKeeper only for what a watch has invalidated, so a broker keeps serving from its cache
while ZooKeeper is away.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Hashable
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType, WatchedEvent

from logstore.controller import zk_paths as zp
from logstore.controller.store import (
    BrokerInfo,
    Credentials,
    ElectedCallback,
    MetadataListener,
    PartitionState,
    ResignedCallback,
    TopicRecord,
)
from logstore.controller.zk_cache import (
    BROKERS_KEY,
    CONTROLLER_KEY,
    SECURITY_KEY,
    TOPICS_KEY,
    CacheKey,
    WatchedCache,
    key_for,
    states_key,
)
from logstore.controller.zk_election import ZkElection
from logstore.controller.zk_events import EventsThread
from logstore.controller.zk_producer_ids import ZkProducerIds
from logstore.controller.zk_remote_log import ZkRemoteLog
from logstore.controller.zk_security import ZkSecurity
from logstore.controller.zk_session import ZkDigest, ZkSession
from logstore.controller.zk_topic_txn import NewTopicState
from logstore.controller.zk_topic_writes import ZkTopicWrites
from logstore.controller.zk_znodes import KazooZNodes
from logstore.errors import (
    ApiError,
    ConfigError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from logstore.security.acl import AclBinding
from logstore.security.scram import ScramCredential
from logstore.tiering.metadata import RemoteLogSegmentMetadata, TopicIdPartition

__all__ = ["KazooMetadataStore", "ZkDigest"]  # ZkDigest: zk_session.py's, for main.py

log = logging.getLogger(__name__)

_SESSION_LOST = "session-lost"
_RECONNECTED = "reconnected"


class KazooMetadataStore:
    """Cluster metadata in ZooKeeper at ``zk_connect`` (``host:port[,host:port]/chroot``)."""

    def __init__(self, zk_connect: str, broker_id: int, session_timeout_ms: int = 18_000,
                 digest: ZkDigest | None = None) -> None:
        hosts, chroot = zp.split_zk_connect(zk_connect)
        self._broker_id = broker_id
        self._zk = ZkSession(hosts, chroot, broker_id, session_timeout_ms / 1000, digest,
                             self._on_watch)
        self._cache = WatchedCache()
        self._listeners: list[MetadataListener] = []
        self._events = EventsThread(f"zk-events-{broker_id}", self._handle,
                                    retry_while=self._zk.connected.is_set)
        self._lock = threading.RLock()  # registration and election state
        self._registered: BrokerInfo | None = None
        self._election = ZkElection(self._zk, self._lock, self.controller_id,
                                    functools.partial(self._changed, CONTROLLER_KEY))
        self._started = False
        self._topic_writes = ZkTopicWrites(self._zk, self._changed)
        self._producer_ids = ZkProducerIds(self._zk)
        self._remote_log = ZkRemoteLog(self._zk)
        self._security = ZkSecurity(KazooZNodes(self._zk))

    def sensitive_acl(self) -> list[Any] | None:
        """The ACL of znodes only the brokers may read (None: ZooKeeper's open default)."""
        return self._zk.sensitive_acl()

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """(session id, password) of the current session; fault-injection tests use it to
        expire the session from outside."""
        return self._zk.client_id

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._zk.start()
        self._started = True
        self._zk.connected.set()
        self._zk.client.add_listener(self._on_connection_state)
        for path in zp.PERSISTENT_PATHS:
            self._zk.op(f"create {path}", self._zk.client.ensure_path_async, path)
        self._zk.create_if_missing(zp.CONTROLLER_EPOCH,
                                   zp.encode_controller_epoch(zp.INITIAL_CONTROLLER_EPOCH))
        self._events.start()
        self._reload_all()
        log.info("broker %d: connected to ZooKeeper at %s%s (session 0x%x)", self._broker_id,
                 self._zk.hosts, self._zk.chroot or "", self._zk.client.client_id[0])

    def close(self) -> None:
        """End the session: ZooKeeper deletes this broker's ephemeral znodes at once."""
        if not self._started:
            return
        self._started = False
        self._zk.client.remove_listener(self._on_connection_state)
        self._events.stop(self._zk.timeout_s)
        self._election.resign("the store is closing")
        self._zk.stop()

    # -- watches, connection state and the events thread -------------------------------------

    def _on_watch(self, event: WatchedEvent) -> None:
        """kazoo's thread: drop what changed and let the events thread read it again."""
        if event.type == EventType.NONE or event.path is None:
            return  # the connection dropped; _on_connection_state handles that
        key = key_for(event.path)
        if key is not None:
            self._cache.invalidate(key)
            self._events.put(key)

    def _on_connection_state(self, state: str) -> None:
        """kazoo's thread: only note the change; the events thread acts on it."""
        log.info("broker %d: ZooKeeper connection %s", self._broker_id, state)
        if state == KazooState.CONNECTED:
            self._zk.connected.set()
            self._events.put(_RECONNECTED)
            return
        self._zk.connected.clear()
        if state == KazooState.LOST:
            self._events.put(_SESSION_LOST)

    def _handle(self, keys: set[Hashable]) -> None:
        """The events thread: act on a batch of watch and connection events."""
        if _SESSION_LOST in keys:
            self._election.resign("the ZooKeeper session expired")
        if _RECONNECTED in keys:
            self._resync()
        else:
            for key in keys - {_SESSION_LOST}:
                self._reload(key)  # type: ignore[arg-type]
            if CONTROLLER_KEY in keys:
                self._election.check()
        self._notify()

    def _resync(self) -> None:
        """After a reconnection: register again if the session (and with it our ephemeral
        znodes) was lost, stand for controller again, and re-read everything (kazoo drops every
        watch when the connection drops)."""
        with self._lock:
            info = self._registered
        if info is not None:
            self._register(info)
        self._reload_all()
        self._election.check()

    def _reload(self, key: CacheKey) -> None:
        if key == BROKERS_KEY:
            self.brokers()
        elif key == TOPICS_KEY:
            self.topics()
        elif key == CONTROLLER_KEY:
            self.controller_id()
        elif key == SECURITY_KEY:
            self._security.reload()
        elif isinstance(key, tuple) and key[1] in self.topics():
            self.partition_states(key[1])

    def _reload_all(self) -> None:
        """Read everything again, re-arming every watch. Until each new value is in, readers
        keep the old one: a broker goes on serving while it resynchronises."""
        self._cache.refresh(BROKERS_KEY, self._load_brokers)
        self._cache.refresh(CONTROLLER_KEY, self._load_controller)
        topics = self._cache.refresh(TOPICS_KEY, self._load_topics)
        for topic in topics:
            self._cache.refresh(states_key(topic), functools.partial(self._load_states, topic))
        # Anything else (a topic deleted while we were away) has lost its watch.
        self._cache.retain({BROKERS_KEY, CONTROLLER_KEY, TOPICS_KEY,
                            *(states_key(t) for t in topics)})
        self._security.reload()

    def _changed(self, *keys: CacheKey) -> None:
        """After our own write: read it back into the cache (so it is served from there even
        if ZooKeeper goes away now), then tell the listeners."""
        for key in keys:
            self._cache.invalidate(key)
        try:
            for key in keys:
                self._reload(key)
        except RequestTimedOutError as e:  # the write itself succeeded
            log.warning("broker %d: %s; reading again after reconnecting", self._broker_id, e)
        self._notify()

    def add_listener(self, listener: MetadataListener) -> None:
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # boundary: the write it reports has already happened
                log.exception("broker %d: metadata listener failed", self._broker_id)

    # -- reads -------------------------------------------------------------------------------

    def brokers(self) -> dict[int, BrokerInfo]:
        return dict(self._cache.get(BROKERS_KEY, self._load_brokers))

    def _load_brokers(self) -> tuple[dict[int, BrokerInfo], bool]:
        out = {}
        for child in self._zk.children(zp.BROKER_IDS, watch=True):
            if found := self._zk.get_or_none(zp.broker_path(int(child)), watch=True):
                out[int(child)] = zp.decode_broker(found[0])
        return out, True

    def controller_id(self) -> int | None:
        return self._cache.get(CONTROLLER_KEY, self._load_controller)

    def _load_controller(self) -> tuple[int | None, bool]:
        # exists() leaves a watch whether or not the znode is there.
        if self._zk.op(f"read {zp.CONTROLLER}", self._zk.client.exists_async, zp.CONTROLLER,
                       self._on_watch) is None:
            return None, True
        found = self._zk.get_or_none(zp.CONTROLLER)  # None: deleted since; the watch fires
        return (zp.decode_controller(found[0]).broker_id if found else None), True

    def topics(self) -> dict[str, TopicRecord]:
        return dict(self._cache.get(TOPICS_KEY, self._load_topics))

    def _load_topics(self) -> tuple[dict[str, TopicRecord], bool]:
        out = {}
        for name in self._zk.children(zp.TOPICS, watch=True):
            if found := self._zk.get_or_none(zp.topic_path(name), watch=True):
                out[name] = zp.decode_topic(found[0])
        return out, True

    def partition_states(self, topic: str) -> dict[int, PartitionState]:
        return dict(self._cache.get(states_key(topic), lambda: self._load_states(topic)))

    def _load_states(self, topic: str) -> tuple[dict[int, PartitionState], bool]:
        try:
            children = self._zk.children(zp.partitions_path(topic), watch=True)
        except NoNodeError:
            return {}, False  # no such topic: nothing to watch, so nothing to cache
        out = {}
        for p in map(int, children):
            if found := self._zk.get_or_none(zp.partition_state_path(topic, p), watch=True):
                out[p] = zp.decode_partition_state(found[0])
        return out, True

    # -- broker registration -----------------------------------------------------------------

    def register_broker(self, info: BrokerInfo) -> None:
        if info.broker_id != self._broker_id:
            raise ValueError(f"this store belongs to broker {self._broker_id}, "
                             f"not {info.broker_id}")
        with self._lock:
            self._registered = info
        self._register(info)
        self._changed(BROKERS_KEY)

    def _register(self, info: BrokerInfo) -> None:
        """Create our ephemeral znode. One left by an earlier process of this broker id (kill
        -9, then a restart) disappears when its session expires, so wait for that a while."""
        path, data = zp.broker_path(info.broker_id), zp.encode_broker(info)
        deadline = time.monotonic() + 1.5 * self._zk.timeout_s + 1.0
        while True:
            try:
                self._zk.op(f"create {path}", self._zk.client.create_async, path, data,
                            ephemeral=True)
                log.info("broker %d: registered at %s", info.broker_id, path)
                return
            except NodeExistsError:
                if self._zk.owned_by_us(path):
                    self._zk.op(f"update {path}", self._zk.client.set_async, path, data)
                    return
            if not self._wait_until_gone(path, deadline):
                raise ConfigError(f"broker_id {info.broker_id} is already registered in "
                                  f"ZooKeeper by another live broker ({path})")

    def _wait_until_gone(self, path: str, deadline: float) -> bool:
        gone = threading.Event()
        while time.monotonic() < deadline:
            gone.clear()
            if self._zk.op(f"read {path}", self._zk.client.exists_async, path,
                           lambda event: gone.set()) is None:
                return True
            gone.wait(max(0.0, deadline - time.monotonic()))
        return False

    # -- controller election (zk_election.py) ------------------------------------------------

    def elect_controller(self, on_elected: ElectedCallback,
                         on_resigned: ResignedCallback | None = None) -> None:
        self._election.elect(on_elected, on_resigned)

    def is_controller(self) -> bool:
        return self._election.is_controller()

    @property
    def controller_epoch(self) -> int:
        return self._election.controller_epoch

    # -- topics (zk_topic_writes.py) and partition states ------------------------------------

    def create_topic(self, record: TopicRecord, states: dict[int, PartitionState]) -> None:
        self._topic_writes.create(record, states)

    def create_topics(self, topics: list[NewTopicState]) -> list[ApiError | None]:
        return self._topic_writes.create_many(topics)

    def update_topic(self, record: TopicRecord, new_states: dict[int, PartitionState]) -> None:
        self._topic_writes.update(record, new_states)

    def delete_topic(self, name: str) -> None:
        self._topic_writes.delete(name)

    def set_partition_state(self, topic: str, partition: int, state: PartitionState,
                            expected_epoch: int | None = None) -> bool:
        path = zp.partition_state_path(topic, partition)
        found = self._zk.get_or_none(path)
        if found is None:
            raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} does not exist")
        current, stat = zp.decode_partition_state(found[0]), found[1]
        if expected_epoch is not None and current.leader_epoch != expected_epoch:
            return False
        epoch, epoch_version = self._election.read_controller_epoch()
        if state.controller_epoch != epoch:
            log.warning("%s-%d: refused a state from controller epoch %d; the epoch is %d",
                        topic, partition, state.controller_epoch, epoch)
            return False
        tx = self._zk.transaction()
        tx.check(zp.CONTROLLER_EPOCH, epoch_version)  # fences a replaced controller
        tx.set_data(path, zp.encode_partition_state(state), version=stat.version)
        error = self._zk.commit(tx, f"write the state of {topic}-{partition}")
        if isinstance(error, BadVersionError | NoNodeError):
            return False  # a concurrent writer won
        if error is not None:
            raise self._zk.unexpected(error, f"write the state of {topic}-{partition}")
        self._changed(states_key(topic))
        return True

    # -- producer ids (zk_producer_ids.py) ---------------------------------------------------

    def next_producer_id_block(self, size: int) -> int:
        return self._producer_ids.next_block(size)

    # -- remote log segment metadata (zk_remote_log.py) --------------------------------------

    def remote_log_segments(self, partition: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return self._remote_log.segments(partition)

    def remote_log_partitions(self) -> list[TopicIdPartition]:
        return self._remote_log.partitions()

    def put_remote_log_segment(self, metadata: RemoteLogSegmentMetadata,
                               leader_epoch: int | None) -> None:
        self._remote_log.put(metadata, leader_epoch)

    # -- security: users and ACLs (zk_security.py) -------------------------------------------

    def scram_credentials(self) -> Credentials:
        return self._security.scram_credentials()

    def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        self._security.put_scram_credential(user, credential)

    def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        return self._security.delete_scram_credential(user, mechanism)

    def acls(self) -> frozenset[AclBinding]:
        return self._security.acls()

    def add_acls(self, bindings: list[AclBinding]) -> None:
        self._security.add_acls(bindings)

    def remove_acls(self, bindings: list[AclBinding]) -> None:
        self._security.remove_acls(bindings)

    def add_security_listener(self, listener: MetadataListener) -> None:
        self._security.add_listener(listener)
