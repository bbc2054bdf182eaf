"""Unit tests of the topic controller's checks of a topic's config against its replicas.

Goal: min_insync_replicas larger than the replication factor (no acks=all write could
succeed) is refused on create, on alter, and when it comes from the brokers' topic
defaults, naming the topic and both values; an alter's other errors name the topic too.
Method: ``TopicController`` over a ``LocalMetadataStore`` with one broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.config import TopicConfig
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo
from logstore.controller.topics import TopicController
from logstore.errors import InvalidConfigError
from logstore.model import NewTopic


def controller(tmp_path: Path, defaults: TopicConfig | None = None) -> TopicController:
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 1)
    store.start()
    store.register_broker(BrokerInfo(1, "127.0.0.1", 9092))
    return TopicController(store, defaults or TopicConfig())


def test_min_insync_above_the_replication_factor_is_refused_on_create(tmp_path: Path) -> None:
    topics = controller(tmp_path)
    [error] = topics.create_topics([NewTopic("t", 1, replication_factor=1,
                                             config={"min_insync_replicas": 2})])
    assert isinstance(error, InvalidConfigError)
    assert "'t'" in error.message and "min_insync_replicas 2" in error.message
    assert "replication factor 1" in error.message
    assert topics.create_topics([NewTopic("u", 1, replication_factor=1,
                                          config={"min_insync_replicas": 1})]) == [None]


def test_a_default_min_insync_above_the_replication_factor_is_refused(tmp_path: Path) -> None:
    topics = controller(tmp_path, TopicConfig(min_insync_replicas=2))
    [error] = topics.create_topics([NewTopic("t", 1, replication_factor=1)])
    assert isinstance(error, InvalidConfigError) and "topic default" in error.message


def test_min_insync_above_the_replication_factor_is_refused_on_alter(tmp_path: Path) -> None:
    topics = controller(tmp_path)
    topics.create_topic(NewTopic("t", 1, replication_factor=1))
    with pytest.raises(InvalidConfigError, match=r"'t'.*min_insync_replicas 2.*factor 1"):
        topics.alter_config("t", {"min_insync_replicas": 2})
    assert topics.alter_config("t", {"min_insync_replicas": 1}).config == {
        "min_insync_replicas": 1}
