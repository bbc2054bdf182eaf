"""Transactions against a real broker process (embedded mode).

Goal: a committed transaction becomes visible to read_committed readers whole, an aborted or
open one never, and read_uncommitted never sees control records; the last stable offset shows
in list-offsets and ``logstore topics describe``; a second producer with the same
transactional id fences the first (whose writes never become visible, and whose every later
call raises ProducerFencedError); offsets sent in a transaction count only when it commits,
and a read_committed consumer's committed offsets wait for the transaction (require_stable);
a producer that dies mid-transaction is aborted after its timeout and the LSO moves on.
Method: one broker shared by the module (the transaction tick every 100 ms), real clients,
bounded waits on conditions; every topic is the test's own.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.coordinator import CoordinatorClient
from logstore.client.metadata import ClusterMetadata
from logstore.client.transactions import TransactionManager
from logstore.errors import (
    ApiError,
    ErrorCode,
    InvalidRecordError,
    InvalidTxnStateError,
    MessageTooLargeError,
    ProducerFencedError,
    TransactionAbortableError,
    UnstableOffsetCommitError,
)
from logstore.messages.groups import KEY_TYPE_GROUP, GroupPartition, OffsetFetchRequest
from logstore.model import OffsetAndMetadata
from tests.brokers import BrokerFactory, BrokerProcess, new_topic, subprocess_env
from tests.helpers import wait_for
from tests.txn_reading import end_offsets, read_values

TXN_SETTINGS = {"transaction_abort_timed_out_transaction_cleanup_interval_ms": 100,
                "group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100}


@pytest.fixture(scope="module")
def tbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("txn"))
    yield factory(**TXN_SETTINGS)
    factory.stop_all()


@pytest.fixture
def topic(tbroker: BrokerProcess) -> str:
    with Admin(tbroker.bootstrap) as admin:
        return new_topic(admin, 3)


def txn_producer(broker: BrokerProcess, tid: str | None = None, **settings: object
                 ) -> Producer:
    producer = Producer(broker.bootstrap, transactional_id=tid or f"tx-{uuid.uuid4().hex[:8]}",
                        linger_ms=1, **settings)  # type: ignore[arg-type]
    producer.init_transactions()
    return producer


def flat(values: dict[int, list[bytes]]) -> list[bytes]:
    return sorted(v for vs in values.values() for v in vs)


def test_committed_records_are_visible_whole_and_aborted_or_open_ones_never(
        tbroker: BrokerProcess, topic: str) -> None:
    """Goal: read_committed returns the committed transaction whole and nothing of an
    aborted or open one; read_uncommitted returns every data record but no control record;
    the LSO stops at the open transaction (list-offsets, topics describe). Method: commit 30
    records, abort 20, leave 10 open, plus plain records from an idempotent producer."""
    with txn_producer(tbroker) as producer, Producer(tbroker.bootstrap) as plain:
        producer.begin_transaction()
        for i in range(30):
            producer.send(topic, value=b"c%d" % i, key=b"%d" % i)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send_batch(topic, pa.table({"value": [b"a%d" % i for i in range(20)]}))
        producer.abort_transaction()
        plain.send(topic, value=b"plain", partition=1).result(10)
        producer.begin_transaction()
        producer.send(topic, value=b"open", partition=2)
        producer.flush()
        committed = read_values(tbroker.bootstrap, topic, range(3))
        uncommitted = read_values(tbroker.bootstrap, topic, range(3), "read_uncommitted")
        stable = end_offsets(tbroker.bootstrap, topic, range(3))
        high = end_offsets(tbroker.bootstrap, topic, range(3), "read_uncommitted")
        described = subprocess.run(
            [sys.executable, "-m", "logstore", "topics", "describe", topic,
             "--bootstrap-server", tbroker.bootstrap], capture_output=True, text=True,
            env=subprocess_env(), timeout=60, check=True).stdout
        producer.abort_transaction()
    assert flat(committed) == sorted([b"c%d" % i for i in range(30)] + [b"plain"])
    assert flat(uncommitted) == sorted([b"c%d" % i for i in range(30)] + [b"plain", b"open"]
                                       + [b"a%d" % i for i in range(20)])
    assert stable[2] < high[2] and committed[2] == uncommitted[2][:len(committed[2])]
    line = next(ln for ln in described.splitlines() if "Partition: 2" in ln)
    assert f"LastStableOffset: {stable[2]}" in line and f"LogEndOffset: {high[2]}" in line


def test_a_new_instance_fences_the_old_one_whose_writes_never_become_visible(
        tbroker: BrokerProcess, topic: str) -> None:
    """Goal: zombie fencing. The second producer with the same transactional id aborts the
    first one's open transaction; the first can neither write nor commit (ProducerFencedError,
    and every later call raises it); nothing it wrote is visible. Method: two producers, one
    id; the old one writes, the new one inits, writes and commits, the old one tries on."""
    tid = f"zombie-{uuid.uuid4().hex[:6]}"
    old = txn_producer(tbroker, tid)
    old.begin_transaction()
    old.send_batch(topic, pa.table({"value": [b"zombie-1"] * 5}), partition=0)
    old.flush()
    with txn_producer(tbroker, tid) as new:
        new.begin_transaction()
        new.send(topic, value=b"new", partition=0)
        new.commit_transaction()
    late = old.send(topic, value=b"zombie-2", partition=0)  # its abort marker's epoch
    with pytest.raises(ProducerFencedError, match=tid):
        late.result(10)
    with pytest.raises(ProducerFencedError, match=tid):
        old.send(topic, value=b"zombie-3", partition=1).result(10)
    for call in (old.commit_transaction, old.abort_transaction, old.begin_transaction):
        with pytest.raises(ProducerFencedError, match=tid):
            call()
    old.close()
    assert flat(read_values(tbroker.bootstrap, topic, range(3))) == [b"new"]


def test_transactional_calls_are_refused_with_clear_errors_and_nothing_is_written(
        tbroker: BrokerProcess, topic: str) -> None:
    """Goal: the client refuses what cannot work before anything is sent: transactional calls
    on a non-transactional producer, commit without begin, a send outside a transaction, an
    empty or too-long transactional id, a timeout above the broker's maximum. Method: each
    call, then the log end offsets are unchanged."""
    before = end_offsets(tbroker.bootstrap, topic, range(3), "read_uncommitted")
    with Producer(tbroker.bootstrap) as plain:
        for call in (plain.init_transactions, plain.begin_transaction, plain.commit_transaction,
                     plain.abort_transaction):
            with pytest.raises(InvalidTxnStateError, match="no transactional_id"):
                call()
    with txn_producer(tbroker) as producer:
        with pytest.raises(InvalidTxnStateError, match="cannot commit in state ready"):
            producer.commit_transaction()
        with pytest.raises(InvalidTxnStateError, match="send outside a transaction"):
            producer.send(topic, value=b"x")
        with pytest.raises(InvalidTxnStateError, match="send outside a transaction"):
            producer.send_batch(topic, pa.table({"value": [b"x"]}))
    for tid in ("", "x" * 250):
        with pytest.raises(Exception, match="transactional id"):
            Producer(tbroker.bootstrap, transactional_id=tid)
    too_long = Producer(tbroker.bootstrap, transactional_id="slow",
                        transaction_timeout_ms=16 * 60 * 1000)
    with pytest.raises(Exception) as e:
        too_long.init_transactions()
    too_long.close()
    assert getattr(e.value, "code", None) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert "transaction_max_timeout_ms" in str(e.value)
    assert end_offsets(tbroker.bootstrap, topic, range(3), "read_uncommitted") == before


def test_offsets_sent_in_a_transaction_count_only_when_it_commits(
        tbroker: BrokerProcess, topic: str) -> None:
    """Goal: send_offsets_to_transaction stages the group's offsets: while the transaction is
    open a require_stable offset fetch is UNSTABLE_OFFSET_COMMIT, an abort drops them, a commit
    makes them the group's committed offsets (read stable by a read_committed consumer).
    Method: a group member's metadata, one aborted and one committed transaction."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Consumer(tbroker.bootstrap, group_id=group, enable_auto_commit=False,
                  isolation_level="read_committed") as consumer, \
            txn_producer(tbroker) as producer:
        consumer.assign([tp])
        meta = consumer.group_metadata()
        for offset, commit in ((5, False), (9, True)):
            producer.begin_transaction()
            producer.send(topic, value=b"x", partition=1)
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(offset, "m")}, meta)
            with pytest.raises(UnstableOffsetCommitError, match=group):
                _fetch_stable(tbroker, group, tp)
            (producer.commit_transaction if commit else producer.abort_transaction)()
            expected = offset if commit else None
            assert (om.offset if (om := consumer.committed(tp)) else None) == expected
        assert consumer.committed(tp) == OffsetAndMetadata(9, "m", consumer.committed(tp)
                                                           .commit_timestamp)


