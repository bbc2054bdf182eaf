"""spark.read.format("logstore") of tiered topics: executors read remote segments straight
from S3 (moto's server on 127.0.0.1), never through a broker; projected reads fetch only the
projected columns' buffers; a missing or corrupt remote object is data loss.

One broker process for the module, tiering to a fresh bucket; each test has its own topics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from logstore import Admin, TopicPartition
from logstore.client.admin import LogTierDescription
from logstore.messages.log import BrokerStatsRequest
from logstore.messages.tiering import ListRemoteSegmentsRequest, RemoteSegmentsRange
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, BrokerProcess
from tests.spark.helpers import consumer_rows, read, spark_rows
from tests.tiered import (
    ROWS,
    create_tiered_topic,
    float_schema,
    produce,
    remote_settings,
    typed_batch,
    wait_tiered,
)


@pytest.fixture(scope="module")
def bucket_url(moto_s3: Any) -> str:
    return f"s3://{moto_s3.create_bucket()}/logstore"


@pytest.fixture(scope="module")
def tier_broker(tmp_path_factory: pytest.TempPathFactory, moto_s3: Any,
                bucket_url: str) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("tiered-broker"))
    yield factory(**remote_settings(bucket_url, moto_s3.options()))
    factory.stop_all()


def _tiered_topic(broker: BrokerProcess, partitions: int = 2, batches: int = 12,
                  rows: int = ROWS, **kwargs: Any
                  ) -> tuple[str, dict[TopicPartition, LogTierDescription]]:
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin, partitions=partitions, **kwargs)
        schema = kwargs.get("value_schema")
        for p in range(partitions):
            if schema is None:
                produce(broker.bootstrap, topic, batches, partition=p, rows=rows)
            else:
                produce(broker.bootstrap, topic, batches, partition=p, rows=rows,
                        make=lambda start, n: typed_batch(schema, start, n))
        tiers = {TopicPartition(topic, p): wait_tiered(admin, topic, p)
                 for p in range(partitions)}
    return topic, tiers


def _fetched_bytes(broker: BrokerProcess) -> int:
    """Bytes the broker's fetches served so far (a consumer closed at the end of the log may
    leave an empty long poll to finish later: bytes, not requests, are compared)."""
    conn = BrokerConnection(broker.bootstrap)
    try:
        return conn.call(BrokerStatsRequest()).fetch_bytes
    finally:
        conn.close()


def _ending(tiers: dict[TopicPartition, LogTierDescription]) -> str:
    """endingOffsets JSON at each partition's local log start (what S3 alone holds)."""
    out: dict[str, dict[str, int]] = {}
    for tp, t in tiers.items():
        out.setdefault(tp.topic, {})[str(tp.partition)] = t.local_log_start_offset
    return json.dumps(out)


def test_remote_mode_reads_the_copied_range_from_object_storage_only(
        spark: Any, tier_broker: BrokerProcess, moto_s3: Any) -> None:
    """Goal: readMode=remote reads every record of the copied range from S3 and none through
    the broker. Method: two tiered partitions; read up to their local log start offsets; the
    rows equal the Consumer's; the broker served no fetch meanwhile; S3 sent the bytes."""
    topic, tiers = _tiered_topic(tier_broker)
    expected = [r for r in consumer_rows(tier_broker.bootstrap, topic)
                if r[1] < tiers[TopicPartition(topic, r[0])].local_log_start_offset]
    fetches, sent = _fetched_bytes(tier_broker), moto_s3.bytes_sent
    df = read(spark, tier_broker.bootstrap, subscribe=topic, readMode="remote",
              endingOffsets=_ending(tiers))
    assert spark_rows(df) == expected
    assert _fetched_bytes(tier_broker) == fetches
    assert moto_s3.bytes_sent - sent >= sum(t.remote_bytes for t in tiers.values())


def test_auto_mode_reads_below_the_local_log_start_from_object_storage(
        spark: Any, tier_broker: BrokerProcess) -> None:
    """Goal: the default readMode reads the remote range from S3 and the rest from the local
    files, together exactly what a Consumer reads. Method: a full read (earliest to latest);
    the broker served no fetch (the executors see its disk), so the older records came from
    S3."""
    topic, _ = _tiered_topic(tier_broker)
    expected = consumer_rows(tier_broker.bootstrap, topic)
    fetches = _fetched_bytes(tier_broker)
    assert spark_rows(read(spark, tier_broker.bootstrap, subscribe=topic)) == expected
    assert _fetched_bytes(tier_broker) == fetches


def test_remote_mode_refuses_a_range_that_is_not_in_the_remote_tier(
        spark: Any, tier_broker: BrokerProcess) -> None:
    """Goal: readMode=remote never falls back to a broker: offsets not in FINISHED remote
    segments are an error naming the partition and the offsets. Method: read to latest (the
    active segment is never copied)."""
    topic, tiers = _tiered_topic(tier_broker, partitions=1)
    start = tiers[TopicPartition(topic, 0)].local_log_start_offset
    with pytest.raises(Exception, match=rf"{topic}-0: readMode=remote, but offsets "
                                        rf"\[{start}, \d+\) are in no FINISHED remote segment"):
        read(spark, tier_broker.bootstrap, subscribe=topic, readMode="remote").count()


