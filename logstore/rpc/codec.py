"""Encoding of requests and responses on Arrow Flight.

The wire protocol (all bodies orjson unless said otherwise):

| call     | carries                                                                           |
|----------|-----------------------------------------------------------------------------------|
| DoAction | control: type = request name, body = JSON request; one Result = JSON response      |
| DoPut    | produce: descriptor command = JSON ``{"type": "produce", "topic", "acks",         |
|          | "timeout_ms"}``; each batch's app_metadata = JSON ``{"seq", "partition",            |
|          | "producer_id", "producer_epoch", "base_sequence"}``; the server answers each batch |
|          | (unless acks=0) with metadata JSON ``{"seq", "partition", "error_code",             |
|          | "error_message", "base_offset", "log_append_time", "log_start_offset"}``           |
| DoGet    | fetch: ticket = JSON fetch request; the stream's batches carry BATCH metadata,     |
|          | then one empty batch carries the SUMMARY (per-partition error, high watermark...)  |

Fetch metadata is binary for speed: ``b"B"`` + int32 partition + the 74-byte batch header
(records.py) + optional int32 offset deltas; or ``b"S"`` + JSON summary.

Request-level errors travel as a FlightServerError whose ``extra_info`` is JSON
``{"error_code", "error_message"}``. Must not: contain business logic.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pyarrow.flight as flight

from logstore.errors import ApiError, ErrorCode, InvalidRequestError, NetworkError, error_class
from logstore.records import HEADER_SIZE, BatchHeader, StoredBatch

BATCH_TAG = b"B"
SUMMARY_TAG = b"S"
_PARTITION = struct.Struct("<i")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def loads_request(data: bytes | memoryview, what: str) -> dict[str, Any]:
    """Parse a JSON request body; anything but a JSON object is INVALID_REQUEST."""
    try:
        obj = orjson.loads(bytes(data))
    except orjson.JSONDecodeError as e:
        raise InvalidRequestError(f"{what}: body is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise InvalidRequestError(f"{what}: body must be a JSON object")
    return obj


def field(req: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str,
          default: Any = ..., ) -> Any:
    """A typed field of a request; a missing or wrongly typed one is INVALID_REQUEST."""
    if name not in req or req[name] is None:
        if default is ...:
            raise InvalidRequestError(f"{what}: missing field {name!r}")
        return default
    value = req[name]
    bad_bool = isinstance(value, bool) and kind in (int, (int,))
    if not isinstance(value, kind) or bad_bool:
        raise InvalidRequestError(f"{what}: field {name!r} has the wrong type "
                                  f"({type(value).__name__})")
    return value


def error_fields(error: ApiError | None) -> dict[str, Any]:
    if error is None:
        return {"error_code": 0, "error_message": None}
    return {"error_code": int(error.code), "error_message": error.message}


def error_from_fields(d: dict[str, Any]) -> ApiError | None:
    code = d.get("error_code", 0)
    if not code:
        return None
    return error_class(code)(d.get("error_message") or "")


def to_flight_error(error: ApiError) -> flight.FlightServerError:
    return flight.FlightServerError(str(error), extra_info=dumps(error_fields(error)))


def from_flight_error(e: flight.FlightError, where: str) -> ApiError:
    """The ApiError a Flight failure stands for (connection failures are NETWORK_EXCEPTION)."""
    info = getattr(e, "extra_info", None)
    if info:
        try:
            err = error_from_fields(orjson.loads(info))
            if err is not None:
                return err
        except orjson.JSONDecodeError:
            pass
    if isinstance(e, flight.FlightUnavailableError | flight.FlightTimedOutError):
        return NetworkError(f"{where}: {str(e).splitlines()[0]}")
    return error_class(ErrorCode.UNKNOWN_SERVER_ERROR)(f"{where}: {e}")


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


def encode_summary(summary: dict[str, Any]) -> bytes:
    return SUMMARY_TAG + dumps(summary)
