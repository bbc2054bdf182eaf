"""The consumer's side of the group protocol: finding the coordinator, joining, assigning (as
the leader), syncing, heartbeating, committing and fetching committed offsets.

Owns: the member id, generation and assignment of one consumer in one group, the heartbeat
thread (which also enforces ``max_poll_interval_ms`` by leaving the group), and retries on the
coordinator's retriable codes (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS). Subscription metadata and assignments are JSON objects:
``{"topics": [...], "owned": [[topic, partition], ...]}`` and ``{"partitions": [...]}``.
Must not: fetch records or hold positions (``consumer.py`` does), or run user callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logstore.client.metadata import ClusterMetadata
from logstore.errors import (
    ApiError,
    IllegalGenerationError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from logstore.groups.assignors import COOPERATIVE, REBALANCE_PROTOCOL, assignor
from logstore.model import OffsetAndMetadata, TopicPartition
from logstore.rpc.client import BrokerConnection
from logstore.rpc.codec import error_from_fields

log = logging.getLogger(__name__)

COORDINATOR_ATTEMPTS = 20
RETRY_BACKOFF_S = 0.05
REJOIN_CODES = (IllegalGenerationError, UnknownMemberIdError, RebalanceInProgressError)


@dataclass(frozen=True, slots=True)
class GroupSettings:
    group_id: str
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300_000
    strategies: tuple[str, ...] = ("range",)
    group_instance_id: str | None = None
    client_id: str = "logstore-consumer"


@dataclass(frozen=True, slots=True)
class JoinOutcome:
    generation_id: int
    protocol: str
    assignment: list[TopicPartition]


class GroupMember:
    def __init__(self, metadata: ClusterMetadata, settings: GroupSettings) -> None:
        for name in settings.strategies:
            assignor(name)  # an unknown strategy fails at construction
        self._metadata = metadata
        self.settings = settings
        self._lock = threading.RLock()
        self._coordinator: BrokerConnection | None = None
        self.member_id = ""
        self.generation_id = -1
        self.need_rejoin = threading.Event()
        self.need_rejoin.set()
        self._joining = False
        self.last_poll = time.monotonic()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None

    @property
    def cooperative(self) -> bool:
        return all(REBALANCE_PROTOCOL[s] == COOPERATIVE for s in self.settings.strategies)

    # -- requests to the coordinator ---------------------------------------------------------

    def _find_coordinator(self) -> BrokerConnection:
        response = self._metadata.request("find_coordinator",
                                          {"group_id": self.settings.group_id})
        err = error_from_fields(response)
        if err is not None:
            raise err
        return self._metadata.connection(f"{response['host']}:{response['port']}")

    def call(self, name: str, body: dict[str, Any], timeout_s: float | None = None
             ) -> dict[str, Any]:
        """``name`` on the coordinator; its top-level error raised, after retrying the
        retriable ones (bounded)."""
        body = {"group_id": self.settings.group_id, **body}
        for attempt in range(COORDINATOR_ATTEMPTS):
            try:
                with self._lock:
                    if self._coordinator is None:
                        self._coordinator = self._find_coordinator()
                    conn = self._coordinator
                response = conn.action(name, body, timeout_s)
                err = error_from_fields(response)
                if err is None:
                    return response
                raise err
            except ApiError as e:
                if not e.retriable or attempt == COORDINATOR_ATTEMPTS - 1:
                    raise
                if e.refresh_metadata:
                    with self._lock:
                        self._coordinator = None
                time.sleep(RETRY_BACKOFF_S * min(attempt + 1, 10))
        raise AssertionError("unreachable")

    # -- join and sync -----------------------------------------------------------------------

    def join(self, topics: list[str], owned: list[TopicPartition],
             partition_counts: Callable[[list[str]], dict[str, int]]) -> JoinOutcome:
        """One join + sync round; raises the coordinator's error (the caller retries)."""
        self._joining = True
        try:
            metadata = {"topics": sorted(topics), "owned": [list(tp) for tp in sorted(owned)]}
            rebalance_s = self.settings.max_poll_interval_ms / 1000.0
            joined = self._join_request(metadata, rebalance_s)
            assignments = None
            if joined["leader"] == joined["member_id"]:
                assignments = self._assign(joined, partition_counts)
            synced = self.call("sync_group", {
                "member_id": self.member_id, "generation_id": joined["generation_id"],
                "assignments": assignments, "timeout_ms": self.settings.max_poll_interval_ms},
                rebalance_s + 10)
            with self._lock:
                self.generation_id = joined["generation_id"]
            self.need_rejoin.clear()
            return JoinOutcome(joined["generation_id"], joined["protocol"],
                               [TopicPartition(t, p) for t, p in
                                synced["assignment"].get("partitions", [])])
        finally:
            self._joining = False

    def _join_request(self, metadata: dict[str, Any], rebalance_s: float) -> dict[str, Any]:
        s = self.settings
        try:
            joined = self.call("join_group", {
                "member_id": self.member_id, "group_instance_id": s.group_instance_id,
                "client_id": s.client_id, "session_timeout_ms": s.session_timeout_ms,
                "rebalance_timeout_ms": s.max_poll_interval_ms, "protocol_type": "consumer",
                "protocols": [{"name": n, "metadata": metadata} for n in s.strategies]},
                rebalance_s + 10)
        except UnknownMemberIdError:
            self.reset_member()
            raise
        self.member_id = joined["member_id"]
        return joined

    @staticmethod
    def _assign(joined: dict[str, Any], partition_counts: Callable[[list[str]], dict[str, int]]
                ) -> dict[str, dict[str, Any]]:
        members = joined["members"]
        subscriptions = {m["member_id"]: m["metadata"]["topics"] for m in members}
        owned = {m["member_id"]: [TopicPartition(t, p) for t, p in m["metadata"]["owned"]]
                 for m in members}
        topics = sorted({t for ts in subscriptions.values() for t in ts})
        result = assignor(joined["protocol"])(subscriptions, partition_counts(topics), owned)
        log.info("group leader %s: assigned %d partition(s) to %d member(s) with %s",
                 joined["member_id"], sum(len(v) for v in result.values()), len(result),
                 joined["protocol"])
        return {m: {"partitions": [list(tp) for tp in tps]} for m, tps in result.items()}

    def reset_member(self) -> None:
        with self._lock:
            self.member_id, self.generation_id = "", -1
        self.need_rejoin.set()

    # -- heartbeats --------------------------------------------------------------------------

    def start_heartbeats(self) -> None:
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"heartbeat-{self.settings.group_id}")
            self._heartbeats.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_interval_ms / 1000.0):
            try:
                self._heartbeat_once()
            except Exception:  # boundary: a background loop logs and goes on
                log.exception("group %s: heartbeat failed", self.settings.group_id)

    def _heartbeat_once(self) -> None:
        if self._joining:
            return  # a join in progress is the poll thread's work, not idleness
        idle_ms = (time.monotonic() - self.last_poll) * 1000
        if self.generation_id >= 0 and idle_ms > self.settings.max_poll_interval_ms:
            log.warning("group %s: no poll for %.0f ms (max_poll_interval_ms %d); leaving the "
                        "group", self.settings.group_id, idle_ms,
                        self.settings.max_poll_interval_ms)
            self.leave()
            return
        if self.generation_id < 0 or self.need_rejoin.is_set():
            return
        try:
            self.call("heartbeat", {"member_id": self.member_id,
                                    "generation_id": self.generation_id})
        except UnknownMemberIdError:
            self.reset_member()
        except REJOIN_CODES:
            self.need_rejoin.set()
        except ApiError as e:
            log.info("group %s: heartbeat failed: %s", self.settings.group_id, e)

    # -- offsets -----------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], as_member: bool) -> None:
        body = {"member_id": self.member_id if as_member else "",
                "generation_id": self.generation_id if as_member else -1,
                "offsets": [{"topic": tp.topic, "partition": tp.partition, "offset": om.offset,
                             "metadata": om.metadata} for tp, om in offsets.items()]}
        try:
            response = self.call("offset_commit", body)
        except REJOIN_CODES:
            self.need_rejoin.set()
            raise
        for entry in response["offsets"]:
            err = error_from_fields(entry)
            if err is not None:
                raise type(err)(f"commit of {entry['topic']}-{entry['partition']}: "
                                f"{err.message}")

    def committed(self, tps: list[TopicPartition] | None) -> dict[TopicPartition,
                                                                    OffsetAndMetadata]:
        body = {"partitions": None if tps is None else
                [{"topic": tp.topic, "partition": tp.partition} for tp in tps]}
        response = self.call("offset_fetch", body)
        return {TopicPartition(e["topic"], e["partition"]):
                OffsetAndMetadata(e["offset"], e["metadata"], e["commit_timestamp"])
                for e in response["offsets"]}

    # -- leaving -----------------------------------------------------------------------------

    def leave(self) -> None:
        if self.member_id and self.settings.group_instance_id is None:
            try:
                self.call("leave_group", {"member_id": self.member_id})
            except ApiError as e:
                log.info("group %s: leave failed: %s", self.settings.group_id, e)
        self.reset_member()

    def close(self, leave: bool) -> None:
        self._stop.set()
        if leave:
            self.leave()
        if self._heartbeats is not None:
            self._heartbeats.join(self.settings.heartbeat_interval_ms / 1000.0 + 5)
