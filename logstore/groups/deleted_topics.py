"""Handler of a topic deletion on one offsets partition: tombstones for the deleted topics'
committed offsets, as Kafka's ``GroupCoordinator.onPartitionsDeleted`` writes them.

Owns: choosing, for each deleted topic (name -> id of the incarnation deleted), the keys
(group, partition) to tombstone, through the shard's index by topic (no scan of every group):
those whose committed offset, and every offset open transactions staged for them, were
committed for that id or for no recorded id (records from before ids were recorded). A key
with an offset recorded under another id (committed for a topic recreated under the name,
perhaps before this coordinator heard of the deletion) is left whole: its tombstone would drop
that offset too, committed or staged (a tombstone drops what transactions staged for its key,
``CommittedOffsets.drop``, so no later COMMIT marker brings a deleted offset back). An old
offset so left is hidden by offset fetch once the topic's id is known (``visible_offsets``).
An empty group left with no offsets is deleted too, as Kafka does. Must not: do I/O, take
locks or read clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from logstore.coordinator import CoordinatorResult
from logstore.groups.coordinator import GroupCoordinatorShard, Rows, batch
from logstore.model import TopicPartition

Key = tuple[str, TopicPartition]


def delete_topics_offsets(shard: GroupCoordinatorShard, topics: Mapping[str, str],
                          now_ms: int) -> CoordinatorResult[int]:
    """Tombstones for the offsets of ``topics`` (name -> deleted id) this shard holds; the
    response is how many keys were tombstoned."""
    doomed: dict[str, list[TopicPartition]] = {}
    for topic, topic_id in sorted(topics.items()):
        for (group_id, tp), ids in _recorded_ids(shard, topic).items():
            if ids <= {topic_id, None}:
                doomed.setdefault(group_id, []).append(tp)
    rows: Rows = []
    changes: list[Callable[[], None]] = []
    for group_id, tps in doomed.items():
        group = shard.groups.get(group_id)
        deleted, change = shard.deletion(group_id, tps, drop_group=group is None or
                                         not group.members, why="of deleted topic(s)")
        rows += deleted
        changes.append(change)

    def apply() -> None:
        for change in changes:
            change()
    return CoordinatorResult(batch(rows, now_ms), sum(map(len, doomed.values())), apply)


def _recorded_ids(shard: GroupCoordinatorShard, topic: str) -> dict[Key, set[str | None]]:
    """Each key of ``topic`` with an offset, committed or staged, and the ids they were
    recorded for."""
    ids: dict[Key, set[str | None]] = {}
    for group_id, tp, stored in shard.committed.of_topic(topic):
        ids.setdefault((group_id, tp), set()).add(stored.topic_id)
    for group_id, tp, stored in shard.committed.staged_of_topic(topic):
        ids.setdefault((group_id, tp), set()).add(stored.topic_id)
    return ids
