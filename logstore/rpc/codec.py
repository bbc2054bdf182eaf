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

Fetch metadata is binary for speed: ``b"B"`` + int32 partition + the 74-byte batch header
(records.py) + optional int32 offset deltas; or ``b"S"`` + the JSON ``FetchSummary``. A
replica's fetch (``replica_id`` >= 0) streams ``records.STORED_MESSAGE_SCHEMA`` instead of the
topic's: each batch is one row holding a stored IPC message's exact bytes, so the follower
appends what the leader stored without decoding and encoding it again.

Request-level errors travel as a FlightServerError whose ``extra_info`` is the JSON of
``ErrorFields`` (``{"error_code", "error_message"}``). Must not: contain business logic.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pyarrow.flight as flight

from logstore.errors import ApiError, ErrorCode, NetworkError, UnknownServerError, error_class
from logstore.messages import ErrorFields, decode_message, decode_response, encode, error_kw
from logstore.messages.fetch import FetchSummary
from logstore.records import HEADER_SIZE, BatchHeader, StoredBatch

# "[SASL_AUTHENTICATION_FAILED] authentication failed ... . Detail: ..." (auth handler errors
# reach the client without extra_info; their code travels in the message).
_CODED_MESSAGE = re.compile(r"\[([A-Z_]+)\] (.*?)(?:\. Detail:|$)", re.DOTALL)
BATCH_TAG = b"B"
SUMMARY_TAG = b"S"
_PARTITION = struct.Struct("<i")


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


def encode_batch_metadata(partition: int, stored: StoredBatch) -> bytes:
    out = BATCH_TAG + _PARTITION.pack(partition) + stored.header.pack()
    if stored.offset_deltas is not None:
        out += np.ascontiguousarray(stored.offset_deltas, dtype="<i4").tobytes()
    return out


def decode_batch_metadata(data: bytes) -> tuple[int, BatchHeader, np.ndarray | None]:
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
