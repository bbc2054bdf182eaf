"""Broker and topic configuration.

Owns: the declared config keys (type, default, validator, doc) for the broker and topic scopes,
the rules that tie topic keys to each other and to the broker (tiered storage), and parsing of
broker TOML files. Unknown keys are rejected with a message naming the key and
the file. Topic config keys accept Kafka's dotted spelling too (``retention.ms`` is
``retention_ms``). Must not: read files at import time or hold a module-level config object.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError, InvalidConfigError
from logstore.security.config import SECURITY_TYPES, SecurityConfig, security_config_from_dict

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
DAY_MS = 24 * 3600 * 1000

CLEANUP_POLICIES = ("delete", "compact", "compact,delete", "delete,compact")
COMPRESSION_TYPES = ("none", "lz4", "zstd")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
DEFAULT_LISTENER = "127.0.0.1:9092"
# The memory pools a pyarrow wheel can give as its default (ARROW_DEFAULT_MEMORY_POOL).
ARROW_MEMORY_POOLS = ("system", "mimalloc", "jemalloc")
EMBEDDED_OFFSETS_PARTITIONS = 8
CLUSTER_OFFSETS_PARTITIONS = 50
HOUR_MS = 3600 * 1000
# local_retention_ms / local_retention_bytes: -2 means "the same as the total retention" (Kafka).
USE_TOTAL_RETENTION = -2
# Keys of remote_storage_options that would carry credentials: those come from the environment
# or the provider's credential chain, never from conf/.
_CREDENTIAL_WORDS = ("secret", "password", "token", "credential", "access_key", "account_key")
_CREDENTIAL_KEYS = ("key", "username", "sas", "aws_access_key_id")


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _non_negative(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _optional_non_negative(v: Any) -> bool:
    return v is None or _non_negative(v)


def _boolean(v: Any) -> bool:
    return isinstance(v, bool)


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: v in choices


def _local_retention(v: Any) -> bool:
    return v is None or v == USE_TOTAL_RETENTION or _non_negative(v)


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
    # Kafka's producer.id.expiration.ms: a producer with no open transaction that wrote nothing
    # for this long is forgotten (its duplicate detection with it).
    producer_id_expiration_ms: int = DAY_MS
    # Tiered storage (Kafka's names). With remote_storage_enable, retention_ms / retention_bytes
    # are the total retention across both tiers and local_retention_* bound the local tier only
    # (-2: the same as the total; None: unlimited).
    remote_storage_enable: bool = False
    local_retention_ms: int | None = USE_TOTAL_RETENTION
    local_retention_bytes: int | None = USE_TOTAL_RETENTION

    @property
    def effective_local_retention_ms(self) -> int | None:
        """local_retention_ms with -2 resolved to retention_ms (None: unlimited)."""
        if self.local_retention_ms == USE_TOTAL_RETENTION:
            return self.retention_ms
        return self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int | None:
        """local_retention_bytes with -2 resolved to retention_bytes (None: unlimited)."""
        if self.local_retention_bytes == USE_TOTAL_RETENTION:
            return self.retention_bytes
        return self.local_retention_bytes

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
    "producer_id_expiration_ms": _positive,
    "remote_storage_enable": _boolean,
    "local_retention_ms": _local_retention,
    "local_retention_bytes": _local_retention,
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
        if text in ("null", "none", ""):  # often an unset shell variable: never unlimited
            raise InvalidConfigError(
                f"invalid value {value!r} for topic config {name!r}: a number is needed"
                + ("; -1 means unlimited" if name in _UNLIMITED else ""))
        if isinstance(default, bool):
            return {"true": True, "false": False}.get(text, value)
        try:
            value = float(text) if isinstance(default, float) else int(text)
        except ValueError:
            return value
    if name in _UNLIMITED and value == -1:
        return None
    return value


# -1 is None for these: unlimited retention; for flush_ms, no forced fsync (the default).
_UNLIMITED = ("retention_ms", "retention_bytes", "local_retention_ms", "local_retention_bytes",
              "flush_ms")


def validate_tiering(topic: str, config: TopicConfig, remote_storage_uri: str | None,
                     previous: TopicConfig | None = None) -> None:
    """The rules that tie a topic's tiered-storage keys to the rest of its config and to the
    broker: no tiering of compacted topics (as in Kafka), no tiering without a remote store, no
    switching tiering off once on (its remote segments would become unreadable), and local
    retention within the total. Raises InvalidConfigError naming the topic and the settings."""
    if previous is not None and previous.remote_storage_enable and not config.remote_storage_enable:
        raise InvalidConfigError(
            f"topic {topic!r}: remote_storage_enable cannot be switched off once on; the "
            "segments already in the remote tier would become unreadable")
    if not config.remote_storage_enable:
        return
    if config.compact:
        raise InvalidConfigError(
            f"topic {topic!r}: remote_storage_enable=true cannot be combined with "
            f"cleanup_policy={config.cleanup_policy!r}: tiered storage does not support "
            "compacted topics; use cleanup_policy='delete' or remote_storage_enable=false")
    if not remote_storage_uri:
        raise InvalidConfigError(
            f"topic {topic!r}: remote_storage_enable=true needs remote_storage_uri in the "
            "broker config, which is not set")
    for local, total in (("local_retention_ms", "retention_ms"),
                         ("local_retention_bytes", "retention_bytes")):
        local_value, total_value = getattr(config, local), getattr(config, total)
        if (local_value is not None and local_value != USE_TOTAL_RETENTION
                and total_value is not None and local_value > total_value):
            raise InvalidConfigError(
                f"topic {topic!r}: {local}={local_value} is larger than {total}={total_value}; "
                "the local tier cannot keep more than the total retention")


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
    # Segment files held open at once (least recently used closed, reopened on demand): a
    # broker's descriptors stay bounded whatever its partition count.
    max_open_segment_files: int = 1_000
    # glibc's malloc keeps freed buffers of up to 64 MiB for reuse (main.tune_malloc), unless
    # MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES choose the thresholds;
    # false leaves glibc's defaults.
    malloc_tuning: bool = True
    # Arrow's default memory pool in the broker's process (main.select_arrow_memory_pool),
    # read by ``logstore broker start`` before it imports pyarrow (a broker built in a process
    # that imported pyarrow already keeps that process's pool): "system" (glibc's malloc,
    # tuned as above), "mimalloc" or "jemalloc"; the environment's ARROW_DEFAULT_MEMORY_POOL
    # wins. Not mimalloc by default: the mimalloc in pyarrow 25-26 is suspected of crashing
    # freshly started brokers while they set up their threads (README, Benchmarks).
    arrow_memory_pool: str = "system"
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
    # Tiered storage (Kafka's names, see tiering/). remote_storage_uri None: tiering is off.
    # remote_storage_options go to fsspec as they are (endpoint_url, client_kwargs...);
    # credentials come from the environment or the provider's chain, never from here.
    remote_storage_uri: str | None = None
    remote_storage_options: dict[str, Any] = field(default_factory=dict)
    remote_log_manager_task_interval_ms: int = 30_000
    remote_log_manager_copy_max_bytes_per_second: int | None = None
    remote_log_reader_threads: int = 10
    remote_log_index_cache_bytes: int = GiB
    # In memory: chunks of remote segments that fetches read (see tiering/remote_reader.py).
    remote_fetch_cache_bytes: int = 256 * MiB
    # Remote segments are read in aligned chunks of this size: larger means fewer requests and
    # more throughput, smaller a faster first byte of a cold read.
    remote_fetch_chunk_bytes: int = 8 * MiB
    # How long a fetch waits for its remote reads before answering without them (Kafka's
    # remote.fetch.max.wait.ms); the reads go on and fill the chunk cache for the retry.
    remote_fetch_max_wait_ms: int = 500
    # Copies STARTED (or objects with no entry) longer than this are a dead upload's leftovers.
    remote_log_manager_orphan_grace_ms: int = 15 * 60_000
    # A failed tiering run is retried after this, doubling up to the max (Kafka's names).
    remote_log_manager_task_retry_backoff_ms: int = 500
    remote_log_manager_task_retry_backoff_max_ms: int = 30_000
    # The Prometheus endpoint ("host:port", Kafka's JMX metrics by their exporter names; see
    # logstore/metrics/). None: no endpoint (the broker still answers describe_broker_metrics).
    metrics_listener: str | None = None
    # TLS, SASL and ACLs: flat keys in the file (listener_security, ssl_certfile, ...; the
    # table is logstore/security/config.py's), gathered here.
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Transactions (Kafka's names; transactions/). transaction_state_log_num_partitions None
    # means 50 in a cluster and 8 embedded, as for the offsets topic. A Prepared transaction
    # (two-phase participation) waits for its decision up to transaction_prepared_timeout_ms,
    # a broker setting of its own, not the producer's timeout.
    transaction_state_log_num_partitions: int | None = None
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_state_log_segment_bytes: int = 100 * MiB
    transaction_max_timeout_ms: int = 15 * 60 * 1000
    transaction_prepared_timeout_ms: int = HOUR_MS
    transactional_id_expiration_ms: int = 7 * DAY_MS
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transaction_partition_verification_enable: bool = True

    @property
    def offsets_partitions(self) -> int:
        if self.offsets_topic_num_partitions is not None:
            return self.offsets_topic_num_partitions
        return EMBEDDED_OFFSETS_PARTITIONS if self.zk_connect is None else \
            CLUSTER_OFFSETS_PARTITIONS

    @property
    def transaction_state_partitions(self) -> int:
        if self.transaction_state_log_num_partitions is not None:
            return self.transaction_state_log_num_partitions
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
    "max_open_segment_files": (int,), "malloc_tuning": (bool,), "arrow_memory_pool": (str,),
    "topic_defaults": (dict,),
    "offsets_topic_num_partitions": (int,), "offsets_topic_replication_factor": (int,),
    "offsets_topic_segment_bytes": (int,), "offsets_retention_minutes": (int,),
    "group_initial_rebalance_delay_ms": (int,), "group_min_session_timeout_ms": (int,),
    "group_max_session_timeout_ms": (int,),
    "remote_storage_uri": (str,), "remote_storage_options": (dict,),
    "remote_log_manager_task_interval_ms": (int,),
    "remote_log_manager_copy_max_bytes_per_second": (int,),
    "remote_log_reader_threads": (int,), "remote_log_index_cache_bytes": (int,),
    "remote_fetch_cache_bytes": (int,), "remote_fetch_max_wait_ms": (int,),
    "remote_fetch_chunk_bytes": (int,),
    "remote_log_manager_orphan_grace_ms": (int,),
    "remote_log_manager_task_retry_backoff_ms": (int,),
    "remote_log_manager_task_retry_backoff_max_ms": (int,),
    "transaction_state_log_num_partitions": (int,),
    "transaction_state_log_replication_factor": (int,),
    "transaction_state_log_min_isr": (int,), "transaction_state_log_segment_bytes": (int,),
    "transaction_max_timeout_ms": (int,), "transaction_prepared_timeout_ms": (int,),
    "transactional_id_expiration_ms": (int,),
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": (int,),
    "transaction_partition_verification_enable": (bool,),
    "metrics_listener": (str,),
}
_POSITIVE_BROKER_KEYS = ("log_retention_check_interval_ms", "log_cleaner_interval_ms",
                         "max_open_segment_files", "offsets_topic_num_partitions",
                         "offsets_topic_replication_factor", "offsets_topic_segment_bytes",
                         "offsets_retention_minutes",
                         "group_min_session_timeout_ms", "group_max_session_timeout_ms",
                         "remote_log_manager_task_interval_ms",
                         "remote_log_manager_copy_max_bytes_per_second",
                         "remote_log_reader_threads", "remote_log_index_cache_bytes",
                         "remote_fetch_cache_bytes", "remote_fetch_max_wait_ms",
                         "remote_fetch_chunk_bytes",
                         "remote_log_manager_orphan_grace_ms",
                         "remote_log_manager_task_retry_backoff_ms",
                         "remote_log_manager_task_retry_backoff_max_ms",
                         "transaction_state_log_num_partitions",
                         "transaction_state_log_replication_factor",
                         "transaction_state_log_min_isr", "transaction_state_log_segment_bytes",
                         "transaction_max_timeout_ms", "transaction_prepared_timeout_ms",
                         "transactional_id_expiration_ms",
                         "transaction_abort_timed_out_transaction_cleanup_interval_ms")


def broker_config_from_dict(raw: dict[str, Any], source: str = "<dict>") -> BrokerConfig:
    """Validate ``raw`` (as parsed from ``source``) into a BrokerConfig; ConfigError names the
    key and the source."""
    values: dict[str, Any] = {}
    security: dict[str, Any] = {}
    known = {**_BROKER_TYPES, **SECURITY_TYPES}
    for key, value in raw.items():
        types = known.get(key)
        if types is None:
            raise ConfigError(f"{source}: unknown key {key!r}; known keys: "
                              f"{', '.join(sorted(known))}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ConfigError(f"{source}: key {key!r} must be {types[0].__name__}, "
                              f"got {value!r}")
        (security if key in SECURITY_TYPES else values)[key] = value
    if isinstance(values.get("log_dirs"), str):
        values["log_dirs"] = [values["log_dirs"]]
    if "log_dirs" in values:
        if not values["log_dirs"]:
            raise ConfigError(f"{source}: log_dirs must name at least one directory")
        values["log_dirs"] = tuple(str(d) for d in values["log_dirs"])
        _check_distinct_log_dirs(values["log_dirs"], source)
    # (Not BrokerConfig.listener: with slots=True that is a descriptor, not the default.)
    _check_listener(values.get("listener", DEFAULT_LISTENER), source)
    if "metrics_listener" in values:
        _check_listener(values["metrics_listener"], source, "metrics_listener")
    if "zk_connect" in values and not values["zk_connect"].strip():
        raise ConfigError(f"{source}: zk_connect must name at least one host:port")
    for key in ("zk_session_timeout_ms", "replica_lag_time_max_ms", *_POSITIVE_BROKER_KEYS):
        if values.get(key, 1) <= 0:
            raise ConfigError(f"{source}: {key} must be positive")
    if values.get("arrow_memory_pool", "system") not in ARROW_MEMORY_POOLS:
        raise ConfigError(f"{source}: arrow_memory_pool must be one of "
                          f"{', '.join(ARROW_MEMORY_POOLS)}, got {values['arrow_memory_pool']!r}")
    if values.get("broker_id", 0) < 0:
        raise ConfigError(f"{source}: broker_id must be >= 0, got {values['broker_id']}")
    if values.get("group_initial_rebalance_delay_ms", 0) < 0:
        raise ConfigError(f"{source}: group_initial_rebalance_delay_ms must be >= 0")
    _check_not_above(values, source, "group_min_session_timeout_ms",
                     "group_max_session_timeout_ms")
    _check_not_above(values, source, "remote_log_manager_task_retry_backoff_ms",
                     "remote_log_manager_task_retry_backoff_max_ms")
    _check_remote_storage(values, source)
    _check_topic_defaults(values, source)
    return BrokerConfig(**values, security=security_config_from_dict(security, source))


def _check_distinct_log_dirs(log_dirs: tuple[str, ...], source: str) -> None:
    """Each directory once (as written or through ``..``): a broker locks each of its log dirs,
    and one listed twice would lock itself out."""
    seen: dict[str, str] = {}
    for d in log_dirs:
        key = os.path.abspath(os.path.expanduser(d))
        if key in seen:
            raise ConfigError(f"{source}: log_dirs lists {key} twice ({seen[key]!r} and {d!r})")
        seen[key] = d


def _check_not_above(values: dict[str, Any], source: str, low: str, high: str) -> None:
    """``low`` <= ``high``, each as given or its default."""
    defaults = BrokerConfig()
    low_value, high_value = values.get(low, getattr(defaults, low)), \
        values.get(high, getattr(defaults, high))
    if low_value > high_value:
        raise ConfigError(f"{source}: {low} ({low_value}) must not be larger than {high} "
                          f"({high_value})")


def _check_topic_defaults(values: dict[str, Any], source: str) -> None:
    """topic_defaults are valid topic config, and their tiering settings fit together and
    with the broker's remote_storage_uri (every topic created with them must be)."""
    try:
        defaults = TopicConfig().updated(values.get("topic_defaults", {}))
        validate_tiering("topic_defaults", defaults, values.get("remote_storage_uri"))
    except InvalidConfigError as e:
        raise ConfigError(f"{source}: topic_defaults: {e.message}") from None


