"""ZooKeeper killed with kill -9 and restarted on the same port and data directory: the store
keeps answering reads from its cache while ZooKeeper is away, refuses writes with a retriable
error within a bounded time, and afterwards reconnects in the same session (ephemeral znodes and
controllership intact), re-arms its watches and accepts writes again.

Its own ZooKeeper, so the restart does not disturb the tests sharing the session one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from logstore.controller.store import BrokerInfo, PartitionState, TopicRecord
from logstore.controller.zookeeper import KazooMetadataStore
from logstore.errors import RequestTimedOutError
from tests.zookeeper import ListenerProbe, ZooKeeperServer

SESSION_TIMEOUT_MS = 6000
RECOVERY_TIMEOUT_S = 30.0
T = TypeVar("T")


def _retry_until_written(write: Callable[[], T]) -> T:
    """Repeat a write that fails with the retriable timeout until ZooKeeper takes it; each try
    is bounded by the session timeout and all of them by RECOVERY_TIMEOUT_S."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        try:
            return write()
        except RequestTimedOutError:
            if time.monotonic() > deadline:
                raise


def test_store_survives_a_zookeeper_restart(private_zookeeper: ZooKeeperServer) -> None:
    connect = private_zookeeper.connect + "/logstore"
    store = KazooMetadataStore(connect, 1, SESSION_TIMEOUT_MS)
    observer = KazooMetadataStore(connect, 2, SESSION_TIMEOUT_MS)
    store.start()
    observer.start()
    try:
        store.register_broker(BrokerInfo(1, "127.0.0.1", 9201))
        observer.register_broker(BrokerInfo(2, "127.0.0.1", 9202))
        store.elect_controller(lambda epoch: None)
        epoch = store.controller_epoch
        store.create_topic(TopicRecord("t", {0: (1,)}), {0: PartitionState(1, 0, (1,), epoch)})
        session = store.client_id

        private_zookeeper.kill()
        assert store.topics()["t"].num_partitions == 1  # served from the cache
        with pytest.raises(RequestTimedOutError):
            store.create_topic(TopicRecord("u", {0: (1,)}), {})
        private_zookeeper.start()

        _retry_until_written(lambda: store.set_partition_state(
            "t", 0, PartitionState(1, 1, (1,), epoch), expected_epoch=0))
        assert store.client_id == session, "the session should survive a ZooKeeper restart"
        assert store.is_controller() and store.controller_id() == 1
        probe = ListenerProbe(observer)
        probe.wait_until(lambda: observer.partition_states("t")[0].leader_epoch == 1,
                         "the observer to see the write made after the restart")
        probe.wait_until(lambda: set(observer.brokers()) == {1, 2}, "both brokers registered")
        assert _retry_until_written(lambda: store.next_producer_id_block(10)) == 0
    finally:
        store.close()
        observer.close()
