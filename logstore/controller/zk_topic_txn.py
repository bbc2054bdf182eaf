"""The znodes a new topic takes, and batches of new topics grouped into ZooKeeper transactions.

Owns: the creations a topic needs, in order (its znode, its partitions' folder, then each
partition and its state), those of partitions added later, and the split of a batch of topics
into consecutive transactions of at most MAX_TOPIC_TXN_OPS creations: a multi travels as one
request, and ZooKeeper refuses requests over jute.maxbuffer (1 MB by default); a partition's
two znodes take about 200 bytes. A topic larger than that bound still goes alone in one
transaction (a topic is created whole or not at all). Must not: import kazoo
(``zk_topic_writes.py`` commits the transactions and reads their errors).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from logstore.controller import zk_paths as zp
from logstore.controller.store import PartitionState, TopicRecord

MAX_TOPIC_TXN_OPS = 2_000

NewTopicState = tuple[TopicRecord, dict[int, PartitionState]]
T = TypeVar("T")


def add_topic(tx: Any, record: TopicRecord, states: dict[int, PartitionState]) -> None:
    """Add the creations of a new topic to the kazoo transaction ``tx``."""
    tx.create(zp.topic_path(record.name), zp.encode_topic(record))
    tx.create(zp.partitions_path(record.name))
    add_partitions(tx, record.name, record.replicas, states)


def add_partitions(tx: Any, topic: str, partitions: Iterable[int],
                   states: dict[int, PartitionState]) -> None:
    """Add the creations of ``partitions`` of ``topic`` (with their states, where given)."""
    for p in sorted(partitions):
        tx.create(zp.partition_path(topic, p))
        if p in states:
            tx.create(zp.partition_state_path(topic, p), zp.encode_partition_state(states[p]))


def creations(record: TopicRecord, states: dict[int, PartitionState]) -> int:
    """How many znodes ``add_topic`` creates."""
    return 2 + len(record.replicas) + sum(1 for p in record.replicas if p in states)


def txn_chunks(topics: list[tuple[T, NewTopicState]]) -> list[list[tuple[T, NewTopicState]]]:
    """Consecutive groups of ``topics`` (each tagged with the caller's ``T``) of at most
    MAX_TOPIC_TXN_OPS creations each; a larger topic alone in its group."""
    chunks: list[list[tuple[T, NewTopicState]]] = [[]]
    ops = 0
    for item in topics:
        n = creations(*item[1])
        if chunks[-1] and ops + n > MAX_TOPIC_TXN_OPS:
            chunks.append([])
            ops = 0
        chunks[-1].append(item)
        ops += n
    return [c for c in chunks if c]
