"""Encoding of requests and responses on Arrow Flight.

The wire protocol (bodies are the JSON of the message types in ``logstore/messages``):

| call     | carries                                                                           |
|----------|-----------------------------------------------------------------------------------|
| DoAction | control: type = the request's ``ACTION``, body = the request; one Result = its    |
|          | ``RESPONSE``                                                                      |
| DoPut    | produce: descriptor command = ``ProduceRequest``; each batch's app_metadata =     |
|          | ``ProduceBatchMetadata``; the server answers each batch (unless acks=0) with one  |
|          | ``ProduceAck`` as metadata, in order (messages/produce.py)                        |
| DoGet    | fetch: ticket = ``FetchRequest``; the stream's batches carry BATCH metadata, then |
|          | one empty batch carries the SUMMARY (``FetchSummary``, messages/fetch.py)         |
| DoExchange | fetch session: descriptor command = ``FetchSessionRequest``; then frames both   |
|          | ways as the table below says (messages/fetch_session.py)                          |

Fetch metadata is binary for speed: ``b"B"`` + int32 partition + the 74-byte batch header
(records.py) + optional int32 offset deltas; or ``b"S"`` + the JSON ``FetchSummary``. A
replica's fetch (``replica_id`` >= 0) streams ``records.STORED_MESSAGE_SCHEMA`` instead of the
topic's: each batch is one row holding a stored IPC message's exact bytes, so the follower
appends what the leader stored without decoding and encoding it again.

A fetch session's frames: each is one FlightData whose app_metadata starts with a tag byte.
The broker begins its side with the schema of the batches it pushes (the topic's; a
replica's: ``STORED_MESSAGE_SCHEMA``); the client sends metadata-only frames, no schema. The
client ends a session by cancelling the call (the broker then stops pushing); the broker ends
one with an X frame, after which the client cancels: the broker's handler returns only once
the client's side is closed, so no thread of it is left reading a finished call. A replica's
push of one partition is one R frame whatever its number of batches, built over the bytes the
segment read returned (``stored_messages_batch``: no copy when they lie back to back).
A client that opens its session with ``state_with_first_batch`` gets a partition's state with
batches in an F frame, which also carries the first B frame (a replica's: the R frame, all of
its stored messages), so a push of one batch is one message, not two; otherwise, or when there
are no batches, the state is a P frame of its own.

| from   | tag    | app_metadata after the tag                    | data                          |
|--------|--------|-----------------------------------------------|-------------------------------|
| broker | ``P``  | JSON ``FetchSessionPartitionState``: a        | none                          |
|        |        | partition's watermarks and ``batches``, the   |                               |
|        |        | number of its batches that follow at once     |                               |
| broker | ``F``  | uint32 length, the JSON state of a partition  | what its first B frame, or its|
|        |        | with batches (``batches`` counts those this   | R frame, would carry          |
|        |        | frame carries), then that frame's metadata    |                               |
| broker | ``B``  | as DoGet's BATCH: int32 partition, the 74-byte| the batch                     |
|        |        | header, optional int32 offset deltas          |                               |
| broker | ``R``  | a replica's batches: int32 partition (their   | one row per stored message,   |
|        |        | headers are in the stored messages)           | its exact bytes               |
| broker | ``U``  | JSON ``FetchSessionUpdated``: update ``seq``  | none                          |
|        |        | is applied; later frames are from the new     |                               |
|        |        | positions                                     |                               |
| broker | ``E``  | JSON ``FetchSessionPartitionEnd``: a partition| none                          |
|        |        | left the session on its error                 |                               |
| broker | ``X``  | JSON ``FetchSessionEnd``: the session is over | none                          |
|        |        | (its error); the last frame                   |                               |
| client | ``C``  | JSON ``FetchSessionCredit``: bytes granted,   | none                          |
|        |        | a follower's log end offsets                  |                               |
| client | ``U``  | JSON ``FetchSessionUpdate``: add, move, remove| none                          |

Request-level errors travel as a FlightServerError whose ``extra_info`` is the JSON of
``ErrorFields`` (``{"error_code", "error_message"}``). Must not: contain business logic.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from logstore.errors import (
    ApiError,
    ErrorCode,
    InvalidRequestError,
    NetworkError,
    UnknownServerError,
    error_class,
)
from logstore.messages import (
    ErrorFields,
    Message,
    decode_message,
    decode_response,
    decode_versioned,
    encode,
    error_kw,
)
from logstore.messages.fetch import FetchSummary
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionEnd,
    FetchSessionPartitionEnd,
    FetchSessionPartitionState,
    FetchSessionUpdate,
    FetchSessionUpdated,
)
from logstore.records import HEADER_SIZE, STORED_MESSAGE_SCHEMA, BatchHeader, StoredBatch

# "[SASL_AUTHENTICATION_FAILED] authentication failed ... . Detail: ..." (auth handler errors
# reach the client without extra_info; their code travels in the message).
_CODED_MESSAGE = re.compile(r"\[([A-Z_]+)\] (.*?)(?:\. Detail:|$)", re.DOTALL)
BATCH_TAG = b"B"
SUMMARY_TAG = b"S"
STATE_TAG = b"P"
FIRST_TAG = b"F"
UPDATED_TAG = b"U"
END_TAG = b"E"
SESSION_END_TAG = b"X"
REPLICA_TAG = b"R"
CREDIT_TAG = b"C"
UPDATE_TAG = b"U"
_PARTITION = struct.Struct("<i")
M = TypeVar("M", bound=Message)
_LENGTH = struct.Struct("<I")


def to_flight_error(error: ApiError) -> flight.FlightServerError:
    return flight.FlightServerError(str(error), extra_info=encode(ErrorFields(**error_kw(error))))


def from_flight_error(e: flight.FlightError, where: str) -> ApiError:
    """The ApiError a Flight failure stands for (connection failures are NETWORK_EXCEPTION)."""
    info = getattr(e, "extra_info", None)
    if info:
        try:
            err = decode_message(ErrorFields, info, where).error()
        except ApiError:  # extra_info that is not ours (gRPC's own): judged by its kind below
            err = None
        if err is not None:
            return err
    coded = _CODED_MESSAGE.search(str(e))
    if coded is not None and coded.group(1) in ErrorCode.__members__:
        return error_class(ErrorCode[coded.group(1)])(f"{where}: {coded.group(2)}")
    if isinstance(e, flight.FlightUnavailableError | flight.FlightTimedOutError):
        return NetworkError(f"{where}: {str(e).splitlines()[0]}")
    return UnknownServerError(f"{where}: {e}")


@dataclass(slots=True)
class FetchedBatch:
    """A batch a client received (fetch or session), with its partition and header."""

    partition: int
    header: BatchHeader
    offset_deltas: np.ndarray | None
    batch: pa.RecordBatch

    def offsets(self) -> np.ndarray:
        base = self.header.base_offset
        if self.offset_deltas is not None:
            return base + self.offset_deltas.astype(np.int64)
        return np.arange(base, base + self.header.record_count, dtype=np.int64)


def encode_replica_metadata(partition: int) -> bytes:
    return REPLICA_TAG + _PARTITION.pack(partition)


def decode_replica_metadata(data: bytes) -> int:
    return int(_PARTITION.unpack_from(data, 1)[0])


def stored_messages_batch(batches: list[StoredBatch]) -> pa.RecordBatch:
    """The stored IPC messages of ``batches`` (in offset order), one per row of
    ``STORED_MESSAGE_SCHEMA``. When they lie back to back in one buffer, as a segment read
    returns them, the column is built over that buffer (no copy); otherwise they are copied
    into one."""
    spans = [b.message_bytes() for b in batches]
    sizes = np.fromiter((s.size for s in spans), dtype=np.int64, count=len(spans))
    contiguous = all(b.address == a.address + a.size for a, b in zip(spans, spans[1:],
                                                                      strict=False))
    data = pa.foreign_buffer(spans[0].address, int(sizes.sum()), base=spans) if contiguous \
        else pa.py_buffer(b"".join(s.to_pybytes() for s in spans))
    offsets = np.zeros(len(spans) + 1, dtype="<i4")
    np.cumsum(sizes, out=offsets[1:])
    column = pa.Array.from_buffers(pa.binary(), len(spans), [None, pa.py_buffer(offsets), data])
    return pa.RecordBatch.from_arrays([column], schema=STORED_MESSAGE_SCHEMA)


def stored_messages(batch: pa.RecordBatch) -> list[pa.Buffer]:
    """Each row's stored message of a ``stored_messages_batch``, zero-copy."""
    column = batch.column(0)
    _, offsets_buffer, data = column.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype="<i4")[column.offset:
                                                        column.offset + len(column) + 1]
    return [data.slice(int(a), int(b - a)) for a, b in zip(offsets[:-1], offsets[1:],
                                                           strict=True)]


