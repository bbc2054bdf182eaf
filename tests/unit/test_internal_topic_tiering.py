"""Unit tests of ``[topic_defaults] remote_storage_enable = true`` (tier every topic).

Goal: the internal compacted topics (``__consumer_offsets``, ``__transaction_state``) are never
tiered whatever the defaults say, so groups and transactions keep working; and topic_defaults
whose tiering settings no topic could have are refused at startup, naming the config file.
Method: ``InternalTopic`` over a ``TopicController`` whose defaults tier every topic;
``broker_config_from_dict`` on small dicts.
"""

from __future__ import annotations

from pathlib import Path

from logstore.broker.coordinator_log import InternalTopic, InternalTopicSpec
from logstore.config import TopicConfig, broker_config_from_dict
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo
from logstore.controller.topics import TopicController
from tests.unit.test_broker_start_checks import SOURCE
from tests.unit.test_broker_start_checks import refused as config_refused


def refused(raw: dict[str, object]) -> str:
    """The startup error of ``raw``, which names the file and topic_defaults."""
    message = config_refused(raw)
    assert message.startswith(f"{SOURCE}: topic_defaults: ")
    return message


def test_topic_defaults_tiering_is_checked_at_startup() -> None:
    assert "needs remote_storage_uri" in refused({"topic_defaults":
                                                  {"remote_storage_enable": True}})
    assert "compacted topics" in refused({
        "remote_storage_uri": "file:///tmp/tier",
        "topic_defaults": {"remote_storage_enable": True, "cleanup_policy": "compact"}})
    assert "local_retention_ms=10 is larger than retention_ms=5" in refused({
        "remote_storage_uri": "file:///tmp/tier",
        "topic_defaults": {"remote_storage_enable": True, "retention_ms": 5,
                           "local_retention_ms": 10}})
    broker_config_from_dict({"remote_storage_uri": "file:///tmp/tier",
                             "topic_defaults": {"remote_storage_enable": True}})


def test_internal_topics_are_never_tiered(tmp_path: Path) -> None:
    """Every topic is tiered by default, yet __consumer_offsets is created (compacted, not
    tiered): a tiered compacted topic would be refused and every group with it."""
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 0)
    store.start()
    store.register_broker(BrokerInfo(0, "127.0.0.1", 9092))
    defaults = TopicConfig(remote_storage_enable=True)
    topics = TopicController(store, defaults, remote_storage_uri="file:///tmp/tier")
    internal = InternalTopic(store, topics, InternalTopicSpec("__consumer_offsets", 2, 3, 1024))
    assert internal.ensure() == 2
    config = defaults.updated(store.topics()["__consumer_offsets"].config)
    assert config.compact and not config.remote_storage_enable
