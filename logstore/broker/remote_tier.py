"""A broker's tiered storage: the RemoteLogManager and the RemoteLogReader over its object
store, kept in step with the partitions this broker leads.

Owns: building the tiering services from the broker config and an ObjectStore (the composition
root opens the store, since only it may import the fsspec adapter); starting each led tiered
partition's task, again at each new leader epoch it learns (an ISR change bumps the epoch, and
the old task is fenced), and stopping it when leadership or tiering ends; the partition's log
start offset over both tiers; serving fetches below the local log start offset on the reader's
pool, waiting at most ``remote_fetch_max_wait_ms`` (the reads go on and fill the chunk cache
for the retry); time lookups in the remote tier; and, while this broker is the controller,
the periodic cleanup of deleted topics' remote segments. Must not: decide what to copy, read or
delete (``tiering/`` does), or touch the network.

read_committed: each segment's ``.txnindex`` is uploaded with it, and a read_committed fetch
of the remote tier answers the aborted transactions of its range from those entries
(``collect_aborted``), as a local read answers them from the local indexes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path

import pyarrow as pa

from logstore.clock import Clock
from logstore.config import BrokerConfig, TopicConfig
from logstore.controller.store import MetadataStore
from logstore.errors import ApiError, UnknownServerError
from logstore.model import TopicPartition
from logstore.replication.partition import Partition
from logstore.segments.reads import search_batch
from logstore.segments.txn_index import TxnIndexEntry
from logstore.tiering.log_view import LogTierView
from logstore.tiering.metadata import RemoteLogSegmentMetadata
from logstore.tiering.remote_cache import ChunkCache, RemoteIndexCache
from logstore.tiering.remote_reader import RemoteFetchRequest, RemoteFetchResult, RemoteLogReader
from logstore.tiering.store import ObjectStore
from logstore.tiering.tier_manager import RemoteLogManager, RemoteLogManagerConfig, TierStats

log = logging.getLogger(__name__)

INDEX_CACHE_DIR = "remote-log-index-cache"  # in the first log dir; not a partition directory
CLEANUP_MIN_INTERVAL_S = 1.0
TIME_LOOKUP_READ_BYTES = 4 * 1024 * 1024

# A remote read's outcome: its batches, the error it raised, or None when it did not finish
# within remote_fetch_max_wait_ms.
RemoteOutcome = RemoteFetchResult | ApiError | None


class RemoteTier:
    """Tiered storage of one broker (see the module docstring)."""

    def __init__(self, config: BrokerConfig, store: ObjectStore, metadata: MetadataStore,
                 clock: Clock) -> None:
        self.config = config
        self.store = store
        self._metadata = metadata
        self.manager = RemoteLogManager(store, metadata, clock,
                                        RemoteLogManagerConfig.of(config))
        cache_dir = Path(config.log_dirs[0]) / INDEX_CACHE_DIR
        self.reader = RemoteLogReader(
            store, self.manager,
            RemoteIndexCache(cache_dir, config.remote_log_index_cache_bytes, store),
            ChunkCache(config.remote_fetch_cache_bytes, config.remote_fetch_chunk_bytes),
            config.remote_log_reader_threads,
            read_ahead=True)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._cleaner: threading.Thread | None = None

    def start(self) -> None:
        self.manager.start()
        self._cleaner = threading.Thread(target=self._clean_deleted_topics,
                                         name="remote-tier-cleanup", daemon=True)
        self._cleaner.start()

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        if self._cleaner is not None:
            self._cleaner.join(30)
        self.manager.close()
        self.reader.close()

    # -- leadership ----------------------------------------------------------------------------

    def sync(self, partition: Partition, config: TopicConfig, topic_id: str,
             topic_config: Callable[[], TopicConfig]) -> None:
        """Run the partition's tiering task when this broker leads it and the topic is tiered,
        at the partition's leader epoch (restarted when that changed); stop it otherwise.
        ``topic_config`` gives the topic's whole config (the Log's lacks total retention)."""
        tp = partition.tp
        running = self.manager.leader_epoch(tp)
        if partition.is_leader and config.remote_storage_enable:
            if running != partition.leader_epoch:
                log_ = partition.log
                view = LogTierView(log_, lambda: [
                    (e.epoch, e.start_offset) for e in partition.epochs.entries],
                    last_stable_offset=lambda: log_.last_stable_offset, config=topic_config)
                self.manager.on_become_leader(view, topic_id, partition.leader_epoch)
                log.info("%s: tiering at leader epoch %d", tp, partition.leader_epoch)
        elif running is not None:
            self.manager.on_stop_leading(tp)

    def stop_partition(self, tp: TopicPartition) -> None:
        self.manager.on_stop_leading(tp)

    def on_metadata_change(self) -> None:
        self._wake.set()

    # -- reads ---------------------------------------------------------------------------------

    def is_tiered(self, tp: TopicPartition) -> bool:
        """Whether this broker runs the partition's tiering task (it leads a tiered topic)."""
        return self.manager.leader_epoch(tp) is not None

    def log_start_offset(self, tp: TopicPartition) -> int | None:
        return self.manager.log_start_offset(tp)

    def stats(self, tp: TopicPartition) -> TierStats | None:
        return self.manager.stats(tp)

    def segments(self, tp: TopicPartition, start: int, end: int
                 ) -> list[RemoteLogSegmentMetadata]:
        """The readable segments holding offsets of ``[start, end)``, by base offset."""
        return [m for m in self.manager.remote_segments(tp)
                if m.base_offset < end and m.next_offset > start]

    def collect_aborted(self, tp: TopicPartition, start: int, end: int
                        ) -> tuple[list[TxnIndexEntry], bool]:
        """The aborted transactions of ``[start, end)`` the remote tier's indexes hold, and
        whether they are all of them (see ``RemoteLogReader.collect_aborted``)."""
        return self.reader.collect_aborted(tp, start, end)

    def read(self, requests: list[RemoteFetchRequest],
             on_late: Callable[[TopicPartition], None] | None = None) -> list[RemoteOutcome]:
        """Read ``requests`` concurrently on the reader's pool, each outcome in order: None for
        a read still running after ``remote_fetch_max_wait_ms``, which goes on filling the
        chunk cache and calls ``on_late(tp)`` when it ends (the caller's cue to read again)."""
        futures = self.reader.read_many(requests)
        done, _ = wait(futures, timeout=self.config.remote_fetch_max_wait_ms / 1000.0)
        out: list[RemoteOutcome] = []
        for request, future in zip(requests, futures, strict=True):
            if future not in done:
                log.debug("%s: remote read at %d still running after %d ms", request.tp,
                          request.offset, self.config.remote_fetch_max_wait_ms)
                if on_late is not None:
                    future.add_done_callback(_calling(on_late, request.tp))
                out.append(None)
                continue
            try:
                out.append(future.result())
            except ApiError as e:
                out.append(e)
            except Exception as e:  # boundary: one broken read fails its partition only
                log.exception("%s: remote read at offset %d failed", request.tp, request.offset)
                out.append(UnknownServerError(f"{request.tp}: offset {request.offset}: "
                                              f"{type(e).__name__}: {e}"))
        return out

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int, schema: pa.Schema,
                        below: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record below offset ``below`` (the local log start
        offset) in the remote tier whose timestamp is >= ``timestamp_ms``; None if none is.
        Segments whose max timestamp is earlier are skipped without being read."""
        start = self.manager.log_start_offset(tp) or 0
        for segment in self.manager.remote_segments(tp):
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= start:
                continue
            found = self._search_segment(tp, segment, timestamp_ms, schema,
                                         max(start, segment.base_offset), below)
            if found is not None:
                return found
            start = max(start, segment.next_offset)
        return None

    def _search_segment(self, tp: TopicPartition, segment: RemoteLogSegmentMetadata,
                        timestamp_ms: int, schema: pa.Schema, offset: int, below: int
                        ) -> tuple[int, int] | None:
        end = min(segment.next_offset, below)
        while offset < end:  # bounded: every read moves past at least one batch
            result = self.reader.read(RemoteFetchRequest(tp, offset, TIME_LOOKUP_READ_BYTES,
                                                         max_offset=end))
            if not result.batches:
                return None
            for batch in result.batches:
                if batch.header.max_timestamp >= timestamp_ms:
                    found = search_batch(batch, timestamp_ms, offset, schema)
                    if found is not None:
                        return found
            offset = result.batches[-1].header.next_offset
        return None

    # -- deleted topics ------------------------------------------------------------------------

    def _clean_deleted_topics(self) -> None:
        """While this broker is the controller: delete the remote segments of topic ids that no
        longer exist, when the metadata changes and every task interval."""
        interval_s = self.config.remote_log_manager_task_interval_ms / 1000.0
        while not self._closing.is_set():
            self._wake.wait(interval_s)
            self._wake.clear()
            if self._closing.is_set():
                return
            try:
                if self._metadata.is_controller():
                    live = {r.topic_id for r in self._metadata.topics().values()}
                    deleted = self.manager.cleanup_deleted_topics(live)
                    if deleted:
                        log.info("deleted %d remote segment(s) of deleted topics", deleted)
            except Exception:  # boundary: a background loop logs and tries again later
                log.exception("cleanup of deleted topics' remote segments failed")
            self._closing.wait(CLEANUP_MIN_INTERVAL_S)


def _calling(on_late: Callable[[TopicPartition], None], tp: TopicPartition
             ) -> Callable[[Future[RemoteFetchResult]], None]:
    """A done-callback that tells ``on_late`` its read of ``tp`` ended (however it ended)."""
    return lambda _future: on_late(tp)
