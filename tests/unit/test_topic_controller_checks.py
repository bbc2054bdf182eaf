"""Unit tests of the topic controller's checks of a topic's config against its replicas.

Goal: min_insync_replicas larger than the replication factor is accepted, as in Kafka (it
binds acks=all writes only); an empty value is refused; an alter's errors name the topic; a
value schema with a dictionary column is refused naming it.
Method: ``TopicController`` over a ``LocalMetadataStore`` with one broker.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from logstore.config import TopicConfig
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo
from logstore.controller.topics import TopicController
from logstore.errors import ErrorCode, InvalidConfigError, InvalidRequestError
from logstore.model import NewTopic


def controller(tmp_path: Path, defaults: TopicConfig | None = None) -> TopicController:
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 1)
    store.start()
    store.register_broker(BrokerInfo(1, "127.0.0.1", 9092))
    return TopicController(store, defaults or TopicConfig())


def test_min_insync_above_the_replication_factor_is_accepted_as_in_kafka(
        tmp_path: Path) -> None:
    """min_insync_replicas binds acks=all writes only (they fail with NOT_ENOUGH_REPLICAS,
    which a producer's expiry names): a cluster whose topic defaults ask for 2 still creates
    replication-factor-1 topics for acks=1 producers, as Kafka does; so do a topic's own
    value and an alter."""
    topics = controller(tmp_path, TopicConfig(min_insync_replicas=2))
    assert topics.create_topics([NewTopic("t", 1, replication_factor=1)]) == [None]
    assert topics.create_topics([NewTopic("u", 1, replication_factor=1,
                                          config={"min_insync_replicas": 3})]) == [None]
    topics.alter_config("t", {"min_insync_replicas": 4}, incremental=True)


@pytest.mark.parametrize("empty", ["", " ", "none", "NULL"])
def test_an_empty_value_is_refused_and_only_minus_one_is_unlimited(tmp_path: Path,
                                                                    empty: str) -> None:
    """``--config retention.ms=$UNSET`` once meant unlimited retention."""
    topics = controller(tmp_path)
    [error] = topics.create_topics([NewTopic("t", 1, config={"retention.ms": empty})])
    assert isinstance(error, InvalidConfigError)
    assert "'t'" in error.message and "'retention_ms'" in error.message
    assert "-1 means unlimited" in error.message
    topics.create_topic(NewTopic("u", 1, config={"retention.ms": "-1", "flush.ms": "5"}))
    assert topics.topic_config("u").retention_ms is None
    with pytest.raises(InvalidConfigError, match=r"topic 'u'.*'flush_ms'"):
        topics.alter_config("u", {"flush.ms": empty})
    assert topics.alter_config("u", {"flush.ms": "-1"}).config["flush_ms"] is None


def test_an_alter_error_names_the_topic(tmp_path: Path) -> None:
    topics = controller(tmp_path)
    topics.create_topic(NewTopic("t", 1))
    with pytest.raises(InvalidConfigError, match=r"topic 't': unknown topic config key"):
        topics.alter_config("t", {"retention.msx": "5"})


@pytest.mark.parametrize(("value_type", "path"), [
    (pa.dictionary(pa.int32(), pa.string()), "city"),
    (pa.struct([pa.field("c", pa.dictionary(pa.int8(), pa.string()))]), "city.c"),
    (pa.list_(pa.dictionary(pa.int8(), pa.string())), "city.item"),
    (pa.map_(pa.string(), pa.dictionary(pa.int8(), pa.int64())), "city.entries.value"),
])
def test_a_dictionary_column_at_any_depth_is_refused_naming_it(
        tmp_path: Path, value_type: pa.DataType, path: str) -> None:
    """A dictionary column used to be accepted, and then every write failed with a misleading
    CORRUPT_MESSAGE: the client's IPC writer sends a dictionary message first, the broker takes
    one record-batch message per batch. Creation refuses it, INVALID_REQUEST naming the topic
    and the column; other nested types are still accepted."""
    topics = controller(tmp_path)
    schema = pa.schema([("city", value_type), ("n", pa.int64())])
    [error] = topics.create_topics([NewTopic("t", 1, value_schema=schema)])
    assert isinstance(error, InvalidRequestError)
    assert error.code == ErrorCode.INVALID_REQUEST
    assert "'t'" in error.message and f"column {path!r}" in error.message
    plain = pa.schema([("city", pa.struct([pa.field("c", pa.list_(pa.string()))]))])
    assert topics.create_topics([NewTopic("u", 1, value_schema=plain)]) == [None]
