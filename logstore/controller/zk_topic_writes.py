"""Topic creation, update and deletion in ZooKeeper, each in transactions.

Owns: committing the creations of new topics (``zk_topic_txn.py`` says which znodes, and how a
batch is grouped into transactions), redoing a batch one topic at a time when one of its topics
exists, replacing a topic's record and partition states (adding the partitions it lacks), and
deleting a topic's whole subtree; each retried from its reads when a concurrent writer changed
what it read. After each write it hands the cache keys it changed to the store. Must not: cache
or watch (``zookeeper.py`` does), or let kazoo exceptions out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError

from logstore.controller import zk_paths as zp
from logstore.controller.store import PartitionState, TopicRecord
from logstore.controller.zk_cache import TOPICS_KEY, states_key
from logstore.controller.zk_session import MAX_CAS_ATTEMPTS, ZkSession
from logstore.controller.zk_topic_txn import NewTopicState, add_partitions, add_topic, txn_chunks
from logstore.errors import (
    ApiError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)


class ZkTopicWrites:
    """Topic writes on the store's session; ``changed`` reads the written keys back into the
    store's cache and tells its listeners."""

    def __init__(self, zk: ZkSession, changed: Callable[..., None]) -> None:
        self._zk = zk
        self._changed = changed

    def create(self, record: TopicRecord, states: dict[int, PartitionState]) -> None:
        self._create_one(record, states)
        self._changed(TOPICS_KEY, states_key(record.name))

    def create_many(self, topics: list[NewTopicState]) -> list[ApiError | None]:
        """Topics in transactions of up to MAX_TOPIC_TXN_OPS creations (``zk_topic_txn.py``);
        a transaction that fails because one of its topics exists is redone one topic at a
        time."""
        outcomes: list[ApiError | None] = [None] * len(topics)
        for chunk in txn_chunks(list(enumerate(topics))):
            self._create_chunk(chunk, outcomes)
        created = [states_key(record.name) for (record, _), error in zip(
            topics, outcomes, strict=True) if error is None]
        if created:
            self._changed(TOPICS_KEY, *created)
        return outcomes

    def _create_chunk(self, chunk: list[tuple[int, NewTopicState]],
                      outcomes: list[ApiError | None]) -> None:
        if len(chunk) > 1:
            what = f"create {len(chunk)} topics"
            tx = self._zk.transaction()
            for _, (record, states) in chunk:
                add_topic(tx, record, states)
            try:
                error = self._zk.commit(tx, what)
            except ApiError as e:  # connection trouble: the outcome is unknown, retriable
                for i, _ in chunk:
                    outcomes[i] = e
                return
            if error is None:
                return
            if not isinstance(error, NodeExistsError):
                for i, _ in chunk:
                    outcomes[i] = self._zk.unexpected(error, what)
                return
        for i, (record, states) in chunk:
            try:
                self._create_one(record, states)
            except ApiError as e:
                outcomes[i] = e

    def _create_one(self, record: TopicRecord, states: dict[int, PartitionState]) -> None:
        name = record.name
        tx = self._zk.transaction()
        add_topic(tx, record, states)
        error = self._zk.commit(tx, f"create topic {name}")
        if isinstance(error, NodeExistsError):
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if error is not None:
            raise self._zk.unexpected(error, f"create topic {name}")

    def update(self, record: TopicRecord, new_states: dict[int, PartitionState]) -> None:
        """Replace the topic's record; create the partitions of ``new_states`` that do not
        exist yet and overwrite the states of those that do (last writer wins, as in the local
        store)."""
        name = record.name

        def build() -> Any:
            existing = self._existing_partitions(name)
            tx = self._zk.transaction()
            tx.set_data(zp.topic_path(name), zp.encode_topic(record))
            add_partitions(tx, name, set(new_states) - existing, new_states)
            for p in set(new_states) & existing:
                tx.set_data(zp.partition_state_path(name, p),
                            zp.encode_partition_state(new_states[p]))
            return tx

        self._commit_retried(name, "update", build, (NodeExistsError, NoNodeError))

    def _existing_partitions(self, topic: str) -> set[int]:
        try:
            return {int(p) for p in self._zk.children(zp.partitions_path(topic))}
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None

    def delete(self, name: str) -> None:
        """Delete the topic's whole subtree in one transaction (retried if it changed)."""
        def build() -> Any:
            paths = self._subtree(zp.topic_path(name))
            if not paths:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            tx = self._zk.transaction()
            for path in paths:
                tx.delete(path)
            return tx

        self._commit_retried(name, "delete", build, (NotEmptyError, NoNodeError))

    def _commit_retried(self, name: str, verb: str, build: Callable[[], Any],
                        races: tuple[type[Exception], ...]) -> None:
        """Commit the transaction ``build`` makes, built afresh after each lost race (one of
        ``races``: the topic's znodes changed meanwhile), at most MAX_CAS_ATTEMPTS times."""
        for _ in range(MAX_CAS_ATTEMPTS):
            error = self._zk.commit(build(), f"{verb} topic {name}")
            if error is None:
                self._changed(TOPICS_KEY, states_key(name))
                return
            if not isinstance(error, races):
                raise self._zk.unexpected(error, f"{verb} topic {name}")
        raise RequestTimedOutError(f"topic {name!r}: {verb} lost {MAX_CAS_ATTEMPTS} races")

    def _subtree(self, path: str) -> list[str]:
        """``path`` and everything below it, children before parents; [] if it is missing."""
        try:
            children = self._zk.children(path)
        except NoNodeError:
            return []
        out: list[str] = []
        for child in children:
            out += self._subtree(f"{path}/{child}")
        return out + [path]
