"""Request handlers: validate a decoded request, route it to the services, build the response.

Every response carries an error code per partition (or per topic for topic requests): one bad
partition never fails the whole request. Must not: contain storage or replication logic, or
know about Arrow Flight.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa

from logstore.broker.replica_manager import FetchPartition, PartitionFetchResult, ReplicaManager
from logstore.config import TopicConfig
from logstore.controller.controller import NewTopicRequest, TopicController
from logstore.controller.store import MetadataStore, TopicRecord
from logstore.errors import (
    ApiError,
    InvalidFetchSizeError,
    InvalidRequestError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from logstore.model import TopicPartition
from logstore.records import (
    DEFAULT_SCHEMA,
    StoredBatch,
    conform_batch,
    decode_schema,
    encode_schema,
    topic_schema,
)
from logstore.wire import error_fields, field

log = logging.getLogger(__name__)

MAX_WAIT_LIMIT_MS = 60_000
PRODUCER_ID_BLOCK = 1000


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
        self.actions = {
            "metadata": self.metadata,
            "create_topics": self.create_topics,
            "delete_topics": self.delete_topics,
            "create_partitions": self.create_partitions,
            "describe_configs": self.describe_configs,
            "alter_configs": self.alter_configs,
            "list_offsets": self.list_offsets,
            "init_producer_id": self.init_producer_id,
        }

    # -- control -----------------------------------------------------------------------------

    def metadata(self, req: dict[str, Any]) -> dict[str, Any]:
        names = field(req, "topics", list, "metadata", default=None)
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
        results = []
        for i, t in enumerate(field(req, "topics", list, "create_topics")):
            name = t.get("name") if isinstance(t, dict) else None
            results.append({"name": name, **self._guard(self._create_topic, t, i)})
        return {"topics": results}

    def _create_topic(self, t: Any, i: int) -> None:
        what = f"create_topics[{i}]"
        if not isinstance(t, dict):
            raise InvalidRequestError(f"{what}: must be an object")
        self._controller.create_topic(NewTopicRequest(
            name=field(t, "name", str, what),
            num_partitions=field(t, "num_partitions", int, what),
            replication_factor=field(t, "replication_factor", int, what, default=1),
            config=field(t, "config", dict, what, default={}),
            value_schema=decode_schema(field(t, "value_schema", str, what, default=None))))

    def delete_topics(self, req: dict[str, Any]) -> dict[str, Any]:
        names = field(req, "topics", list, "delete_topics")
        return {"topics": [{"name": n, **self._guard(self._delete_topic, n)} for n in names]}

    def _delete_topic(self, name: Any) -> None:
        if not isinstance(name, str):
            raise InvalidRequestError(f"delete_topics: topic name must be a string, got {name!r}")
        self._controller.delete_topic(name)

    def create_partitions(self, req: dict[str, Any]) -> dict[str, Any]:
        out = []
        for t in field(req, "topics", list, "create_partitions"):
            name = t.get("name") if isinstance(t, dict) else None
            out.append({"name": name, **self._guard(
                lambda t=t: self._controller.create_partitions(
                    field(t, "name", str, "create_partitions"),
                    field(t, "count", int, "create_partitions")))})
        return {"topics": out}

    def describe_configs(self, req: dict[str, Any]) -> dict[str, Any]:
        out = []
        for name in field(req, "topics", list, "describe_configs"):
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
        out = []
        for t in field(req, "topics", list, "alter_configs"):
            name = t.get("name") if isinstance(t, dict) else None
            out.append({"name": name, **self._guard(
                lambda t=t: self._controller.alter_config(
                    field(t, "name", str, "alter_configs"),
                    field(t, "config", dict, "alter_configs"), incremental))})
        return {"topics": out}

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

    def init_producer_id(self, req: dict[str, Any]) -> dict[str, Any]:
        return {**error_fields(None), "producer_id": self._producer_ids.next_producer_id(),
                "producer_epoch": 0}

    # -- produce -----------------------------------------------------------------------------

    def topic_schema(self, topic: str) -> pa.Schema:
        record = self._store.topics().get(topic)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return topic_schema(record.value_schema)

    def produce(self, topic: str, batch: pa.RecordBatch, meta: dict[str, Any], acks: int,
                timeout_ms: int) -> dict[str, Any]:
        """Append one producer batch; returns the per-batch acknowledgement fields."""
        what = f"produce to {topic!r}"
        partition = field(meta, "partition", int, what)
        tp = TopicPartition(topic, partition)
        try:
            batch = conform_batch(batch, self.topic_schema(topic), f"topic-partition {tp}")
            info = self._replicas.append_records(
                tp, batch, acks, timeout_ms,
                producer_id=field(meta, "producer_id", int, what, default=-1),
                producer_epoch=field(meta, "producer_epoch", int, what, default=-1),
                base_sequence=field(meta, "base_sequence", int, what, default=-1))
        except ApiError as e:
            return {"partition": partition, **error_fields(e), "base_offset": -1}
        return {"partition": partition, **error_fields(None), "base_offset": info.first_offset,
                "log_append_time": info.log_append_time,
                "log_start_offset": info.log_start_offset}

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
                field(p, "max_bytes", int, "fetch", default=max_bytes)))
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


def topic_config_for(default: TopicConfig, record: TopicRecord | None) -> TopicConfig:
    return default if record is None else default.updated(record.config)
