"""Broker and topic configuration.

Owns: the declared config keys (type, default, validator, doc) for the broker and topic scopes,
and parsing of broker TOML files. Unknown keys are rejected with a message naming the key and
the file. Topic config keys accept Kafka's dotted spelling too (``retention.ms`` is
``retention_ms``). Must not: read files at import time or hold a module-level config object.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError, InvalidConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
DAY_MS = 24 * 3600 * 1000

CLEANUP_POLICIES = ("delete", "compact", "compact,delete", "delete,compact")
COMPRESSION_TYPES = ("none", "lz4", "zstd")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
DEFAULT_LISTENER = "127.0.0.1:9092"
EMBEDDED_OFFSETS_PARTITIONS = 8
CLUSTER_OFFSETS_PARTITIONS = 50


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _non_negative(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _optional_non_negative(v: Any) -> bool:
    return v is None or _non_negative(v)


def _boolean(v: Any) -> bool:
    return isinstance(v, bool)


def _one_of(choices: tuple[str, ...]):  # noqa: ANN202
    return lambda v: v in choices


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """Per-topic settings. ``None`` for retention means unlimited; for flush_ms, no forced fsync
    (the operating system flushes, as in Kafka); ``flush_ms = 0`` fsyncs before every
    acknowledgement, with group commit."""

    segment_bytes: int = 128 * MiB
    segment_ms: int = 7 * DAY_MS
    segment_index_bytes: int = 10 * MiB
    index_interval_bytes: int = 4 * KiB
    retention_ms: int | None = 7 * DAY_MS
    retention_bytes: int | None = None
    cleanup_policy: str = "delete"
    delete_retention_ms: int = DAY_MS
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    flush_ms: int | None = None
    max_message_bytes: int = 8 * MiB
    message_timestamp_type: str = "CreateTime"
    compression_type: str = "none"
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def updated(self, changes: dict[str, Any]) -> TopicConfig:
        """A copy with ``changes`` applied after validation (raises InvalidConfigError)."""
        return replace(self, **validate_topic_config(changes))


_TOPIC_VALIDATORS = {
    "segment_bytes": _positive,
    "segment_ms": _positive,
    "segment_index_bytes": _positive,
    "index_interval_bytes": _positive,
    "retention_ms": _optional_non_negative,
    "retention_bytes": _optional_non_negative,
    "cleanup_policy": _one_of(CLEANUP_POLICIES),
    "delete_retention_ms": _non_negative,
    "min_compaction_lag_ms": _non_negative,
    "min_cleanable_dirty_ratio": lambda v: isinstance(v, int | float) and 0 <= v <= 1,
    "flush_ms": _optional_non_negative,
    "max_message_bytes": _positive,
    "message_timestamp_type": _one_of(TIMESTAMP_TYPES),
    "compression_type": _one_of(COMPRESSION_TYPES),
    "min_insync_replicas": _positive,
    "unclean_leader_election_enable": _boolean,
}


def normalize_key(key: str) -> str:
    """``retention.ms`` -> ``retention_ms``: Kafka's spelling is accepted everywhere."""
    return key.replace(".", "_").replace("-", "_")


def validate_topic_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Normalised, validated topic config changes. Values may come as strings (from the CLI);
    -1 for retention means unlimited as in Kafka. Raises InvalidConfigError naming the key."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = normalize_key(key)
        validator = _TOPIC_VALIDATORS.get(name)
        if validator is None:
            raise InvalidConfigError(f"unknown topic config key {key!r}; known keys: "
                                     f"{', '.join(sorted(_TOPIC_VALIDATORS))}")
        value = _coerce(name, value)
        if not validator(value):
            raise InvalidConfigError(f"invalid value {value!r} for topic config {key!r}")
        out[name] = value
    return out


