"""Tiered-storage configuration: the broker and topic keys, the rules that tie them together,
and topic ids (remote objects are named by them)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from logstore.config import (
    GiB,
    TopicConfig,
    broker_config_from_dict,
    validate_tiering,
    validate_topic_config,
)
from logstore.controller import zk_paths as zp
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.controller.store import BrokerInfo, TopicRecord, legacy_topic_id
from logstore.controller.topics import TopicController
from logstore.errors import ConfigError, InvalidConfigError
from logstore.model import NewTopic

URI = "s3://bucket/logstore"


def test_broker_tiering_keys_have_kafkas_defaults_and_are_checked() -> None:
    """Goal: the broker keys exist with the documented defaults and bad values name the key.
    Method: parse an empty dict and dicts with one bad value each."""
    config = broker_config_from_dict({})
    assert config.remote_storage_uri is None and config.remote_storage_options == {}
    assert config.remote_log_manager_task_interval_ms == 30_000
    assert config.remote_log_manager_copy_max_bytes_per_second is None
    assert config.remote_log_reader_threads == 10
    assert config.remote_log_index_cache_bytes == GiB
    given = broker_config_from_dict({"remote_storage_uri": URI, "remote_storage_options": {
        "endpoint_url": "http://127.0.0.1:9000", "client_kwargs": {"region_name": "x"}}})
    assert given.remote_storage_options["endpoint_url"] == "http://127.0.0.1:9000"
    for bad, key in [({"remote_log_reader_threads": 0}, "remote_log_reader_threads"),
                     ({"remote_storage_uri": "bucket"}, "remote_storage_uri"),
                     ({"remote_storage_uri": "s3://"}, "remote_storage_uri"),
                     ({"remote_fetch_cache_bytes": "1"}, "remote_fetch_cache_bytes")]:
        with pytest.raises(ConfigError, match=key):
            broker_config_from_dict(bad, "b.toml")


@pytest.mark.parametrize("options", [{"key": "AKIA"}, {"secret": "s"}, {"token": "t"},
                                     {"client_kwargs": {"aws_secret_access_key": "s"}}])
def test_credentials_in_remote_storage_options_are_refused(options: dict[str, object]) -> None:
    """Goal: credentials never live in conf/. Method: put a credential-like key (at any depth)
    in remote_storage_options; the error names it and says where credentials come from."""
    with pytest.raises(ConfigError, match="credential chain"):
        broker_config_from_dict({"remote_storage_uri": URI, "remote_storage_options": options})


def test_local_retention_takes_minus_two_for_the_total() -> None:
    """Goal: Kafka's local_retention_* semantics. Method: -2 resolves to the total retention,
    -1 to unlimited, a number to itself; other negatives are refused."""
    config = TopicConfig(retention_ms=5000, retention_bytes=None)
    assert config.effective_local_retention_ms == 5000
    assert config.effective_local_retention_bytes is None
    changed = config.updated({"local.retention.ms": "100", "local_retention_bytes": -1,
                              "remote.storage.enable": "true"})
    assert changed.effective_local_retention_ms == 100
    assert changed.local_retention_bytes is None and changed.remote_storage_enable
    with pytest.raises(InvalidConfigError, match="local_retention_ms"):
        validate_topic_config({"local_retention_ms": -3})


def test_tiering_a_compacted_topic_is_refused_naming_topic_and_settings() -> None:
    """Goal: as in Kafka, compacted topics are not tiered. Method: validate a compacted config
    with remote_storage_enable; the error names the topic and both settings."""
    config = TopicConfig(cleanup_policy="compact", remote_storage_enable=True)
    with pytest.raises(InvalidConfigError,
                       match="'orders'.*remote_storage_enable=true.*cleanup_policy='compact'"):
        validate_tiering("orders", config, URI)


def test_tiering_without_a_remote_store_or_switching_it_off_is_refused() -> None:
    """Goal: a topic cannot ask for tiering the broker cannot do, or drop its remote data.
    Method: enable without remote_storage_uri; disable an enabled topic; local retention above
    the total."""
    on = TopicConfig(remote_storage_enable=True)
    with pytest.raises(InvalidConfigError, match="'t'.*remote_storage_uri"):
        validate_tiering("t", on, None)
    with pytest.raises(InvalidConfigError, match="cannot be switched off"):
        validate_tiering("t", TopicConfig(), URI, previous=on)
    with pytest.raises(InvalidConfigError, match="local_retention_ms=10.*retention_ms=5"):
        validate_tiering("t", TopicConfig(remote_storage_enable=True, retention_ms=5,
                                          local_retention_ms=10), URI)
    validate_tiering("t", on, URI)


def _controller(tmp_path: Path, uri: str | None = URI) -> tuple[TopicController,
                                                                 LocalMetadataStore]:
    store = LocalMetadataStore(tmp_path / METADATA_FILE, 1)
    store.start()
    store.register_broker(BrokerInfo(1, "127.0.0.1", 9092))
    return TopicController(store, TopicConfig(), remote_storage_uri=uri), store


def test_new_topics_get_a_fresh_id_that_changes_keep(tmp_path: Path) -> None:
    """Goal: a topic id tells a topic from an earlier one of the same name, and stays with the
    topic. Method: create, alter and grow a topic, delete and recreate it; the id survives the
    changes and the recreated topic has another."""
    controller, store = _controller(tmp_path)
    first = controller.create_topic(NewTopic("orders", 1))
    assert len(first.topic_id) == 32 and first.topic_id != legacy_topic_id("orders")
    controller.alter_config("orders", {"remote_storage_enable": True})
    controller.create_partitions("orders", 3)
    assert store.topics()["orders"].topic_id == first.topic_id
    with pytest.raises(InvalidConfigError, match="switched off"):
        controller.alter_config("orders", {"remote_storage_enable": False})
    controller.delete_topic("orders")
    assert controller.create_topic(NewTopic("orders", 1)).topic_id != first.topic_id


def test_controller_refuses_tiering_a_compacted_topic(tmp_path: Path) -> None:
    """Goal: the refusal reaches topic creation and alteration. Method: create a compacted
    tiered topic, and tier a compacted one; both fail naming the topic."""
    controller, _ = _controller(tmp_path)
    with pytest.raises(InvalidConfigError, match="'c'.*cleanup_policy"):
        controller.create_topic(NewTopic("c", 1, config={
            "cleanup.policy": "compact", "remote.storage.enable": "true"}))
    controller.create_topic(NewTopic("c", 1, config={"cleanup.policy": "compact"}))
    with pytest.raises(InvalidConfigError, match="'c'.*cleanup_policy"):
        controller.alter_config("c", {"remote_storage_enable": True})
    untiered, _ = _controller(tmp_path / "other", uri=None)
    with pytest.raises(InvalidConfigError, match="remote_storage_uri"):
        untiered.create_topic(NewTopic("d", 1, config={"remote_storage_enable": True}))


def test_topic_records_without_an_id_get_a_stable_one() -> None:
    """Goal: records written before topic ids existed still read, and every broker derives the
    same id for them. Method: decode topic JSON without topic_id twice; encode and decode one
    with an id."""
    old = orjson.dumps({"version": 1, "name": "t", "replicas": {"0": [1]}})
    assert zp.decode_topic(old).topic_id == zp.decode_topic(old).topic_id == legacy_topic_id("t")
    record = TopicRecord("t", {0: (1,)}, topic_id="ab" * 16)
    assert zp.decode_topic(zp.encode_topic(record)).topic_id == "ab" * 16