def test_a_projected_remote_read_fetches_only_the_projected_columns(
        spark: Any, tier_broker: BrokerProcess, moto_s3: Any) -> None:
    """Goal: ``.schema(...)`` naming 2 of 20 float64 columns makes executors fetch about a
    tenth of the bytes, and the values are right. Method: a typed topic; read two columns,
    then all twenty, from S3, counting the bytes moto sends."""
    schema = float_schema(20)
    topic, tiers = _tiered_topic(tier_broker, partitions=1, batches=8, rows=2000,
                                 value_schema=schema, segment_bytes=1024 * 1024)
    end = tiers[TopicPartition(topic, 0)].local_log_start_offset
    options = {"subscribe": topic, "readMode": "remote", "endingOffsets": _ending(tiers)}
    sent = moto_s3.bytes_sent
    two = (spark.read.format("logstore").option("bootstrap.servers", tier_broker.bootstrap)
           .options(**options).schema("c3 double, c17 double, offset long").load()
           .collect())  # (an orderBy would scan twice: once to sample its range bounds)
    two_bytes, sent = moto_s3.bytes_sent - sent, moto_s3.bytes_sent
    assert sorted((r.offset, r.c3, r.c17) for r in two) == [
        (i, i * 100.0 + 3, i * 100.0 + 17) for i in range(end)]
    columns = ", ".join(f"c{j} double" for j in range(20))
    every = (spark.read.format("logstore").option("bootstrap.servers", tier_broker.bootstrap)
             .options(**options).schema(columns).load().count())
    all_bytes = moto_s3.bytes_sent - sent
    assert every == end
    assert two_bytes <= 0.2 * all_bytes, (two_bytes, all_bytes)


def _s3(moto_s3: Any) -> Any:
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3.endpoint_url)


def _remote_key(moto_s3: Any, bucket_url: str, topic: str, segment_base: int
                ) -> tuple[str, str]:
    """(bucket, key) of the segment object of ``topic``-0 starting at ``segment_base``."""
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    pages = _s3(moto_s3).get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/{topic}-")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    name = f"/0/{segment_base:020d}-"
    (key,) = [k for k in keys if name in k and k.endswith(".arrow")]
    return bucket, key


def _second_segment_base(tier_broker: BrokerProcess, topic: str) -> int:
    conn = BrokerConnection(tier_broker.bootstrap)
    try:
        response = conn.call(ListRemoteSegmentsRequest(topic=topic, partitions=[
            RemoteSegmentsRange(partition=0, start_offset=0, end_offset=2**40)]))
    finally:
        conn.close()
    return response.partitions[0].segments[1].base_offset


def test_a_missing_remote_object_is_data_loss_unless_fail_on_data_loss_is_false(
        spark: Any, tier_broker: BrokerProcess, bucket_url: str, moto_s3: Any) -> None:
    """Goal: a segment object deleted behind the broker's back fails the read with an error
    naming topic, partition and offsets; with failOnDataLoss=false the other records are
    read. Method: delete the second segment's object through the S3 API; read remote."""
    topic, tiers = _tiered_topic(tier_broker, partitions=1)
    base = _second_segment_base(tier_broker, topic)
    bucket, key = _remote_key(moto_s3, bucket_url, topic, base)
    _s3(moto_s3).delete_object(Bucket=bucket, Key=key)
    options = {"subscribe": topic, "readMode": "remote", "endingOffsets": _ending(tiers)}
    with pytest.raises(Exception, match=rf"{topic}-0: offsets \[{base}, \d+\) .* cannot be read "
                                        r"from the remote tier.*failOnDataLoss=false"):
        read(spark, tier_broker.bootstrap, **options).count()
    kept = read(spark, tier_broker.bootstrap, failOnDataLoss="false", **options)
    offsets = sorted(r.offset for r in kept.select("offset").collect())
    assert base not in offsets and 0 in offsets
    assert len(offsets) < tiers[TopicPartition(topic, 0)].local_log_start_offset


def test_a_bit_flip_in_a_remote_object_fails_the_read_naming_the_offset(
        spark: Any, tier_broker: BrokerProcess, bucket_url: str, moto_s3: Any) -> None:
    """Goal: corruption in S3 is caught by the batch CRC on the executor, never returned.
    Method: flip one bit in the middle of the second segment's object (in some batch's
    values) through the S3 API; a whole-record remote read fails naming topic, partition and
    offsets."""
    topic, tiers = _tiered_topic(tier_broker, partitions=1)
    base = _second_segment_base(tier_broker, topic)
    bucket, key = _remote_key(moto_s3, bucket_url, topic, base)
    s3 = _s3(moto_s3)
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x04  # inside some batch's value bytes
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    with pytest.raises(Exception, match=rf"{topic}-0: offsets \[\d+, \d+\) .* cannot be read "
                                        r"from the remote tier.*CRC32C mismatch"):
        read(spark, tier_broker.bootstrap, subscribe=topic, readMode="remote",
             endingOffsets=_ending(tiers)).count()
