"""The Arrow Flight client side of the wire protocol (see codec.py for the table of calls).

Owns: one connection to one broker, control calls, the produce stream and fetch calls, turning
Flight failures back into ApiErrors, and the one place a Flight client is built from a client's
security settings (``ClientSecurity``): TLS with the CA, client certificate and hostname check
it names, and SASL on Flight's Handshake call (``rpc/auth.py`` is the server's side). A SASL
connection authenticates once, before its first call, and every call carries its session
token; a broker that no longer knows the session (it restarted) answers ILLEGAL_SASL_STATE, and
the connection authenticates again and retries that call once. Must not: contain client policy
(batching, retries, partitioning); that is ``logstore/client``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.flight as flight

from logstore.errors import (
    ApiError,
    IllegalSaslStateError,
    InvalidRequestError,
    NetworkError,
    UnknownServerError,
)
from logstore.messages import Message, Request, decode_response, encode
from logstore.messages.fetch import FetchPartitionSummary, FetchRequest
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.produce import ProduceAck, ProduceBatchMetadata, ProduceRequest
from logstore.messages.security import SaslAuthenticate, SaslSession
from logstore.rpc.codec import (
    BATCH_TAG,
    SUMMARY_TAG,
    FetchedBatch,
    decode_batch_metadata,
    decode_summary,
    from_flight_error,
)
from logstore.rpc.session_client import FetchSessionStream
from logstore.rpc.tls import client_tls_options
from logstore.security.config import PLAINTEXT, ClientSecurity
from logstore.security.sasl import client_exchange

R = TypeVar("R", bound=Message)
T = TypeVar("T")


@dataclass(slots=True)
class FetchResponse:
    schema: pa.Schema
    batches: list[FetchedBatch] = field(default_factory=list)
    partitions: dict[int, FetchPartitionSummary] = field(default_factory=dict)


class ProduceStream:
    """A long-lived DoPut stream for one topic: batches go out pipelined, acks come back in
    order. ``send`` and ``read_ack`` may run on different threads, and ``close`` on a third:
    the writer is closed once, under a lock (gRPC aborts the process when two threads close
    one call at the same time). A SASL session the broker no longer knows (it restarted)
    breaks the stream as a NETWORK_EXCEPTION, as a lost connection would, after
    ``session_lost`` makes the connection authenticate again."""

    def __init__(self, writer: flight.FlightStreamWriter, reader: flight.FlightMetadataReader,
                 where: str, session_lost: Callable[[], None] | None = None) -> None:
        self._writer = writer
        self._reader = reader
        self._where = where
        self._session_lost = session_lost
        self._closed = False  # close() was called
        self._writer_lock = threading.Lock()
        self._writer_closed = False

    def _error(self, e: flight.FlightError) -> ApiError:
        error = from_flight_error(e, self._where)
        if isinstance(error, IllegalSaslStateError) and self._session_lost is not None:
            self._session_lost()
            return NetworkError(error.message)
        return error

    def send(self, batch: pa.RecordBatch, meta: ProduceBatchMetadata) -> None:
        try:
            self._writer.write_with_metadata(batch, pa.py_buffer(encode(meta)))
        except flight.FlightError as e:
            raise self._error(e) from None
        except (pa.ArrowException, OSError) as e:
            raise from_flight_error(flight.FlightUnavailableError(str(e)), self._where) from None

    def read_ack(self) -> ProduceAck | None:
        """The next acknowledgement, or None when the server closed the stream."""
        try:
            buf = self._reader.read()
        except flight.FlightError as e:
            raise self._error(e) from None
        except (pa.ArrowException, OSError) as e:
            raise from_flight_error(flight.FlightUnavailableError(str(e)), self._where) from None
        if buf is None:
            self._raise_final_status()
            return None
        return decode_response(ProduceAck, buf.to_pybytes(), self._where)

    def _raise_final_status(self) -> None:
        """The server ended the stream: if it ended it with an error of its own (a refused
        produce), that error is the call's final status, which closing the writer reads.
        Anything else (a broker going away) stays a closed stream, which the producer
        retries."""
        try:
            self._close_writer(done_writing=False)
        except flight.FlightError as e:
            error = self._error(e)
            if not isinstance(error, UnknownServerError | NetworkError):  # one of ours
                raise error from None
        except (pa.ArrowException, OSError):
            return

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
            self._close_writer(done_writing=True)

    def _close_writer(self, done_writing: bool) -> None:
        """Close the writer (half-closing it first with ``done_writing``), unless a thread
        already did."""
        with self._writer_lock:
            if self._writer_closed:
                return
            self._writer_closed = True
            if done_writing:
                with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
                    self._writer.done_writing()
            self._writer.close()


class SaslClientAuthHandler(flight.ClientAuthHandler):  # type: ignore[misc]  # untyped
    """The client's side of the SASL handshake (``rpc/auth.py`` describes the messages)."""

    def __init__(self, security: ClientSecurity) -> None:
        super().__init__()
        self._security = security
        self.token = b""
        self.principal = ""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        s = self._security
        assert s.sasl_plain_username is not None and s.sasl_plain_password is not None
        exchange = client_exchange(s.sasl_mechanism, s.sasl_plain_username,
                                   s.sasl_plain_password)
        outgoing.write(encode(SaslAuthenticate(mechanism=exchange.mechanism,
                                               auth_bytes=exchange.first())))
        while (message := exchange.step(incoming.read())) is not None:
            outgoing.write(message)
        session = decode_response(SaslSession, incoming.read(), "SASL handshake")
        self.token, self.principal = session.token, session.principal

    def get_token(self) -> bytes:
        return self.token


