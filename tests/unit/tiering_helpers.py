"""Shared helpers of the tiering tests: a real Log in tmp_path with a leader-epoch cache, the
embedded metadata store, a file:// object store, and a RemoteLogManager over them, on a
FakeClock; plus ObjectStore wrappers that count bytes or fail on cue (at the seam only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import PartitionState, TopicRecord
from logstore.model import TopicPartition
from logstore.records import DEFAULT_SCHEMA
from logstore.segments.log import Log
from logstore.tiering.fsspec_store import FsspecObjectStore
from logstore.tiering.log_view import LogTierView
from logstore.tiering.metadata import TopicIdPartition
from logstore.tiering.store import ObjectInfo, ObjectStore, RemoteStorageError
from logstore.tiering.tier_manager import RemoteLogManager, RemoteLogManagerConfig
from tests.unit.segment_helpers import keyed

TOPIC_ID = "c0ffee" + "0" * 26
TP = TopicPartition("orders", 0)
TIP = TopicIdPartition("orders", TOPIC_ID, 0)


class CountingStore:
    """Delegates to a real store and counts the bytes read through it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.bytes_read = 0
        self.reads = 0
        self.keys_read: list[str] = []

    @property
    def url(self) -> str:
        return self.inner.url

    def put_file(self, key: str, path: Path) -> int:
        return self.inner.put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(key, data)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self.inner.read_range(key, start, length)
        self.bytes_read += len(data)
        self.reads += 1
        self.keys_read.append(key)
        return data

    def read_object(self, key: str) -> bytes:
        data = self.inner.read_object(key)
        self.bytes_read += len(data)
        self.reads += 1
        self.keys_read.append(key)
        return data

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)


class FailingStore(CountingStore):
    """Raises RemoteStorageError from ``put_file``/``put_bytes`` while ``fail_put`` says so
    for the key (called before the write), as an unreachable store would."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.fail_put: Callable[[str], bool] = lambda key: False

    def put_file(self, key: str, path: Path) -> int:
        if self.fail_put(key):
            raise RemoteStorageError(f"{self.url}/{key}: upload failed: injected")
        return super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.fail_put(key):
            raise RemoteStorageError(f"{self.url}/{key}: upload failed: injected")
        super().put_bytes(key, data)


@dataclass
class Tiered:
    """A tiered partition ``orders-0`` led by broker 1."""

    root: Path
    clock: FakeClock
    log: Log
    meta: LocalMetadataStore
    store: Any
    rlm: RemoteLogManager
    epochs: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])

    @property
    def view(self) -> LogTierView:
        return LogTierView(self.log, lambda: self.epochs)

    def produce_segments(self, count: int, records: int = 10, epoch: int = 0,
                         committed: bool = True) -> None:
        """Append ``count`` segments of one batch each and seal them; the HW follows when
        ``committed``."""
        for _ in range(count):
            self.log.append_as_leader(keyed(self.log.log_end_offset, records, self.clock),
                                      leader_epoch=epoch)
            self.log.roll()
        if committed:
            self.log.update_high_watermark(self.log.log_end_offset)

    def lead(self, epoch: int = 0) -> None:
        self.rlm.on_become_leader(self.view, TOPIC_ID, epoch)

    def set_leader_epoch(self, epoch: int) -> None:
        assert self.meta.set_partition_state("orders", 0, PartitionState(1, epoch, (1,)))

    def objects(self) -> list[str]:
        return [i.key for i in self.store.list(f"orders-{TOPIC_ID}/")]


def tiered(tmp_path: Path, store: Callable[[ObjectStore], Any] | None = None,
           schema: pa.Schema = DEFAULT_SCHEMA, rlm_config: RemoteLogManagerConfig | None = None,
           **topic_config: Any) -> Tiered:
    # Object stores stamp objects with the real time; orphan ages compare that with the clock.
    clock = FakeClock(int(time.time() * 1000))
    config = TopicConfig(remote_storage_enable=True, retention_ms=None, **topic_config)
    log = Log.open(tmp_path / "data" / "orders-0", "orders", 0, config, schema, clock)
    meta = LocalMetadataStore(tmp_path / METADATA_FILE, 1)
    meta.start()
    meta.create_topic(TopicRecord("orders", {0: (1,)}, topic_id=TOPIC_ID),
                      {0: PartitionState(1, 0, (1,))})
    inner = FsspecObjectStore(f"file://{tmp_path}/remote")
    wrapped = inner if store is None else store(inner)
    rlm = RemoteLogManager(wrapped, meta, clock, rlm_config or RemoteLogManagerConfig(
        task_interval_ms=1000, orphan_grace_ms=60_000, broker_id=1))
    return Tiered(tmp_path, clock, log, meta, wrapped, rlm)
