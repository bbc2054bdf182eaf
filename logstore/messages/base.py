"""The base of every wire message: typed, versioned, validated bodies, encoded with msgspec.

Owns: the ``Message`` base class (a frozen msgspec Struct), ``Request`` (a message with an action
name, a version and a response type), the per-entry ``error_code``/``error_message`` fields
(``ErrorFields``), and the one place where bodies are encoded and decoded. Decoding validates
every field against its annotation (type, and range where the annotation says so), so a
malformed body is INVALID_REQUEST naming the field (``$.partitions[0].offset``), and a request
of a version newer than this code speaks is UNSUPPORTED_VERSION. Must not: do I/O, or know about
Arrow Flight.

How a request is declared (Kafka declares each message once in a JSON spec; here it is a class)::

    class HeartbeatResponse(ErrorFields, frozen=True, kw_only=True):
        pass

    class HeartbeatRequest(Request[HeartbeatResponse], frozen=True, kw_only=True, tag=0):
        ACTION: ClassVar[str] = "heartbeat"
        RESPONSE: ClassVar[type[Message]] = HeartbeatResponse
        group_id: str
        member_id: str
        generation_id: Int32

The class keyword ``tag`` is the request's version. It travels as the body's ``"version"``
field (absent means 0); a body whose version is newer than the class's is refused before its
fields are read, since a newer version may change them. When a message changes in a way an
older peer cannot read, declare the new shape as a new class with the next tag and keep
decoding the old one. Fields a peer does not know are ignored, as Kafka ignores unknown tagged
fields, so adding an optional field needs no new version.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, TypeVar

import msgspec

from logstore.errors import (
    ApiError,
    InvalidRequestError,
    UnknownServerError,
    UnsupportedVersionError,
    error_class,
)

INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Field types with the ranges of Kafka's wire types. -1 is the usual "none" value.
Int16 = Annotated[int, msgspec.Meta(ge=-1, le=INT16_MAX)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=INT64_MAX)]
PartitionId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
BrokerId = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
ProducerId = Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]
ProducerEpoch = Annotated[int, msgspec.Meta(ge=-1, le=INT16_MAX)]
LeaderEpoch = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
# Offsets in requests may be -2 (earliest) and -1 (latest / none).
Offset = Annotated[int, msgspec.Meta(ge=-2, le=INT64_MAX)]
# Waits and timeouts; the handlers cap them further.
TimeoutMs = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]

R = TypeVar("R", bound="Message")


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every request, response and entry: an immutable value."""


class ErrorFields(Message, frozen=True, kw_only=True):
    """The error of one entry (a partition, a topic, a group) or of a whole response."""

    error_code: int = 0
    error_message: str | None = None

    def error(self) -> ApiError | None:
        """The ApiError this entry carries, None if it succeeded."""
        if not self.error_code:
            return None
        return error_class(self.error_code)(self.error_message or "")

    def raise_error(self, what: str = "") -> None:
        """Raise this entry's error (prefixed with ``what``), if it carries one."""
        err = self.error()
        if err is not None:
            raise type(err)(f"{what}: {err.message}" if what else err.message)


def error_kw(error: ApiError | None) -> dict[str, Any]:
    """``error_code`` and ``error_message`` keyword arguments for an entry that failed (or,
    with None, succeeded)."""
    if error is None:
        return {"error_code": 0, "error_message": None}
    return {"error_code": int(error.code), "error_message": error.message}


class Request(Message, Generic[R], frozen=True, kw_only=True, tag_field="version"):
    """A control request (DoAction). Subclasses set ``ACTION`` and ``tag`` (the version);
    ``RESPONSE`` is the class of the answer."""

    ACTION: ClassVar[str] = ""
    RESPONSE: ClassVar[type[Message]]

    @classmethod
    def version(cls) -> int:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, int), f"{cls.__name__} must declare an int tag (its version)"
        return tag


class _Version(msgspec.Struct):
    """Only the version of a body, read before its fields."""

    version: int = 0


_VERSION_DECODER = msgspec.json.Decoder(_Version)
_ENCODER = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}

Q = TypeVar("Q", bound=Request[Any])
M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def _decoder(cls: type[M]) -> msgspec.json.Decoder[M]:
    decoder = _decoders.get(cls)
    if decoder is None:
        decoder = _decoders[cls] = msgspec.json.Decoder(cls)
    return decoder


def check_version(cls: type[Request[Any]], body: bytes) -> None:
    """Refuse a body whose version this code does not speak (UNSUPPORTED_VERSION), and one
    that is not a JSON object at all (INVALID_REQUEST)."""
    try:
        version = _VERSION_DECODER.decode(body).version
    except msgspec.DecodeError as e:
        raise InvalidRequestError(f"{cls.ACTION}: body is not a valid JSON object ({e})") \
            from None
    if version > cls.version():
        raise UnsupportedVersionError(
            f"{cls.ACTION} v{version} is newer than this broker speaks (up to "
            f"v{cls.version()}); upgrade the broker or use a client of its version")


def decode_request(cls: type[Q], body: bytes) -> Q:
    """A request body, validated; INVALID_REQUEST naming the field, or UNSUPPORTED_VERSION."""
    body = body or b"{}"
    check_version(cls, body)
    try:
        return _decoder(cls).decode(body)
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise InvalidRequestError(f"{cls.ACTION} v{cls.version()}: {e}") from None


def decode_message(cls: type[M], body: bytes, what: str) -> M:
    """A message of a known type (a response, or a non-action body such as the produce
    descriptor); a body that does not match is INVALID_REQUEST naming ``what`` and the
    field."""
    try:
        return _decoder(cls).decode(body)
    except msgspec.DecodeError as e:
        raise InvalidRequestError(f"{what}: {e}") from None


def decode_versioned(cls: type[M], body: bytes, what: str) -> M:
    """A versioned message that is not a request (a stream's control message, declared with
    ``tag_field="version"`` and its version as ``tag``, as requests are): UNSUPPORTED_VERSION
    when the body is newer than this code speaks, else as ``decode_message``."""
    ours = cls.__struct_config__.tag
    try:
        version = _VERSION_DECODER.decode(body).version
    except msgspec.DecodeError as e:
        raise InvalidRequestError(f"{what}: not a valid JSON object ({e})") from None
    if isinstance(ours, int) and version > ours:
        raise UnsupportedVersionError(
            f"{what} v{version} is newer than this peer speaks (up to v{ours})")
    return decode_message(cls, body, what)


def decode_response(cls: type[M], body: bytes, what: str) -> M:
    """A response from a broker; one that does not match its declaration is the broker's
    fault, so UNKNOWN_SERVER_ERROR naming ``what`` and the field."""
    try:
        return _decoder(cls).decode(body)
    except msgspec.DecodeError as e:
        raise UnknownServerError(f"{what}: malformed response ({e})") from None
