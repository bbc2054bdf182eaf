"""The wire messages: every request is declared once, versioned, and validated on decode."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstore.errors import InvalidRequestError, UnknownServerError, UnsupportedVersionError
from logstore.messages import REQUEST_TYPES, Message, Request, decode_request, encode
from logstore.messages.cluster import (
    EpochRequestPartition,
    LeaderAndIsrPartition,
    LeaderEpochsPartition,
)
from logstore.messages.fetch import FetchPartition, FetchRequest
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionEnd,
    FetchSessionPartitionEnd,
    FetchSessionPartitionState,
    FetchSessionUpdate,
    FetchSessionUpdated,
    PartitionOffset,
)
from logstore.messages.groups import GroupProtocol, JoinGroupRequest
from logstore.messages.produce import ProduceBatchMetadata
from logstore.records import (
    HEADER_SIZE,
    BatchHeader,
    decode_message,
    encode_batch,
    iter_messages,
)
from logstore.rpc.codec import (
    decode_batch_metadata,
    decode_broker_frame,
    decode_client_frame,
    decode_first_frame,
    encode_broker_frame,
    encode_client_frame,
    encode_first_frame,
    stored_messages,
    stored_messages_batch,
)


def test_every_request_has_an_action_a_version_and_a_response_type() -> None:
    """Goal: the index of requests is complete and consistent, so the dispatch table and the
    clients cannot disagree on a name. Method: check each indexed class."""
    assert len(REQUEST_TYPES) >= 27
    for name, cls in REQUEST_TYPES.items():
        assert name == cls.ACTION
        assert isinstance(cls.version(), int) and cls.version() >= 0, name
        assert issubclass(cls.RESPONSE, Message), name


@pytest.mark.parametrize("cls", sorted(REQUEST_TYPES.values(), key=lambda c: c.ACTION),
                         ids=lambda c: c.ACTION)
def test_a_newer_version_is_refused_before_its_fields_are_read(cls: type[Request[Any]]) -> None:
    """Goal: a request from a newer client is UNSUPPORTED_VERSION naming the action and both
    versions, never a confusing field error. Method: a body whose only field is a newer
    version."""
    body = encode_version(cls.version() + 1)
    with pytest.raises(UnsupportedVersionError, match=rf"{cls.ACTION} v{cls.version() + 1}"):
        decode_request(cls, body)


def encode_version(version: int) -> bytes:
    return msgspec.json.encode({"version": version})


def test_a_request_round_trips_and_carries_its_version() -> None:
    """Goal: what a client encodes is what the broker decodes. Method: encode, look at the
    body, decode."""
    request = JoinGroupRequest(group_id="g", session_timeout_ms=6000,
                               protocols=[GroupProtocol(name="range", metadata={"t": [1]})])
    body = encode(request)
    assert msgspec.json.decode(body)["version"] == 0
    assert decode_request(JoinGroupRequest, body) == request


@pytest.mark.parametrize("body, field", [
    (b'{"topic": "t", "partitions": [{"partition": 0, "offset": "7"}]}', "$.partitions[0].offset"),
    (b'{"topic": "t", "partitions": [{"partition": -1, "offset": 0}]}',
     "$.partitions[0].partition"),
    (b'{"topic": 5, "partitions": []}', "$.topic"),
    (b'{"topic": "t", "partitions": [{"partition": true, "offset": 0}]}',
     "$.partitions[0].partition"),
])
def test_a_malformed_field_is_invalid_request_naming_its_path(body: bytes, field: str) -> None:
    """Goal: the error says which field is wrong, so a client author can fix it. Method:
    fetch tickets with one bad field each (a bool is not an int)."""
    with pytest.raises(InvalidRequestError) as e:
        decode_request(FetchRequest, body)
    assert field in str(e.value) and "fetch" in str(e.value)


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'"x"'])
def test_junk_bodies_are_invalid_request(body: bytes) -> None:
    """Goal: junk never raises anything but INVALID_REQUEST (an empty body is an empty
    object, which this request refuses for its missing fields). Method: decode each."""
    with pytest.raises(InvalidRequestError):
        decode_request(FetchRequest, body)


@given(partition=st.integers(0, 2**31 - 1), offset=st.integers(-2, 2**63 - 1),
       end=st.none() | st.integers(0, 2**63 - 1), epoch=st.integers(-1, 2**31 - 1))
def test_fetch_requests_round_trip(partition: int, offset: int, end: int | None,
                                   epoch: int) -> None:
    """Goal: any valid fetch request survives encoding. Method: hypothesis over the
    partition fields' ranges."""
    request = FetchRequest(topic="t", partitions=[FetchPartition(
        partition=partition, offset=offset, end_offset=end, current_leader_epoch=epoch)])
    assert decode_request(FetchRequest, encode(request)) == request


