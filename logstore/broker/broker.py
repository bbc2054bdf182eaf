"""One broker process: wires the log manager, metadata store, controller, replica manager,
tiered storage (when given an object store), request handlers and Flight server together, and
keeps hosted partitions in step with the cluster metadata. Must not: contain storage or
replication logic.

The metadata sync runs on its own thread: a metadata change only wakes it (changes that come
while it runs are taken by its next pass). A pass brings new partitions online on SYNC_THREADS
threads (creating a log is mostly waiting for fsync); a topic admin request waits, bounded, for
the pass after its change (``await_metadata_sync``) instead of doing the work itself. At start
the first pass runs before the broker says it listens.

Log directories: start locks each one and checks its recorded broker id first (``log_dirs``),
then, with the metadata loaded, refuses an embedded store that is new while partitions exist,
and renames aside (never deletes) partition directories the metadata does not give this broker.
Only a partition hosted while running and then deleted or moved away is deleted.

Topic incarnations (KIP-516): a partition directory records its topic's id
(``partition.metadata``, see segments/format.py). At start a directory that records another id
than the metadata's for its topic (deleted and created again while this broker was down) is
renamed aside too, and one that records none (written by an earlier version) adopts the current
id. At run time a sync pass that finds a hosted partition's (or a found log's) topic id replaced
stops that replica and deletes its log, as for a deleted topic, and brings the new topic's
partition up from an empty log. Between the metadata change and that pass the old replica
answers UNKNOWN_TOPIC_ID (``current_topic_id``, see replica_manager.py), and a follower does not
replicate into it (fetcher.py).

Tiered topics: their Logs run without the total retention (``local_log_config``), which only
the tier manager applies, deleting a local segment once its copy is finished and it is past
local retention; their tiering task follows leadership and each new leader epoch.
"""

from __future__ import annotations

import gc
import logging
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from logstore.broker.cluster import ClusterHandlers, ConnectionFactory, Peers
from logstore.broker.group_coordinator import GroupCoordinatorService
from logstore.broker.group_handlers import GroupHandlers, ReplicaOffsetsLog
from logstore.broker.handlers import RequestHandlers
from logstore.broker.lag import GroupLag, OffsetTimestamps
from logstore.broker.log_dirs import LogDirs
from logstore.broker.remote_tier import RemoteTier
from logstore.broker.replica_manager import ReplicaManager
from logstore.broker.security import SecurityManager
from logstore.broker.txn_handlers import TxnHandlers
from logstore.clock import Clock, SystemClock
from logstore.config import BrokerConfig, TopicConfig
from logstore.controller.cluster_controller import ClusterController
from logstore.controller.local import METADATA_FILE, LocalMetadataStore, metadata_path
from logstore.controller.store import BrokerInfo, MetadataStore, PartitionState, TopicRecord
from logstore.controller.topics import TopicController
from logstore.errors import ApiError, ConfigError, InconsistentTopicIdError
from logstore.groups.coordinator import GroupConfig
from logstore.messages.cluster import ControlledShutdownRequest
from logstore.model import TopicPartition
from logstore.records import topic_schema
from logstore.replication.fetcher import FetcherManager
from logstore.replication.isr import AlterIsrSender, IsrExpirer
from logstore.segments.log_manager import LogManager
from logstore.tiering.log_view import local_log_config
from logstore.tiering.store import ObjectStore

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000
GROUP_TICK_MS = 100  # session expiry and delayed joins are checked this often
TXN_TICK_MS = 100  # led transaction partitions are loaded within this
STOP_GRACE_S = 3.0
CONTROLLED_SHUTDOWN_S = 10.0
CONTROLLED_SHUTDOWN_RETRY_S = 0.2
SYNC_THREADS = 8
FREEZE_AFTER_PARTITIONS = 1_000


class Server(Protocol):
    """What the broker needs of its transport (``rpc.server.FlightBrokerServer`` has it)."""

    @property
    def port(self) -> int: ...

    def wait(self) -> None: ...

    def shutdown(self) -> None: ...


class Endpoint(Protocol):
    """A side server the broker starts first and closes last (the metrics endpoint)."""

    def start(self) -> None: ...

    def close(self) -> None: ...