def encode_batch_metadata(partition: int, stored: StoredBatch) -> bytes:
    out = BATCH_TAG + _PARTITION.pack(partition) + stored.header.pack()
    if stored.offset_deltas is not None:
        out += np.ascontiguousarray(stored.offset_deltas, dtype="<i4").tobytes()
    return out


def decode_batch_metadata(data: bytes, where: str
                          ) -> tuple[int, BatchHeader, np.ndarray | None]:
    """A B frame's partition, batch header and offset deltas; a frame too short for them, or
    with a partial delta, is the broker's fault (UNKNOWN_SERVER_ERROR)."""
    if len(data) < 5 + HEADER_SIZE or (len(data) - 5 - HEADER_SIZE) % 4:
        raise UnknownServerError(f"{where}: a batch frame's metadata of {len(data)} bytes "
                                 f"is not a partition, a {HEADER_SIZE}-byte header and "
                                 "int32 offset deltas")
    (partition,) = _PARTITION.unpack_from(data, 1)
    header = BatchHeader.unpack(data[5: 5 + HEADER_SIZE])
    rest = data[5 + HEADER_SIZE:]
    deltas = np.frombuffer(rest, dtype="<i4") if rest else None
    return partition, header, deltas


def encode_summary(summary: FetchSummary) -> bytes:
    return SUMMARY_TAG + encode(summary)


