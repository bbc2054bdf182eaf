"""Base layer: the wire error table, config parsing, the batch header and Kafka's partitioner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstore import errors
from logstore.client.partitioner import (
    StickyPartitioner,
    assign_partitions,
    murmur2,
    murmur2_array,
    partitions_for_keys,
)
from logstore.config import TopicConfig, broker_config_from_dict, load_broker_config
from logstore.errors import (
    ConfigError,
    ErrorCode,
    InvalidConfigError,
    InvalidTopicError,
    error_class,
)
from logstore.model import validate_topic_name
from logstore.records import (
    DEFAULT_SCHEMA,
    FLAG_HAS_OFFSET_DELTAS,
    BatchHeader,
    conform_batch,
    decode_message,
    encode_batch,
    iter_messages,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


# (class, wire code, retriable, refresh_metadata) for every ApiError subclass. Numbers never
# change (a renumbering breaks every client in the field) and clients act on the flags alone,
# so a change to either must fail here first.
WIRE_ERRORS: list[tuple[type[errors.ApiError], int, bool, bool]] = [
    (errors.UnknownServerError, -1, False, False),
    (errors.OffsetOutOfRangeError, 1, False, False),
    (errors.CorruptRecordError, 2, False, False),
    (errors.UnknownTopicOrPartitionError, 3, True, True),
    (errors.InvalidFetchSizeError, 4, False, False),
    (errors.LeaderNotAvailableError, 5, True, True),
    (errors.NotLeaderOrFollowerError, 6, True, True),
    (errors.RequestTimedOutError, 7, True, False),
    (errors.BrokerNotAvailableError, 8, True, True),
    (errors.ReplicaNotAvailableError, 9, True, True),
    (errors.MessageTooLargeError, 10, False, False),
    (errors.StaleControllerEpochError, 11, False, False),
    (errors.NetworkError, 13, True, True),
    (errors.CoordinatorLoadInProgressError, 14, True, False),
    (errors.CoordinatorNotAvailableError, 15, True, True),
    (errors.NotCoordinatorError, 16, True, True),
    (errors.InvalidTopicError, 17, False, False),
    (errors.RecordListTooLargeError, 18, False, False),
    (errors.NotEnoughReplicasError, 19, True, False),
    (errors.NotEnoughReplicasAfterAppendError, 20, True, False),
    (errors.InvalidRequiredAcksError, 21, False, False),
    (errors.IllegalGenerationError, 22, False, False),
    (errors.InconsistentGroupProtocolError, 23, False, False),
    (errors.InvalidGroupIdError, 24, False, False),
    (errors.UnknownMemberIdError, 25, False, False),
    (errors.InvalidSessionTimeoutError, 26, False, False),
    (errors.RebalanceInProgressError, 27, False, False),
    (errors.InvalidCommitOffsetSizeError, 28, False, False),
    (errors.TopicAuthorizationFailedError, 29, False, False),
    (errors.GroupAuthorizationFailedError, 30, False, False),
    (errors.ClusterAuthorizationFailedError, 31, False, False),
    (errors.InvalidTimestampError, 32, False, False),
    (errors.UnsupportedSaslMechanismError, 33, False, False),
    (errors.IllegalSaslStateError, 34, False, False),
    (errors.UnsupportedVersionError, 35, False, False),
    (errors.TopicAlreadyExistsError, 36, False, False),
    (errors.InvalidPartitionsError, 37, False, False),
    (errors.InvalidReplicationFactorError, 38, False, False),
    (errors.InvalidReplicaAssignmentError, 39, False, False),
    (errors.InvalidConfigError, 40, False, False),
    (errors.NotControllerError, 41, True, True),
    (errors.InvalidRequestError, 42, False, False),
    (errors.OutOfOrderSequenceError, 45, True, False),
    (errors.DuplicateSequenceError, 46, False, False),
    (errors.InvalidProducerEpochError, 47, False, False),
    (errors.InvalidTxnStateError, 48, False, False),
    (errors.InvalidProducerIdMappingError, 49, False, False),
    (errors.InvalidTransactionTimeoutError, 50, False, False),
    (errors.ConcurrentTransactionsError, 51, True, False),
    (errors.TransactionalIdAuthorizationFailedError, 53, False, False),
    (errors.SecurityDisabledError, 54, False, False),
    (errors.OperationNotAttemptedError, 55, False, False),
    (errors.TransactionCoordinatorFencedError, 52, False, False),
    (errors.KafkaStorageError, 56, True, True),
    (errors.SaslAuthenticationFailedError, 58, False, False),
    (errors.NonEmptyGroupError, 68, False, False),
    (errors.GroupIdNotFoundError, 69, False, False),
    (errors.FencedLeaderEpochError, 74, True, True),
    (errors.UnknownLeaderEpochError, 75, True, True),
    (errors.OffsetNotAvailableError, 78, True, False),
    (errors.MemberIdRequiredError, 79, False, False),
    (errors.FencedInstanceIdError, 82, False, False),
    (errors.InvalidRecordError, 87, False, False),
    (errors.UnknownTopicIdError, 100, True, True),
    (errors.InconsistentTopicIdError, 103, True, True),
    (errors.OffsetMovedToTieredStorageError, 109, False, False),
    (errors.ResourceNotFoundError, 91, False, False),
    (errors.UnacceptableCredentialError, 93, False, False),
    (errors.UnstableOffsetCommitError, 88, True, False),
    (errors.ProducerFencedError, 90, False, False),
    (errors.TransactionAbortableError, 120, False, False),
]


def _api_error_classes() -> set[type[errors.ApiError]]:
    found: set[type[errors.ApiError]] = set()
    todo: list[type[errors.ApiError]] = [errors.ApiError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found


@pytest.mark.parametrize("cls,code,retriable,refresh_metadata", WIRE_ERRORS,
                         ids=[row[0].__name__ for row in WIRE_ERRORS])
def test_every_error_class_keeps_its_wire_code_and_flags(
        cls: type[errors.ApiError], code: int, retriable: bool, refresh_metadata: bool) -> None:
    """Goal: no error class is renumbered and no retry flag flips unnoticed.
    Method: each row of the table above against the class and ``error_class(code)``."""
    assert (cls.code, cls.retriable, cls.refresh_metadata) == (code, retriable, refresh_metadata)
    assert error_class(code) is cls


def test_every_error_code_has_exactly_one_class_and_every_class_is_pinned() -> None:
    """Goal: the code table, the classes and the pinned table describe the same set.
    Method: every ErrorCode member but NONE (0) is the code of exactly one ApiError subclass,
    every ApiError subclass is in WIRE_ERRORS, and unknown codes map to UnknownServerError."""
    assert ErrorCode.NONE == 0
    refinements = {cls for cls in _api_error_classes() if cls.__module__ != errors.__name__}
    for cls in refinements:  # a subclass outside errors.py refines a message, never the wire
        base = error_class(cls.code)
        assert issubclass(cls, base) and (cls.retriable, cls.refresh_metadata) == (
            base.retriable, base.refresh_metadata), cls
    classes = _api_error_classes() - refinements
    by_code = {c: [cls for cls in classes if cls.code == c] for c in ErrorCode}
    assert by_code.pop(ErrorCode.NONE) == []
    assert {c.name: len(found) for c, found in by_code.items() if len(found) != 1} == {}
    assert classes == {row[0] for row in WIRE_ERRORS}
    assert len(WIRE_ERRORS) == len(ErrorCode) - 1
    assert error_class(12345) is errors.UnknownServerError


# Kafka's own test vectors for murmur2 (UtilsTest.testMurmur2).
KAFKA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482,
                 b"a-little-bit-long-string": -985981536,
                 b"a-little-bit-longer-string": -1486304829,
                 b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
                 b"abc": 479470107}


@pytest.mark.parametrize("key,expected", KAFKA_MURMUR2.items())
def test_murmur2_matches_kafka_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def _murmur2_reference(data: bytes) -> int:
    """A line-by-line transcription of Kafka's Java murmur2, with 32-bit wrap-around."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail, base = length % 4, length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=50))
