"""A three-broker cluster on a real ZooKeeper for the replication fault tests.

``Cluster`` starts brokers 1..3 (real processes, tests/brokers.py) with a short ZooKeeper
session and lag time, and offers bounded waits on the metadata every broker serves: who leads
a partition, its ISR. Extra keyword arguments are broker settings for every broker. ``client``
holds the client settings every client of the cluster uses (security: tests/security.py's
``cluster_security`` makes both for a TLS or SASL_SSL cluster). No fixed sleeps: every wait
polls a condition with a deadline.
"""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

from logstore import Admin, Consumer, NewTopic, TopicPartition
from logstore.client.admin import PartitionDescription
from logstore.errors import ApiError
from logstore.messages.topics import MetadataRequest
from logstore.model import LATEST
from logstore.rpc.client import BrokerConnection
from logstore.security.config import client_security
from tests.brokers import BrokerFactory, BrokerProcess
from tests.helpers import WAIT_S, wait_for

SESSION_TIMEOUT_MS = 3000
LAG_TIME_MS = 1500
# What asking a cluster in the middle of a failover may raise: waits on cluster state retry it.
FAILOVER_ERRORS: tuple[type[Exception], ...] = (ApiError, OSError)


def consume_partitions(cluster: Cluster, topic: str, partitions: list[int],
                       timeout_s: float = WAIT_S) -> dict[int, list[bytes]]:
    """The values of each partition from offset 0 to its high watermark as listed first, so
    acknowledged records at the tail cannot be missed; fails if they are not all read within
    ``timeout_s``."""
    tps = [TopicPartition(topic, p) for p in partitions]
    with Admin(cluster.live_bootstrap(), **cluster.client) as admin:
        ends = wait_for(lambda: admin.list_offsets({tp: LATEST for tp in tps}),
                        "the high watermarks", tolerate=FAILOVER_ERRORS)
    values: dict[int, list[bytes]] = {p: [] for p in partitions}
    with Consumer(cluster.live_bootstrap(), auto_offset_reset="earliest",
                  **cluster.client) as consumer:
        consumer.assign(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, \
                f"read {[consumer.position(tp) for tp in tps]} of {ends} in {timeout_s} s"
            for tp, table in consumer.poll_arrow(timeout_ms=300).items():
                values[tp.partition] += table.column("value").to_pylist()
    return values


class Cluster:
    def __init__(self, factory: BrokerFactory, zk_connect: str, size: int = 3,
                 lag_time_ms: int = LAG_TIME_MS, racks: dict[int, str] | None = None,
                 client: dict[str, Any] | None = None, **settings: Any) -> None:
        self.client = client or {}
        self.brokers: dict[int, BrokerProcess] = {}
        for i in range(1, size + 1):
            rack = {"rack": racks[i]} if racks and i in racks else {}
            self.brokers[i] = factory(
                broker_id=i, zk_connect=zk_connect, zk_session_timeout_ms=SESSION_TIMEOUT_MS,
                replica_lag_time_max_ms=lag_time_ms, **rack, **settings)
        self.bootstrap = [b.bootstrap for b in self.brokers.values()]
        self.frozen: set[int] = set()

    def freeze(self, broker_id: int) -> None:
        """SIGSTOP a broker; the cluster's own requests avoid it until ``thaw``."""
        self.frozen.add(broker_id)
        self.brokers[broker_id].kill(signal.SIGSTOP)

    def thaw(self, broker_id: int) -> None:
        self.brokers[broker_id].kill(signal.SIGCONT)
        self.frozen.discard(broker_id)

    def controller_id(self) -> int:
        """The controller, as a live broker's metadata names it (waits for one)."""
        def ask() -> int | None:
            conn = BrokerConnection(self.live_bootstrap()[0], timeout_s=5,
                                    security=client_security(self.client))
            try:
                return conn.call(MetadataRequest(topics=[])).controller_id
            finally:
                conn.close()
        return int(wait_for(lambda: (c := ask()) is not None and c in self.brokers
                            and self.brokers[c].running and str(c), "a live controller",
                            tolerate=FAILOVER_ERRORS))

    def live_bootstrap(self) -> list[str]:
        return [b.bootstrap for i, b in self.brokers.items()
                if b.running and i not in self.frozen]

    def admin(self) -> Admin:
        return Admin(self.live_bootstrap(), **self.client)

    def create_topic(self, partitions: int = 1, rf: int = 3, **config: Any) -> str:
        name = f"r-{uuid.uuid4().hex[:8]}"
        with self.admin() as admin:
            admin.create_topics([NewTopic(name, partitions, rf, config=dict(config))])
        for p in range(partitions):
            self.wait_for_isr(name, p, rf)
        return name

    def describe(self, topic: str, partition: int = 0) -> PartitionDescription:
        with self.admin() as admin:
            return admin.describe_topics([topic])[0].partitions[partition]

    def wait_for_isr(self, topic: str, partition: int, size: int,
                     timeout_s: float = WAIT_S) -> PartitionDescription:
        return wait_for(lambda: (d := self.describe(topic, partition)).leader >= 0
                        and len(d.isr) == size and d, f"{topic}-{partition} isr of {size}",
                        timeout_s, FAILOVER_ERRORS)

    def leader(self, topic: str, partition: int = 0) -> BrokerProcess:
        return self.brokers[self.describe(topic, partition).leader]

    def wait_for_new_leader(self, topic: str, old: int, partition: int = 0,
                            timeout_s: float = WAIT_S) -> int:
        return int(wait_for(lambda: (d := self.describe(topic, partition)).leader not in (
            -1, old) and d.leader, f"a leader other than {old}", timeout_s, FAILOVER_ERRORS))
