"""Topic and partition management: the controller's decisions.

Owns: validating topic requests, assigning replicas to brokers (distinct brokers, leaders
spread evenly, rack-aware when racks are set), and the initial leader/ISR of new partitions.
It records decisions in a ``MetadataStore``; brokers learn them through store listeners.
Must not: touch logs or the network.

Many topics at once (``create_topics``): each is validated on its own, the valid ones are
recorded in one store call (one file write embedded, few ZooKeeper transactions), and the
answer says per topic whether it now exists; creating the partitions' logs is the brokers'
metadata sync, which the call does not wait for.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from dataclasses import replace
from typing import Any

from logstore.config import TopicConfig, validate_tiering, validate_topic_config
from logstore.controller.store import (
    BrokerInfo,
    MetadataStore,
    PartitionState,
    TopicRecord,
    new_topic_id,
)
from logstore.errors import (
    ApiError,
    InvalidPartitionsError,
    InvalidRecordError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
)
from logstore.model import (
    INTERNAL_TOPICS,
    NewTopic,
    validate_partition_count,
    validate_topic_name,
)
from logstore.records import refuse_dictionary_columns, topic_schema

log = logging.getLogger(__name__)


def assign_replicas(brokers: list[BrokerInfo], num_partitions: int, replication_factor: int,
                    start_partition: int = 0, offset: int = 0) -> dict[int, tuple[int, ...]]:
    """Replicas per partition on distinct brokers, with preferred leaders rotating over the
    brokers so leadership is spread evenly. Brokers are interleaved by rack first, so the
    replicas of a partition span racks when racks are set."""
    ordered = _rack_interleaved(brokers)
    n = len(ordered)
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {n} live broker(s)")
    result: dict[int, tuple[int, ...]] = {}
    for p in range(start_partition, start_partition + num_partitions):
        first = (p + offset) % n
        result[p] = tuple(ordered[(first + r) % n].broker_id for r in range(replication_factor))
    return result


def _rack_interleaved(brokers: list[BrokerInfo]) -> list[BrokerInfo]:
    by_rack: dict[str | None, list[BrokerInfo]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(b.rack, []).append(b)
    racks = list(by_rack.values())
    out: list[BrokerInfo] = []
    for i in range(max((len(r) for r in racks), default=0)):
        out.extend(r[i] for r in racks if i < len(r))
    return out


def named(topic: str, error: ApiError) -> ApiError:
    """``error``, its message naming ``topic`` (unless it already does)."""
    return error if repr(topic) in error.message else type(error)(
        f"topic {topic!r}: {error.message}")


def collision_key(name: str) -> str | None:
    """Kafka's collision rule: '.' and '_' are one character in metric names, so two topics
    whose names differ only there are refused. None for a name with neither (no collision)."""
    return name.replace(".", "_") if "." in name or "_" in name else None


def check_collision(name: str, taken: dict[str, str]) -> None:
    """Refuse ``name`` if another topic's name in ``taken`` (collision key -> name) collides."""
    key = collision_key(name)
    other = taken.get(key) if key is not None else None
    if other is not None and other != name:
        raise InvalidTopicError(f"topic {name!r} collides with existing topic {other!r}: "
                                "names may not differ only in '.' and '_'")


def repeated_topic_error(name: str, count: int, done: str = "created"
                         ) -> InvalidRequestError:
    """The error of each copy of a topic name given ``count`` times in one request (Kafka's
    "Duplicate topic in request"): none of them is acted on."""
    return InvalidRequestError(f"topic {name!r} appears {count} times in the request; none "
                               f"of them was {done}")


