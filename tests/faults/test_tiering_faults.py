"""Tiered storage under faults, on real brokers and a real S3 endpoint (moto's server on
127.0.0.1, reached through s3fs): the object store down for a while, a broker killed with
kill -9 in the middle of an upload, a leader killed while copying on a three-broker cluster
(real ZooKeeper), and remote objects corrupted or deleted behind the broker's back.

An upload is caught in the middle deterministically: the brokers reach S3 through a TCP proxy
(tests/tcp_proxy.py) that the test pauses, so the copy's COPY_SEGMENT_STARTED entry is written
and its upload hangs; the test waits for that entry, then kills the broker.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from logstore import Admin, Consumer, TopicPartition
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import MetadataStore
from logstore.errors import CorruptRecordError
from logstore.model import LATEST
from logstore.tiering.metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tests.brokers import BrokerFactory, BrokerProcess
from tests.faults.cluster import FAILOVER_ERRORS, Cluster
from tests.helpers import WAIT_S, wait_for
from tests.tcp_proxy import TcpProxy
from tests.tiered import (
    ROWS,
    SEGMENT_BYTES,
    create_tiered_topic,
    log_tiers,
    produce,
    remote_settings,
    value_batch,
    wait_tiered,
)

S = RemoteLogSegmentState
GRACE_MS = 3000


@pytest.fixture
def s3_proxy(moto_s3: Any) -> Iterator[TcpProxy]:
    proxy = TcpProxy(moto_s3.port).start()
    yield proxy
    proxy.close()


def _options(moto_s3: Any, endpoint_url: str | None = None) -> dict[str, Any]:
    options: dict[str, Any] = moto_s3.options()
    if endpoint_url is not None:
        options["endpoint_url"] = endpoint_url
    return options


def _read(bootstrap: str | list[str], tp: TopicPartition, start: int, end: int,
          timeout_s: float = 60) -> tuple[list[int], list[bytes]]:
    """Offsets and values of ``tp`` in ``[start, end)``, with a Consumer."""
    offsets: list[int] = []
    values: list[bytes] = []
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(offsets)} of {end - start} records"
            for table in consumer.poll_arrow(timeout_ms=300).values():
                offsets += table.column("offset").to_pylist()
                values += table.column("value").to_pylist()
    return offsets, values


def _expected_values(start: int, end: int) -> list[bytes]:
    values: list[bytes] = []
    for first in range(0, end, ROWS):
        values += value_batch(first).column("value").to_pylist()
    return values[start:end]


def _entries(store: MetadataStore, topic: str) -> list[RemoteLogSegmentMetadata]:
    topic_id = store.topics()[topic].topic_id
    return store.remote_log_segments(TopicIdPartition(topic, topic_id, 0))


def _embedded_entries(broker: BrokerProcess, topic: str) -> list[RemoteLogSegmentMetadata]:
    """The remote segment entries as an embedded broker's metadata file holds them now."""
    store = LocalMetadataStore(broker.log_dir / METADATA_FILE, -1)
    store.start()
    return _entries(store, topic)


def _stderr_count(broker: BrokerProcess, text: str) -> int:
    return broker.stderr_path.read_text().count(text)


def test_copies_wait_out_an_object_store_outage_and_the_copy_lag_drains(
        broker_factory: BrokerFactory, moto_s3: Any, s3_url: str) -> None:
    """Goal: while S3 is down, copies retry with backoff, nothing local is deleted, and
    produce and consume of local data go on; once S3 is back the copy lag drains to zero and
    every offset is read from the two tiers. Method: tier a topic; stop moto; produce more;
    wait for several failed attempts; the local log start has not moved; read the local
    range; start moto on the same port; wait for the lag to drain; read from offset 0."""
    broker = broker_factory(**remote_settings(s3_url, _options(moto_s3)))
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        tp = TopicPartition(topic, 0)
        middle = produce(broker.bootstrap, topic, 10)
        before = wait_tiered(admin, topic)
        moto_s3.stop()
        end = produce(broker.bootstrap, topic, 10, start=middle)  # local produce goes on
        failures = _stderr_count(broker, "tiering failed")
        wait_for(lambda: _stderr_count(broker, "tiering failed") >= failures + 3,
                 "three failed tiering attempts while S3 is down")
        during = log_tiers(admin, topic)
        assert during is not None and during.copy_lag_segments > 0
        assert during.local_log_start_offset == before.local_log_start_offset
        offsets, _ = _read(broker.bootstrap, tp, during.local_log_start_offset, end)
        assert offsets == list(range(during.local_log_start_offset, end))
        moto_s3.start()
        after = wait_tiered(admin, topic, condition=lambda t: t.copy_lag_segments == 0
                            and t.local_log_start_offset > middle)
    assert after.log_start_offset == 0
    offsets, values = _read(broker.bootstrap, tp, 0, end)
    assert offsets == list(range(end)) and values == _expected_values(0, end)


