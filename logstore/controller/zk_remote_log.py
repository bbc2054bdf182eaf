"""Remote log segment metadata in ZooKeeper (``/remote_log_segments``, ``zk_paths.py``).

Owns: listing a partition's entries and the partitions that have any, and writing an entry in
one transaction that checks the versions of the topic and partition-state znodes it was fenced
against (leader-epoch fencing, ``store.remote_write_fence``), retried from the reads when one
changed meanwhile; removing the entry directories of a partition and topic once empty. Entries
are not cached: a new leader reads its partition's once. Must not: decide which state
transitions are allowed (``tiering/metadata.py``'s ``check_transition``), or let kazoo
exceptions out.
"""

from __future__ import annotations

import contextlib

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from logstore.controller import zk_paths as zp
from logstore.controller.store import remote_write_fence
from logstore.controller.zk_session import MAX_CAS_ATTEMPTS, ZkSession
from logstore.errors import RequestTimedOutError
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    check_transition,
    parse_topic_dir,
)


class ZkRemoteLog:
    """The remote log segment entries on the store's session."""

    def __init__(self, zk: ZkSession) -> None:
        self._zk = zk

    def segments(self, partition: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        try:
            children = self._zk.children(zp.remote_partition_path(partition))
        except NoNodeError:
            return []
        found = (self._zk.get_or_none(zp.remote_segment_path(partition, c)) for c in children)
        entries = [zp.decode_remote_segment(f[0]) for f in found if f is not None]
        return sorted(entries, key=lambda m: (m.base_offset, m.segment_id))

    def partitions(self) -> list[TopicIdPartition]:
        out: list[TopicIdPartition] = []
        for topic_dir in self._zk.children(zp.REMOTE_LOG_SEGMENTS):
            parsed = parse_topic_dir(topic_dir)
            with contextlib.suppress(NoNodeError):
                if parsed is not None:
                    out += [TopicIdPartition(parsed[0], parsed[1], int(p))
                            for p in self._zk.children(zp.remote_topic_path(topic_dir))]
        return sorted(out)

    def put(self, metadata: RemoteLogSegmentMetadata, leader_epoch: int | None) -> None:
        """One transaction: the fence's version checks plus the entry's create, compare-and-set
        or delete; retried from the reads when a checked znode changed meanwhile."""
        tp, what = metadata.partition, f"write {metadata.describe()}"
        path = zp.remote_segment_path(tp, metadata.segment_id)
        finished = metadata.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
        for _ in range(MAX_CAS_ATTEMPTS):
            checks = self._remote_fence(tp, leader_epoch)
            found = self._zk.get_or_none(path)
            if not check_transition(None if found is None else
                                    zp.decode_remote_segment(found[0]), metadata):
                return
            if found is None:
                self._zk.op(f"create {tp.topic_dir}", self._zk.client.ensure_path_async,
                            zp.remote_partition_path(tp))
            tx = self._zk.transaction()
            for checked, version in checks:
                tx.check(checked, version)
            data = zp.encode_remote_segment(metadata)
            if found is None:
                tx.create(path, data)
            elif finished:
                tx.delete(path, version=found[1].version)
            else:
                tx.set_data(path, data, version=found[1].version)
            error = self._zk.commit(tx, what)
            if error is None:
                if finished:
                    self._prune_remote_dirs(tp)
                return
            if not isinstance(error, BadVersionError | NoNodeError | NodeExistsError):
                raise self._zk.unexpected(error, what)
        raise RequestTimedOutError(f"{metadata.describe()}: write lost {MAX_CAS_ATTEMPTS} races")

    def _remote_fence(self, tp: TopicIdPartition, leader_epoch: int | None
                      ) -> list[tuple[str, int]]:
        """The (path, version) pairs the write's transaction checks; raises the fencing error
        (store.remote_write_fence) if the write may not happen at all. A deleted topic's id
        never comes back, so its cleanup needs no check."""
        topic = self._zk.get_or_none(zp.topic_path(tp.topic))
        record = None if topic is None else zp.decode_topic(topic[0])
        state_path = zp.partition_state_path(tp.topic, tp.partition)
        state = None
        if leader_epoch is not None and record is not None:
            state = self._zk.get_or_none(state_path)
        fenced = remote_write_fence(tp, leader_epoch, record,
                                    None if state is None else
                                    zp.decode_partition_state(state[0]))
        if fenced is not None:
            raise fenced
        if topic is None or state is None:
            return []
        return [(zp.topic_path(tp.topic), topic[1].version), (state_path, state[1].version)]

    def _prune_remote_dirs(self, tp: TopicIdPartition) -> None:
        """Remove the partition's and topic's entry directories once empty, so the metadata
        does not grow with deleted topics (a writer racing with this retries its create)."""
        for path in (zp.remote_partition_path(tp), zp.remote_topic_path(tp.topic_dir)):
            try:
                self._zk.op(f"delete {path}", self._zk.client.delete_async, path)
            except (NotEmptyError, NoNodeError):
                return
