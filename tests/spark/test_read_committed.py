"""spark.read.format("logstore") with kafka.isolation.level=read_committed equals a
read_committed Consumer, whichever path the executors read by.

Goal: Spark's read_committed never returns an aborted record, a control record or a record of
an open transaction, and returns every committed one: from the leader's files (readMode local),
from fetches (fetch) and from object storage (remote, auto on a tiered topic). Method: topics
holding plain records, committed and aborted transactions and one transaction left open (with
records after it), read by Spark and by a read_committed Consumer (tests/spark/helpers.py reads
the same way, up to the last stable offset); rows are compared record by record. The tiered
topic's last aborted transaction has its ABORT marker in the active segment, past the remote
tier, so a remote read must learn it from the leader (datasource/committed.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.brokers import BrokerFactory, BrokerProcess, bounded_producer
from tests.helpers import WAIT_S
from tests.spark.helpers import read, spark_rows
from tests.tiered import create_tiered_topic, remote_settings, value_batch, wait_tiered

PARTITIONS = 2
COMMITTED = {"kafka.isolation.level": "read_committed"}


def committed_rows(bootstrap: str, topic: str, partitions: int,
                   ends: dict[int, int] | None = None) -> list[tuple[Any, ...]]:
    """(partition, offset, key, value) of every record a read_committed Consumer reads up to
    each partition's last stable offset (or ``ends``), sorted."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    rows: list[tuple[Any, ...]] = []
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_committed",
                  fetch_max_wait_ms=100) as consumer:
        consumer.assign(tps)
        stop = consumer.end_offsets(tps) if ends is None else \
            {tp: ends[tp.partition] for tp in tps}
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < stop[tp] for tp in tps):
            assert time.monotonic() < deadline, "the consumer did not reach the ends"
            for tp, table in consumer.poll_arrow(timeout_ms=200).items():
                rows += [(tp.partition, o, k, v) for o, k, v in zip(
                    table.column("offset").to_pylist(), table.column("key").to_pylist(),
                    table.column("value").to_pylist(), strict=True) if o < stop[tp]]
    return sorted(rows)


def four(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """spark_rows' tuples cut to (partition, offset, key, value)."""
    return sorted(r[:4] for r in rows)


def _batch(tag: str, n: int, rows: int = 50) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([f"{tag}-{n}-{i}".encode() for i in range(rows)]),
                            "value": pa.array([f"{tag}:{n}:{i}".encode() for i in range(rows)])})


@pytest.fixture(scope="module")
def txn_topic(broker: BrokerProcess) -> Iterator[str]:
    """Plain records, transactions committed and aborted over both partitions, then one left
    open on partition 1 with plain records after it (past the last stable offset)."""
    topic = f"rc-{uuid.uuid4().hex[:8]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])
    with bounded_producer(broker.bootstrap, linger_ms=0) as plain, \
            Producer(broker.bootstrap, transactional_id=f"{topic}-a") as txn:
        txn.init_transactions()
        for n, commit in enumerate([True, False, True, False, False, True]):
            plain.send_batch(topic, _batch("plain", n), partition=n % PARTITIONS).result(30)
            txn.begin_transaction()
            for p in range(PARTITIONS):
                txn.send_batch(topic, _batch("txn", n), partition=p)
            (txn.commit_transaction if commit else txn.abort_transaction)()
        opened = Producer(broker.bootstrap, transactional_id=f"{topic}-open",
                          transaction_timeout_ms=600_000)
        opened.init_transactions()
        opened.begin_transaction()
        opened.send_batch(topic, _batch("open", 0), partition=1)
        opened.flush(30)
        plain.send_batch(topic, _batch("after", 0), partition=1).result(30)
    try:
        yield topic
    finally:
        opened.abort_transaction()
        opened.close()


@pytest.mark.parametrize("mode", ["local", "fetch", "auto"])
def test_read_committed_equals_the_consumer_in_each_read_mode(
        spark: Any, broker: BrokerProcess, txn_topic: str, mode: str) -> None:
    """Goal: local files, fetches and auto all read exactly what a read_committed Consumer
    reads: no aborted, control or open-transaction record, every committed one; the default
    (read_uncommitted) still returns the aborted records. Method: the module's topic, read by
    Spark per readMode and by the Consumer; rows compared record by record."""
    expected = committed_rows(broker.bootstrap, txn_topic, PARTITIONS)
    got = four(spark_rows(read(spark, broker.bootstrap, subscribe=txn_topic, readMode=mode,
                               **COMMITTED)))
    assert got == expected
    values = {r[3] for r in got}
    assert not any(v.startswith((b"open", b"after")) for v in values)
    assert {b"txn:1:0", b"txn:3:0"}.isdisjoint(values) and b"txn:5:0" in values
    everything = spark_rows(read(spark, broker.bootstrap, subscribe=txn_topic, readMode=mode))
    assert {b"txn:1:0", b"txn:3:0"} <= {r[3] for r in everything}