def flight_client(address: str, security: ClientSecurity) -> flight.FlightClient:
    """A Flight client to ``address`` as ``security`` says (not yet authenticated)."""
    if not security.tls:
        return flight.connect(f"grpc://{address}")
    return flight.connect(f"grpc+tls://{address}", **client_tls_options(address, security))


class BrokerConnection:
    """One Flight client to one broker. Thread-safe: gRPC multiplexes concurrent calls."""

    def __init__(self, address: str, timeout_s: float = 30.0,
                 compression: str | None = None, security: ClientSecurity = PLAINTEXT) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._security = security
        self._client = flight_client(address, security)
        self._write_options = pa.ipc.IpcWriteOptions(
            compression=compression) if compression else None
        self._lock = threading.Lock()
        self._auth: SaslClientAuthHandler | None = None

    def _authenticated(self) -> None:
        """Authenticate (SASL) unless this connection has a session already."""
        if not self._security.sasl or self._auth is not None:
            return
        with self._lock:
            if self._auth is not None:
                return
            handler = SaslClientAuthHandler(self._security)
            try:
                self._client.authenticate(handler, flight.FlightCallOptions(
                    timeout=self._timeout_s))
            except flight.FlightError as e:
                raise from_flight_error(e, f"SASL authentication to {self.address}") from None
            self._auth = handler

    def _session_lost(self) -> None:
        with self._lock:
            self._auth = None

    def _in_session(self, call: Callable[[], T]) -> T:
        """``call()`` within an authenticated session; once again in a new session if the
        broker no longer knows this one."""
        self._authenticated()
        try:
            return call()
        except IllegalSaslStateError:
            if not self._security.sasl:
                raise
            self._session_lost()
            self._authenticated()
            return call()

    def call(self, request: Request[R], timeout_s: float | None = None) -> R:
        """A typed control request; the response decoded as its declared type."""
        return self._in_session(lambda: self._call(request, timeout_s))

    def _call(self, request: Request[R], timeout_s: float | None) -> R:
        name = request.ACTION
        options = flight.FlightCallOptions(timeout=timeout_s or self._timeout_s)
        try:
            results = list(self._client.do_action(flight.Action(name, encode(request)), options))
        except flight.FlightError as e:
            raise from_flight_error(e, f"{name} on {self.address}") from None
        if not results:
            raise InvalidRequestError(f"{name} on {self.address}: empty response")
        response = decode_response(type(request).RESPONSE, results[0].body.to_pybytes(),
                                   f"{name} on {self.address}")
        return cast(R, response)

    def open_produce(self, request: ProduceRequest, schema: pa.Schema) -> ProduceStream:
        """A DoPut stream of batches of ``schema`` to ``request.topic``."""
        return self._in_session(lambda: self._open_produce(request, schema))

    def _open_produce(self, request: ProduceRequest, schema: pa.Schema) -> ProduceStream:
        descriptor = flight.FlightDescriptor.for_command(encode(request))
        options = flight.FlightCallOptions(write_options=self._write_options) \
            if self._write_options else flight.FlightCallOptions()
        where = f"produce to {request.topic!r} on {self.address}"
        try:
            writer, reader = self._client.do_put(descriptor, schema, options)
        except flight.FlightError as e:
            raise from_flight_error(e, where) from None
        return ProduceStream(writer, reader, where,
                             self._session_lost if self._security.sasl else None)

    def fetch(self, request: FetchRequest, timeout_s: float | None = None) -> FetchResponse:
        return self._in_session(lambda: self._fetch(request, timeout_s))

    def _fetch(self, request: FetchRequest, timeout_s: float | None) -> FetchResponse:
        wait_s = max(request.max_wait_ms, 0) / 1000.0
        options = flight.FlightCallOptions(timeout=(timeout_s or self._timeout_s) + wait_s)
        where = f"fetch from {request.topic!r} on {self.address}"
        try:
            reader = self._client.do_get(flight.Ticket(encode(request)), options)
            response = FetchResponse(reader.schema)
            for chunk in reader:
                self._add_chunk(response, chunk, where)
        except flight.FlightError as e:
            raise from_flight_error(e, where) from None
        return response

    def open_fetch_session(self, request: FetchSessionRequest) -> FetchSessionStream:
        """A push session (no deadline: it lives until closed or ended by the broker); open
        once the broker accepted it (its schema arrived)."""
        return self._in_session(lambda: self._open_fetch_session(request))

    def _open_fetch_session(self, request: FetchSessionRequest) -> FetchSessionStream:
        where = f"fetch session on {request.topic!r} at {self.address}"
        try:
            writer, reader = self._client.do_exchange(
                flight.FlightDescriptor.for_command(encode(request)))
        except flight.FlightError as e:
            raise from_flight_error(e, where) from None
        stream = FetchSessionStream(writer, reader, where, None)
        try:
            stream.schema  # noqa: B018  (waits for the broker's answer: accepted or refused)
        except ApiError:
            stream.close()
            raise
        stream.session_lost = self._session_lost if self._security.sasl else None
        return stream

    @staticmethod
    def _add_chunk(response: FetchResponse, chunk: flight.FlightStreamChunk, where: str
                   ) -> None:
        meta = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
        tag = meta[:1]
        if tag == BATCH_TAG:
            partition, header, deltas = decode_batch_metadata(meta, where)
            response.batches.append(FetchedBatch(partition, header, deltas, chunk.data))
        elif tag == SUMMARY_TAG:
            summary = decode_summary(meta, where)
            response.partitions = {p.partition: p for p in summary.partitions}
            if summary.stream_error is not None:  # the broker could not send all it read
                summary.stream_error.raise_error(where)

    def close(self) -> None:
        with contextlib.suppress(flight.FlightError, OSError):
            self._client.close()


__all__ = ["ApiError", "BrokerConnection", "FetchResponse", "FetchSessionStream", "FetchedBatch",
           "ProduceStream"]