def test_a_commit_made_after_a_transactions_offsets_wins_over_them_also_after_a_restart(
        broker_factory) -> None:
    """Goal: as in Kafka, a transaction's offsets replace the group's committed offset only if
    their record was appended after it: a plain commit between send_offsets_to_transaction
    and commit_transaction wins for its partition; one made before the transaction's offsets
    loses; a restarted broker, replaying __consumer_offsets, answers the same. Method: a
    broker of its own; an empty group (an assign()ed consumer's metadata); transaction 1
    sends 5 for t-0 and t-1 and an admin commit sets t-0 to 7 before its commit; then an
    admin commit of 3 for t-0 and transaction 2 sending 9 for t-0; the committed offsets are
    read before and after a restart."""
    broker = broker_factory(**TXN_SETTINGS)
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    def committed() -> dict[TopicPartition, int]:
        with Admin(broker.bootstrap) as admin:
            return {tp: om.offset for tp, om in admin.list_group_offsets(group).items()}

    with Consumer(broker.bootstrap, group_id=group, enable_auto_commit=False) as consumer, \
            Admin(broker.bootstrap) as admin, txn_producer(broker) as producer:
        consumer.assign([tp0, tp1])
        meta = consumer.group_metadata()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp0: OffsetAndMetadata(5), tp1: OffsetAndMetadata(5)},
                                             meta)
        admin.alter_group_offsets(group, {tp0: 7})
        producer.commit_transaction()
        assert committed() == {tp0: 7, tp1: 5}
        admin.alter_group_offsets(group, {tp0: 3})
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp0: OffsetAndMetadata(9)}, meta)
        producer.commit_transaction()
        assert committed() == {tp0: 9, tp1: 5}
    broker.restart()
    assert wait_for(committed, "the restarted broker's group offsets",
                    tolerate=(ApiError,)) == {tp0: 9, tp1: 5}