# (listener "host:port", handlers) -> a started server. Injected by the composition root
# (logstore/main.py), because the transport layer sits above this one.
ServerFactory = Callable[[str, RequestHandlers], Server]


class ProducerIdAllocator:
    """Hands out producer ids from blocks reserved in the metadata store."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._next = self._end = 0

    def next_producer_id(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._next = self._store.next_producer_id_block(PRODUCER_ID_BLOCK)
                self._end = self._next + PRODUCER_ID_BLOCK
            self._next += 1
            return self._next - 1


class Broker:
    def __init__(self, config: BrokerConfig, serve: ServerFactory, clock: Clock | None = None,
                 store: MetadataStore | None = None,
                 connect: ConnectionFactory | None = None,
                 object_store: ObjectStore | None = None) -> None:
        self.config = config
        self._make_server = serve
        self.clock = clock or SystemClock()
        log_dirs = [Path(d) for d in config.log_dirs]
        self.log_dirs = LogDirs(log_dirs)  # created and locked by start()
        self.store = store or LocalMetadataStore(metadata_path(log_dirs), config.broker_id)
        self.default_topic_config: TopicConfig = config.default_topic_config()
        self.controller = TopicController(self.store, self.default_topic_config,
                                          remote_storage_uri=config.remote_storage_uri)
        self.tier = RemoteTier(config, object_store, self.store, self.clock) \
            if object_store is not None else None
        self.log_manager = LogManager(
            log_dirs, self.clock, self._topic_config,
            retention_check_interval_ms=config.log_retention_check_interval_ms,
            cleaner_interval_ms=config.log_cleaner_interval_ms,
            max_open_segment_files=config.max_open_segment_files)
        # Replication runs when the broker can reach its peers (cluster mode).
        self.peers = Peers(self.store, connect) if connect is not None else None
        self._isr_sender = AlterIsrSender(config.broker_id, self.peers.to_controller) \
            if self.peers else None
        # Each topic's id in the metadata now, replaced whole on every metadata change (a
        # lookup per request partition: see current_topic_id).
        self._topic_ids: dict[str, str] = {}
        self._topic_ids_lock = threading.Lock()
        self.replicas = ReplicaManager(config.broker_id, self.log_manager, self.clock,
                                       self._isr_sender.propose if self._isr_sender else None,
                                       self.tier, topic_id_of=self.current_topic_id)
        producer_ids = ProducerIdAllocator(self.store)
        self.handlers = RequestHandlers(config.broker_id, self.store, self.controller,
                                        self.replicas, producer_ids)
        self.groups = self._group_handlers(config)
        self.handlers.add_routes(self.groups.routes())
        self.security = SecurityManager(config.security, self.store)
        self.handlers.add_routes(self.security.routes())
        self.handlers.permissions = self.security.permissions
        self.handlers.credentials = self.security.credentials
        self.handlers.await_metadata_sync = self.await_metadata_sync
        self.transactions = self._txn_handlers(config, producer_ids)
        self.handlers.add_routes(self.transactions.routes())
        self.lag = GroupLag(config.broker_id, self.groups.coordinator,
                            OffsetTimestamps(self.replicas), self.store,
                            self.peers.get if self.peers else None)
        self.handlers.add_routes(self.lag.routes())
        self.endpoints: list[Endpoint] = []  # the composition root adds them
        self.server: Server | None = None
        self._sync_lock = threading.RLock()
        self._sync_wanted = threading.Event()
        self._sync_stopped = threading.Event()
        # Passes of the metadata-sync thread begun and finished (await_metadata_sync).
        self._sync_passes = threading.Condition()
        self._sync_begun = 0
        self._sync_done = 0
        self._sync_thread: threading.Thread | None = None
        # Every topic's id as the previous sync pass saw it (None: no pass yet).
        self._synced_topic_ids: dict[str, str] | None = None
        self._stopping = threading.Event()
        self.fetchers: FetcherManager | None = None
        self.cluster_controller: ClusterController | None = None
        if self.peers is not None:
            self._init_cluster(self.peers)

    def _init_cluster(self, peers: Peers) -> None:
        self.fetchers = FetcherManager(self.config.broker_id, peers.get,
                                       topic_id_of=self.current_topic_id)
        self.cluster_controller = ClusterController(self.store, self.config.broker_id,
                                                    peers.notify)
        self._isr_expirer = IsrExpirer(self.replicas.leaders,
                                       self.config.replica_lag_time_max_ms)
        cluster = ClusterHandlers(self.config.broker_id, self.cluster_controller, self.replicas,
                                  self._apply_state)
        self.handlers.add_routes(cluster.routes())

    def _group_handlers(self, config: BrokerConfig) -> GroupHandlers:
        coordinator = GroupCoordinatorService(
            ReplicaOffsetsLog(self.replicas, self.store),
            GroupConfig(group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                        group_min_session_timeout_ms=config.group_min_session_timeout_ms,
                        group_max_session_timeout_ms=config.group_max_session_timeout_ms,
                        offsets_retention_minutes=config.offsets_retention_minutes),
            self.clock, topic_id_of=self.current_topic_id)
        return GroupHandlers(coordinator, self.store, self.controller, config.offsets_partitions,
                             config.offsets_topic_replication_factor,
                             config.offsets_topic_segment_bytes)

    def _txn_handlers(self, config: BrokerConfig, producer_ids: ProducerIdAllocator
                      ) -> TxnHandlers:
        txn = TxnHandlers(config, self.store, self.controller, self.replicas, producer_ids,
                          self.groups, self.clock, self.peers.get if self.peers else None)
        self.groups.transaction_lookup = txn.find_coordinator
        if config.transaction_partition_verification_enable:
            self.handlers.txn_verifier = txn.verifier
        return txn

    def _tick_transactions(self) -> None:
        """Background loop: loading led transaction partitions, timeouts, markers owed."""
        while not self._stopping.wait(TXN_TICK_MS / 1000.0):
            try:
                self.transactions.tick()
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("broker %d: transaction coordinator tick failed",
                              self.config.broker_id)

    def _tick_groups(self) -> None:
        """Background loop: session expiry, delayed joins and offset expiry."""
        while not self._stopping.wait(GROUP_TICK_MS / 1000.0):
            try:
                self.groups.coordinator.tick()
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("broker %d: group coordinator tick failed", self.config.broker_id)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def start(self) -> None:
        _raise_open_file_limit()
        # Loading thousands of partitions allocates objects that live as long as the broker:
        # collections meanwhile would only scan them again and again (a third of the start
        # time with 4,000 partitions), and frozen afterwards later ones skip them.
        gc.disable()
        try:
            self._start()
        finally:
            gc.enable()
            gc.freeze()

    def _start(self) -> None:
        for endpoint in self.endpoints:  # first: a port taken fails before anything opens
            endpoint.start()
        # Before anything reads or writes them: another broker's directories are refused.
        self.log_dirs.lock()
        recorded = self.log_dirs.check_broker_id(self.config.broker_id)
        self.store.start()
        # First of the listeners: the sync pass and the replicas' checks see the new ids.
        self._refresh_topic_ids()
        self.store.add_listener(self._refresh_topic_ids)
        self._check_metadata_present()
        # Partition directories the metadata does not give this broker (or another topic id)
        # are renamed aside before the log manager sees them, never deleted at start.
        topic_ids = self.log_dirs.set_aside_strays(self.config.broker_id, self.store.topics(),
                                                   first_start=not recorded)
        self.log_dirs.record_broker_id(self.config.broker_id)
        self.security.start()
        self.log_manager.startup(topic_ids)
        self.log_manager.sync_metadata_later(self.log_dirs.unsynced_metadata)
        if self.tier is not None:
            self.tier.start()
            self.store.add_listener(self.tier.on_metadata_change)
        self.server = self._make_server(self.config.listener, self.handlers)
        self.store.register_broker(BrokerInfo(self.config.broker_id, self.config.host,
                                              self.server.port, self.config.rack))
        self.store.add_listener(self._sync_wanted.set)
        if self.cluster_controller is not None:
            assert self._isr_sender is not None
            self._isr_sender.start()
            self._isr_expirer.start()
            self.cluster_controller.start()
            self.store.add_listener(self.cluster_controller.on_metadata_change)
        self.store.elect_controller(self._on_elected, self._on_resigned)
        self.sync_partitions()
        self._sync_thread = threading.Thread(target=self._sync_loop, name="metadata-sync",
                                             daemon=True)
        self._sync_thread.start()
        threading.Thread(target=self._tick_groups, name="group-coordinator-tick",
                         daemon=True).start()
        threading.Thread(target=self._tick_transactions, name="txn-coordinator-tick",
                         daemon=True).start()
        log.info("broker %d listening on %s:%d", self.config.broker_id, self.config.host,
                 self.server.port)

    def _on_elected(self, epoch: int) -> None:
        # New partition states carry the epoch, so a replaced controller's writes are refused.
        self.controller.controller_epoch = epoch
        if self.cluster_controller is not None:
            self.cluster_controller.on_elected(epoch)
        log.info("broker %d is the controller (epoch %d)", self.config.broker_id, epoch)

    def _on_resigned(self) -> None:
        if self.cluster_controller is not None:
            self.cluster_controller.on_resigned()
        log.info("broker %d is no longer the controller", self.config.broker_id)

    def serve(self) -> None:
        """Block until ``stop()`` is called from another thread or a signal handler."""
        assert self.server is not None
        # wait(), not serve(): serve() installs Arrow's own SIGINT/SIGTERM handlers, whose
        # shutdown waits forever on an idle client stream and which replace ours.
        self.server.wait()

    def stop(self, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop serving, then flush and close storage. Requests get ``grace_s`` to finish; a
        client holding an idle produce stream open would otherwise keep the Flight server's
        shutdown waiting forever, so after the grace period storage is closed regardless (a
        late append then fails with a retriable storage error). True if every request ended."""
        log.info("broker %d stopping", self.config.broker_id)
        self._stopping.set()
        if self.peers is not None and self.server is not None:
            self._controlled_shutdown()
        finished = True
        # Push sessions would hold the server's shutdown open: they end now, telling their
        # clients to go elsewhere (after the controlled shutdown, which followers' sessions
        # serve).
        self.handlers.sessions.close_all(self.config.broker_id)
        if self.server is not None:
            done = threading.Event()
            server = self.server

            def shutdown() -> None:
                server.shutdown()
                done.set()

            threading.Thread(target=shutdown, name="flight-shutdown", daemon=True).start()
            finished = done.wait(grace_s)
            if not finished:
                log.warning("broker %d: requests still open after %.1f s; closing storage",
                            self.config.broker_id, grace_s)
        self._stop_sync()
        self.transactions.stop()
        self._stop_cluster()
        if self.tier is not None:  # its tasks use the logs and the store
            self.tier.close()
        # The store first: its events thread must not bring partitions online while storage
        # closes.
        self.store.close()
        if self.peers is not None:
            self.peers.close()
        self.log_manager.shutdown()
        self.log_dirs.release()
        for endpoint in self.endpoints:
            endpoint.close()
        return finished

    def _check_metadata_present(self) -> None:
        """An embedded broker whose metadata file is new (none found in any log dir, or never
        used by a broker) must not find partitions: their topics would look deleted. Refused,
        naming the directories, instead of starting empty (a reordered log_dirs, or a new
        directory put first, once did that)."""
        if not isinstance(self.store, LocalMetadataStore) or not self.store.is_new:
            return
        found = self.log_dirs.partition_dirs()
        if found:
            raise ConfigError(
                f"log_dirs {', '.join(str(d) for d in self.log_dirs.dirs)} hold {len(found)} "
                f"partition directories (e.g. {found[0]}) but no embedded metadata file "
                f"({METADATA_FILE}) that a broker has used; the broker would not know their "
                "topics. Restore the log directory holding it, or move the partition "
                "directories away to start an empty broker")

    def _controlled_shutdown(self) -> None:
        """Ask the controller to move leadership away, until it has or the time is up."""
        deadline = time.monotonic() + CONTROLLED_SHUTDOWN_S
        assert self.peers is not None
        while time.monotonic() < deadline:
            try:
                resp = self.peers.to_controller(
                    ControlledShutdownRequest(broker_id=self.config.broker_id))
                if not resp.remaining:
                    log.info("broker %d: controlled shutdown done", self.config.broker_id)
                    return
                log.info("broker %d: still leads %s", self.config.broker_id, resp.remaining)
            except ApiError as e:
                log.info("broker %d: controlled shutdown: %s", self.config.broker_id, e)
            time.sleep(CONTROLLED_SHUTDOWN_RETRY_S)
        log.warning("broker %d: leadership did not move within %.0f s; stopping anyway",
                    self.config.broker_id, CONTROLLED_SHUTDOWN_S)

    def _stop_cluster(self) -> None:
        if self.fetchers is not None:
            self.fetchers.shutdown()
        if self.cluster_controller is not None:
            self.cluster_controller.stop(STOP_GRACE_S)
            self._isr_expirer.stop(STOP_GRACE_S)
        if self._isr_sender is not None:
            self._isr_sender.stop(STOP_GRACE_S)

    def _topic_config(self, topic: str) -> TopicConfig:
        """The config of ``topic``'s Logs (what the log manager opens them with)."""
        return self._log_config(self._full_topic_config(topic))

    def _full_topic_config(self, topic: str) -> TopicConfig:
        record = self.store.topics().get(topic)
        if record is None:
            return self.default_topic_config
        return self.default_topic_config.updated(record.config)

    def _log_config(self, config: TopicConfig) -> TopicConfig:
        """A tiered topic's Logs leave total retention to the tier manager."""
        return local_log_config(config) if self.tier is not None else config

    def current_topic_id(self, topic: str) -> str | None:
        """``topic``'s id in this broker's metadata now (None: no such topic)."""
        return self._topic_ids.get(topic)

    def _refresh_topic_ids(self) -> None:
        """A metadata listener: every topic's id, read again (under a lock, so that a slower
        listener call cannot put back an older map over a newer one)."""
        with self._topic_ids_lock:
            self._topic_ids = {name: r.topic_id for name, r in self.store.topics().items()}

    def await_metadata_sync(self, timeout_s: float) -> bool:
        """Wait until a metadata-sync pass begun after this call has finished, so that the
        hosted partitions reflect every metadata change this broker knew of when called;
        False if that took over ``timeout_s`` or the broker is stopping."""
        with self._sync_passes:
            target = self._sync_begun + 1
            self._sync_wanted.set()
            done = self._sync_passes.wait_for(
                lambda: self._sync_done >= target or self._sync_stopped.is_set(), timeout_s)
            return done and not self._sync_stopped.is_set()

    def _stop_sync(self) -> None:
        """No more sync passes; a pass under way stops at its next partition."""
        self._sync_stopped.set()
        self._sync_wanted.set()
        with self._sync_passes:
            self._sync_passes.notify_all()
        if self._sync_thread is not None:
            self._sync_thread.join()

    def _sync_loop(self) -> None:
        """The metadata-sync thread: a pass per wake-up, until the broker stops."""
        while True:
            self._sync_wanted.wait()
            if self._sync_stopped.is_set():
                return
            with self._sync_passes:
                self._sync_wanted.clear()
                self._sync_begun += 1
                begun = self._sync_begun
            try:
                self.sync_partitions()
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("broker %d: metadata sync failed", self.config.broker_id)
            finally:
                with self._sync_passes:
                    self._sync_done = begun
                    self._sync_passes.notify_all()

    def sync_partitions(self) -> None:
        """Make hosted partitions match the metadata: lead what we lead, drop what is gone."""
        with self._sync_lock:
            wanted: set[TopicPartition] = set()
            new: list[_PartitionSync] = []
            topics = self.store.topics()
            # Old incarnations' logs deleted here rewrite the checkpoints once, before their
            # partitions' new logs are created (_bring_online)
            with self.log_manager.checkpoint_once():
                for name, record in topics.items():
                    config = self.default_topic_config.updated(record.config)
                    schema = topic_schema(record.value_schema)
                    states = self.store.partition_states(name)
                    for p, replicas in record.replicas.items():
                        if self.config.broker_id not in replicas:
                            continue
                        tp = TopicPartition(name, p)
                        wanted.add(tp)
                        item = _PartitionSync(tp, states.get(p), replicas, config, schema,
                                              record.topic_id)
                        if not self._old_incarnation_gone(tp, record.topic_id):
                            continue  # the next pass tries again; the old replica refuses
                        if self.replicas.get(tp) is None:
                            new.append(item)
                        else:
                            self._sync_guarded(item)
            self._bring_online(new)
            with self.log_manager.checkpoint_once():  # a deleted topic's logs: one rewrite
                self._drop_unwanted(wanted)
            self._report_deleted_topics(topics)

    def _report_deleted_topics(self, topics: dict[str, TopicRecord]) -> None:
        """Tell the group coordinator the topic ids gone since the previous pass (deleted,
        or created again under a new id), of every topic in the metadata, hosted here or
        not; the first pass after start has nothing to compare with."""
        ids = {name: record.topic_id for name, record in topics.items()}
        previous, self._synced_topic_ids = self._synced_topic_ids, ids
        if previous is None:
            return
        gone = {name: old for name, old in previous.items() if ids.get(name) != old}
        if gone:
            log.info("broker %d: %d topic id(s) deleted (of %s)", self.config.broker_id,
                     len(gone), ", ".join(sorted(gone)[:20]))
            self.groups.coordinator.on_topics_deleted(gone)

    def _bring_online(self, new: list[_PartitionSync]) -> None:
        """Take the roles of new partitions: those whose logs must be created or recovered (an
        unclean stop leaves their ends unknown) on SYNC_THREADS threads, as that is mostly
        waiting on the file system; those whose logs exist and are opened on first use (pure
        Python) on this one; then their tiering tasks."""
        with_io = [item for item in new if self._needs_io(item.tp)]
        if len(with_io) > 1:
            with ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="partition-sync") as pool:
                list(pool.map(lambda item: self._sync_guarded(item, tier=False), with_io))
        # a no-op for those done above; a retry (and their verdict) for those that failed there
        roles = [self._sync_guarded(item, tier=False) for item in new]
        online = sum(role and self._sync_guarded(item, role=False)
                     for role, item in zip(roles, new, strict=True))
        if new:
            log.info("broker %d: %d new partition(s) online", self.config.broker_id, online)
        if len(new) >= FREEZE_AFTER_PARTITIONS:
            gc.freeze()  # long-lived: later collections need not scan them

    def _needs_io(self, tp: TopicPartition) -> bool:
        found = self.log_manager.get_log(tp)
        return found is None or found.needs_recovery

    def _sync_guarded(self, item: _PartitionSync, role: bool = True, tier: bool = True) -> bool:
        """Whether the partition was synced (False if it failed, or syncing has stopped)."""
        if self._sync_stopped.is_set():
            return False
        try:
            self._sync_partition(item.tp, item.state, item.replicas, item.config, item.schema,
                                 item.topic_id, role, tier)
        except Exception:  # boundary: one partition's disk trouble stays its own
            log.exception("%s: could not be brought online", item.tp)
            return False
        return True

    def _apply_state(self, tp: TopicPartition, st: PartitionState, replicas: tuple[int, ...],
                     topic_id: str | None = None) -> None:
        """A state the controller sent (leader_and_isr) for topic id ``topic_id`` (None:
        unchecked); a topic this broker does not know yet is brought online when its metadata
        watch fires, and a state of another incarnation of the topic than the metadata's is
        refused (INCONSISTENT_TOPIC_ID), not applied to this one's replica."""
        if self.config.broker_id not in replicas:
            return
        with self._sync_lock:
            record = self.store.topics().get(tp.topic)
            if record is None:
                return
            if topic_id is not None and topic_id != record.topic_id:
                raise InconsistentTopicIdError(
                    f"{tp}: the state (leader {st.leader}, epoch {st.leader_epoch}) is for "
                    f"topic id {topic_id}, but the metadata has {record.topic_id}")
            self._delete_old_incarnation(tp, record.topic_id)
            self._sync_partition(tp, st, replicas, self.default_topic_config.updated(
                record.config), topic_schema(record.value_schema), record.topic_id)

    def _sync_partition(self, tp: TopicPartition, st: PartitionState | None,
                        replicas: tuple[int, ...], config: TopicConfig, schema: pa.Schema,
                        topic_id: str, role: bool = True, tier: bool = True) -> None:
        """Lead or follow as ``st`` says, unless this replica already knows a newer epoch;
        then run or stop the partition's tiering task to match."""
        if role:
            self._sync_role(tp, st, replicas, self._log_config(config), schema, topic_id)
        hosted = self.replicas.get(tp)
        if tier and self.tier is not None and hosted is not None:
            self.tier.sync(hosted, config, topic_id, lambda: self._full_topic_config(tp.topic))

    def _sync_role(self, tp: TopicPartition, st: PartitionState | None,
                   replicas: tuple[int, ...], config: TopicConfig, schema: pa.Schema,
                   topic_id: str) -> None:
        hosted = self.replicas.get(tp)
        if st is None or (hosted is not None and (
                st.leader_epoch < hosted.leader_epoch or (
                    st.leader_epoch == hosted.leader_epoch and st.leader == hosted.leader_id))):
            self.replicas.update_config(tp, config)
        elif st.leader == self.config.broker_id:
            if self.fetchers is not None:
                self.fetchers.remove(tp)
            self.replicas.make_leader(tp, config, schema, st.leader_epoch, replicas, st.isr,
                                      topic_id)
        elif self.fetchers is not None:
            p = self.replicas.make_follower(tp, config, schema, st.leader, st.leader_epoch,
                                            replicas, topic_id)
            if st.leader >= 0:
                self.fetchers.add(p, st.leader)
            else:
                self.fetchers.remove(tp)
        else:
            self.replicas.update_config(tp, config)

    def _old_incarnation_gone(self, tp: TopicPartition, topic_id: str) -> bool:
        """``_delete_old_incarnation``, False if it failed (logged): one partition's disk
        trouble must not stop the pass for the others."""
        try:
            self._delete_old_incarnation(tp, topic_id)
        except Exception:  # boundary: as _sync_guarded
            log.exception("%s: the log of its deleted topic could not be deleted", tp)
            return False
        return True

    def _delete_old_incarnation(self, tp: TopicPartition, topic_id: str) -> None:
        """A replica (or a log found at start) of ``tp`` that belongs to an earlier topic of
        its name than ``topic_id`` is stopped and its log deleted, as a deleted topic's: the
        deletion happened while this broker ran. A dict lookup when nothing changed."""
        hosted = self.replicas.get(tp)
        old = hosted.log if hosted is not None else self.log_manager.get_log(tp)
        if old is None or old.topic_id is None or old.topic_id == topic_id:
            return
        log.warning("%s: topic id %s was deleted and %r created again as topic id %s; "
                    "deleting the old log", tp, old.topic_id, tp.topic, topic_id)
        self._stop_replica(tp)
        self.log_manager.delete_log(tp)

    def _stop_replica(self, tp: TopicPartition) -> None:
        """Stop hosting ``tp`` (its tiering task, its fetcher) and delete its log."""
        if self.tier is not None:
            self.tier.stop_partition(tp)
        if self.fetchers is not None:
            self.fetchers.remove(tp)
        self.replicas.stop_replica(tp, delete=True)

    def _drop_unwanted(self, wanted: set[TopicPartition]) -> None:
        for tp in set(self.replicas.hosted()) - wanted:
            self._stop_replica(tp)
        # Logs found at start were checked by set_aside_strays; what is left here was
        # created while running for a partition since deleted or moved away.
        for tp in set(self.log_manager.all_logs()) - wanted:
            log.warning("deleting log %s: no longer assigned to broker %d", tp,
                        self.config.broker_id)
            self.log_manager.delete_log(tp)


@dataclass(frozen=True, slots=True)
class _PartitionSync:
    """What the metadata says of one partition this broker hosts."""

    tp: TopicPartition
    state: PartitionState | None
    replicas: tuple[int, ...]
    config: TopicConfig
    schema: pa.Schema
    topic_id: str


def _raise_open_file_limit() -> None:
    """Open segment files are bounded (max_open_segment_files), but connections and index
    files come on top, so take the hard limit on open files anyway (as Kafka's operators are
    told to); a failure only matters when the bound is set high."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        log.warning("could not raise the open-file limit: %s", e)