def test_vector_murmur2_equals_scalar_reference(keys: list[bytes]) -> None:
    hashed = murmur2_array(pa.array(keys, pa.binary()))
    assert [int(h) for h in hashed] == [_murmur2_reference(k) for k in keys]


def test_partition_for_key_is_positive_hash_mod_count() -> None:
    parts = partitions_for_keys(pa.array([b"foobar", None], pa.binary()), 7)
    assert parts[0] == (-790332482 & 0x7FFFFFFF) % 7
    assert parts[1] == -1


def test_null_keys_stick_to_a_partition_per_block() -> None:
    keys = pa.nulls(10, pa.binary())
    parts = assign_partitions(keys, None, "t", 4, StickyPartitioner(seed=1), block_rows=5)
    assert len(set(parts[:5])) == 1 and len(set(parts[5:])) == 1 and parts[0] != parts[5]


def test_topic_config_accepts_kafka_spelling_and_rejects_unknown_keys() -> None:
    cfg = TopicConfig().updated({"retention.ms": "-1", "cleanup.policy": "compact"})
    assert cfg.retention_ms is None and cfg.compact
    with pytest.raises(InvalidConfigError, match="bogus"):
        TopicConfig().updated({"bogus": 1})
    with pytest.raises(InvalidConfigError, match="segment_bytes"):
        TopicConfig().updated({"segment_bytes": 0})


