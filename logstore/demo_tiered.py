"""The tiered part of ``logstore demo``: a remote store for the demo broker, and the phases of
a tiered topic whose older records live only in object storage.

The store is S3 served by moto on 127.0.0.1 (``make demo`` installs moto with the test extra;
its dummy credentials are set in this process's environment, where s3fs and Spark's executors
find them), or a ``file://`` directory when moto is not installed. The topic has 1 MiB
segments and ``local_retention_ms = 0``: each sealed segment leaves the local disk once it is
copied. The phases: producing it, waiting until every sealed segment is copied and gone
locally (its row is the copy), and reading the remote-only range back with a Consumer (through
the broker's remote reads) and with each tier step (Spark, from S3 itself).

Owns: those phases and the store. Must not: import jobs/, datasource/ or pyspark (steps come
in as ``DemoStep``s), or boto3/s3fs (the tiering adapter reaches S3).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from logstore.demo import DemoStep, Phase, _bar, _batch, _payload_bytes

TIERED_TOPIC = "demo-tiered"
TIERED_PARTITIONS = 2
TIERED_SEGMENT_BYTES = 1024 * 1024
TIERED_MIN_RECORDS = 40_000  # a few sealed 1 MiB segments per partition
TIER_WAIT_S = 120.0
POLL_S = 0.1
BATCH_ROWS = 10_000
# moto accepts any credentials; these are set only where none are (never logged).
DEMO_S3_ENV = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo",
               "AWS_DEFAULT_REGION": "us-west-2", "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass(frozen=True)
class RemoteStore:
    url: str
    describe: str
    options: dict[str, Any] = field(default_factory=dict)


@contextmanager
def remote_store(data_dir: str, enabled: bool = True) -> Iterator[RemoteStore | None]:
    """The demo broker's remote store (None when tiering is off): moto's S3 on 127.0.0.1
    when moto is installed, else a directory under ``data_dir``."""
    if not enabled:
        yield None
        return
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield RemoteStore(f"file://{data_dir}/remote-tier", "a file:// directory (install "
                          "moto for an S3 endpoint)")
        return
    for name, value in DEMO_S3_ENV.items():
        os.environ.setdefault(name, value)
    # moto's HTTP server logs every request at INFO (hundreds of lines over the demo's table)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        store = RemoteStore("s3://logstore-demo/tier", f"S3 (moto) at {endpoint}",
                            {"endpoint_url": endpoint,
                             # not us-east-1: S3 refuses it as a bucket's location constraint
                             "client_kwargs": {"region_name": "us-west-2"}})
        from logstore.tiering.fsspec_store import FsspecObjectStore

        FsspecObjectStore(store.url, store.options).ensure_root()  # the bucket
        yield store
    finally:
        server.stop()


def run_tiered(bootstrap: str, records: int, steps: Sequence[DemoStep], out: IO[str]
               ) -> tuple[list[Phase], list[tuple[Phase, int]]]:
    """(phases, (checked phase, records it must read)) of the tiered topic."""
    from logstore import Admin, NewTopic

    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(TIERED_TOPIC, TIERED_PARTITIONS, config={
            "remote_storage_enable": True, "segment_bytes": TIERED_SEGMENT_BYTES,
            "local_retention_ms": 0, "retention_ms": -1})])
        produced, payload = _produce(bootstrap, records)
        began = time.perf_counter()
        starts = _wait_tiered(admin)
        seconds = time.perf_counter() - began
    remote = sum(starts.values())
    remote_payload = payload * remote // max(produced.records, 1)
    copy = Phase("copy to object storage", remote, remote_payload, seconds)
    checked = [(_consume_remote(bootstrap, starts), remote)]
    checked += [(step.run(bootstrap, TIERED_TOPIC, remote, out), remote) for step in steps]
    return [produced, copy], checked


def _produce(bootstrap: str, records: int) -> tuple[Phase, int]:
    from logstore import Producer

    rng = np.random.default_rng(2)
    batches = [_batch(rng, start, min(BATCH_ROWS, records - start))
               for start in range(0, records, BATCH_ROWS)]
    payload = sum(_payload_bytes(b) for b in batches)
    with _bar(records, "produce tiered topic") as bar, Producer(
            bootstrap_servers=bootstrap, acks=1, linger_ms=5) as producer:
        began = time.perf_counter()
        futures = []
        for batch in batches:
            futures.append(producer.send_batch(TIERED_TOPIC, batch))
            bar.update(batch.num_rows)
        for future in futures:
            future.result(timeout=60)
        seconds = time.perf_counter() - began
    return Phase("produce tiered topic", records, payload, seconds), payload


def _wait_tiered(admin: Any) -> dict[int, int]:
    """Each partition's local log start offset once every sealed segment is copied and gone
    from the local disk (everything below it is in the remote tier only)."""
    deadline = time.monotonic() + TIER_WAIT_S
    while time.monotonic() < deadline:
        parts = admin.describe_topics([TIERED_TOPIC], include_log_tiers=True)[0].partitions
        tiers = [p.log_tiers for p in parts]
        if all(t is not None and t.copy_lag_segments == 0 and t.local_log_start_offset > 0
               for t in tiers):
            return {p.partition: p.log_tiers.local_log_start_offset for p in parts}
        time.sleep(POLL_S)  # the copy runs in the broker: there is nothing to block on
    raise RuntimeError(f"{TIERED_TOPIC} was not tiered within {TIER_WAIT_S:.0f} s")


def _consume_remote(bootstrap: str, ends: dict[int, int]) -> Phase:
    """Every partition from offset 0 up to its local log start offset: the broker serves all
    of it from the remote tier."""
    from logstore import Consumer, TopicPartition

    tps = [TopicPartition(TIERED_TOPIC, p) for p in ends]
    count = payload = 0
    with _bar(sum(ends.values()), "consume remote tier") as bar, Consumer(
            bootstrap_servers=bootstrap) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        began = time.perf_counter()
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            if time.perf_counter() - began > TIER_WAIT_S:
                break
            for tp, table in consumer.poll_arrow(timeout_ms=500).items():
                table = table.filter(np.asarray(table.column("offset")) < ends[tp.partition])
                count += table.num_rows
                payload += _payload_bytes(table)
                bar.update(table.num_rows)
        seconds = time.perf_counter() - began
    return Phase("consume remote tier", count, payload, seconds)