def _fetch_stable(broker: BrokerProcess, group: str, tp: TopicPartition) -> None:
    metadata = ClusterMetadata(broker.bootstrap)
    try:
        coordinator = CoordinatorClient(metadata, group, KEY_TYPE_GROUP, timeout_s=0)
        coordinator.call(OffsetFetchRequest(group_id=group, require_stable=True, partitions=[
            GroupPartition(topic=tp.topic, partition=tp.partition)]), timeout_s=0)
    finally:
        metadata.close()


def test_a_producer_that_dies_mid_transaction_is_aborted_after_its_timeout(
        tbroker: BrokerProcess, topic: str) -> None:
    """Goal: an open transaction whose producer goes away pins the LSO only until its
    transaction_timeout_ms: the coordinator aborts it at a bumped epoch, the LSO moves past
    it, its records never become visible, and the producer, if it comes back, is fenced.
    Method: a producer with a 1 s timeout writes and stops; wait for the LSO."""
    producer = txn_producer(tbroker, transaction_timeout_ms=1000)
    producer.begin_transaction()
    producer.send(topic, value=b"lost", partition=0)
    producer.flush()
    high = end_offsets(tbroker.bootstrap, topic, [0], "read_uncommitted")[0]
    assert end_offsets(tbroker.bootstrap, topic, [0])[0] < high
    wait_for(lambda: end_offsets(tbroker.bootstrap, topic, [0])[0] > high,
             "the LSO to pass the timed-out transaction's abort marker")
    assert read_values(tbroker.bootstrap, topic, [0])[0] == []
    with pytest.raises(ProducerFencedError):
        producer.commit_transaction()
    producer.close()


