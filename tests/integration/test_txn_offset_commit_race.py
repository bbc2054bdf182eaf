"""A transaction aborted while its TxnOffsetCommit is between the leader's check with the
transaction coordinator and the append of the offsets batch (KIP-890 part 1).

Goal: the commit is refused with TRANSACTION_ABORTABLE and leaves no transaction open on the
group's ``__consumer_offsets`` partition: its last stable offset is not held, and a
require_stable offset fetch (a read_committed consumer's committed offsets) is answered at
once instead of waiting for the transaction timeout. Method: a real broker in this process
(``build_broker``, embedded mode) and real clients; the race is made deterministic by running
the broker's own ``end_txn`` abort right after its verifier said yes for the offsets
partition (the real verifier, called first), i.e. in the window between check and append.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.broker.broker import Broker
from logstore.config import BrokerConfig
from logstore.errors import TransactionAbortableError
from logstore.main import build_broker
from logstore.messages.transactions import EndTxnRequest
from logstore.model import OFFSETS_TOPIC, OffsetAndMetadata
from tests.brokers import free_port, new_topic

SETTINGS = {"transaction_abort_timed_out_transaction_cleanup_interval_ms": 100,
            "group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100,
            "offsets_topic_num_partitions": 1, "transaction_state_log_num_partitions": 1}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    config = BrokerConfig(listener=f"127.0.0.1:{free_port()}",
                          log_dirs=(str(tmp_path / "data"),), **SETTINGS)  # type: ignore[arg-type]
    b = build_broker(config)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def abort_after_verify(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[TopicPartition]:
    """Make the broker abort the transaction right after its verifier's yes for an offsets
    partition; the partitions it did that for."""
    txn = broker.transactions
    verify: Callable[[str, int, int, TopicPartition], None] = txn.verifier.verify
    aborted: list[TopicPartition] = []

    def verify_then_abort(transactional_id: str, producer_id: int, producer_epoch: int,
                          tp: TopicPartition) -> None:
        verify(transactional_id, producer_id, producer_epoch, tp)
        if tp.topic == OFFSETS_TOPIC and not aborted:
            aborted.append(tp)
            response = txn.end_txn(EndTxnRequest(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, committed=False))
            response.raise_error()
    monkeypatch.setattr(txn.verifier, "verify", verify_then_abort)
    return aborted


def test_an_abort_between_the_check_and_the_append_leaves_nothing_open(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = f"127.0.0.1:{broker.config.port}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        tp = TopicPartition(new_topic(admin, 1), 0)
    aborted = abort_after_verify(broker, monkeypatch)
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False,
                  isolation_level="read_committed") as consumer, \
            Producer(bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:6]}",
                     linger_ms=1) as producer:
        consumer.assign([tp])
        # The group coordinator's partition loaded first: a commit answered
        # LOAD_IN_PROGRESS after the abort would be retried and refused by the check itself.
        assert consumer.committed(tp) is None
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(TransactionAbortableError, match="no transaction verified"):
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(5, "m")},
                                                 consumer.group_metadata())
        assert aborted == [TopicPartition(OFFSETS_TOPIC, 0)]  # the race did happen
        log = broker.replicas.partition(aborted[0]).log
        assert log.producer_state.open_transactions == {}
        assert log.last_stable_offset == log.high_watermark == log.log_end_offset
        assert consumer.committed(tp) is None  # require_stable: answered, nothing committed