def decode_summary(data: bytes, where: str) -> FetchSummary:
    """The summary that ends a fetch stream (``data`` starts with SUMMARY_TAG)."""
    return decode_response(FetchSummary, data[1:], where)


# -- fetch session frames ----------------------------------------------------------------------

ClientFrame = FetchSessionCredit | FetchSessionUpdate
BrokerFrame = (FetchSessionPartitionState | FetchSessionUpdated | FetchSessionPartitionEnd
               | FetchSessionEnd)
_CLIENT_FRAMES: dict[bytes, type[Message]] = {CREDIT_TAG: FetchSessionCredit,
                                              UPDATE_TAG: FetchSessionUpdate}
_BROKER_FRAMES: dict[bytes, type[Message]] = {STATE_TAG: FetchSessionPartitionState,
                                              UPDATED_TAG: FetchSessionUpdated,
                                              END_TAG: FetchSessionPartitionEnd,
                                              SESSION_END_TAG: FetchSessionEnd}
_BROKER_TAGS = {cls: tag for tag, cls in _BROKER_FRAMES.items()}


def encode_client_frame(frame: ClientFrame) -> bytes:
    return (CREDIT_TAG if isinstance(frame, FetchSessionCredit) else UPDATE_TAG) + encode(frame)


def decode_client_frame(data: bytes, where: str) -> ClientFrame:
    """A client's frame on a fetch session; INVALID_REQUEST when it is none of them."""
    cls = _CLIENT_FRAMES.get(data[:1])
    if cls is None:
        raise InvalidRequestError(f"{where}: a client frame tagged {data[:1]!r}")
    frame = decode_versioned(cls, data[1:], f"{where}: {cls.__name__}")
    assert isinstance(frame, FetchSessionCredit | FetchSessionUpdate)
    return frame


def encode_broker_frame(frame: BrokerFrame) -> bytes:
    return _BROKER_TAGS[type(frame)] + encode(frame)


def encode_first_frame(state: FetchSessionPartitionState, batch_metadata: bytes) -> bytes:
    """An F frame's metadata: ``state`` carried with the metadata of the partition's first B
    frame, or of its R frame (whose data the F frame carries)."""
    body = encode(state)
    return FIRST_TAG + _LENGTH.pack(len(body)) + body + batch_metadata


def decode_first_frame(data: bytes, where: str) -> tuple[FetchSessionPartitionState, bytes]:
    """An F frame's state, and the metadata of the batch it carries (B or R)."""
    if len(data) < 1 + _LENGTH.size:
        raise UnknownServerError(f"{where}: an F frame of {len(data)} bytes")
    (size,) = _LENGTH.unpack_from(data, 1)
    start = 1 + _LENGTH.size
    if start + size > len(data):
        raise UnknownServerError(f"{where}: an F frame announces a state of {size} bytes "
                                 f"and holds {len(data) - start}")
    state = _broker_message(FetchSessionPartitionState, data[start:start + size], where)
    return state, data[start + size:]


def decode_broker_frame(data: bytes, where: str) -> BrokerFrame:
    """A broker's metadata-only frame on a fetch session (a malformed one is the broker's
    fault: UNKNOWN_SERVER_ERROR)."""
    cls = _BROKER_FRAMES.get(data[:1])
    if cls is None:
        raise UnknownServerError(f"{where}: a broker frame tagged {data[:1]!r}")
    frame = _broker_message(cls, data[1:], where)
    assert isinstance(frame, FetchSessionPartitionState | FetchSessionUpdated
                      | FetchSessionPartitionEnd | FetchSessionEnd)
    return frame


def _broker_message(cls: type[M], body: bytes, where: str) -> M:
    """A versioned message the broker sent; a malformed one is UNKNOWN_SERVER_ERROR."""
    try:
        return decode_versioned(cls, body, f"{where}: {cls.__name__}")
    except InvalidRequestError as e:
        raise UnknownServerError(e.message) from None
