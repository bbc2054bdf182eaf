"""Unit tests of Kafka's topic-name collision rule: '.' and '_' are the same character in
metric names, so two topics whose names differ only there would report as one.

Goal: a topic whose name equals an existing topic's, or another's of the same request, once
'.' is read as '_', is refused with INVALID_TOPIC_EXCEPTION naming both (Kafka's "collides
with existing topic"); the same name again stays TOPIC_ALREADY_EXISTS; names with neither
character are never compared. Method: ``TopicController`` over a ``LocalMetadataStore`` with
one broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.config import TopicConfig
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo
from logstore.controller.topics import TopicController
from logstore.errors import InvalidTopicError, TopicAlreadyExistsError
from logstore.model import NewTopic


def controller(tmp_path: Path) -> tuple[TopicController, LocalMetadataStore]:
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 1)
    store.start()
    store.register_broker(BrokerInfo(1, "127.0.0.1", 9092))
    return TopicController(store, TopicConfig()), store


def test_a_name_differing_from_an_existing_one_only_in_dot_or_underscore_is_refused(
        tmp_path: Path) -> None:
    topics, store = controller(tmp_path)
    assert topics.create_topics([NewTopic("metrics.cpu_load", 1)]) == [None]
    [error] = topics.create_topics([NewTopic("metrics_cpu.load", 1)])
    assert isinstance(error, InvalidTopicError)
    assert "'metrics_cpu.load'" in error.message and "'metrics.cpu_load'" in error.message
    with pytest.raises(InvalidTopicError, match="collides"):
        topics.create_topic(NewTopic("metrics_cpu_load", 1))
    [again] = topics.create_topics([NewTopic("metrics.cpu_load", 1)])
    assert isinstance(again, TopicAlreadyExistsError)
    assert sorted(store.topics()) == ["metrics.cpu_load"]


def test_two_colliding_names_in_one_request_create_the_first_only(tmp_path: Path) -> None:
    topics, store = controller(tmp_path)
    first, second, other = topics.create_topics(
        [NewTopic("a.b", 1), NewTopic("a_b", 1), NewTopic("a-b", 1)])
    assert first is None and other is None
    assert isinstance(second, InvalidTopicError) and "'a.b'" in second.message
    assert sorted(store.topics()) == ["a-b", "a.b"]
