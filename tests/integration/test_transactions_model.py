"""read_committed never returns aborted or open data: a randomised test against a model.

Goal: whatever mix of committed, aborted and still-open transactions (of several
transactional ids) and plain records a partition holds, a read_committed consumer returns
exactly the model's view: per partition, in offset order, the records of committed
transactions and the plain records below the first still-open transaction, nothing else; once
the open ones are aborted, every committed record. Method: a seeded random program (the
``seed`` fixture; LOGSTORE_TEST_SEED replays it) of begin/send/commit/abort/plain-send steps
by three producers on a real broker, each send flushed so the model knows the log's order;
then the consumer's view is compared with the model's.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from logstore import Admin, Producer
from tests.brokers import BrokerFactory, BrokerProcess, new_topic
from tests.txn_reading import read_values

PARTITIONS = 3
STEPS = 120


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("txn-model"))
    yield factory()
    factory.stop_all()


@dataclass
class Model:
    """Each partition's records in log order, with the transaction they belong to."""

    log: dict[int, list[tuple[bytes, int | None]]] = field(
        default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    committed: set[int] = field(default_factory=set)
    open: set[int] = field(default_factory=set)

    def visible(self) -> dict[int, list[bytes]]:
        out = {}
        for p, entries in self.log.items():
            first_open = next((i for i, (_, t) in enumerate(entries) if t in self.open),
                              len(entries))
            out[p] = [v for v, t in entries[:first_open] if t is None or t in self.committed]
        return out


class Program:
    def __init__(self, rng: random.Random, producers: list[Producer], plain: Producer,
                 topic: str) -> None:
        self.rng, self.producers, self.plain, self.topic = rng, producers, plain, topic
        self.model = Model()
        self.current: dict[int, int | None] = dict.fromkeys(range(len(producers)))
        self.next_txn = 0
        self.counter = 0

    def step(self) -> None:
        who = self.rng.randrange(len(self.producers) + 1)
        if who == len(self.producers):
            self._send(self.plain, None)
            return
        txn = self.current[who]
        if txn is None:
            self.producers[who].begin_transaction()
            self.current[who] = txn = self.next_txn
            self.model.open.add(txn)
            self.next_txn += 1
        action = self.rng.choices(["send", "commit", "abort"], [6, 2, 1])[0]
        if action == "send":
            self._send(self.producers[who], txn)
        else:
            self._end(who, txn, action == "commit")

    def _send(self, producer: Producer, txn: int | None) -> None:
        partition = self.rng.randrange(PARTITIONS)
        value = b"v%d" % self.counter
        self.counter += 1
        producer.send(self.topic, value=value, partition=partition).result(30)
        self.model.log[partition].append((value, txn))

    def _end(self, who: int, txn: int, commit: bool) -> None:
        producer = self.producers[who]
        (producer.commit_transaction if commit else producer.abort_transaction)()
        self.model.open.discard(txn)
        if commit:
            self.model.committed.add(txn)
        self.current[who] = None

    def abort_open(self) -> None:
        for who, txn in self.current.items():
            if txn is not None:
                self._end(who, txn, commit=False)


def test_read_committed_matches_the_model(mbroker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    with Admin(mbroker.bootstrap) as admin:
        topic = new_topic(admin, PARTITIONS)
    producers = [Producer(mbroker.bootstrap, transactional_id=f"m-{uuid.uuid4().hex[:6]}-{i}",
                          linger_ms=0) for i in range(3)]
    plain = Producer(mbroker.bootstrap, linger_ms=0)
    try:
        for producer in producers:
            producer.init_transactions()
        program = Program(rng, producers, plain, topic)
        for _ in range(STEPS):
            program.step()
        assert read_values(mbroker.bootstrap, topic, range(PARTITIONS)) == \
            program.model.visible(), f"seed {seed}: with open transactions"
        program.abort_open()
        assert read_values(mbroker.bootstrap, topic, range(PARTITIONS)) == \
            program.model.visible(), f"seed {seed}: all transactions ended"
    finally:
        for producer in [*producers, plain]:
            producer.close()
