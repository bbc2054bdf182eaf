"""Helpers for tests of tiered topics on real brokers: broker settings for a remote store,
tiered topics with small segments, producing whole segments, and bounded waits on what the
leader reports about its two tiers (``describe_log_tiers``).

Owns: nothing but these helpers. Must not: start servers (tests/brokers.py, tests/moto_s3.py
do) or mock anything we own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from logstore import Admin, NewTopic
from logstore.client.admin import LogTierDescription
from logstore.errors import ApiError
from tests.brokers import bounded_producer
from tests.helpers import WAIT_S, wait_for

SEGMENT_BYTES = 64 * 1024
ROWS = 200  # per produced batch
VALUE_BYTES = 100
FAST_TIERING = {"remote_log_manager_task_interval_ms": 200,
                "remote_log_manager_task_retry_backoff_ms": 100,
                "remote_log_manager_task_retry_backoff_max_ms": 1000}


def remote_settings(url: str, options: dict[str, Any] | None = None, **more: Any
                    ) -> dict[str, Any]:
    """Broker settings for tiering to ``url`` (credentials stay in the environment)."""
    settings: dict[str, Any] = {"remote_storage_uri": url, **FAST_TIERING, **more}
    if options:
        settings["remote_storage_options"] = options
    return settings


def create_tiered_topic(admin: Admin, partitions: int = 1, replication_factor: int = 1,
                        value_schema: pa.Schema | None = None, **config: Any) -> str:
    """A tiered topic with small segments whose sealed segments leave the local tier as soon
    as they are copied (local_retention_ms 0), unless ``config`` says otherwise."""
    name = f"tier-{uuid.uuid4().hex[:8]}"
    settings = {"remote_storage_enable": True, "segment_bytes": SEGMENT_BYTES,
                "local_retention_ms": 0, "retention_ms": -1, **config}
    admin.create_topics([NewTopic(name, partitions, replication_factor, config=settings,
                                  value_schema=value_schema)])
    return name


def value_batch(start: int, rows: int = ROWS) -> pa.RecordBatch:
    """Keys ``k<i>`` and values that name their record (``v<i>`` padded to VALUE_BYTES)."""
    keys = [b"k%d" % i for i in range(start, start + rows)]
    values = [(b"v%d-" % i).ljust(VALUE_BYTES, b"x") for i in range(start, start + rows)]
    return pa.record_batch([pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                           names=["key", "value"])


def typed_batch(schema: pa.Schema, start: int, rows: int = ROWS) -> pa.RecordBatch:
    """Rows of a typed topic with float64 columns: column j of record i holds i * 100 + j."""
    base = np.arange(start, start + rows, dtype=np.float64) * 100
    columns = [pa.array(base + j) for j in range(len(schema))]
    return pa.record_batch([pa.array([b"k%d" % i for i in range(start, start + rows)]),
                            *columns], names=["key", *schema.names])


def produce(bootstrap: str, topic: str, batches: int, partition: int = 0, start: int = 0,
            make: Callable[[int, int], pa.RecordBatch] = value_batch, rows: int = ROWS
            ) -> int:
    """Produce ``batches`` batches of ``rows`` (acks=all) to one partition, ``make(start,
    rows)`` each; returns the next record index."""
    with bounded_producer(bootstrap, acks=-1, linger_ms=0) as producer:
        futures = [producer.send_batch(topic, make(start + i * rows, rows), partition=partition)
                   for i in range(batches)]
        producer.flush(60)
        for f in futures:
            f.result(timeout=60)
    return start + batches * rows


def float_schema(columns: int) -> pa.Schema:
    return pa.schema([pa.field(f"c{j}", pa.float64()) for j in range(columns)])


def log_tiers(admin: Admin, topic: str, partition: int = 0) -> LogTierDescription | None:
    described = admin.describe_topics([topic], include_log_tiers=True)[0]
    return next(p.log_tiers for p in described.partitions if p.partition == partition)


def wait_tiered(admin: Admin, topic: str, partition: int = 0,
                condition: Callable[[LogTierDescription], bool] | None = None,
                timeout_s: float = WAIT_S) -> LogTierDescription:
    """The partition's tiers once every sealed segment is copied and the local log start
    offset has moved (or ``condition`` holds)."""
    def ready(t: LogTierDescription) -> bool:
        return t.copy_lag_segments == 0 and t.local_log_start_offset > 0

    check = condition or ready
    return wait_for(lambda: (t := log_tiers(admin, topic, partition)) is not None and check(t)
                    and t, f"{topic}-{partition} tiered", timeout_s, (ApiError, OSError))