def _coerce(name: str, value: Any) -> Any:
    default = getattr(TopicConfig(), name)
    if isinstance(value, str) and not isinstance(default, str):
        text = value.strip().lower()
        if text in ("null", "none", ""):
            return None
        if isinstance(default, bool):
            return {"true": True, "false": False}.get(text, value)
        try:
            value = float(text) if isinstance(default, float) else int(text)
        except ValueError:
            return value
    if name in ("retention_ms", "retention_bytes") and value == -1:
        return None
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """Process-level settings of one broker, read from a TOML file. Without ``zk_connect``
    the broker runs alone with embedded coordination; with it, it joins the cluster whose
    metadata lives in that ZooKeeper (``host:port[,host:port][/chroot]``)."""

    broker_id: int = 0
    listener: str = DEFAULT_LISTENER
    log_dirs: tuple[str, ...] = ("./data",)
    rack: str | None = None
    zk_connect: str | None = None
    zk_session_timeout_ms: int = 18_000
    replica_lag_time_max_ms: int = 30_000
    log_retention_check_interval_ms: int = 60_000
    log_cleaner_interval_ms: int = 15_000
    topic_defaults: dict[str, Any] = field(default_factory=dict)
    # Consumer groups (Kafka's names). offsets_topic_num_partitions None means Kafka's 50 in a
    # cluster and 8 for an embedded broker, where 50 partitions (each with open segment and
    # index files) would cost more than one process's groups need.
    offsets_topic_num_partitions: int | None = None
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 * MiB
    offsets_retention_minutes: int = 7 * 24 * 60
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000

    @property
    def offsets_partitions(self) -> int:
        if self.offsets_topic_num_partitions is not None:
            return self.offsets_topic_num_partitions
        return EMBEDDED_OFFSETS_PARTITIONS if self.zk_connect is None else \
            CLUSTER_OFFSETS_PARTITIONS

    @property
    def host(self) -> str:
        return self.listener.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listener.rsplit(":", 1)[1])

    def default_topic_config(self) -> TopicConfig:
        return TopicConfig().updated(self.topic_defaults)


_BROKER_TYPES: dict[str, tuple[type, ...]] = {
    # Only keys something reads, so a file naming a key nothing reads fails loudly.
    "broker_id": (int,), "listener": (str,), "log_dirs": (list, str), "rack": (str,),
    "zk_connect": (str,), "zk_session_timeout_ms": (int,), "replica_lag_time_max_ms": (int,),
    "log_retention_check_interval_ms": (int,), "log_cleaner_interval_ms": (int,),
    "topic_defaults": (dict,),
    "offsets_topic_num_partitions": (int,), "offsets_topic_replication_factor": (int,),
    "offsets_topic_segment_bytes": (int,), "offsets_retention_minutes": (int,),
    "group_initial_rebalance_delay_ms": (int,), "group_min_session_timeout_ms": (int,),
    "group_max_session_timeout_ms": (int,),
}
_POSITIVE_BROKER_KEYS = ("offsets_topic_num_partitions", "offsets_topic_replication_factor",
                         "offsets_topic_segment_bytes", "offsets_retention_minutes",
                         "group_min_session_timeout_ms", "group_max_session_timeout_ms")


def broker_config_from_dict(raw: dict[str, Any], source: str = "<dict>") -> BrokerConfig:
    """Validate ``raw`` (as parsed from ``source``) into a BrokerConfig; ConfigError names the
    key and the source."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        types = _BROKER_TYPES.get(key)
        if types is None:
            raise ConfigError(f"{source}: unknown key {key!r}; known keys: "
                              f"{', '.join(sorted(_BROKER_TYPES))}")
        if not isinstance(value, types) or isinstance(value, bool):
            raise ConfigError(f"{source}: key {key!r} must be {types[0].__name__}, "
                              f"got {value!r}")
        values[key] = value
    if isinstance(values.get("log_dirs"), str):
        values["log_dirs"] = [values["log_dirs"]]
    if "log_dirs" in values:
        if not values["log_dirs"]:
            raise ConfigError(f"{source}: log_dirs must name at least one directory")
        values["log_dirs"] = tuple(str(d) for d in values["log_dirs"])
    # (Not BrokerConfig.listener: with slots=True that is a descriptor, not the default.)
    _check_listener(values.get("listener", DEFAULT_LISTENER), source)
    if "zk_connect" in values and not values["zk_connect"].strip():
        raise ConfigError(f"{source}: zk_connect must name at least one host:port")
    for key in ("zk_session_timeout_ms", "replica_lag_time_max_ms", *_POSITIVE_BROKER_KEYS):
        if values.get(key, 1) <= 0:
            raise ConfigError(f"{source}: {key} must be positive")
    if values.get("group_initial_rebalance_delay_ms", 0) < 0:
        raise ConfigError(f"{source}: group_initial_rebalance_delay_ms must be >= 0")
    try:
        validate_topic_config(values.get("topic_defaults", {}))
    except InvalidConfigError as e:
        raise ConfigError(f"{source}: topic_defaults: {e.message}") from None
    return BrokerConfig(**values)


def _check_listener(listener: str, source: str) -> None:
    host, sep, port = listener.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{source}: listener must be 'host:port', got {listener!r}")


def load_broker_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BrokerConfig:
    """Parse a broker TOML file; relative log_dirs are taken relative to the working directory."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    raw.update(overrides or {})
    return broker_config_from_dict(raw, str(path))
