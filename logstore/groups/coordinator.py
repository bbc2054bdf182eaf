"""The group coordinator of one ``__consumer_offsets`` partition, as a pure state machine.

Owns: the groups and committed offsets of one partition (``GroupCoordinatorShard``), building
them by replaying the partition (``GroupShardLoader``), the rules every handler shares (a group
changes on a copy, installed once its new generation is durable), the admin reads (list,
describe), which committed offsets a fetch shows (not those recorded for another incarnation
of their topic than the current one, as ``topic_id_of`` reports it: ``visible_offsets``) and
the background tick (session expiry, delayed joins, offset expiry of long-empty groups). The
handlers of the group API live beside it, split by API: ``membership.py`` (join, sync,
heartbeat, leave), ``commits.py`` (offset commit and fetch, delete), ``txn_offsets.py``
(offsets committed inside a transaction, applied or dropped by its marker) and
``deleted_topics.py`` (tombstones for a deleted topic's offsets). Every handler takes the
shard, a typed request and ``now_ms`` and returns a ``CoordinatorResult``: records to append,
the response, and the change to apply once the records are acknowledged; a refused request
raises its ApiError and changes nothing.

Invariant: memory is never ahead of the log. Every installed group's generation is the one of
its latest group record (``persisted``), and every committed offset in ``offsets`` is in the
log, at the position ``committed.positions`` holds for it (so a transaction's offsets,
decided by a late marker, never replace a newer commit): a change reaches memory only through
``apply``. Must not: do I/O, take locks or read clocks (``broker/coordinator_runtime.py`` runs
the results against the log and ``broker/group_coordinator.py`` routes requests to shards);
``topic_id_of`` is the broker's lookup in its metadata, in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from logstore.coordinator import Completions, CoordinatorResult, LoggedBatch
from logstore.errors import GroupIdNotFoundError, NotCoordinatorError
from logstore.groups.offsets import (
    CommittedOffsets,
    GroupOffsets,
    GroupRecord,
    LoadedGroups,
    PendingTxnOffsets,
    StoredOffset,
    encode_batch,
    group_key,
    offset_key,
)
from logstore.groups.state import Group, GroupState
from logstore.messages.groups import GroupDescription, GroupListing, MemberDescription
from logstore.model import OFFSETS_TOPIC, SINK_PROGRESS_TOPIC, TopicPartition

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
R = TypeVar("R")
Rows = list[tuple[bytes, bytes | None]]
# The current id of a topic as this broker's metadata has it (None: a topic it does not know,
# perhaps not yet); read by commits without an id and by offset fetches.
TopicIdOf = Callable[[str], str | None]


def no_topic_ids(_topic: str) -> str | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """The broker's group settings (Kafka's names and defaults, except the session minimum)."""

    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_retention_minutes: int = 7 * 24 * 60
    offset_metadata_max_bytes: int = 4096

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * MINUTE_MS


@dataclass
class GroupCoordinatorShard:
    """The groups of one offsets partition, as its log has them."""

    partition: int
    config: GroupConfig
    groups: dict[str, Group] = field(default_factory=dict)
    committed: CommittedOffsets = field(default_factory=CommittedOffsets)
    persisted: dict[str, int] = field(default_factory=dict)  # group -> generation in the log
    topic_id_of: TopicIdOf = no_topic_ids

    @property
    def offsets(self) -> GroupOffsets:
        """Every group's committed offsets (change them through ``committed``)."""
        return self.committed.offsets

    @property
    def pending_txn(self) -> PendingTxnOffsets:
        """Offsets staged by transactions not decided yet."""
        return self.committed.pending

    def visible_offsets(self, group_id: str) -> dict[TopicPartition, StoredOffset]:
        """The group's committed offsets a fetch answers: all but those committed for another
        topic id than the topic's current one (a topic deleted and recreated under the same
        name, whose old offsets this coordinator never tombstoned: it did not lead the
        partition, or was down, when the topic was deleted). An offset of a topic whose
        current id is unknown here, or recorded with none, is shown as before ids."""
        ids: dict[str, str | None] = {}
        out = {}
        for tp, so in self.offsets.get(group_id, {}).items():
            if so.topic_id is not None:
                if tp.topic not in ids:
                    ids[tp.topic] = self.topic_id_of(tp.topic)
                current = ids[tp.topic]
                if current is not None and current != so.topic_id:
                    continue
            out[tp] = so
        return out

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str | None]:
        """The current id of each topic, looked up once."""
        return {t: self.topic_id_of(t) for t in set(topics)}

    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
        return group

    def draft(self, group_id: str, now_ms: int, create: bool = False) -> Group:
        """A copy of the group to change (a new, empty group if ``create`` and it does not
        exist); nothing changes until the result's ``apply`` installs it."""
        if create and group_id not in self.groups:
            return Group(group_id, now_ms)
        return self.group(group_id).copy()

    def changed(self, draft: Group, now_ms: int, response: R) -> CoordinatorResult[R]:
        """The result of a request that changed ``draft``: a group record if it reached a
        generation the log does not hold yet; once durable, ``draft`` is installed and the
        futures it resolved are woken."""
        rows = self.generation_rows(draft)
        return CoordinatorResult(batch(rows, now_ms), response, self.installer(draft))

    def generation_rows(self, draft: Group) -> Rows:
        if self.persisted.get(draft.group_id) == draft.generation_id:
            return []
        record = GroupRecord(draft.protocol_type or "", draft.generation_id, draft.protocol,
                             draft.leader_id)
        return [(group_key(draft.group_id), record.encode())]

    def installer(self, draft: Group) -> Callable[[], None]:
        completions = draft.completions.take()

        def install() -> None:
            self.groups[draft.group_id] = draft
            self.persisted[draft.group_id] = draft.generation_id
            completions.fire()
        return install

    def deletion(self, group_id: str, tps: list[TopicPartition], *, drop_group: bool = True,
                 why: str = "") -> tuple[Rows, Callable[[], None]]:
        """Tombstones for ``tps`` and, when no offsets remain and ``drop_group``, for the
        group itself; and the matching change."""
        remaining = set(self.offsets.get(group_id, {})) - set(tps)
        drop_group = drop_group and not remaining
        rows: Rows = [(offset_key(group_id, tp), None) for tp in tps]
        if drop_group:
            rows.append((group_key(group_id), None))

        def delete() -> None:
            self.committed.drop(group_id, tps)
            if drop_group:
                self.groups.pop(group_id, None)
                self.persisted.pop(group_id, None)
            log.info("group %s: deleted %d offset(s)%s%s", group_id, len(tps),
                     f" {why}" if why else "", " and the group" if drop_group else "")
        return rows, delete


