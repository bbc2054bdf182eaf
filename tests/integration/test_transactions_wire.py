"""Transactions on the wire: what no LogStore client sends, and the tools for what goes wrong.

Goal: a transactional write is refused unless it belongs to the producer's ongoing transaction
(KIP-890 part 1: an unknown producer id, a stale epoch, a partition not added), as are
transaction requests naming an unknown producer id or a stale epoch, each with Kafka's code
naming the transactional id and nothing written; and a hanging transaction (one no coordinator
knows, which pins the LSO) is found and aborted with ``logstore transactions find-hanging`` and
``abort``, after which the LSO moves on. Method: raw requests through ``BrokerConnection`` to a
broker; the hanging transaction needs a broker without the partition leaders' verification
(``transaction_partition_verification_enable = false``), as Kafka had before KIP-890.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from logstore import Admin, Producer
from logstore.errors import ErrorCode
from logstore.messages.produce import ProduceBatchMetadata, ProduceRequest
from logstore.messages.transactions import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    TxnTopicPartitions,
)
from logstore.records import DEFAULT_SCHEMA
from logstore.rpc.client import BrokerConnection
from tests.brokers import BrokerFactory, BrokerProcess, new_topic, subprocess_env
from tests.helpers import wait_for
from tests.txn_reading import end_offsets


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    f = BrokerFactory(tmp_path_factory.mktemp("txn-wire"))
    yield f
    f.stop_all()


@pytest.fixture(scope="module")
def wbroker(factory: BrokerFactory) -> BrokerProcess:
    return factory(broker_id=0)


def raw_produce(broker: BrokerProcess, topic: str, tid: str, producer_id: int, epoch: int,
                sequence: int = 0) -> int:
    """One transactional batch on a raw produce stream; the error code of its ack."""
    conn = BrokerConnection(broker.bootstrap)
    try:
        stream = conn.open_produce(ProduceRequest(topic=topic, acks=-1, transactional_id=tid),
                                   DEFAULT_SCHEMA)
        stream.send(pa.RecordBatch.from_pylist([{"value": b"raw"}], schema=DEFAULT_SCHEMA),
                    ProduceBatchMetadata(seq=1, partition=0, producer_id=producer_id,
                                         producer_epoch=epoch, base_sequence=sequence,
                                         transactional=True))
        ack = stream.read_ack()
        stream.close()
    finally:
        conn.close()
    assert ack is not None
    return ack.error_code


def test_transactional_writes_outside_the_ongoing_transaction_are_refused(
        wbroker: BrokerProcess) -> None:
    """Goal: the partition leader asks the coordinator before the first transactional batch
    of a transaction lands: an unknown producer id is INVALID_PRODUCER_ID_MAPPING, a stale
    epoch PRODUCER_FENCED, a partition not added INVALID_TXN_STATE, and a producer between
    transactions TRANSACTION_ABORTABLE; nothing is written. Method: raw produce requests
    around a real transactional producer."""
    with Admin(wbroker.bootstrap) as admin:
        topic = new_topic(admin, 2)
    tid = f"wire-{uuid.uuid4().hex[:6]}"
    with Producer(wbroker.bootstrap, transactional_id=tid) as producer:
        producer.init_transactions()
        pid, epoch = producer._txn.producer_id, producer._txn.producer_epoch  # type: ignore[union-attr]
        assert raw_produce(wbroker, topic, tid, pid, epoch) == ErrorCode.TRANSACTION_ABORTABLE
        producer.begin_transaction()
        producer.send(topic, value=b"ok", partition=1).result(10)
        assert raw_produce(wbroker, topic, tid, pid, epoch) == ErrorCode.INVALID_TXN_STATE
        assert raw_produce(wbroker, topic, tid, pid + 1000, 0) == \
            ErrorCode.INVALID_PRODUCER_ID_MAPPING
        producer.abort_transaction()
    with Producer(wbroker.bootstrap, transactional_id=tid) as newer:
        newer.init_transactions()
    assert raw_produce(wbroker, topic, tid, pid, epoch) == ErrorCode.PRODUCER_FENCED
    assert end_offsets(wbroker.bootstrap, topic, [0], "read_uncommitted") == {0: 0}


def test_requests_with_an_unknown_producer_or_a_stale_epoch_get_kafkas_codes(
        wbroker: BrokerProcess) -> None:
    """Goal: an end_txn of a fenced epoch is PRODUCER_FENCED naming the id, an add for an id
    the coordinator never initialised is INVALID_PRODUCER_ID_MAPPING, an empty id
    INVALID_REQUEST. Method: raw requests after two real inits."""
    with Admin(wbroker.bootstrap) as admin:
        topic = new_topic(admin, 1)
    tid = f"wire-{uuid.uuid4().hex[:6]}"
    with Producer(wbroker.bootstrap, transactional_id=tid) as producer:
        producer.init_transactions()
        pid = producer._txn.producer_id  # type: ignore[union-attr]
    with Producer(wbroker.bootstrap, transactional_id=tid) as newer:
        newer.init_transactions()
    conn = BrokerConnection(wbroker.bootstrap)
    try:
        stale = conn.call(EndTxnRequest(transactional_id=tid, producer_id=pid,
                                        producer_epoch=0, committed=True))
        unknown = conn.call(AddPartitionsToTxnRequest(
            transactional_id=f"never-{tid}", producer_id=5, producer_epoch=0,
            topics=[TxnTopicPartitions(topic=topic, partitions=[0])]))
        empty = conn.call(EndTxnRequest(transactional_id="", producer_id=5,
                                        producer_epoch=0, committed=True))
    finally:
        conn.close()
    assert (stale.error_code, tid in (stale.error_message or "")) == \
        (ErrorCode.PRODUCER_FENCED, True)
    assert unknown.error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert empty.error_code == ErrorCode.INVALID_REQUEST


def test_a_hanging_transaction_is_found_and_aborted_with_the_cli(
        factory: BrokerFactory) -> None:
    """Goal: Kafka's hanging-transaction repair: a transactional write no coordinator knows
    pins the LSO; ``find-hanging`` lists it (with its start offset) and ``abort
    --start-offset`` writes the ABORT marker, after which the LSO passes it and the write
    stays invisible. Method: a broker without verification takes a raw transactional batch
    of an unknown producer; the CLI as a user runs it."""
    broker = factory(broker_id=1, transaction_partition_verification_enable=False)
    with Admin(broker.bootstrap) as admin:
        topic = new_topic(admin, 1)
    with Producer(broker.bootstrap, transactional_id="anchor") as anchor:
        anchor.init_transactions()  # the coordinator exists; it never hears of producer 777
    assert raw_produce(broker, topic, "ghost", 777, 0) == 0
    assert end_offsets(broker.bootstrap, topic, [0]) == {0: 0}

    def cli(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "logstore", "transactions", *args,
                               "--bootstrap-server", broker.bootstrap], capture_output=True,
                              text=True, env=subprocess_env(), timeout=60, check=True).stdout
    found = cli("find-hanging", "--topic", topic, "--max-transaction-timeout", "0")
    rows = [line.split("\t") for line in found.splitlines()[1:]]
    assert [(r[0], r[2], r[5]) for r in rows] == [(topic, "777", "0")], found
    assert "777" in cli("describe-producers", "--topic", topic, "--partition", "0")
    out = cli("abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert "producer 777" in out
    wait_for(lambda: end_offsets(broker.bootstrap, topic, [0]) == {0: 2},
             "the LSO to pass the aborted transaction and its marker")
    assert cli("find-hanging", "--topic", topic, "--max-transaction-timeout", "0") \
        .splitlines()[1:] == []
    assert "anchor" in cli("list") and "Empty" in cli("describe", "--transactional-id",
                                                      "anchor")