def test_broker_toml_unknown_key_names_key_and_file(tmp_path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('broker_id = 1\nlistener = "127.0.0.1:9092"\nlog_dirs = ["x"]\nlog_dir = 1\n')
    with pytest.raises(ConfigError) as e:
        load_broker_config(path)
    assert "log_dir" in str(e.value) and str(path) in str(e.value)
    with pytest.raises(ConfigError, match="listener"):
        broker_config_from_dict({"listener": "nohost"})


def test_cluster_config_keys_are_read_and_checked() -> None:
    cfg = broker_config_from_dict({"zk_connect": "h:1/x", "zk_session_timeout_ms": 6000})
    assert cfg.zk_connect == "h:1/x" and cfg.zk_session_timeout_ms == 6000
    assert broker_config_from_dict({}).zk_connect is None
    with pytest.raises(ConfigError, match="zk_connect"):
        broker_config_from_dict({"zk_connect": " "})
    with pytest.raises(ConfigError, match="zk_session_timeout_ms"):
        broker_config_from_dict({"zk_session_timeout_ms": 0})
    assert broker_config_from_dict(
        {"replica_lag_time_max_ms": 1000}).replica_lag_time_max_ms == 1000
    with pytest.raises(ConfigError, match="replica_lag_time_max_ms"):
        broker_config_from_dict({"replica_lag_time_max_ms": 0})
    with pytest.raises(ConfigError, match="unknown key 'replica_fetch_max_bytes'"):
        broker_config_from_dict({"replica_fetch_max_bytes": 1000})


def test_shipped_cluster_configs_describe_three_distinct_brokers() -> None:
    configs = [load_broker_config(REPO_ROOT / f"conf/cluster/broker-{i}.toml") for i in (1, 2, 3)]
    assert [c.broker_id for c in configs] == [1, 2, 3]
    assert [c.port for c in configs] == [9201, 9202, 9203]
    assert [c.rack for c in configs] == ["a", "b", "c"]
    assert len({c.log_dirs for c in configs}) == 3
    assert {c.zk_connect for c in configs} == {"127.0.0.1:2181/logstore"}


def test_broker_config_without_a_listener_gets_the_default() -> None:
    """A file that leaves out ``listener`` used to crash reading the slots descriptor."""
    assert broker_config_from_dict({"broker_id": 3}).listener == "127.0.0.1:9092"


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "ü"])
def test_invalid_topic_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


def _batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({
        "key": pa.array([b"k%d" % i for i in range(n)]),
        "value": pa.array([b"v" * 10] * n),
        "timestamp": pa.array(range(n), pa.timestamp("ms", tz="UTC")),
        "headers": pa.nulls(n, DEFAULT_SCHEMA.field("headers").type)}, schema=DEFAULT_SCHEMA)


def test_batch_header_round_trips_with_crc_and_offset_deltas() -> None:
    header = BatchHeader(base_offset=100, last_offset_delta=4, record_count=3,
                         first_timestamp=0, max_timestamp=2, producer_id=7, producer_epoch=1,
                         base_sequence=5, leader_epoch=3, flags=FLAG_HAS_OFFSET_DELTAS)
    message = encode_batch(_batch(3), header, offset_deltas=np.array([0, 1, 4]))
    (_, msg), = iter_messages(pa.py_buffer(bytes(message)))
    stored = decode_message(msg)
    assert stored.header.batch_size == len(message)
    assert stored.header.producer_id == 7 and stored.header.leader_epoch == 3
    assert list(stored.offsets()) == [100, 101, 104]
    assert stored.record_batch(DEFAULT_SCHEMA).equals(_batch(3))


def test_flipped_body_byte_fails_crc() -> None:
    message = bytearray(encode_batch(_batch(3), BatchHeader(0, 2, 3, 0, 2)))
    message[-3] ^= 0xFF
    (_, msg), = iter_messages(pa.py_buffer(bytes(message)))
    with pytest.raises(Exception, match="CRC32C mismatch"):
        decode_message(msg)


def test_conform_batch_casts_and_names_bad_columns() -> None:
    b = pa.record_batch({"key": pa.array([b"a"], pa.large_binary()),
                         "value": pa.array([b"b"], pa.large_binary())})
    out = conform_batch(b, DEFAULT_SCHEMA, "t-0")
    assert out.schema.equals(DEFAULT_SCHEMA)
    with pytest.raises(Exception, match="'value'"):
        conform_batch(pa.record_batch({"value": pa.array([1.5])}), DEFAULT_SCHEMA, "t-0")
    with pytest.raises(Exception, match="unexpected column"):
        conform_batch(pa.record_batch({"value": pa.array([b"x"]), "zzz": pa.array([1])}),
                      DEFAULT_SCHEMA, "t-0")


def test_flipped_header_field_fails_crc_but_base_offset_may_be_patched() -> None:
    """The CRC covers header fields (a flipped max_timestamp is caught) but not the base
    offset, which the log assigns by patching an encoded batch."""
    import struct

    from logstore.records import MAGIC

    message = encode_batch(_batch(3), BatchHeader(0, 2, 3, 0, 2))
    at = bytes(message).find(MAGIC)
    patched = bytearray(message)
    struct.pack_into("<q", patched, at + len(MAGIC), 1234)
    (_, msg), = iter_messages(pa.py_buffer(bytes(patched)))
    assert decode_message(msg).header.base_offset == 1234
    flipped = bytearray(message)
    flipped[at + len(MAGIC) + 8 + 8 + 9] ^= 0x01  # inside max_timestamp
    (_, msg), = iter_messages(pa.py_buffer(bytes(flipped)))
    with pytest.raises(Exception, match="CRC32C mismatch"):
        decode_message(msg)