def _check_remote_storage(values: dict[str, Any], source: str) -> None:
    uri = values.get("remote_storage_uri")
    if uri is not None:
        scheme, sep, path = uri.partition("://")
        if not sep or not scheme or not path.strip("/"):
            raise ConfigError(f"{source}: remote_storage_uri must be an fsspec URL with a path, "
                              f"like 's3://bucket/logstore' or 'file:///var/tier'; got {uri!r}")
    found = credential_keys(values.get("remote_storage_options", {}), "remote_storage_options")
    if found:
        raise ConfigError(f"{source}: {', '.join(found)} looks like a credential; credentials "
                          "for remote storage come from the environment or the provider's "
                          "credential chain, never from the config file")


def credential_keys(options: dict[str, Any], where: str) -> list[str]:
    """The keys of fsspec ``options`` (nested ones as ``where.a.b``) that look like credentials;
    credentials come from the environment or the provider's chain, never from options."""
    found = []
    for key, value in options.items():
        lowered = str(key).lower()
        if lowered in _CREDENTIAL_KEYS or any(w in lowered for w in _CREDENTIAL_WORDS):
            found.append(f"{where}.{key}")
        if isinstance(value, dict):
            found += credential_keys(value, f"{where}.{key}")
    return found


def _check_listener(listener: str, source: str, key: str = "listener") -> None:
    host, sep, port = listener.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{source}: {key} must be 'host:port', got {listener!r}")


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