def test_a_broker_killed_mid_upload_leaves_no_readable_half_segment_and_resumes(
        broker_factory: BrokerFactory, moto_s3: Any, s3_url: str, s3_proxy: TcpProxy) -> None:
    """Goal: kill -9 during an upload leaves a COPY_SEGMENT_STARTED entry that no reader
    uses; after restart copying resumes, the dead copy's entry and objects go after the grace
    period, and every offset reads back once. Method: S3 behind a paused proxy, so the next
    copy hangs after its STARTED entry; kill -9 then; resume the proxy and restart."""
    broker = broker_factory(**remote_settings(
        s3_url, _options(moto_s3, s3_proxy.endpoint_url),
        remote_log_manager_orphan_grace_ms=GRACE_MS))
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        middle = produce(broker.bootstrap, topic, 6)
        wait_tiered(admin, topic)
    s3_proxy.pause()
    end = produce(broker.bootstrap, topic, 6, start=middle)
    started = wait_for(lambda: [m for m in _embedded_entries(broker, topic)
                                if m.state is S.COPY_SEGMENT_STARTED],
                       "a copy stuck in its upload")
    assert broker.kill(signal.SIGKILL) == -signal.SIGKILL
    s3_proxy.resume()
    broker.start()
    dead = {m.segment_id for m in started}
    with Admin(broker.bootstrap) as admin:
        wait_tiered(admin, topic, condition=lambda t: t.copy_lag_segments == 0
                    and t.local_log_start_offset >= middle + ROWS)
    wait_for(lambda: not any(m.segment_id in dead for m in _embedded_entries(broker, topic)),
             "the dead copy's entry cleaned after the grace period")
    store_keys = _s3_keys(moto_s3, s3_url, topic)
    assert not [k for k in store_keys if any(sid in k for sid in dead)]
    assert {m.state for m in _embedded_entries(broker, topic)} == {S.COPY_SEGMENT_FINISHED}
    offsets, values = _read(broker.bootstrap, TopicPartition(topic, 0), 0, end)
    assert offsets == list(range(end)) and values == _expected_values(0, end)


