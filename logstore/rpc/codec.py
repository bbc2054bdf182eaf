"""Encoding of requests and responses on Arrow Flight.

The wire protocol (all bodies orjson unless said otherwise):

| call     | carries                                                                           |
|----------|-----------------------------------------------------------------------------------|
| DoAction | control: type = request name, body = JSON request; one Result = JSON response      |
| DoPut    | produce: descriptor command = JSON ``{"type": "produce", "topic", "acks",         |
|          | "timeout_ms"}``; each batch's app_metadata = JSON ``{"seq", "partition",            |
|          | "producer_id", "producer_epoch", "base_sequence", "leader_epoch"}``; leader_epoch |
|          | is the epoch the producer saw (optional, -1 or absent: unchecked; older than the   |
|          | partition's: FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH); the server answers |
|          | each batch (unless acks=0) with metadata JSON ``{"seq", "partition", "error_code", |
|          | "error_message", "base_offset", "log_append_time", "log_start_offset"}``           |
| DoGet    | fetch: ticket = JSON fetch request (per partition: offset, max_bytes, optional     |
|          | end_offset: no batch starting at or after it); the stream's batches carry BATCH    |
|          | metadata, then one empty batch carries the SUMMARY (per-partition error, high      |
|          | watermark...)                                                                      |

Fetch metadata is binary for speed: ``b"B"`` + int32 partition + the 74-byte batch header
(records.py) + optional int32 offset deltas; or ``b"S"`` + JSON summary. A replica's fetch
(``replica_id`` >= 0) streams ``records.STORED_MESSAGE_SCHEMA`` instead of the topic's: each
batch is one row holding a stored IPC message's exact bytes, so the follower appends what the
leader stored without decoding and encoding it again.

Request-level errors travel as a FlightServerError whose ``extra_info`` is JSON
``{"error_code", "error_message"}``. Must not: contain business logic.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pyarrow.flight as flight

from logstore.errors import ApiError, ErrorCode, NetworkError, error_class
from logstore.records import HEADER_SIZE, BatchHeader, StoredBatch
from logstore.wire import dumps, error_fields, error_from_fields, field, loads_request

__all__ = ["dumps", "error_fields", "error_from_fields", "field", "loads_request"]

BATCH_TAG = b"B"
SUMMARY_TAG = b"S"
_PARTITION = struct.Struct("<i")


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
