"""Tiered topics on a real broker process: copies to a real S3 endpoint (moto's server on
127.0.0.1, through s3fs) or a ``file://`` directory, consumers reading across both tiers,
offsets over both tiers, ``topics describe``/``alter`` from the command line, topic deletion
and read_committed over both tiers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.messages.fetch import FetchPartition, FetchRequest
from logstore.model import EARLIEST, LATEST
from logstore.rpc.client import BrokerConnection
from logstore.tiering.fsspec_store import FsspecObjectStore
from tests.brokers import BrokerFactory, BrokerProcess, new_topic, subprocess_env
from tests.helpers import wait_for
from tests.tiered import (
    ROWS,
    create_tiered_topic,
    log_tiers,
    produce,
    remote_settings,
    value_batch,
    wait_tiered,
)

CLI_TIMEOUT_S = 60


def read_all(bootstrap: str, tp: TopicPartition, end: int, timeout_s: float = 60
             ) -> tuple[list[int], list[bytes]]:
    """Offsets and values of ``tp`` from its beginning to ``end``, with a Consumer."""
    offsets: list[int] = []
    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(offsets)} of {end} records"
            for table in consumer.poll_arrow(timeout_ms=300).values():
                offsets += table.column("offset").to_pylist()
                values += table.column("value").to_pylist()
    return offsets, values


def expected_values(end: int) -> list[bytes]:
    values: list[bytes] = []
    for start in range(0, end, ROWS):
        values += value_batch(start).column("value").to_pylist()
    return values


@pytest.fixture
def s3_broker(broker_factory: BrokerFactory, moto_s3: Any, s3_url: str) -> BrokerProcess:
    return broker_factory(**remote_settings(s3_url, moto_s3.options()))


@pytest.fixture
def file_broker(broker_factory: BrokerFactory, tmp_path: Path) -> BrokerProcess:
    return broker_factory(**remote_settings(f"file://{tmp_path}/remote"))


def test_a_consumer_reads_every_offset_once_across_the_remote_and_local_tiers(
        s3_broker: BrokerProcess) -> None:
    """Goal: a tiered partition whose older segments live only in S3 is read from offset 0
    to its end, every offset once and in order, with its values. Method: small segments,
    local_retention_ms 0; produce 40 batches; wait until every sealed segment is copied and
    gone locally; EARLIEST is 0 while the local log starts later; consume from the start."""
    with Admin(s3_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        end = produce(s3_broker.bootstrap, topic, 40)
        tiers = wait_tiered(admin, topic)
        assert tiers.log_start_offset == 0 < tiers.local_log_start_offset < end
        assert tiers.remote_segments > 0 and tiers.remote_bytes > 0
        tp = TopicPartition(topic, 0)
        assert admin.list_offsets({tp: EARLIEST}) == {tp: 0}
        assert admin.list_offsets({tp: LATEST}) == {tp: end}
    offsets, values = read_all(s3_broker.bootstrap, tp, end)
    assert offsets == list(range(end))
    assert values == expected_values(end)


def test_one_fetch_is_served_from_several_partitions_remote_segments(
        file_broker: BrokerProcess) -> None:
    """Goal: a fetch naming several partitions below their local log start gets batches of
    each of them in the one response (read concurrently on the reader pool). Method: three
    tiered partitions, each tiered; one fetch at offset 0 of all three."""
    with Admin(file_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin, partitions=3)
        for p in range(3):
            produce(file_broker.bootstrap, topic, 12, partition=p)
        for p in range(3):
            wait_tiered(admin, topic, p)
    conn = BrokerConnection(file_broker.bootstrap)
    try:
        response = conn.fetch(FetchRequest(topic=topic, max_wait_ms=0, partitions=[
            FetchPartition(partition=p, offset=0) for p in range(3)]))
    finally:
        conn.close()
    assert {b.partition for b in response.batches} == {0, 1, 2}
    assert all(s.error() is None and s.log_start_offset == 0 < s.local_log_start_offset
               for s in response.partitions.values())
    firsts = {p: min(b.header.base_offset for b in response.batches if b.partition == p)
              for p in range(3)}
    assert firsts == {0: 0, 1: 0, 2: 0}


@pytest.mark.parametrize("fetch_session", [True, False])
def test_a_consumer_reads_on_when_its_remote_reads_outlast_the_fetch_wait(
        broker_factory: BrokerFactory, moto_s3: Any, s3_url: str, fetch_session: bool) -> None:
    """Goal: a remote-tier read still running when ``remote_fetch_max_wait_ms`` ends is read
    again, so a consumer reads every offset of an idle tiered partition, on a push session
    (nothing else would wake it: the log does not move) as on plain fetches. Method:
    remote_fetch_max_wait_ms 1, shorter than any S3 read of moto's server; 40 batches
    produced and tiered, then nothing; a consumer reads from offset 0 to the end."""
    broker = broker_factory(**remote_settings(s3_url, moto_s3.options(),
                                              remote_fetch_max_wait_ms=1))
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        end = produce(broker.bootstrap, topic, 40)
        assert wait_tiered(admin, topic).local_log_start_offset > 0
    tp = TopicPartition(topic, 0)
    offsets: list[int] = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                  fetch_session=fetch_session) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(offsets)} of {end} records"
            for table in consumer.poll_arrow(timeout_ms=300).values():
                offsets += table.column("offset").to_pylist()
    assert offsets == list(range(end))


def test_tiering_is_enabled_on_a_live_topic_from_the_command_line(
        file_broker: BrokerProcess) -> None:
    """Goal: ``logstore topics alter --config remote_storage_enable=true`` tiers a topic that
    already has data, and ``topics describe`` then shows both tiers. Method: a plain topic
    with sealed segments; alter it from the CLI (and its local retention); wait until it is
    tiered; every record is still read from offset 0; describe prints the tier columns."""
    with Admin(file_broker.bootstrap) as admin:
        topic = new_topic(admin, 1, prefix="live", segment_bytes=64 * 1024)
        end = produce(file_broker.bootstrap, topic, 20)
        assert log_tiers(admin, topic).remote_storage_enable is False  # type: ignore[union-attr]
        _cli("topics", "alter", topic, "--config", "remote_storage_enable=true",
             "--config", "local_retention_ms=0", bootstrap=file_broker.bootstrap)
        tiers = wait_tiered(admin, topic)
    offsets, _ = read_all(file_broker.bootstrap, TopicPartition(topic, 0), end)
    assert offsets == list(range(end))
    described = _cli("topics", "describe", topic, bootstrap=file_broker.bootstrap)
    line = next(x for x in described.splitlines() if "Partition: 0" in x)
    assert "LogStartOffset: 0\t" in line
    assert f"LocalLogStartOffset: {tiers.local_log_start_offset}" in line
    assert f"RemoteSegments: {tiers.remote_segments}\t" in line and "CopyLagSegments: 0" in line


def test_deleting_a_tiered_topic_deletes_its_remote_objects(
        s3_broker: BrokerProcess, moto_s3: Any, s3_url: str) -> None:
    """Goal: topic deletion removes the topic's objects from S3 (and its remote segment
    metadata). Method: tier a topic; see objects under its prefix; delete it; wait until the
    prefix is empty."""
    store = FsspecObjectStore(s3_url, moto_s3.options())
    with Admin(s3_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        produce(s3_broker.bootstrap, topic, 10)
        wait_tiered(admin, topic)
        prefix = next(i.key.split("/")[0] for i in store.list("") if i.key.startswith(topic))
        assert store.list(prefix)
        admin.delete_topics([topic])
    wait_for(lambda: not store.list(prefix), f"no object left under {prefix}")


def test_total_retention_moves_the_log_start_offset_over_both_tiers(
        file_broker: BrokerProcess) -> None:
    """Goal: retention_bytes bounds both tiers together: the oldest remote segments go and
    the log start offset moves past them, EARLIEST follows, and a consumer starting from the
    beginning reads from there. Method: retention_bytes of about four segments; produce
    thirty; wait until the log start offset is above 0 and the remote bytes within bound."""
    with Admin(file_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin, retention_bytes=4 * 64 * 1024)
        end = produce(file_broker.bootstrap, topic, 30)
        tiers = wait_tiered(admin, topic, condition=lambda t: t.log_start_offset > 0
                            and t.copy_lag_segments == 0
                            and t.remote_bytes <= 4 * 64 * 1024)
        tp = TopicPartition(topic, 0)
        assert admin.list_offsets({tp: EARLIEST}) == {tp: tiers.log_start_offset}
    offsets, _ = read_all(file_broker.bootstrap, tp, end)
    assert offsets == list(range(tiers.log_start_offset, end))


def test_a_timestamp_lookup_finds_the_first_record_in_the_remote_tier(
        file_broker: BrokerProcess) -> None:
    """Goal: offsets_for_times looks in the remote tier first, so a timestamp older than the
    local tier finds its record there. Method: records produced with increasing timestamps;
    tier; look up the timestamp of a record at an offset only S3 holds."""
    with Admin(file_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        produce(file_broker.bootstrap, topic, 2)
        time.sleep(0.01)  # the next batches' timestamps are later than the first two
        middle = int(time.time() * 1000)
        produce(file_broker.bootstrap, topic, 20, start=2 * ROWS)
        wait_tiered(admin, topic, condition=lambda t: t.local_log_start_offset > 2 * ROWS
                    and t.copy_lag_segments == 0)
    tp = TopicPartition(topic, 0)
    with Consumer(file_broker.bootstrap) as consumer:
        found = consumer.offsets_for_times({tp: middle})[tp]
        assert found is not None and found.offset == 2 * ROWS
        oldest = consumer.offsets_for_times({tp: 0})[tp]
        assert oldest is not None and oldest.offset == 0


def test_a_read_committed_consumer_reads_the_remote_tier_without_aborted_records(
        file_broker: BrokerProcess) -> None:
    """Goal: read_committed works across both tiers: the aborted transactions of a remote
    range come from the uploaded transaction indexes, so a read_committed consumer reading
    from the start gets exactly the committed records. Method: a transactional producer
    commits, aborts and commits whole segments of records to a tiered topic; once the first
    ones are only remote, read everything read_committed and compare with the committed
    values; read_uncommitted still sees the aborted ones."""
    with Admin(file_broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        committed = _transactions(file_broker.bootstrap, topic, [True, False, True, False, True])
        wait_tiered(admin, topic)
    tp = TopicPartition(topic, 0)
    with Consumer(file_broker.bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign([tp])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < len(committed) and time.monotonic() < deadline:
            for table in consumer.poll_arrow(timeout_ms=500).values():
                values += table.column("value").to_pylist()
    assert values == committed
    with Consumer(file_broker.bootstrap, auto_offset_reset="earliest") as everything:
        everything.assign([tp])
        assert everything.poll_arrow(timeout_ms=5000)[tp].num_rows > 0


def _transactions(bootstrap: str, topic: str, outcomes: list[bool]) -> list[bytes]:
    """One transaction of ROWS * 4 records per outcome (True: commit); the committed values."""
    committed: list[bytes] = []
    with Producer(bootstrap, transactional_id=f"tiered-{topic}") as producer:
        producer.init_transactions()
        for n, commit in enumerate(outcomes):
            producer.begin_transaction()
            batches = [value_batch((n * 4 + i) * ROWS) for i in range(4)]
            for batch in batches:
                producer.send_batch(topic, batch, partition=0)
            if commit:
                producer.commit_transaction()
                committed += [v for b in batches for v in b.column("value").to_pylist()]
            else:
                producer.abort_transaction()
    return committed


def _cli(*args: str, bootstrap: str) -> str:
    result = subprocess.run([sys.executable, "-m", "logstore", *args, "--bootstrap-server",
                             bootstrap], capture_output=True, text=True, env=subprocess_env(),
                            timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return result.stdout