class _OldEpochRequestPartition(msgspec.Struct, frozen=True, kw_only=True):
    """EpochRequestPartition as a peer that predates topic ids declares it."""

    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@pytest.mark.parametrize("cls, fields", [
    (FetchPartition, {"partition": 0, "offset": 5}),
    (EpochRequestPartition, {"partition": 0, "leader_epoch": 3}),
    (LeaderEpochsPartition, {"partition": 0}),
    (LeaderAndIsrPartition, {"topic": "t", "partition": 0, "leader": 1, "leader_epoch": 0,
                             "isr": [1], "replicas": [1, 2]}),
])
def test_replication_messages_carry_an_optional_topic_id(cls: type[Message],
                                                         fields: dict[str, Any]) -> None:
    """Goal: the topic ids of replication messages (KIP-516) keep the wire compatible both
    ways: a body from an older peer (no ``topic_id``) decodes as unchecked (None), one with
    it round-trips, and an older peer reads the new body, ignoring the field. Method: decode
    bodies with and without the field, and the new one with the old declaration."""
    old_body = msgspec.json.encode(fields)
    assert msgspec.json.decode(old_body, type=cls).topic_id is None  # type: ignore[attr-defined]
    new = cls(**fields, topic_id="ab" * 16)
    assert msgspec.json.decode(encode(new), type=cls) == new
    if cls is EpochRequestPartition:
        old = msgspec.json.decode(encode(new), type=_OldEpochRequestPartition)
        assert (old.partition, old.leader_epoch) == (0, 3)


@pytest.mark.parametrize("fields", [{"producer_epoch": 2**15}, {"base_sequence": 2**31},
                                    {"producer_id": 2**63}, {"leader_epoch": -2}])
def test_producer_fields_outside_their_header_types_are_refused(fields: dict[str, int]) -> None:
    """Goal: a batch's producer fields must fit the batch header's int16/int32/int64 fields.
    Method: one field past its range each."""
    body = msgspec.json.encode({"partition": 0, **fields})
    with pytest.raises(msgspec.ValidationError, match=next(iter(fields))):
        msgspec.json.decode(body, type=ProduceBatchMetadata)


def _declared_messages() -> list[type[Message]]:
    from logstore.messages import (
        cluster,
        fetch,
        fetch_session,
        groups,
        log,
        produce,
        topics,
        transactions,
    )

    return sorted({value for module in (topics, log, produce, fetch, fetch_session, cluster,
                                        groups, transactions)
                   for value in vars(module).values()
                   if isinstance(value, type) and issubclass(value, Message)},
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _declared_messages(), ids=lambda c: c.__name__)
def test_every_declared_message_has_a_decoder(cls: type[Message]) -> None:
    """Goal: a declaration msgspec cannot turn into a decoder (a field whose name shadows a
    name its annotations use, such as ``type``) fails here, not on a broker's first request.
    Method: build the JSON decoder of every message class the modules declare."""
    msgspec.json.Decoder(cls)


# -- fetch session frames -----------------------------------------------------------------------

_partitions = st.integers(0, 2**31 - 1)
_offsets = st.integers(-1, 2**63 - 1)
_client_frames = st.one_of(
    st.builds(FetchSessionCredit, credit_bytes=st.integers(0, 2**63 - 1),
              log_end_offsets=st.lists(st.builds(PartitionOffset, partition=_partitions,
                                                 offset=_offsets), max_size=4)),
    st.builds(FetchSessionUpdate, seq=st.integers(1, 2**63 - 1),
              add=st.lists(st.builds(FetchPartition, partition=_partitions, offset=_offsets),
                           max_size=4),
              remove=st.lists(_partitions, max_size=4)))
_broker_frames = st.one_of(
    st.builds(FetchSessionUpdated, seq=st.integers(1, 2**63 - 1)),
    st.builds(FetchSessionPartitionState, partition=_partitions, batches=st.integers(0, 99),
              high_watermark=_offsets, last_stable_offset=_offsets),
    st.builds(FetchSessionPartitionEnd, partition=_partitions, error_code=st.integers(1, 99),
              log_start_offset=_offsets),
    st.builds(FetchSessionEnd, error_code=st.integers(1, 99), error_message=st.text()))


@given(frame=_client_frames)
def test_client_session_frames_round_trip(frame: Any) -> None:
    """Goal: what a session client sends is what the broker reads. Method: hypothesis over
    the credit and update frames' fields, through the codec."""
    assert decode_client_frame(encode_client_frame(frame), "test") == frame


