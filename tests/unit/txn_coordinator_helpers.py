"""Helpers of the transaction coordinator's unit tests: the coordinator (the pure handlers of
``transactions/`` on the coordinator runtime, ``TxnCoordinatorService``) over the in-memory
``CoordinatorLog`` of the group tests, a FakeClock, a counter for producer ids, and the marker
jobs it decides collected (a test "writes the markers" by completing them), with typed
requests at the tests' defaults."""

from __future__ import annotations

import itertools
from concurrent.futures import Future

from logstore.broker.txn_coordinator import TxnCoordinatorService
from logstore.clock import FakeClock
from logstore.coordinator import key_partition
from logstore.messages.produce import InitProducerIdRequest, InitProducerIdResponse
from logstore.messages.transactions import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    PreparedTxn,
    PrepareTxnRequest,
    TransactionDescription,
    TxnTopicPartitions,
)
from logstore.model import TopicPartition
from logstore.transactions.coordinator import MarkerJob, TxnConfig
from tests.unit.group_helpers import MemoryOffsetsLog

PARTITIONS = 4
CONFIG = TxnConfig(transaction_max_timeout_ms=60_000, transaction_prepared_timeout_ms=300_000,
                   transactional_id_expiration_ms=3_600_000)


class Counter:
    def __init__(self) -> None:
        self._ids = itertools.count(1000)

    def next_producer_id(self) -> int:
        return next(self._ids)


class Harness:
    """One coordinator, its log and the marker jobs it decided (newest last)."""

    def __init__(self, config: TxnConfig = CONFIG) -> None:
        self.clock = FakeClock()
        self.log = MemoryOffsetsLog(partitions=PARTITIONS)
        self.jobs: list[MarkerJob] = []
        self.ids = Counter()
        self.config = config
        self.coord = self.new_coordinator()

    def new_coordinator(self) -> TxnCoordinatorService:
        """A coordinator that replays the log afresh (a failover, or a restart)."""
        self.jobs = []
        self.coord = TxnCoordinatorService(self.log, self.config, self.clock, self.ids,
                                           self.jobs.append)
        return self.coord

    # -- requests --

    def init(self, tid: str, timeout_ms: int = 10_000, two_phase: bool = False,
             keep_prepared: bool = False, producer: tuple[int, int] = (-1, -1)
             ) -> InitProducerIdResponse:
        return self.coord.init_producer_id(InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=timeout_ms,
            enable_two_phase_commit=two_phase, keep_prepared_txn=keep_prepared,
            producer_id=producer[0], producer_epoch=producer[1]))

    def add(self, tid: str, pid: int, epoch: int, *tps: TopicPartition,
            verify_only: bool = False) -> AddPartitionsToTxnResponse:
        by_topic: dict[str, list[int]] = {}
        for tp in tps or (TopicPartition("t", 0),):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return self.coord.add_partitions(AddPartitionsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch,
            verify_only=verify_only,
            topics=[TxnTopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]))

    def end(self, tid: str, pid: int, epoch: int, committed: bool = True,
            with_prepared: list[PreparedTxn] | None = None) -> Future[None]:
        return self.coord.end_txn(EndTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=committed,
            with_prepared=with_prepared or []))

    def prepare(self, tid: str, pid: int, epoch: int) -> PreparedTxn:
        """Prepare; the state it returns (prepare bumps the epoch: the producer goes on at
        the returned one)."""
        response = self.coord.prepare(PrepareTxnRequest(transactional_id=tid, producer_id=pid,
                                                        producer_epoch=epoch))
        return PreparedTxn(transactional_id=tid, producer_id=response.producer_id,
                           producer_epoch=response.producer_epoch)

    def describe(self, tid: str) -> TransactionDescription:
        return self.coord.describe(tid)

    def state(self, tid: str) -> str:
        return self.describe(tid).state

    def write_markers(self) -> int:
        """Complete every decided transaction (as the marker sender does once each partition
        has its marker); how many completed."""
        jobs, self.jobs[:] = list(self.jobs), []
        return sum(self.coord.complete(job) for job in jobs)

    def tick(self) -> None:
        for future in self.coord.tick():
            future.result(5)


def ids_on_one_partition(count: int, prefix: str = "tx") -> list[str]:
    """``count`` transactional ids coordinated by the same partition."""
    target = key_partition(f"{prefix}-0", PARTITIONS)
    return [f"{prefix}-{i}" for i in range(10_000)
            if key_partition(f"{prefix}-{i}", PARTITIONS) == target][:count]


def id_elsewhere(tid: str, prefix: str = "other") -> str:
    """A transactional id coordinated by another partition than ``tid``'s."""
    mine = key_partition(tid, PARTITIONS)
    return next(f"{prefix}-{i}" for i in range(10_000)
                if key_partition(f"{prefix}-{i}", PARTITIONS) != mine)
