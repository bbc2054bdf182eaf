"""Pure parts of cluster coordination: zk_connect parsing, the znode layout and its versioned
JSON, and the watched cache's rule against keeping stale reads."""

from __future__ import annotations

import threading

import orjson
import pyarrow as pa
import pytest

from logstore.controller import zk_paths as zp
from logstore.controller.store import BrokerInfo, PartitionState, TopicRecord
from logstore.controller.zk_cache import (
    BROKERS_KEY,
    CONTROLLER_KEY,
    TOPICS_KEY,
    WatchedCache,
    key_for,
    states_key,
)
from logstore.errors import ConfigError


@pytest.mark.parametrize(("connect", "hosts", "chroot"), [
    ("127.0.0.1:2181", "127.0.0.1:2181", None),
    ("127.0.0.1:2181/", "127.0.0.1:2181", None),
    ("127.0.0.1:2181/logstore", "127.0.0.1:2181", "/logstore"),
    ("a:1,b:2,c:3/clusters/prod", "a:1,b:2,c:3", "/clusters/prod"),
])
def test_zk_connect_splits_into_hosts_and_chroot(connect: str, hosts: str,
                                                 chroot: str | None) -> None:
    assert zp.split_zk_connect(connect) == (hosts, chroot)


@pytest.mark.parametrize("connect", ["", "/logstore", "a:1,,b:2", "a:1/x//y", "a:1/x/../y",
                                     "a:1/x/"])
def test_malformed_zk_connect_is_a_config_error(connect: str) -> None:
    with pytest.raises(ConfigError, match="zk_connect"):
        zp.split_zk_connect(connect)


def test_znode_paths_follow_kafkas_layout() -> None:
    assert zp.broker_path(3) == "/brokers/ids/3"
    assert zp.topic_path("t") == "/brokers/topics/t"
    assert zp.partition_state_path("t", 2) == "/brokers/topics/t/partitions/2/state"
    assert zp.topic_of("/brokers/topics/t/partitions/2/state") == "t"
    assert zp.topic_of("/brokers/topics") is None and zp.topic_of("/controller") is None


def test_znode_json_round_trips_and_carries_a_version() -> None:
    schema = pa.schema([("x", pa.int32())])
    cases = [
        (BrokerInfo(1, "h", 9, "a"), zp.encode_broker, zp.decode_broker),
        (TopicRecord("t", {0: (1, 2)}, {"retention_ms": 5}, schema, True), zp.encode_topic,
         zp.decode_topic),
        (PartitionState(2, 4, (2, 1), 3), zp.encode_partition_state, zp.decode_partition_state),
        (zp.ControllerZNode(1, 123), zp.encode_controller, zp.decode_controller),
        (7, zp.encode_controller_epoch, zp.decode_controller_epoch),
        (zp.ProducerIdBlock(1, 1000, 1999), zp.encode_producer_id_block,
         zp.decode_producer_id_block),
    ]
    for value, encode, decode in cases:
        data = encode(value)  # type: ignore[operator]
        assert orjson.loads(data)["version"] == 1
        assert decode(data) == value  # type: ignore[operator]


def test_newer_or_unversioned_znode_json_is_refused() -> None:
    with pytest.raises(ValueError, match="newer"):
        zp.decode_controller_epoch(orjson.dumps({"version": 2, "epoch": 1}))
    with pytest.raises(ValueError, match="not versioned"):
        zp.decode_controller_epoch(b"5")


def test_watched_paths_map_to_their_cache_keys() -> None:
    assert key_for("/brokers/ids") == key_for("/brokers/ids/1") == BROKERS_KEY
    assert key_for("/brokers/topics") == key_for("/brokers/topics/t") == TOPICS_KEY
    assert key_for("/brokers/topics/t/partitions") == states_key("t")
    assert key_for("/brokers/topics/t/partitions/0/state") == states_key("t")
    assert key_for("/controller") == CONTROLLER_KEY
    assert key_for("/controller_epoch") is None


def test_cache_keeps_watched_values_until_invalidated() -> None:
    cache, loads = WatchedCache(), []

    def load() -> tuple[int, bool]:
        loads.append(1)
        return len(loads), True

    assert cache.get("k", load) == 1 and cache.get("k", load) == 1
    cache.invalidate("k")
    assert cache.get("k", load) == 2
    assert cache.refresh("k", load) == 3 and cache.get("k", load) == 3
    cache.retain({"other"})
    assert cache.get("k", load) == 4
    assert cache.get("u", lambda: ("unwatched", False)) == "unwatched"
    assert cache.get("u", lambda: ("again", False)) == "again"


def test_refresh_serves_the_old_value_until_the_new_one_is_in() -> None:
    cache = WatchedCache()
    cache.get("k", lambda: ("old", True))
    seen_during_refresh: list[str] = []

    def load() -> tuple[str, bool]:
        seen_during_refresh.append(cache.get("k", lambda: ("miss", True)))
        return "new", True

    assert cache.refresh("k", load) == "new"
    assert seen_during_refresh == ["old"] and cache.get("k", load) == "new"


@pytest.mark.parametrize("reader", ["get", "refresh"])
def test_cache_does_not_keep_a_read_that_raced_with_a_watch(reader: str) -> None:
    """A load that was under way when its key was invalidated is returned to its caller but
    not kept: the next reader loads again and sees the change."""
    cache = WatchedCache()
    loading, release = threading.Event(), threading.Event()

    def slow_stale_load() -> tuple[str, bool]:
        loading.set()
        assert release.wait(10)
        return "stale", True

    result: list[str] = []
    read = cache.get if reader == "get" else cache.refresh
    thread = threading.Thread(target=lambda: result.append(read("k", slow_stale_load)))
    thread.start()
    assert loading.wait(10)
    cache.invalidate("k")
    release.set()
    thread.join(10)
    assert result == ["stale"]
    assert cache.get("k", lambda: ("fresh", True)) == "fresh"
