"""The group coordinator: the groups whose ``__consumer_offsets`` partition this broker leads.

Owns: routing a group to its offsets partition (``partition_for``), loading a partition's
groups and offsets by replaying it when this broker becomes its leader (answering
COORDINATOR_LOAD_IN_PROGRESS to other requests meanwhile, NOT_COORDINATOR when it does not lead
the partition), the group operations (join, sync, heartbeat, leave, commit, fetch, list,
describe, delete), persisting offsets and generations as records, session expiry and offset
expiry from ``tick()``. Time comes from the injected clock. Must not: parse wire requests
(``broker/group_handlers.py`` does) or touch the network; the log is reached through the
``OffsetsLog`` seam.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from logstore.clock import Clock
from logstore.errors import (
    ApiError,
    CoordinatorLoadInProgressError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InvalidCommitOffsetSizeError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetOutOfRangeError,
)
from logstore.groups.offsets import (
    GroupRecord,
    LoadedGroups,
    encode_batch,
    group_key,
    offset_key,
    offset_value,
    partition_for,
)
from logstore.groups.state import Group, GroupState, JoinResult
from logstore.model import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """The broker's group settings (Kafka's names and defaults, except the session minimum)."""

    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_retention_minutes: int = 7 * 24 * 60
    offset_metadata_max_bytes: int = 4096


class OffsetsLog(Protocol):
    """The coordinator's view of the ``__consumer_offsets`` partitions on this broker."""

    def num_partitions(self) -> int: ...

    def leader_epoch(self, partition: int) -> int | None:
        """The leader epoch if this broker leads ``partition``, else None."""

    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        """Append and wait for the acknowledgement (acks=all); raises ApiError."""

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        """Every record batch up to the log end (this broker leads the partition), in offset
        order."""


@dataclass
class _Shard:
    """The groups of one offsets partition, as loaded at one leader epoch."""

    leader_epoch: int
    groups: dict[str, Group] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    persisted: dict[str, int] = field(default_factory=dict)  # group -> generation on disk


@dataclass(frozen=True, slots=True)
class CommitEntry:
    tp: TopicPartition
    offset: int
    metadata: str = ""