@given(frame=_broker_frames)
def test_broker_session_frames_round_trip(frame: Any) -> None:
    """Goal: what the broker pushes (other than batches) is what the client reads. Method:
    hypothesis over the state, update, partition end and session end frames."""
    assert decode_broker_frame(encode_broker_frame(frame), "test") == frame


@given(state=st.builds(FetchSessionPartitionState, partition=_partitions,
                      batches=st.integers(1, 99), high_watermark=_offsets),
       batch_metadata=st.binary(max_size=200))
def test_a_state_carried_with_its_first_batch_round_trips(state: Any,
                                                           batch_metadata: bytes) -> None:
    """Goal: an F frame gives back the state and its batch's own metadata, whatever that
    holds. Method: hypothesis over states and metadata bytes, through the codec."""
    assert decode_first_frame(encode_first_frame(state, batch_metadata), "test") == \
        (state, batch_metadata)


@pytest.mark.parametrize("data", [b"F", b"F\x01\x00", b"F\x10\x00\x00\x00{}",
                                  b"F\x02\x00\x00\x00{}B", b"F\x03\x00\x00\x00[1]B"])
def test_a_malformed_first_batch_frame_is_the_brokers_fault(data: bytes) -> None:
    """Goal: an F frame too short for its length, its state, or holding no valid state, is
    UNKNOWN_SERVER_ERROR naming the frame, never an IndexError or a partial state. Method:
    truncated and malformed frames."""
    with pytest.raises(UnknownServerError, match="F frame|FetchSessionPartitionState"):
        decode_first_frame(data, "test")


@pytest.mark.parametrize("size", [1, 5, 4 + HEADER_SIZE, 6 + HEADER_SIZE, 7 + HEADER_SIZE])
def test_a_truncated_batch_frame_is_the_brokers_fault(size: int) -> None:
    """Goal: a B frame's metadata (alone, or inside an F frame after its state) too short for
    its partition and header, or ending in part of an offset delta, is UNKNOWN_SERVER_ERROR
    (which ends a consumer's session and reaches its poll), never a struct error that stops
    the session's reading thread and leaves the consumer waiting. Method: truncated frames."""
    state = FetchSessionPartitionState(partition=0, batches=1)
    data = b"B" + bytes(size - 1)
    _, inner = decode_first_frame(encode_first_frame(state, data), "test")
    with pytest.raises(UnknownServerError, match="batch frame"):
        decode_batch_metadata(inner, "test")


@pytest.mark.parametrize("data, error", [
    (b"C" + b'{"version": 1, "credit_bytes": 5}', UnsupportedVersionError),
    (b"U" + b'{"seq": 0}', InvalidRequestError),
    (b"C" + b'{"credit_bytes": -1}', InvalidRequestError),
    (b"Z{}", InvalidRequestError), (b"", InvalidRequestError)])
def test_a_bad_client_frame_is_refused_with_its_code(data: bytes, error: type) -> None:
    """Goal: a client frame from a newer client is UNSUPPORTED_VERSION and a malformed or
    unknown one INVALID_REQUEST (which ends the session with that code, never a crash).
    Method: one bad frame each."""
    with pytest.raises(error):
        decode_client_frame(data, "test")


def test_a_replica_push_carries_the_stored_bytes_and_copies_none_read_back_to_back() -> None:
    """Goal: a replica's R frame holds each stored message's exact bytes, over the buffer a
    segment read returned (no copy) when the messages lie back to back, copied otherwise.
    Method: three encoded batches in one buffer, read as a segment read reads them, and the
    same three read from buffers of their own, and one whose metadata Arrow copied because it
    was misaligned (its bytes are serialised anew)."""
    header = BatchHeader(0, 1, 2, 0, 0)
    batch = pa.record_batch({"value": [b"a", b"b"]})
    encoded = [bytes(encode_batch(batch, header)) for _ in range(3)]
    chunk = pa.py_buffer(b"".join(encoded))
    read = [decode_message(m) for _, m in iter_messages(chunk)]
    together = stored_messages_batch(read)
    assert together.column(0).buffers()[2].address == chunk.address
    assert [m.to_pybytes() for m in stored_messages(together)] == encoded
    apart = [decode_message(ipc.read_message(pa.py_buffer(e))) for e in encoded]
    assert [m.to_pybytes() for m in stored_messages(stored_messages_batch(apart))] == encoded
    shifted = pa.py_buffer(b"\0" * 3 + encoded[0]).slice(3)  # Arrow copies the metadata
    misaligned = decode_message(ipc.read_message(shifted))
    assert misaligned.message_bytes().to_pybytes() == encoded[0]