def test_read_committed_stream_reads_committed_records_only(
        spark: Any, broker: BrokerProcess, txn_topic: str, tmp_path: Path) -> None:
    """Goal: a stream with read_committed stops at the last stable offset and drops aborted
    records. Method: an AvailableNow query into Parquet, compared with the Consumer."""
    df = (spark.readStream.format("logstore").option("bootstrap.servers", broker.bootstrap)
          .option("subscribe", txn_topic).option("startingOffsets", "earliest")
          .option("kafka.isolation.level", "read_committed").load())
    query = (df.selectExpr("partition", "offset", "key", "value").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    got = sorted((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in rows)
    assert got == committed_rows(broker.bootstrap, txn_topic, PARTITIONS)


# -- the remote tier ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def file_tier_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("rc-tier")
    (root / "brokers").mkdir()
    factory = BrokerFactory(root / "brokers")
    yield factory(**remote_settings(f"file://{root}/remote"))
    factory.stop_all()


def _tiered_transactions(bootstrap: str, topic: str) -> None:
    """Whole segments of committed and aborted transactions on partition 0, the last abort
    spanning several segments with its marker in the active one."""
    with Producer(bootstrap, transactional_id=f"{topic}-t", linger_ms=0) as producer:
        producer.init_transactions()
        start = 0
        for commit, batches in [(True, 4), (False, 4), (True, 4), (False, 7)]:
            producer.begin_transaction()
            for i in range(batches):
                producer.send_batch(topic, value_batch(start + i * 200), partition=0)
            start += batches * 200
            (producer.commit_transaction if commit else producer.abort_transaction)()


@pytest.fixture(scope="module")
def tiered_txn_topic(file_tier_broker: BrokerProcess) -> Iterator[tuple[str, int]]:
    """A tiered topic (file:// store) with transactions on partition 0, its local log start
    offset (what the remote tier alone holds), and an open transaction on partition 1 (there,
    so that partition 0's active segment, holding the last ABORT marker, is not rolled)."""
    bootstrap = file_tier_broker.bootstrap
    with Admin(bootstrap) as admin:
        topic = create_tiered_topic(admin, partitions=2)
        _tiered_transactions(bootstrap, topic)
        tiers = wait_tiered(admin, topic)
    opened = Producer(bootstrap, transactional_id=f"{topic}-open",
                      transaction_timeout_ms=600_000)
    opened.init_transactions()
    opened.begin_transaction()
    opened.send_batch(topic, value_batch(10_000, 20), partition=1)
    opened.flush(30)
    with bounded_producer(bootstrap, linger_ms=0) as plain:
        plain.send_batch(topic, value_batch(20_000, 20), partition=1).result(30)
    try:
        yield topic, tiers.local_log_start_offset
    finally:
        opened.abort_transaction()
        opened.close()


def test_read_committed_of_the_remote_tier_equals_the_consumer(
        spark: Any, file_tier_broker: BrokerProcess, tiered_txn_topic: tuple[str, int]) -> None:
    """Goal: executors reading remote segments drop the aborted transactions, including one
    whose ABORT marker is not in the remote tier yet; auto mode reads both tiers and stops at
    the last stable offset. Method: readMode=remote up to the local log start offset and
    readMode=auto over everything, each against the read_committed Consumer; read_uncommitted
    of the same remote range has the aborted records (the test has something to drop)."""
    topic, remote_end = tiered_txn_topic
    bootstrap = file_tier_broker.bootstrap
    ending = json.dumps({topic: {"0": remote_end}})
    first = json.dumps({topic: [0]})
    remote = four(spark_rows(read(spark, bootstrap, assign=first, readMode="remote",
                                  endingOffsets=ending, **COMMITTED)))
    assert remote == committed_rows(bootstrap, topic, 1, {0: remote_end})
    assert remote and all(r[1] < remote_end for r in remote)
    uncommitted = spark_rows(read(spark, bootstrap, assign=first, readMode="remote",
                                  endingOffsets=ending))
    assert len(uncommitted) > len(remote)
    whole = four(spark_rows(read(spark, bootstrap, subscribe=topic, **COMMITTED)))
    assert whole == committed_rows(bootstrap, topic, 2)
    assert len({r[3] for r in whole}) == 8 * 200  # the two committed transactions, once