class GroupCoordinator:
    def __init__(self, offsets_log: OffsetsLog, config: GroupConfig, clock: Clock) -> None:
        self._log = offsets_log
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._shards: dict[int, _Shard] = {}
        self._loading: set[int] = set()

    # -- routing and loading -----------------------------------------------------------------

    def _now(self) -> int:
        return self._clock.time_ms()

    def _partition(self, group_id: str) -> int:
        if not isinstance(group_id, str) or not group_id:
            raise InvalidGroupIdError(f"group id must be a non-empty string, got {group_id!r}")
        return partition_for(group_id, self._log.num_partitions())

    def _ensure_loaded(self, group_id: str) -> None:
        """Replay the group's offsets partition if this broker leads it at an epoch not yet
        loaded. The replay runs without the lock: other groups go on meanwhile, and requests
        for this partition get COORDINATOR_LOAD_IN_PROGRESS."""
        partition = self._partition(group_id)
        with self._lock:
            epoch = self._log.leader_epoch(partition)
            shard = self._shards.get(partition)
            if epoch is None or (shard is not None and shard.leader_epoch == epoch):
                return
            if partition in self._loading:
                raise CoordinatorLoadInProgressError(
                    f"loading groups of __consumer_offsets-{partition}")
            self._loading.add(partition)
        try:
            shard = self._replay(partition, epoch)
        finally:
            with self._lock:
                self._loading.discard(partition)
        with self._lock:
            self._shards[partition] = shard

    def _shard_of(self, group_id: str) -> tuple[int, _Shard]:
        """The loaded shard of ``group_id``. Call with the lock held, after
        ``_ensure_loaded``."""
        partition = self._partition(group_id)
        epoch = self._log.leader_epoch(partition)
        if epoch is None:
            self._unload(partition)
            raise NotCoordinatorError(f"this broker does not lead __consumer_offsets-"
                                      f"{partition}, the partition of group {group_id!r}")
        shard = self._shards.get(partition)
        if shard is None or shard.leader_epoch != epoch:
            raise CoordinatorLoadInProgressError(  # leadership moved since _ensure_loaded
                f"loading groups of __consumer_offsets-{partition}")
        return partition, shard

    def _unload(self, partition: int) -> None:
        """Forget a partition this broker no longer leads; members waiting in a join or sync
        learn at once that they must find the new coordinator."""
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        moved = NotCoordinatorError(f"__consumer_offsets-{partition} moved to another leader")
        for group in shard.groups.values():
            group.fail_pending(moved)
        log.info("__consumer_offsets-%d: unloaded %d group(s)", partition, len(shard.groups))

    def _replay(self, partition: int, epoch: int) -> _Shard:
        loaded = LoadedGroups()
        for batch in self._log.read(partition):
            loaded.apply_batch(batch)
        shard = _Shard(epoch, offsets=loaded.offsets)
        for group_id in set(loaded.offsets) | set(loaded.groups):
            record = loaded.groups.get(group_id)
            stamps = [o.commit_timestamp for o in loaded.offsets.get(group_id, {}).values()]
            group = Group(group_id, max(stamps, default=self._now()),
                          record.generation_id if record else 0,
                          record.protocol_type if record else None)
            shard.groups[group_id] = group
            shard.persisted[group_id] = group.generation_id
        log.info("__consumer_offsets-%d: loaded %d group(s) at leader epoch %d", partition,
                 len(shard.groups), epoch)
        return shard

    def _group(self, group_id: str, create: bool = False) -> tuple[int, _Shard, Group]:
        partition, shard = self._shard_of(group_id)
        group = shard.groups.get(group_id)
        if group is None:
            if not create:
                raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
            group = shard.groups[group_id] = Group(group_id, self._now())
        return partition, shard, group

    # -- membership --------------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None,
                   client_id: str, session_timeout_ms: int, rebalance_timeout_ms: int,
                   protocol_type: str, protocols: list[tuple[str, Any]]) -> Future[JoinResult]:
        cfg = self.config
        if not cfg.group_min_session_timeout_ms <= session_timeout_ms \
                <= cfg.group_max_session_timeout_ms:
            raise InvalidSessionTimeoutError(
                f"group {group_id!r}: session_timeout_ms {session_timeout_ms} is outside "
                f"[{cfg.group_min_session_timeout_ms}, {cfg.group_max_session_timeout_ms}]")
        self._ensure_loaded(group_id)
        with self._lock:
            partition, shard, group = self._group(group_id, create=True)
            future = group.join(member_id, group_instance_id, client_id, session_timeout_ms,
                                max(rebalance_timeout_ms, session_timeout_ms), protocol_type,
                                protocols, self._now(), cfg.group_initial_rebalance_delay_ms)
            self._persist_generation(partition, shard, group)
            return future

    def sync_group(self, group_id: str, member_id: str, generation_id: int,
                   assignments: dict[str, dict[str, Any]] | None) -> Future[dict[str, Any]]:
        self._ensure_loaded(group_id)
        with self._lock:
            _, _, group = self._group(group_id)
            return group.sync(member_id, generation_id, assignments)

    def heartbeat(self, group_id: str, member_id: str, generation_id: int) -> None:
        self._ensure_loaded(group_id)
        with self._lock:
            _, _, group = self._group(group_id)
            group.heartbeat(member_id, generation_id, self._now())

    def leave_group(self, group_id: str, member_id: str, group_instance_id: str | None
                    ) -> None:
        self._ensure_loaded(group_id)
        with self._lock:
            partition, shard, group = self._group(group_id)
            group.leave(member_id, group_instance_id, self._now())
            self._persist_generation(partition, shard, group)

    def _persist_generation(self, partition: int, shard: _Shard, group: Group) -> None:
        if shard.persisted.get(group.group_id) == group.generation_id:
            return
        record = GroupRecord(group.protocol_type or "", group.generation_id, group.protocol,
                             group.leader_id)
        self._log.append(partition, encode_batch(
            [(group_key(group.group_id), record.encode())], self._now()))
        shard.persisted[group.group_id] = group.generation_id

    # -- offsets -----------------------------------------------------------------------------

    def offset_commit(self, group_id: str, member_id: str, generation_id: int,
                      entries: list[CommitEntry]) -> dict[TopicPartition, ApiError | None]:
        """Commit what is valid; one error per partition (the whole request fails only when
        the member or generation is wrong)."""
        self._ensure_loaded(group_id)
        with self._lock:
            partition, shard, group = self._group(group_id, create=True)
            now = self._now()
            member = group.check_commit(member_id, generation_id, now)
            owned = member.owned() if member is not None else None
            errors: dict[TopicPartition, ApiError | None] = {}
            rows = []
            for e in entries:
                errors[e.tp] = self._commit_error(group, e, owned, generation_id)
                if errors[e.tp] is None:
                    rows.append((e, OffsetAndMetadata(e.offset, e.metadata, now)))
            if rows:
                self._log.append(partition, encode_batch(
                    [(offset_key(group_id, e.tp), offset_value(om)) for e, om in rows], now))
                committed = shard.offsets.setdefault(group_id, {})
                committed.update((e.tp, om) for e, om in rows)
            return errors

    def _commit_error(self, group: Group, e: CommitEntry, owned: set[TopicPartition] | None,
                      generation_id: int) -> ApiError | None:
        if e.offset < 0:
            return OffsetOutOfRangeError(f"group {group.group_id}: {e.tp}: a committed offset "
                                         f"must be >= 0, got {e.offset}")
        if len(e.metadata.encode()) > self.config.offset_metadata_max_bytes:
            return InvalidCommitOffsetSizeError(
                f"group {group.group_id}: {e.tp}: metadata is longer than "
                f"{self.config.offset_metadata_max_bytes} bytes")
        if owned is not None and group.protocol_type == "consumer" and e.tp not in owned:
            return IllegalGenerationError(
                f"group {group.group_id}: {e.tp} is not assigned to this member in "
                f"generation {generation_id}")
        return None

    def offset_fetch(self, group_id: str, tps: list[TopicPartition] | None
                     ) -> dict[TopicPartition, OffsetAndMetadata]:
        self._ensure_loaded(group_id)
        with self._lock:
            _, shard = self._shard_of(group_id)
            committed = shard.offsets.get(group_id, {})
            if tps is None:
                return dict(committed)
            return {tp: committed[tp] for tp in tps if tp in committed}

    # -- admin -------------------------------------------------------------------------------

    def list_groups(self) -> list[dict[str, Any]]:
        with self._lock:
            out = []
            for partition, shard in list(self._shards.items()):
                if self._log.leader_epoch(partition) != shard.leader_epoch:
                    continue
                out.extend({"group_id": g.group_id, "state": g.state.value,
                            "protocol_type": g.protocol_type or ""}
                           for g in shard.groups.values())
            return out

    def describe_group(self, group_id: str) -> dict[str, Any]:
        self._ensure_loaded(group_id)
        with self._lock:
            return self._group(group_id)[2].describe()

    def delete_group(self, group_id: str) -> None:
        self._ensure_loaded(group_id)
        with self._lock:
            partition, shard, group = self._group(group_id)
            if group.members:
                raise NonEmptyGroupError(f"group {group_id!r} has {len(group.members)} "
                                         "active member(s); it can only be deleted when empty")
            self._delete(partition, shard, group_id, list(shard.offsets.get(group_id, {})))

    def _delete(self, partition: int, shard: _Shard, group_id: str,
                tps: list[TopicPartition]) -> None:
        """Tombstones for ``tps`` and, when no offsets remain, for the group itself."""
        remaining = set(shard.offsets.get(group_id, {})) - set(tps)
        rows: list[tuple[bytes, bytes | None]] = [(offset_key(group_id, tp), None) for tp in tps]
        if not remaining:
            rows.append((group_key(group_id), None))
        self._log.append(partition, encode_batch(rows, self._now()))
        for tp in tps:
            shard.offsets.get(group_id, {}).pop(tp, None)
        if not remaining:
            shard.offsets.pop(group_id, None)
            shard.groups.pop(group_id, None)
            shard.persisted.pop(group_id, None)
        log.info("group %s: deleted %d offset(s)%s", group_id, len(tps),
                 "" if remaining else " and the group")

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> None:
        """Expire sessions, complete due joins, expire offsets of long-empty groups."""
        with self._lock:
            now = self._now()
            for partition, shard in list(self._shards.items()):
                if self._log.leader_epoch(partition) != shard.leader_epoch:
                    self._unload(partition)
                    continue
                for group in list(shard.groups.values()):
                    try:
                        self._tick_group(partition, shard, group, now)
                    except ApiError as e:  # e.g. the partition lost leadership mid-write
                        log.warning("group %s: tick failed: %s", group.group_id, e)

    def _tick_group(self, partition: int, shard: _Shard, group: Group, now: int) -> None:
        expired = group.tick(now)
        if expired:
            log.info("group %s: session expired for %s", group.group_id, expired)
        self._persist_generation(partition, shard, group)
        retention = self.config.offsets_retention_minutes * MINUTE_MS
        if group.state != GroupState.EMPTY or now - group.empty_since_ms < retention:
            return
        old = [tp for tp, om in shard.offsets.get(group.group_id, {}).items()
               if now - om.commit_timestamp >= retention]
        if old or not shard.offsets.get(group.group_id):
            self._delete(partition, shard, group.group_id, old)