def test_an_abort_fails_its_unacknowledged_records_and_none_joins_the_next_transaction(
        tbroker: BrokerProcess) -> None:
    """Goal: ``abort_transaction(timeout)`` fails the records of the aborted transaction the
    broker has not acknowledged with TRANSACTION_ABORTABLE; none of them is sent later, into
    the next transaction or into none (where it would pin the LSO). Method: a topic whose
    min_insync_replicas the single broker cannot meet, so its batch is retried, unwritten,
    until the abort fails it; then the topic is made writable (the abort's marker needs the
    ISR too, so the abort completes only then) and the same producer commits a second
    transaction to it; read_committed and read_uncommitted hold only the second one's record
    and the LSO is the high watermark."""
    with Admin(tbroker.bootstrap) as admin:
        stuck = new_topic(admin, 1, min_insync_replicas=2)
    with txn_producer(tbroker) as producer, ThreadPoolExecutor(1) as pool:
        producer.begin_transaction()
        late = producer.send(stuck, value=b"aborted", partition=0)
        aborting = pool.submit(producer.abort_transaction, 0.5)
        with pytest.raises(TransactionAbortableError, match="aborted before this record"):
            late.result(30)
        with Admin(tbroker.bootstrap) as admin:
            admin.alter_configs({stuck: {"min_insync_replicas": 1}})
        aborting.result(60)
        producer.begin_transaction()
        producer.send(stuck, value=b"next", partition=0).result(30)
        producer.commit_transaction()
    assert read_values(tbroker.bootstrap, stuck, range(1)) == {0: [b"next"]}
    assert read_values(tbroker.bootstrap, stuck, range(1), "read_uncommitted") == \
        {0: [b"next"]}
    assert end_offsets(tbroker.bootstrap, stuck, [0]) == \
        end_offsets(tbroker.bootstrap, stuck, [0], "read_uncommitted")


def test_a_record_that_fails_in_the_producer_makes_its_transaction_abort(
        tbroker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: a transaction is all or nothing also when one of its records fails before it is
    sent (over the topic's max_message_bytes, here): as in Kafka, the transaction can then
    only abort, commit_transaction() raises that error, and read_committed sees none of it;
    after the abort the next transaction commits. Before, the failed record's future failed
    alone and the commit published the rest. The transaction fails before the record's
    future does, so a commit that was waiting on it cannot slip in between. (A send_batch
    refused before any of it is sent leaves the transaction as it was.) Method: a topic with
    max_message_bytes 2,000; a transaction of a small record (acknowledged) and a 5,000-byte
    one (its failure recorded 50 ms late, standing in for a thread switch), committed at once;
    then one with a small record and two send_batch calls refused up front."""
    with Admin(tbroker.bootstrap) as admin:
        topic = new_topic(admin, 1, max_message_bytes=2000)
    fail = TransactionManager.fail

    def late_fail(self: TransactionManager, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return fail(self, *args, **kwargs)

    monkeypatch.setattr(TransactionManager, "fail", late_fail)
    with txn_producer(tbroker) as producer:
        producer.begin_transaction()
        producer.send(topic, value=b"part-1", partition=0).result(10)
        too_large = producer.send(topic, value=b"x" * 5000, partition=0)
        with pytest.raises(MessageTooLargeError):
            producer.commit_transaction()
        with pytest.raises(MessageTooLargeError):
            too_large.result(10)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, value=b"after", partition=0)
        with pytest.raises(MessageTooLargeError, match="nothing was sent"):
            producer.send_batch(topic, pa.table({"value": [b"ok", b"x" * 5000]}), partition=0)
        with pytest.raises(InvalidRecordError, match="missing column"):
            producer.send_batch(topic, pa.table({"key": [b"k"]}), partition=0)
        producer.commit_transaction()  # both refused whole before any of it was sent
    assert read_values(tbroker.bootstrap, topic, [0]) == {0: [b"after"]}