class TopicController:
    """Creates, deletes and grows topics in the metadata store."""

    def __init__(self, store: MetadataStore, default_config: TopicConfig,
                 controller_epoch: int = 0, remote_storage_uri: str | None = None) -> None:
        self._store = store
        self._default_config = default_config
        self.controller_epoch = controller_epoch
        self._remote_storage_uri = remote_storage_uri

    def create_topic(self, req: NewTopic) -> TopicRecord:
        record = self._plan_topic(req, list(self._store.brokers().values()))
        check_collision(req.name, self._collision_keys([req]))
        self._store.create_topic(record, self._initial_states(record.replicas))
        log.info("created topic %s with %d partition(s), rf %d", req.name, req.num_partitions,
                 req.replication_factor)
        return record

    def create_topics(self, reqs: list[NewTopic]) -> list[ApiError | None]:
        """Create every valid topic of ``reqs`` in one store call; per topic, in order, None
        when it now exists or the error (naming the topic) that kept it from being created.
        A name given more than once is refused in every copy and not created (Kafka's rule:
        the answers are by name, so one copy's success would hide the other's error)."""
        outcomes: list[ApiError | None] = [None] * len(reqs)
        brokers = list(self._store.brokers().values())
        planned: list[tuple[int, TopicRecord]] = []
        counts = Counter(req.name for req in reqs)
        taken = self._collision_keys(reqs)
        for i, req in enumerate(reqs):
            try:
                if counts[req.name] > 1:
                    raise repeated_topic_error(req.name, counts[req.name])
                record = self._plan_topic(req, brokers)  # the name is valid from here
                check_collision(req.name, taken)
                planned.append((i, record))
                if (key := collision_key(req.name)) is not None:
                    taken.setdefault(key, req.name)  # a later name of the request collides
            except ApiError as e:
                outcomes[i] = named(req.name, e)
        if not planned:
            return outcomes
        live = {b.broker_id for b in brokers}
        try:
            stored = self._store.create_topics(
                [(record, self._initial_states(record.replicas, live)) for _, record in planned])
        except ApiError as e:  # the whole write failed: no topic of it exists
            stored = [e] * len(planned)
        for (i, _), error in zip(planned, stored, strict=True):
            outcomes[i] = error
        created = [record for (_, record), error in zip(planned, stored, strict=True)
                   if error is None]
        log.info("created %d topic(s) with %d partition(s) in all", len(created),
                 sum(r.num_partitions for r in created))
        return outcomes

    def _collision_keys(self, reqs: list[NewTopic]) -> dict[str, str]:
        """The existing topics' names by collision key; the store is read only when a name
        asked for has a '.' or '_' (a request of plain names costs nothing)."""
        if not any(isinstance(r.name, str) and collision_key(r.name) for r in reqs):
            return {}
        return {key: name for name in self._store.topics()
                if (key := collision_key(name)) is not None}

    def _plan_topic(self, req: NewTopic, brokers: list[BrokerInfo]) -> TopicRecord:
        """The record of a new topic, after every check that needs no write."""
        validate_topic_name(req.name)
        if req.name.startswith("__") and req.name not in INTERNAL_TOPICS:
            raise InvalidTopicError(f"topic names starting with '__' are reserved: {req.name!r}")
        validate_partition_count(req.name, req.num_partitions)
        if not isinstance(req.replication_factor, int) or req.replication_factor <= 0:
            raise InvalidReplicationFactorError(
                f"topic {req.name!r}: replication factor must be positive, "
                f"got {req.replication_factor!r}")
        config = validate_topic_config(req.config)
        # The combination must be valid too. (min_insync_replicas above the replication
        # factor is accepted, as in Kafka: it binds acks=all writes only, which then fail
        # with NOT_ENOUGH_REPLICAS.)
        validate_tiering(req.name, self._default_config.updated(config),
                         self._remote_storage_uri)
        if req.value_schema is not None:
            try:
                topic_schema(req.value_schema)
                refuse_dictionary_columns(req.value_schema)
            except InvalidRecordError as e:  # no record is at fault: the request is
                raise InvalidRequestError(f"topic {req.name!r}: {e.message}") from None
        replicas = assign_replicas(brokers, req.num_partitions, req.replication_factor,
                                   offset=zlib.crc32(req.name.encode()) % max(len(brokers), 1))
        return TopicRecord(req.name, replicas, config, req.value_schema,
                           internal=req.name in INTERNAL_TOPICS, topic_id=new_topic_id())

    def delete_topic(self, name: str) -> None:
        self._require(name)
        self._store.delete_topic(name)
        log.info("deleted topic %s", name)

    def create_partitions(self, name: str, total_count: int) -> TopicRecord:
        record = self._require(name)
        if not isinstance(total_count, int) or total_count <= record.num_partitions:
            raise InvalidPartitionsError(
                f"topic {name!r} has {record.num_partitions} partition(s); the new count must "
                f"be larger, got {total_count!r}")
        validate_partition_count(name, total_count)
        rf = len(next(iter(record.replicas.values())))
        brokers = list(self._store.brokers().values())
        added = assign_replicas(brokers, total_count - record.num_partitions, rf,
                                start_partition=record.num_partitions)
        new_record = replace(record, replicas={**record.replicas, **added})
        self._store.update_topic(new_record, self._initial_states(added))
        return new_record

    def alter_config(self, name: str, changes: dict[str, Any], incremental: bool = True
                     ) -> TopicRecord:
        record = self._require(name)
        try:
            validated = validate_topic_config(changes)
        except ApiError as e:
            raise named(name, e) from None
        merged = {**record.config, **validated} if incremental else validated
        merged = {k: v for k, v in merged.items() if v is not None or k in validated}
        validate_tiering(name, self._default_config.updated(merged), self._remote_storage_uri,
                         previous=self._default_config.updated(record.config))
        new_record = replace(record, config=merged)
        self._store.update_topic(new_record, {})
        return new_record

    def topic_config(self, name: str) -> TopicConfig:
        return self._default_config.updated(self._require(name).config)

    def _require(self, name: str) -> TopicRecord:
        record = self._store.topics().get(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return record

    def _initial_states(self, replicas: dict[int, tuple[int, ...]],
                        live: set[int] | None = None) -> dict[int, PartitionState]:
        live = set(self._store.brokers()) if live is None else live
        states = {}
        for p, reps in replicas.items():
            isr = tuple(r for r in reps if r in live)
            states[p] = PartitionState(isr[0] if isr else -1, 0, isr, self.controller_epoch)
        return states
