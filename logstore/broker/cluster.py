"""A broker's part in a replicated cluster: its peers, and the cluster request handlers.

Owns: connections to other brokers by id (addresses from the metadata store), delivering the
controller's ``leader_and_isr`` notices asynchronously, sending requests to the current
controller, and the cluster actions this broker answers: ``leader_and_isr`` (refused from a
stale controller epoch; a partition's state for another topic id than this broker's metadata
has is refused with INCONSISTENT_TOPIC_ID, as Kafka's), ``alter_isr`` and ``controlled_shutdown`` (answered when this broker is
the controller), ``offsets_for_leader_epoch`` and ``leader_epochs`` (answered by leaders).
Must not: contain replication or election logic (that is ``replication/`` and ``controller/``) or import the
transport (connections come from the injected factory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from logstore.broker import acl_rules as rules
from logstore.broker.replica_manager import ReplicaManager
from logstore.controller.cluster_controller import ClusterController
from logstore.controller.store import MetadataStore, PartitionState
from logstore.errors import (
    ApiError,
    BrokerNotAvailableError,
    NotControllerError,
    StaleControllerEpochError,
)
from logstore.messages import Message, Request, Route, error_kw
from logstore.messages.cluster import (
    AlterIsrRequest,
    AlterIsrResponse,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    EpochEndOffset,
    EpochStart,
    LeaderAndIsrPartition,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    LeaderEpochsRequest,
    LeaderEpochsResponse,
    LeaderEpochsResult,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    PartitionResult,
)
from logstore.model import TopicPartition
from logstore.replication.fetcher import LeaderConnection

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_S = 5.0
CONTROLLER_TIMEOUT_S = 10.0

R = TypeVar("R", bound=Message)
# "host:port" -> a connection to that broker (rpc.client.BrokerConnection).
ConnectionFactory = Callable[[str], LeaderConnection]
# (topic-partition, state, replicas, the topic id the state is for (None: unchecked)): make
# this broker leader or follower as the state says; INCONSISTENT_TOPIC_ID when this broker's
# metadata has another id for the topic (the state is of another incarnation of it).
ApplyState = Callable[[TopicPartition, PartitionState, tuple[int, ...], str | None], None]


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

    def to_controller(self, request: Request[R]) -> R:
        controller = self._store.controller_id()
        conn = None if controller is None else self.get(controller)
        if conn is None:
            raise NotControllerError("no controller is known right now")
        return conn.call(request, timeout_s=CONTROLLER_TIMEOUT_S)

    def notify(self, broker_id: int, request: LeaderAndIsrRequest) -> None:
        """Send ``leader_and_isr`` without waiting: a broker that misses it learns the same
        states from its own metadata watches."""
        self._pool.submit(self._notify, broker_id, request)

    def _notify(self, broker_id: int, request: LeaderAndIsrRequest) -> None:
        try:
            conn = self.get(broker_id)
            if conn is None:
                raise BrokerNotAvailableError(f"broker {broker_id} is not registered")
            conn.call(request, timeout_s=NOTIFY_TIMEOUT_S)
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

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(LeaderAndIsrRequest, self.leader_and_isr, rules.BROKERS_ONLY),
                Route(AlterIsrRequest, self.alter_isr, rules.BROKERS_ONLY),
                Route(ControlledShutdownRequest, self.controlled_shutdown, rules.BROKERS_ONLY),
                Route(OffsetsForLeaderEpochRequest, self.offsets_for_leader_epoch,
                      rules.BROKERS_ONLY),
                Route(LeaderEpochsRequest, self.leader_epochs, rules.BROKERS_ONLY)]

    def leader_and_isr(self, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse:
        """The controller's word on partitions this broker hosts."""
        with self._lock:
            if req.controller_epoch < self._controller_epoch:
                raise StaleControllerEpochError(
                    f"controller epoch {req.controller_epoch} is older than "
                    f"{self._controller_epoch}")
            self._controller_epoch = req.controller_epoch
        return LeaderAndIsrResponse(partitions=[self._apply(p, req.controller_id)
                                                for p in req.partitions])

    def _apply(self, p: LeaderAndIsrPartition, controller_id: int) -> PartitionResult:
        state = PartitionState(p.leader, p.leader_epoch, tuple(p.isr), p.controller_epoch)
        try:
            self._apply_state(TopicPartition(p.topic, p.partition), state, tuple(p.replicas),
                              p.topic_id)
        except ApiError as e:
            log.warning("broker %d: leader_and_isr for %s-%d from controller %d not applied: "
                        "%s", self._broker_id, p.topic, p.partition, controller_id, e)
            return PartitionResult(topic=p.topic, partition=p.partition, **error_kw(e))
        return PartitionResult(topic=p.topic, partition=p.partition)

    def alter_isr(self, req: AlterIsrRequest) -> AlterIsrResponse:
        """A leader's proposal of a new ISR (answered when this broker is the controller)."""
        state = self._controller.alter_isr(req.broker_id, req.topic, req.partition,
                                           req.leader_epoch, tuple(req.isr), req.topic_id)
        return AlterIsrResponse(leader_epoch=state.leader_epoch, isr=list(state.isr))

    def controlled_shutdown(self, req: ControlledShutdownRequest) -> ControlledShutdownResponse:
        """A stopping broker asks this one, the controller, to move its leaderships away."""
        return ControlledShutdownResponse(
            remaining=self._controller.controlled_shutdown(req.broker_id))

    def offsets_for_leader_epoch(self, req: OffsetsForLeaderEpochRequest
                                 ) -> OffsetsForLeaderEpochResponse:
        """Where an epoch ends in this leader's log."""
        out = []
        for p in req.partitions:
            try:
                epoch, end = self._replicas.offsets_for_leader_epoch(
                    TopicPartition(req.topic, p.partition), p.leader_epoch,
                    p.current_leader_epoch, p.topic_id)
                out.append(EpochEndOffset(partition=p.partition, leader_epoch=epoch,
                                          end_offset=end))
            except ApiError as e:
                out.append(EpochEndOffset(partition=p.partition, **error_kw(e)))
        return OffsetsForLeaderEpochResponse(topic=req.topic, partitions=out)

    def leader_epochs(self, req: LeaderEpochsRequest) -> LeaderEpochsResponse:
        """This leader's leader-epoch cache, for a follower restarting its log at the local
        log start offset of a tiered partition."""
        out = []
        for p in req.partitions:
            try:
                entries = self._replicas.leader_epochs(TopicPartition(req.topic, p.partition),
                                                       p.current_leader_epoch, p.topic_id)
                out.append(LeaderEpochsResult(partition=p.partition, entries=[
                    EpochStart(leader_epoch=e, start_offset=s) for e, s in entries]))
            except ApiError as e:
                out.append(LeaderEpochsResult(partition=p.partition, **error_kw(e)))
        return LeaderEpochsResponse(topic=req.topic, partitions=out)
