"""The wire messages: every request is declared once, versioned, and validated on decode."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstore.errors import InvalidRequestError, UnsupportedVersionError
from logstore.messages import REQUEST_TYPES, Message, Request, decode_request, encode
from logstore.messages.fetch import FetchPartition, FetchRequest
from logstore.messages.groups import GroupProtocol, JoinGroupRequest
from logstore.messages.produce import ProduceBatchMetadata


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


@pytest.mark.parametrize("fields", [{"producer_epoch": 2**15}, {"base_sequence": 2**31},
                                    {"producer_id": 2**63}, {"leader_epoch": -2}])
def test_producer_fields_outside_their_header_types_are_refused(fields: dict[str, int]) -> None:
    """Goal: a batch's producer fields must fit the batch header's int16/int32/int64 fields.
    Method: one field past its range each."""
    body = msgspec.json.encode({"partition": 0, **fields})
    with pytest.raises(msgspec.ValidationError, match=next(iter(fields))):
        msgspec.json.decode(body, type=ProduceBatchMetadata)


def _declared_messages() -> list[type[Message]]:
    from logstore.messages import cluster, fetch, groups, log, produce, topics, transactions

    return sorted({value for module in (topics, log, produce, fetch, cluster, groups,
                                        transactions)
                   for value in vars(module).values()
                   if isinstance(value, type) and issubclass(value, Message)},
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _declared_messages(), ids=lambda c: c.__name__)
def test_every_declared_message_has_a_decoder(cls: type[Message]) -> None:
    """Goal: a declaration msgspec cannot turn into a decoder (a field whose name shadows a
    name its annotations use, such as ``type``) fails here, not on a broker's first request.
    Method: build the JSON decoder of every message class the modules declare."""
    msgspec.json.Decoder(cls)