def _s3_keys(moto_s3: Any, s3_url: str, topic: str) -> list[str]:
    bucket, prefix = s3_url[len("s3://"):].split("/", 1)
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3.endpoint_url)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                         Prefix=f"{prefix}/{topic}-")
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_a_new_leader_resumes_copying_and_every_offset_is_read_once_from_both_tiers(
        broker_factory: BrokerFactory, zk_connect: str, moto_s3: Any, s3_url: str,
        s3_proxy: TcpProxy) -> None:
    """Goal: kill -9 of the leader while it copies: the new leader accepts what was copied,
    resumes copying, cleans the dead copy; the old leader comes back as a follower that
    restarts at the new leader's local log start (OFFSET_MOVED_TO_TIERED_STORAGE) and rejoins
    the ISR; every offset is read exactly once from the two tiers together. Method: three
    brokers on ZooKeeper, S3 behind a paused proxy while the leader's copy hangs."""
    from logstore.controller.zookeeper import KazooMetadataStore

    cluster = Cluster(broker_factory, zk_connect, **remote_settings(
        s3_url, _options(moto_s3, s3_proxy.endpoint_url),
        remote_log_manager_orphan_grace_ms=GRACE_MS))
    zk = KazooMetadataStore(zk_connect, 99, session_timeout_ms=6000)
    zk.start()
    try:
        topic = cluster.create_topic(rf=3, **_tiered_config(), min_insync_replicas=2)
        tp = TopicPartition(topic, 0)
        first = produce(cluster.live_bootstrap()[0], topic, 6)
        with cluster.admin() as admin:
            wait_tiered(admin, topic)
        s3_proxy.pause()
        second = produce(cluster.live_bootstrap()[0], topic, 6, start=first)
        wait_for(lambda: any(m.state is S.COPY_SEGMENT_STARTED for m in _entries(zk, topic)),
                 "the leader's copy stuck in its upload", tolerate=FAILOVER_ERRORS)
        old = cluster.leader(topic)
        old.kill(signal.SIGKILL)
        s3_proxy.resume()
        cluster.wait_for_new_leader(topic, old.broker_id)
        end = produce(cluster.live_bootstrap()[0], topic, 8, start=second)
        with cluster.admin() as admin:
            wait_tiered(admin, topic, condition=lambda t: t.copy_lag_segments == 0
                        and t.local_log_start_offset > second)
        old.start()
        cluster.wait_for_isr(topic, 0, 3)
        assert "restarted the log at the leader's local log start offset" in \
            old.stderr_path.read_text()
        wait_for(lambda: {m.state for m in _entries(zk, topic)} == {S.COPY_SEGMENT_FINISHED},
                 "only FINISHED entries left", tolerate=FAILOVER_ERRORS)
        with cluster.admin() as admin:
            assert admin.list_offsets({tp: LATEST}) == {tp: end}
        offsets, values = _read(cluster.live_bootstrap(), tp, 0, end)
        assert offsets == list(range(end)) and values == _expected_values(0, end)
    finally:
        zk.close()


def _tiered_config() -> dict[str, Any]:
    return {"remote_storage_enable": True, "segment_bytes": SEGMENT_BYTES,
            "local_retention_ms": 0, "retention_ms": -1}


def test_a_corrupt_or_deleted_remote_object_fails_the_consumer_naming_the_offset(
        broker_factory: BrokerFactory, moto_s3: Any, s3_url: str) -> None:
    """Goal: a bit flip in, or the deletion of, a remote segment object behind the broker's
    back is caught (CRC, missing object) and the consumer's read fails with an error naming
    topic, partition and offset; the records before it are returned, none after it skipped.
    Method: tier a topic; flip a bit in the second segment's object and delete the third's
    through the S3 API; consume from offset 0, then from the third segment."""
    broker = broker_factory(**remote_settings(s3_url, _options(moto_s3)))
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        produce(broker.bootstrap, topic, 12)
        wait_tiered(admin, topic)
    keys = sorted(k for k in _s3_keys(moto_s3, s3_url, topic) if k.endswith(".arrow"))
    second_base, third_base = (int(k.rsplit("/", 1)[1][:20]) for k in keys[1:3])
    bucket = s3_url[len("s3://"):].split("/", 1)[0]
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3.endpoint_url)
    data = bytearray(s3.get_object(Bucket=bucket, Key=keys[1])["Body"].read())
    data[len(data) // 2] ^= 0x10
    s3.put_object(Bucket=bucket, Key=keys[1], Body=bytes(data))
    s3.delete_object(Bucket=bucket, Key=keys[2])
    tp = TopicPartition(topic, 0)
    read: list[int] = []
    with pytest.raises(CorruptRecordError, match=rf"{topic}-0: offset \d+: .*CRC32C mismatch"
                       ) as caught, Consumer(broker.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        _poll_until_error(consumer, read)
    assert read == list(range(len(read))) and second_base <= len(read) < third_base
    assert str(second_base) in str(caught.value) or f"offset {len(read)}" in str(caught.value)
    with pytest.raises(CorruptRecordError, match=rf"{topic}-0: offset {third_base}: an object of"
                       r" .* is missing from the remote tier"), Consumer(broker.bootstrap) as c:
        c.assign([tp])
        c.seek(tp, third_base)
        _poll_until_error(c, [])


def _poll_until_error(consumer: Consumer, offsets: list[int]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for table in consumer.poll_arrow(timeout_ms=300).values():
            offsets += table.column("offset").to_pylist()
    raise AssertionError(f"no error after reading {len(offsets)} records")

