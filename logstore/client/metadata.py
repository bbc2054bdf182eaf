"""The client's view of the cluster: brokers, topics, partition leaders and topic schemas.

Owns: bootstrapping from any listed broker, refreshing on demand (clients refresh when an error
carries ``refresh_metadata``), and a connection per broker. Must not: know about batching,
retries or offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

from logstore.errors import (
    ApiError,
    LeaderNotAvailableError,
    NetworkError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import Message, Request
from logstore.messages.topics import DEFAULT_MAX_MESSAGE_BYTES, MetadataRequest, TopicMetadata
from logstore.model import TopicPartition
from logstore.records import decode_schema, topic_schema
from logstore.rpc.client import BrokerConnection
from logstore.security.config import PLAINTEXT, ClientSecurity

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: dict[int, PartitionInfo]
    schema: pa.Schema
    value_schema: pa.Schema | None
    internal: bool = False
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # the topic's, for cutting batches
    compression_type: str = "none"  # the topic's: how its leaders store batches
    topic_id: str | None = None  # tells it from an earlier topic of the same name

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


def parse_bootstrap(servers: str | list[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise ValueError("bootstrap_servers must name at least one host:port")
    for s in out:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap server {s!r} is not host:port")
    return out


class ClusterMetadata:
    def __init__(self, bootstrap_servers: str | list[str], request_timeout_ms: int = 30_000,
                 compression: str | None = None, metadata_max_age_ms: int = 300_000,
                 security: ClientSecurity = PLAINTEXT) -> None:
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security
        self._timeout_s = request_timeout_ms / 1000.0
        self._compression = compression
        self._lock = threading.RLock()
        self._brokers: dict[int, str] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._refreshed_at: dict[str, float] = {}
        # The last refresh's answer for topics it did not return (TOPIC_AUTHORIZATION_FAILED
        # must not read as "no such topic", which clients retry).
        self._refused: dict[str, ApiError] = {}
        self._max_age_s = metadata_max_age_ms / 1000.0
        self._connections: dict[str, BrokerConnection] = {}
        self.controller_id: int | None = None

    # -- connections -------------------------------------------------------------------------

    def connection(self, address: str) -> BrokerConnection:
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = BrokerConnection(address, self._timeout_s, self._compression,
                                        self.security)
                self._connections[address] = conn
            return conn

    def broker_connection(self, broker_id: int) -> BrokerConnection:
        with self._lock:
            address = self._brokers.get(broker_id)
        if address is None:
            raise LeaderNotAvailableError(f"broker {broker_id} is not in the cluster metadata")
        return self.connection(address)

    def call(self, request: Request[R], prefer: str | None = None) -> R:
        """A typed control request to any reachable broker (``prefer`` first, e.g. one that
        just answered, then known brokers, then bootstrap)."""
        return self._to_any_broker(lambda conn: conn.call(request), prefer)

    def _to_any_broker(self, send: Callable[[BrokerConnection], T], prefer: str | None) -> T:
        with self._lock:
            candidates = list(dict.fromkeys(
                [*([prefer] if prefer else []), *self._brokers.values(), *self._bootstrap]))
        last: ApiError | None = None
        for address in candidates:
            try:
                return send(self.connection(address))
            except NetworkError as e:
                last = e
        raise last or NetworkError(f"no broker reachable in {candidates}")

    # -- metadata ----------------------------------------------------------------------------

    def refresh(self, topics: list[str] | None = None, prefer: str | None = None) -> None:
        response = self.call(MetadataRequest(topics=topics), prefer)
        with self._lock:
            self._brokers = {b.broker_id: f"{b.host}:{b.port}" for b in response.brokers}
            self.controller_id = response.controller_id
            if topics is None:
                self._topics = {}
            now = time.monotonic()
            for t in response.topics:
                error = t.error()
                if error is None:
                    self._topics[t.name] = _topic_info(t)
                    self._refreshed_at[t.name] = now
                    self._refused.pop(t.name, None)
                else:
                    self._topics.pop(t.name, None)
                    if not error.retriable:
                        self._refused[t.name] = error

    def topic(self, name: str, refresh: bool = False) -> TopicInfo:
        """A topic's metadata, refreshed when asked, unknown or older than
        metadata_max_age_ms (so added partitions are found, as in Kafka)."""
        stale = time.monotonic() - self._refreshed_at.get(name, 0.0) > self._max_age_s
        if refresh or stale or name not in self._topics:
            self.refresh([name])
        info = self._topics.get(name)
        if info is None:
            refused = self._refused.get(name)
            if refused is not None:
                raise type(refused)(refused.message)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return info

    def known(self, name: str) -> TopicInfo | None:
        """The topic's metadata as the last refresh saw it, without asking a broker (None:
        not known here)."""
        with self._lock:
            return self._topics.get(name)

    def known_topic_id(self, name: str) -> str | None:
        """The topic's id as the last refresh saw it, without asking a broker (None: not
        known here, or from a broker that sends none)."""
        with self._lock:
            info = self._topics.get(name)
        return None if info is None else info.topic_id

    def leader(self, tp: TopicPartition) -> int:
        return self.leader_partition(tp).leader

    def leader_partition(self, tp: TopicPartition) -> PartitionInfo:
        """The partition's metadata (leader and leader epoch); it must have a leader. A
        partition the cached topic lacks is asked for again before it is refused: the topic
        may have gained it since (as Kafka's clients wait on metadata for it)."""
        info = self.topic(tp.topic)
        part = info.partitions.get(tp.partition)
        if part is None and tp.partition >= info.num_partitions:
            info = self.topic(tp.topic, refresh=True)
            part = info.partitions.get(tp.partition)
        if part is None:
            raise UnknownTopicOrPartitionError(
                f"topic {tp.topic!r} has no partition {tp.partition} "
                f"(it has {info.num_partitions})")
        if part.leader < 0:
            raise LeaderNotAvailableError(f"{tp} has no leader")
        return part

    def leader_connection(self, tp: TopicPartition) -> BrokerConnection:
        return self.broker_connection(self.leader(tp))

    def topic_names(self, include_internal: bool = False) -> list[str]:
        """Names of the topics known from the last refresh (a full ``refresh()`` lists all)."""
        with self._lock:
            return sorted(n for n, t in self._topics.items() if include_internal or not t.internal)

    def brokers(self) -> dict[int, str]:
        with self._lock:
            return dict(self._brokers)

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


def _topic_info(t: TopicMetadata) -> TopicInfo:
    value_schema = decode_schema(t.value_schema)
    parts = {p.partition: PartitionInfo(p.partition, p.leader, p.leader_epoch,
                                        tuple(p.replicas), tuple(p.isr))
             for p in t.partitions}
    return TopicInfo(t.name, parts, topic_schema(value_schema), value_schema, t.internal,
                     t.max_message_bytes, t.compression_type, t.topic_id)
