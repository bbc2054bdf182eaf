"""Request handlers: validate a decoded request, route it to the services, build the response.

Every response carries an error code per partition (or per topic for topic requests): one bad
partition never fails the whole request. Must not: contain storage or replication logic, or
know about Arrow Flight.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from logstore.broker.replica_manager import FetchPartition, PartitionFetchResult, ReplicaManager
from logstore.controller.store import MetadataStore, TopicRecord
from logstore.controller.topics import TopicController
from logstore.errors import (
    ApiError,
    InvalidFetchSizeError,
    InvalidRequestError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.messages import Route
from logstore.messages.log import BrokerStatsRequest, BrokerStatsResponse
from logstore.model import NewTopic, TopicPartition
from logstore.records import (
    DEFAULT_SCHEMA,
    StoredBatch,
    conform_batch,
    decode_schema,
    encode_schema,
    topic_schema,
)
from logstore.replication.partition import PendingAppend
from logstore.wire import error_fields, field, int_field, str_list

log = logging.getLogger(__name__)

MAX_WAIT_LIMIT_MS = 60_000


INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class PendingProduce:
    """A produced batch that is appended (or failed); ``ack`` waits for its acknowledgement."""

    partition: int
    pending: PendingAppend | None
    error: ApiError | None

    def ack(self, timeout_ms: int) -> dict[str, Any]:
        error = self.error
        if error is None and self.pending is not None:
            try:
                info = self.pending.wait(timeout_ms)
                return {"partition": self.partition, **error_fields(None),
                        "base_offset": info.first_offset, "log_append_time": info.log_append_time,
                        "log_start_offset": info.log_start_offset}
            except ApiError as e:
                error = e
            except Exception as e:  # boundary: the ack path must answer, never die
                log.exception("partition %d: waiting for an acknowledgement failed",
                              self.partition)
                error = UnknownServerError(f"{type(e).__name__}: {e}")
        return {"partition": self.partition, **error_fields(error), "base_offset": -1}


class ProducerIdSource(Protocol):
    def next_producer_id(self) -> int: ...


class RequestHandlers:
    """One instance per broker; thread-safe because every service it calls is."""

    def __init__(self, broker_id: int, store: MetadataStore, controller: TopicController,
                 replicas: ReplicaManager, producer_ids: ProducerIdSource) -> None:
        self.broker_id = broker_id
        self._store = store
        self._controller = controller
        self._replicas = replicas
        self._producer_ids = producer_ids
        self._action_counts: Counter[str] = Counter()
        self.actions = {
            "metadata": self.metadata,
            "create_topics": self.create_topics,
            "delete_topics": self.delete_topics,
            "create_partitions": self.create_partitions,
            "describe_configs": self.describe_configs,
            "alter_configs": self.alter_configs,
            "list_offsets": self.list_offsets,
            "init_producer_id": self.init_producer_id,
            "describe_log_dirs": self.describe_log_dirs,
            "await_high_watermarks": self.await_high_watermarks,
        }
        self.actions = {name: _counted(name, fn, self._action_counts)
                        for name, fn in self.actions.items()}
        # Typed actions (logstore/messages): the Flight server tries these first.
        self.routes: dict[str, Route[Any, Any]] = {}
        self.add_routes([Route(BrokerStatsRequest, self.broker_stats)])

    def add_routes(self, routes: list[Route[Any, Any]]) -> None:
        """Serve typed actions, counted like the others."""
        for route in routes:
            self.routes[route.action] = Route(route.request_type,
                                              _counted(route.action, route.handle,
                                                       self._action_counts))

    def register(self, name: str, fn: Any) -> None:
        """Add an action (the cluster actions come from cluster.py)."""
        self.add_actions({name: fn})

    def add_actions(self, actions: dict[str, Any]) -> None:
        """Serve more DoActions (the cluster's, the group coordinator's), counted like the
        built-in ones."""
        self.actions.update({name: _counted(name, fn, self._action_counts)
                             for name, fn in actions.items()})

    # -- control -----------------------------------------------------------------------------

    def metadata(self, req: dict[str, Any]) -> dict[str, Any]:
        names = str_list(req, "topics", "metadata", default=None)
        topics = self._store.topics()
        wanted = sorted(topics) if names is None else names
        return {
            "brokers": [b.to_json() for b in self._store.brokers().values()],
            "controller_id": self._store.controller_id(),
            "topics": [self._topic_metadata(n, topics.get(n)) for n in wanted],
        }

    def _topic_metadata(self, name: Any, record: TopicRecord | None) -> dict[str, Any]:
        if record is None or not isinstance(name, str):
            err = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            return {"name": name, **error_fields(err), "partitions": []}
        states = self._store.partition_states(name)
        partitions = []
        for p, replicas in sorted(record.replicas.items()):
            st = states.get(p)
            partitions.append({
                "partition": p, "replicas": list(replicas),
                "leader": st.leader if st else -1, "leader_epoch": st.leader_epoch if st else -1,
                "isr": list(st.isr) if st else [], "error_code": 0})
        return {"name": name, **error_fields(None), "internal": record.internal,
                "value_schema": encode_schema(record.value_schema), "partitions": partitions}

    def create_topics(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._each_topic(req, "create_topics", self._create_topic)

    def _create_topic(self, t: dict[str, Any]) -> None:
        what = f"create_topics[{t.get('name')!r}]"
        self._controller.create_topic(NewTopic(
            name=field(t, "name", str, what),
            num_partitions=field(t, "num_partitions", int, what),
            replication_factor=field(t, "replication_factor", int, what, default=1),
            config=field(t, "config", dict, what, default={}),
            value_schema=_value_schema(field(t, "value_schema", str, what, default=None), what)))

    def delete_topics(self, req: dict[str, Any]) -> dict[str, Any]:
        names = field(req, "topics", list, "delete_topics")
        return {"topics": [{"name": n, **self._guard(self._delete_topic, n)} for n in names]}

    def _delete_topic(self, name: Any) -> None:
        if not isinstance(name, str):
            raise InvalidRequestError(f"delete_topics: topic name must be a string, got {name!r}")
        self._controller.delete_topic(name)

    def create_partitions(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._each_topic(req, "create_partitions", lambda t: (
            self._controller.create_partitions(field(t, "name", str, "create_partitions"),
                                               field(t, "count", int, "create_partitions"))))

    def describe_configs(self, req: dict[str, Any]) -> dict[str, Any]:
        out = []
        for name in str_list(req, "topics", "describe_configs") or []:
            entry: dict[str, Any] = {"name": name}
            try:
                cfg = self._controller.topic_config(name)
                overrides = self._store.topics()[name].config
                entry.update(error_fields(None), config=cfg.to_dict(),
                             overrides=sorted(overrides))
            except ApiError as e:
                entry.update(error_fields(e))
            out.append(entry)
        return {"topics": out}

    def alter_configs(self, req: dict[str, Any]) -> dict[str, Any]:
        incremental = field(req, "incremental", bool, "alter_configs", default=True)
        return self._each_topic(req, "alter_configs", lambda t: self._controller.alter_config(
            field(t, "name", str, "alter_configs"), field(t, "config", dict, "alter_configs"),
            incremental))

    def list_offsets(self, req: dict[str, Any]) -> dict[str, Any]:
        topic = field(req, "topic", str, "list_offsets")
        out = []
        for p in field(req, "partitions", list, "list_offsets"):
            entry: dict[str, Any] = {"partition": p.get("partition") if isinstance(p, dict) else p}
            try:
                if not isinstance(p, dict):
                    raise InvalidRequestError("list_offsets: partitions must be objects")
                tp = TopicPartition(topic, field(p, "partition", int, "list_offsets"))
                offset, ts = self._replicas.list_offset(
                    tp, field(p, "timestamp", int, "list_offsets"))
                entry.update(error_fields(None), offset=offset, timestamp=ts)
            except ApiError as e:
                entry.update(error_fields(e), offset=-1, timestamp=-1)
            out.append(entry)
        return {"topic": topic, "partitions": out}

    def describe_log_dirs(self, req: dict[str, Any]) -> dict[str, Any]:
        """Per partition: the directory of its files, the incarnation id that proves a reader
        sees this broker's disk, and its log start offset and high watermark."""
        topic = field(req, "topic", str, "describe_log_dirs")
        out = []
        for p in field(req, "partitions", list, "describe_log_dirs"):
            entry: dict[str, Any] = {"partition": p}
            try:
                if not isinstance(p, int) or isinstance(p, bool):
                    raise InvalidRequestError("describe_log_dirs: partitions must be integers")
                entry.update(self._replicas.describe_log_dir(TopicPartition(topic, p)))
                entry.update(error_fields(None))
            except ApiError as e:
                entry.update(error_fields(e))
            out.append(entry)
        return {"topic": topic, "partitions": out}

    def await_high_watermarks(self, req: dict[str, Any]) -> dict[str, Any]:
        """A long poll: answers once a partition's high watermark passes the given offset, or
        after ``max_wait_ms``, with the high watermarks of the partitions this broker leads."""
        topic = field(req, "topic", str, "await_high_watermarks")
        positions = {}
        for p in field(req, "partitions", list, "await_high_watermarks"):
            if not isinstance(p, dict):
                raise InvalidRequestError("await_high_watermarks: partitions must be objects")
            positions[TopicPartition(topic, field(p, "partition", int, "await_high_watermarks"))] \
                = field(p, "offset", int, "await_high_watermarks")
        wait_ms = min(max(field(req, "max_wait_ms", int, "await_high_watermarks", default=0), 0),
                      MAX_WAIT_LIMIT_MS)
        hws = self._replicas.await_high_watermarks(positions, wait_ms)
        return {"topic": topic, "partitions": [
            {"partition": tp.partition, "high_watermark": hw} for tp, hw in sorted(hws.items())]}

    def broker_stats(self, req: BrokerStatsRequest) -> BrokerStatsResponse:
        """Counters of this broker's fetches since it started."""
        stats = self._replicas.stats
        return BrokerStatsResponse(broker_id=self.broker_id, fetch_requests=stats.requests,
                                   fetch_batches=stats.batches, fetch_bytes=stats.bytes,
                                   actions=dict(self._action_counts))

    def init_producer_id(self, req: dict[str, Any]) -> dict[str, Any]:
        return {**error_fields(None), "producer_id": self._producer_ids.next_producer_id(),
                "producer_epoch": 0}

    # -- produce -----------------------------------------------------------------------------

    def topic_schema(self, topic: str) -> pa.Schema:
        record = self._store.topics().get(topic)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return topic_schema(record.value_schema)

    def produce(self, topic: str, batch: pa.RecordBatch, meta: dict[str, Any], acks: int
                ) -> PendingProduce:
        """Append one producer batch now; the result's ``ack(timeout_ms)`` waits for the
        acknowledgement and gives the per-batch response fields."""
        what = f"produce to {topic!r}"
        partition = int_field(meta, "partition", what, 0, INT32_MAX)
        tp = TopicPartition(topic, partition)
        try:
            producer_id = int_field(meta, "producer_id", what, -1, INT64_MAX, default=-1)
            producer_epoch = int_field(meta, "producer_epoch", what, -1, INT16_MAX, default=-1)
            base_sequence = int_field(meta, "base_sequence", what, -1, INT32_MAX, default=-1)
            leader_epoch = int_field(meta, "leader_epoch", what, -1, INT32_MAX, default=-1)
            batch = conform_batch(batch, self.topic_schema(topic), f"topic-partition {tp}")
            pending = self._replicas.append_records(
                tp, batch, acks, producer_id=producer_id, producer_epoch=producer_epoch,
                base_sequence=base_sequence, current_leader_epoch=leader_epoch)
        except ApiError as e:
            return PendingProduce(partition, None, e)
        return PendingProduce(partition, pending, None)

    # -- fetch -------------------------------------------------------------------------------

    def fetch(self, req: dict[str, Any]) -> tuple[pa.Schema, list[PartitionFetchResult]]:
        topic = field(req, "topic", str, "fetch")
        max_bytes = field(req, "max_bytes", int, "fetch", default=50 * 1024 * 1024)
        if max_bytes <= 0:
            raise InvalidFetchSizeError(f"fetch from {topic!r}: max_bytes must be positive")
        parts = []
        for p in field(req, "partitions", list, "fetch"):
            if not isinstance(p, dict):
                raise InvalidRequestError("fetch: partitions must be objects")
            parts.append(FetchPartition(
                TopicPartition(topic, field(p, "partition", int, "fetch")),
                field(p, "offset", int, "fetch"),
                field(p, "max_bytes", int, "fetch", default=max_bytes),
                field(p, "current_leader_epoch", int, "fetch", default=-1),
                field(p, "end_offset", int, "fetch", default=None)))
        try:
            schema = self.topic_schema(topic)
        except UnknownTopicOrPartitionError:
            schema = DEFAULT_SCHEMA
        results = self._replicas.fetch(
            parts, min(max(field(req, "max_wait_ms", int, "fetch", default=500), 0),
                       MAX_WAIT_LIMIT_MS),
            field(req, "min_bytes", int, "fetch", default=1), max_bytes,
            field(req, "isolation_level", int, "fetch", default=0),
            field(req, "replica_id", int, "fetch", default=-1))
        return schema, results

    @staticmethod
    def iter_fetch_batches(schema: pa.Schema, results: list[PartitionFetchResult]
                           ) -> Iterator[tuple[int, StoredBatch, pa.RecordBatch]]:
        for r in results:
            for stored in r.batches:
                yield r.tp.partition, stored, stored.record_batch(schema)

    @staticmethod
    def fetch_summary(results: list[PartitionFetchResult]) -> dict[str, Any]:
        return {"partitions": [
            {"partition": r.tp.partition, **error_fields(r.error),
             "high_watermark": r.high_watermark, "log_start_offset": r.log_start_offset,
             "log_end_offset": r.log_end_offset} for r in results]}

    # -- helpers -----------------------------------------------------------------------------

    def _each_topic(self, req: dict[str, Any], what: str, fn: Any) -> dict[str, Any]:
        """Apply ``fn`` to every topic entry of ``req``; each entry gets its own error code."""
        out = []
        for t in field(req, "topics", list, what):
            if isinstance(t, dict):
                out.append({"name": t.get("name"), **self._guard(fn, t)})
            else:
                out.append({"name": None, **error_fields(InvalidRequestError(
                    f"{what}: each topic entry must be an object, got {t!r}"))})
        return {"topics": out}

    @staticmethod
    def _guard(fn: Any, *args: Any) -> dict[str, Any]:
        try:
            fn(*args)
        except ApiError as e:
            return error_fields(e)
        except Exception as e:  # boundary: report, never crash the broker
            log.exception("request failed")
            return error_fields(UnknownServerError(f"{type(e).__name__}: {e}"))
        return error_fields(None)


def _counted(name: str, fn: Any, counts: Counter[str]) -> Any:
    """``fn`` counting its calls in ``counts[name]`` (approximate under concurrency)."""
    def call(req: Any) -> Any:
        counts[name] += 1
        return fn(req)

    call.__doc__ = fn.__doc__
    return call


def _value_schema(text: str | None, what: str) -> pa.Schema | None:
    try:
        return decode_schema(text)
    except ApiError as e:
        raise InvalidRequestError(f"{what}: {e.message}") from None