def batch(rows: Rows, now_ms: int) -> list[pa.RecordBatch]:
    """The records to append for ``rows`` (none for no rows)."""
    return [encode_batch(rows, now_ms)] if rows else []


class GroupShardLoader:
    """Builds a partition's shard from its log, and gives one up (``ShardLoader``)."""

    def __init__(self, config: GroupConfig, topic_id_of: TopicIdOf = no_topic_ids) -> None:
        self.config = config
        self.topic_id_of = topic_id_of

    def load(self, partition: int, leader_epoch: int, batches: Iterable[LoggedBatch],
             now_ms: int) -> GroupCoordinatorShard:
        loaded = LoadedGroups()
        for b in batches:
            loaded.apply_logged(b)
        shard = GroupCoordinatorShard(partition, self.config, committed=loaded.committed,
                                      topic_id_of=self.topic_id_of)
        for group_id in set(loaded.committed.offsets) | set(loaded.groups):
            record = loaded.groups.get(group_id)
            stamps = [o.commit_timestamp
                      for o in loaded.committed.offsets.get(group_id, {}).values()]
            group = Group(group_id, max(stamps, default=now_ms),
                          record.generation_id if record else 0,
                          record.protocol_type if record else None)
            shard.groups[group_id] = group
            shard.persisted[group_id] = group.generation_id
        log.info("%s-%d: loaded %d group(s) at leader epoch %d", OFFSETS_TOPIC, partition,
                 len(shard.groups), leader_epoch)
        return shard

    def unload(self, shard: GroupCoordinatorShard, partition: int) -> Completions:
        moved = NotCoordinatorError(f"{OFFSETS_TOPIC}-{partition} moved to another leader")
        failed = Completions()
        for group in shard.groups.values():
            group.fail_pending(moved)
            failed.pending.extend(group.completions.take().pending)
        return failed


# -- admin reads ---------------------------------------------------------------------------


def list_groups(shard: GroupCoordinatorShard) -> list[GroupListing]:
    return [GroupListing(group_id=g.group_id, state=g.state.value,
                         protocol_type=g.protocol_type or "") for g in shard.groups.values()]


def describe_group(shard: GroupCoordinatorShard, group_id: str) -> GroupDescription:
    g = shard.group(group_id)
    return GroupDescription(
        group_id=g.group_id, state=g.state.value, protocol_type=g.protocol_type or "",
        protocol=g.protocol or "", generation_id=g.generation_id, leader=g.leader_id or "",
        members=[MemberDescription(member_id=m.member_id,
                                   group_instance_id=m.group_instance_id,
                                   client_id=m.client_id, assignment=m.assignment)
                 for m in g.members.values()])


# -- time ----------------------------------------------------------------------------------


def tick(shard: GroupCoordinatorShard, now_ms: int) -> dict[str, CoordinatorResult[None]]:
    """A result for every group with something due: expired sessions, a join to complete,
    offsets of a group empty for longer than the retention."""
    return {group_id: _tick_group(shard, group, now_ms)
            for group_id, group in list(shard.groups.items()) if _due(shard, group, now_ms)}


def _due(shard: GroupCoordinatorShard, group: Group, now_ms: int) -> bool:
    return (group.state == GroupState.PREPARING_REBALANCE or bool(group.expired(now_ms))
            or _long_empty(shard, group, now_ms))


def _long_empty(shard: GroupCoordinatorShard, group: Group, now_ms: int) -> bool:
    return group.state == GroupState.EMPTY and \
        now_ms - group.empty_since_ms >= shard.config.offsets_retention_ms


def _tick_group(shard: GroupCoordinatorShard, group: Group, now_ms: int
                ) -> CoordinatorResult[None]:
    draft = group.copy()
    expired = draft.tick(now_ms)
    if expired:
        log.info("group %s: session expired for %s", group.group_id, expired)
    rows = shard.generation_rows(draft)
    changes = [shard.installer(draft)]
    if _long_empty(shard, draft, now_ms):
        retention = shard.config.offsets_retention_ms
        committed = shard.offsets.get(group.group_id, {})
        # A sink's progress record never expires: without it, a batch Spark replays after
        # a restart would be published a second time. Nor does one an open transaction
        # staged a new offset for (as in Kafka): its tombstone would drop that offset too.
        staged = shard.committed.staged_keys(group.group_id)
        old = [tp for tp, om in committed.items() if now_ms - om.commit_timestamp >= retention
               and tp.topic != SINK_PROGRESS_TOPIC and tp not in staged]
        if old or not committed:
            deleted, delete = shard.deletion(group.group_id, old)
            rows += deleted
            changes.append(delete)
    return CoordinatorResult(batch(rows, now_ms), None, lambda: _run(changes))


def _run(changes: list[Callable[[], None]]) -> None:
    for change in changes:
        change()
