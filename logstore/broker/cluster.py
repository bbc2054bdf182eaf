"""A broker's part in a replicated cluster: its peers, and the cluster request handlers.

Owns: connections to other brokers by id (addresses from the metadata store), delivering the
controller's ``leader_and_isr`` notices asynchronously, sending requests to the current
controller, and the cluster actions this broker answers: ``leader_and_isr`` (refused from a
stale controller epoch), ``alter_isr`` and ``controlled_shutdown`` (answered when this broker is
the controller) and ``offsets_for_leader_epoch`` (answered by leaders). Must not: contain
replication or election logic (that is ``replication/`` and ``controller/``) or import the
transport (connections come from the injected factory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.cluster_controller import ClusterController
from logstore.controller.store import MetadataStore, PartitionState
from logstore.errors import (
    ApiError,
    BrokerNotAvailableError,
    InvalidRequestError,
    NotControllerError,
    StaleControllerEpochError,
)
from logstore.model import TopicPartition
from logstore.replication.fetcher import LeaderConnection
from logstore.wire import error_fields, field

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_S = 5.0
CONTROLLER_TIMEOUT_S = 10.0

# "host:port" -> a connection to that broker (rpc.client.BrokerConnection).
ConnectionFactory = Callable[[str], LeaderConnection]
# (topic, partition, state, replicas): make this broker leader or follower as the state says.
ApplyState = Callable[[TopicPartition, PartitionState, tuple[int, ...]], None]


class Peers:
    """Connections to the other brokers, by broker id, made on first use."""

    def __init__(self, store: MetadataStore, connect: ConnectionFactory) -> None:
        self._store = store
        self._connect = connect
        self._lock = threading.Lock()
        self._conns: dict[str, LeaderConnection] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="peer-notify")

    def get(self, broker_id: int) -> LeaderConnection | None:
        info = self._store.brokers().get(broker_id)
        if info is None:
            return None
        address = f"{info.host}:{info.port}"
        with self._lock:
            conn = self._conns.get(address)
            if conn is None:
                conn = self._conns[address] = self._connect(address)
            return conn

    def to_controller(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        controller = self._store.controller_id()
        conn = None if controller is None else self.get(controller)
        if conn is None:
            raise NotControllerError("no controller is known right now")
        return conn.action(action, body, timeout_s=CONTROLLER_TIMEOUT_S)

    def notify(self, broker_id: int, body: dict[str, Any]) -> None:
        """Send ``leader_and_isr`` without waiting: a broker that misses it learns the same
        states from its own metadata watches."""
        self._pool.submit(self._notify, broker_id, body)

    def _notify(self, broker_id: int, body: dict[str, Any]) -> None:
        try:
            conn = self.get(broker_id)
            if conn is None:
                raise BrokerNotAvailableError(f"broker {broker_id} is not registered")
            conn.action("leader_and_isr", body, timeout_s=NOTIFY_TIMEOUT_S)
        except ApiError as e:
            log.info("leader_and_isr to broker %d failed: %s", broker_id, e)
        except Exception:  # boundary: a background send logs
            log.exception("leader_and_isr to broker %d failed", broker_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            close = getattr(conn, "close", None)
            if close is not None:
                close()


class ClusterHandlers:
    """The cluster actions of one broker."""

    def __init__(self, broker_id: int, controller: ClusterController, replicas: ReplicaManager,
                 apply_state: ApplyState) -> None:
        self._broker_id = broker_id
        self._controller = controller
        self._replicas = replicas
        self._apply_state = apply_state
        self._lock = threading.Lock()
        self._controller_epoch = 0

    @property
    def actions(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"leader_and_isr": self.leader_and_isr, "alter_isr": self.alter_isr,
                "controlled_shutdown": self.controlled_shutdown,
                "offsets_for_leader_epoch": self.offsets_for_leader_epoch}

    def leader_and_isr(self, req: dict[str, Any]) -> dict[str, Any]:
        """The controller's word on partitions this broker hosts."""
        epoch = field(req, "controller_epoch", int, "leader_and_isr")
        with self._lock:
            if epoch < self._controller_epoch:
                raise StaleControllerEpochError(
                    f"controller epoch {epoch} is older than {self._controller_epoch}")
            self._controller_epoch = epoch
        out = []
        for entry in field(req, "partitions", list, "leader_and_isr"):
            if not isinstance(entry, dict):
                raise InvalidRequestError("leader_and_isr: partitions must be objects")
            tp = TopicPartition(field(entry, "topic", str, "leader_and_isr"),
                                field(entry, "partition", int, "leader_and_isr"))
            try:
                self._apply_state(tp, PartitionState.from_json(entry),
                                  tuple(field(entry, "replicas", list, "leader_and_isr")))
                out.append({"topic": tp.topic, "partition": tp.partition, **error_fields(None)})
            except ApiError as e:
                out.append({"topic": tp.topic, "partition": tp.partition, **error_fields(e)})
        return {"partitions": out}

    def alter_isr(self, req: dict[str, Any]) -> dict[str, Any]:
        what = "alter_isr"
        state = self._controller.alter_isr(
            field(req, "broker_id", int, what), field(req, "topic", str, what),
            field(req, "partition", int, what), field(req, "leader_epoch", int, what),
            tuple(field(req, "isr", list, what)))
        return {**error_fields(None), "leader_epoch": state.leader_epoch, "isr": list(state.isr)}

    def controlled_shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        remaining = self._controller.controlled_shutdown(
            field(req, "broker_id", int, "controlled_shutdown"))
        return {**error_fields(None), "remaining": remaining}

    def offsets_for_leader_epoch(self, req: dict[str, Any]) -> dict[str, Any]:
        what = "offsets_for_leader_epoch"
        topic = field(req, "topic", str, what)
        out = []
        for p in field(req, "partitions", list, what):
            if not isinstance(p, dict):
                raise InvalidRequestError(f"{what}: partitions must be objects")
            entry: dict[str, Any] = {"partition": field(p, "partition", int, what)}
            try:
                epoch, end = self._replicas.offsets_for_leader_epoch(
                    TopicPartition(topic, entry["partition"]), field(p, "leader_epoch", int, what),
                    field(p, "current_leader_epoch", int, what, default=-1))
                entry.update(error_fields(None), leader_epoch=epoch, end_offset=end)
            except ApiError as e:
                entry.update(error_fields(e), leader_epoch=-1, end_offset=-1)
            out.append(entry)
        return {"topic": topic, "partitions": out}
