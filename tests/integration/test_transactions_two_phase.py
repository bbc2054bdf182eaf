"""Two-phase participation through the clients (what the exactly-once Spark sink builds on).

Goal: transactions prepared by two producers stay invisible, are listed as Prepared (found by
state and id prefix), and are committed atomically with a third producer's transaction and its
offsets by ``commit_transaction(with_prepared=...)``; a stale or mismatched prepared state
fails the whole commit and decides nothing (the committing producer may abort and go on); a new
instance with ``keep_prepared_txn`` completes its predecessor's prepared transaction when the
state matches and aborts it otherwise; ``fence_producers`` aborts a Prepared one. Method: one
embedded broker; ids co-located on one ``__transaction_state`` partition with
``colocated_transactional_id``, as the sink names its tasks' ids.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator

import pytest

from logstore import Admin, Consumer, PreparedTxnState, Producer, TopicPartition
from logstore.client.transactions import ConsumerGroupMetadata, colocated_transactional_id
from logstore.errors import ProducerFencedError
from logstore.model import OffsetAndMetadata
from tests.brokers import BrokerFactory, BrokerProcess, new_topic
from tests.txn_reading import read_values


@pytest.fixture(scope="module")
def pbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("txn-2pc"))
    yield factory()
    factory.stop_all()


@pytest.fixture
def topic(pbroker: BrokerProcess) -> str:
    with Admin(pbroker.bootstrap) as admin:
        return new_topic(admin, 2)


def sink_ids(pbroker: BrokerProcess, count: int) -> tuple[str, list[str]]:
    """A sink id and ``count`` task ids on its coordinator partition."""
    sink = f"sink-{uuid.uuid4().hex[:6]}"
    with Admin(pbroker.bootstrap) as admin:
        n = admin.transaction_state_partitions()
    return sink, [colocated_transactional_id(sink, f"{sink}-{i}-0", n) for i in range(count)]


def stage(pbroker: BrokerProcess, tid: str, topic: str, partition: int, value: bytes
          ) -> PreparedTxnState:
    """A task's transaction: written, prepared, the producer gone."""
    with Producer(pbroker.bootstrap, transactional_id=tid,
                  transaction_two_phase_commit=True) as task:
        task.init_transactions()
        task.begin_transaction()
        task.send(topic, value=value, partition=partition)
        state = task.prepare_transaction()
    return pickle.loads(pickle.dumps(state))  # it travels in a Spark commit message


def test_prepared_transactions_commit_atomically_with_the_committers(
        pbroker: BrokerProcess, topic: str) -> None:
    sink, (a, b) = sink_ids(pbroker, 2)
    states = [stage(pbroker, a, topic, 0, b"a"), stage(pbroker, b, topic, 1, b"b")]
    assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [], 1: []}
    with Admin(pbroker.bootstrap) as admin:
        listed = admin.list_transactions(["Prepared"], transactional_id_prefix=sink)
    assert {t.transactional_id for t in listed} == {a, b}
    progress = TopicPartition("__sink_progress", 0)
    with Producer(pbroker.bootstrap, transactional_id=sink) as driver:
        driver.init_transactions()
        driver.begin_transaction()
        driver.send(topic, value=b"driver", partition=0)
        driver.send_offsets_to_transaction({progress: OffsetAndMetadata(7, "batch 7")},
                                           ConsumerGroupMetadata(sink))
        driver.commit_transaction(with_prepared=states)
    assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [b"a", b"driver"],
                                                               1: [b"b"]}
    with Consumer(pbroker.bootstrap, group_id=sink, isolation_level="read_committed") as c:
        assert c.committed(progress).offset == 7  # type: ignore[union-attr]
    with Admin(pbroker.bootstrap) as admin:
        assert not admin.list_transactions(["Prepared"], transactional_id_prefix=sink)


def test_a_stale_prepared_state_fails_the_whole_commit_and_decides_nothing(
        pbroker: BrokerProcess, topic: str) -> None:
    sink, (a, b) = sink_ids(pbroker, 2)
    good, stale = stage(pbroker, a, topic, 0, b"a"), stage(pbroker, b, topic, 1, b"b")
    with Producer(pbroker.bootstrap, transactional_id=b,
                  transaction_two_phase_commit=True) as again:
        again.init_transactions(keep_prepared_txn=True)  # b's epoch moves on: stale is stale
    with Producer(pbroker.bootstrap, transactional_id=sink) as driver:
        driver.init_transactions()
        driver.begin_transaction()
        driver.send(topic, value=b"driver", partition=0)
        with pytest.raises(ProducerFencedError, match=b):
            driver.commit_transaction(with_prepared=[good, stale])
        driver.abort_transaction()  # the driver is not fenced: it aborts and goes on
        driver.begin_transaction()
        driver.commit_transaction(with_prepared=[good])
    with Admin(pbroker.bootstrap) as admin:
        states = {d.transactional_id: d.state for d in admin.describe_transactions([a, b])}
    assert states == {a: "CompleteCommit", b: "Prepared"}
    assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [b"a"], 1: []}


def test_a_new_instance_completes_its_predecessors_prepared_transaction(
        pbroker: BrokerProcess, topic: str) -> None:
    _, (a, b) = sink_ids(pbroker, 2)
    kept = stage(pbroker, a, topic, 0, b"kept")
    stage(pbroker, b, topic, 1, b"dropped")
    for tid, state, committed in ((a, kept, True), (b, kept, False)):
        with Producer(pbroker.bootstrap, transactional_id=tid,
                      transaction_two_phase_commit=True) as instance:
            instance.init_transactions(keep_prepared_txn=True)
            assert instance.complete_transaction(state) is committed
            instance.begin_transaction()  # and it goes on with transactions of its own
            instance.abort_transaction()
    assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [b"kept"], 1: []}


def test_fence_producers_aborts_a_prepared_transaction(pbroker: BrokerProcess,
                                                       topic: str) -> None:
    _, (a,) = sink_ids(pbroker, 1)
    stage(pbroker, a, topic, 0, b"never")
    with Admin(pbroker.bootstrap) as admin:
        admin.fence_producers([a])
        (d,) = admin.describe_transactions([a])
    assert d.state in ("CompleteAbort", "Empty")
    assert read_values(pbroker.bootstrap, topic, [0]) == {0: []}


def test_a_producer_goes_on_at_the_epoch_its_prepare_returned(
        pbroker: BrokerProcess, topic: str) -> None:
    """Goal: prepare bumps the epoch, so each prepared state names one transaction; the same
    producer aborts at the new epoch and writes its next transaction (sequences from 0 at
    that epoch), whose state differs from the first one's, and the first state cannot commit
    it. Method: one producer prepares, aborts, writes again and prepares; a driver tries the
    old state, then the new one."""
    sink, (a,) = sink_ids(pbroker, 1)
    with Producer(pbroker.bootstrap, transactional_id=a,
                  transaction_two_phase_commit=True) as task:
        task.init_transactions()
        task.begin_transaction()
        task.send(topic, value=b"first", partition=0)
        first = task.prepare_transaction()
        task.abort_transaction()
        task.begin_transaction()
        task.send(topic, value=b"second", partition=0)
        task.send(topic, value=b"second", partition=1)
        second = task.prepare_transaction()
    assert (second.producer_id, second.producer_epoch) == \
        (first.producer_id, first.producer_epoch + 1)
    with Producer(pbroker.bootstrap, transactional_id=sink) as driver:
        driver.init_transactions()
        driver.begin_transaction()
        with pytest.raises(ProducerFencedError, match=a):
            driver.commit_transaction(with_prepared=[first])
        driver.abort_transaction()
        assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [], 1: []}
        driver.begin_transaction()
        driver.commit_transaction(with_prepared=[second])
    assert read_values(pbroker.bootstrap, topic, range(2)) == {0: [b"second"],
                                                               1: [b"second"]}
