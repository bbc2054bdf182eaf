"""The Arrow Flight server: decodes calls, hands them to the request handlers, encodes replies.

Each call is made on behalf of a principal (``auth.ServerSecurity``: the SASL session, the
client certificate, or ANONYMOUS); the handlers get that principal's ``Permissions`` with the
request, and a long produce stream checks its session and its ACLs (those current then)
between batches. Must not: contain business logic. It is also the outermost boundary, so it
catches everything: an ``ApiError`` becomes a Flight error carrying its code, anything else is
logged and becomes UNKNOWN_SERVER_ERROR, and the server keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight

from logstore.broker.handlers import PendingProduce, RequestHandlers
from logstore.broker.replica_manager import PartitionFetchResult
from logstore.errors import (
    ApiError,
    CorruptRecordError,
    InvalidRequestError,
    UnknownServerError,
    UnsupportedVersionError,
)
from logstore.messages import decode_message, decode_request, encode
from logstore.messages.fetch import FetchRequest
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.produce import BatchSeq, ProduceBatchMetadata, ProduceRequest
from logstore.records import STORED_MESSAGE_SCHEMA, StoredBatch, stored_message_batch
from logstore.rpc.auth import ServerSecurity
from logstore.rpc.codec import encode_batch_metadata, encode_summary, to_flight_error
from logstore.rpc.session_server import serve_fetch_session
from logstore.security.access import Permissions
from logstore.security.config import SecurityConfig

log = logging.getLogger(__name__)


class RequestRecorder(Protocol):
    """Told of every answered request (``metrics.requests.RequestMetrics`` is one); error
    codes are 0 for success."""

    def action(self, name: str, seconds: float, error_code: int) -> None: ...

    def produced(self, topic: str, records: int, size: int, seconds: float,
                 error_code: int) -> None: ...

    def fetched(self, topic: str, follower: bool, records: int, size: int, seconds: float,
                error_codes: list[int]) -> None: ...

    def pushed(self, topic: str, follower: bool, records: int, size: int) -> None: ...


class _NoRecorder:
    def action(self, name: str, seconds: float, error_code: int) -> None:
        return None

    def produced(self, topic: str, records: int, size: int, seconds: float,
                 error_code: int) -> None:
        return None

    def fetched(self, topic: str, follower: bool, records: int, size: int, seconds: float,
                error_codes: list[int]) -> None:
        return None

    def pushed(self, topic: str, follower: bool, records: int, size: int) -> None:
        return None


class FlightBrokerServer(flight.FlightServerBase):  # type: ignore[misc]  # pyarrow: untyped
    def __init__(self, listener: str, handlers: RequestHandlers,
                 security: SecurityConfig | None = None,
                 recorder: RequestRecorder | None = None) -> None:
        self._security = ServerSecurity(security or SecurityConfig(), handlers.credentials)
        super().__init__(self._security.location(listener), **self._security.flight_options())
        self._handlers = handlers
        self._recorder: RequestRecorder = recorder or _NoRecorder()

    def _permissions(self, context: Any) -> Permissions | None:
        principal, host = self._security.principal(context)
        return self._handlers.permissions(principal, host)

    # -- control -----------------------------------------------------------------------------

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        name = action.type
        started = time.perf_counter()
        try:
            permissions = self._permissions(context)
            route = self._handlers.routes.get(name)
            if route is None:
                raise UnsupportedVersionError(
                    f"unknown action {name!r}; this broker answers {sorted(self._handlers.routes)}")
            response = route(action.body.to_pybytes() if action.body else b"{}", permissions)
        except Exception as e:
            self._recorder.action(name, time.perf_counter() - started, _code_of(e))
            raise self._flight_error(e, f"action {name!r}") from None
        self._recorder.action(name, time.perf_counter() - started, 0)
        return iter([flight.Result(response)])

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return sorted((name, route.request_type.__doc__ or name)
                      for name, route in self._handlers.routes.items())

    # -- produce -----------------------------------------------------------------------------

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader,
               writer: flight.FlightMetadataWriter) -> None:
        try:
            request = decode_request(ProduceRequest, descriptor.command or b"")
            permissions = self._permissions(context)
            self._handlers.authorize_stream(request, permissions)
        except Exception as e:
            raise self._flight_error(e, "produce") from None
        # Batches are appended in arrival order here; a separate thread waits for each one's
        # acknowledgement and answers in the same order, so the next batch is appended while
        # earlier ones wait for an fsync or for replicas.
        acker = _AckWriter(writer, request.timeout_ms, request.topic, self._recorder) \
            if request.acks != 0 else None
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                started = time.perf_counter()
                pending = self._produce_one(request, chunk, context, permissions)
                if acker is not None:
                    acker.put(pending, started)
                else:
                    _record_produce(self._recorder, request.topic, pending, started,
                                    _code_of(pending.error))
        except Exception as e:
            raise self._flight_error(e, "produce") from None
        finally:
            if acker is not None:
                acker.close()

    def _produce_one(self, request: ProduceRequest, chunk: flight.FlightStreamChunk,
                     context: Any, permissions: Permissions | None) -> PendingProduce:
        """Append one batch; a batch that cannot be appended still gets its (failed) ack, so
        one bad batch never ends the stream for the ones after it."""
        what = f"produce to {request.topic!r}"
        raw = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else None
        try:
            meta = _batch_metadata(raw, what)
        except ApiError as e:
            return PendingProduce(_seq_of(raw), -1, None, e)
        try:
            if chunk.data is None:
                raise InvalidRequestError(f"{what}: metadata without a batch")
            self._security.check_session(context)
            return self._handlers.produce(request, chunk.data, meta, permissions)
        except ApiError as e:
            return PendingProduce(meta.seq, meta.partition, None, e)
        except Exception as e:  # boundary: logged, answered, and the stream goes on
            log.exception("%s-%d: batch failed", request.topic, meta.partition)
            return PendingProduce(meta.seq, meta.partition, None,
                                  UnknownServerError(f"{type(e).__name__}: {e}"))

    # -- fetch -------------------------------------------------------------------------------

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        started = time.perf_counter()
        try:
            request = decode_request(FetchRequest, ticket.ticket)
            schema, results = self._handlers.fetch(request, self._permissions(context))
        except Exception as e:
            self._recorder.fetched("", False, 0, 0, time.perf_counter() - started, [_code_of(e)])
            raise self._flight_error(e, "fetch") from None
        if request.replica_id >= 0:
            batches = _stored_messages(results)
            schema = STORED_MESSAGE_SCHEMA
        else:
            batches = self._handlers.iter_fetch_batches(schema, results)
        stream = self._fetch_stream(schema, results, batches)
        return flight.GeneratorStream(schema, self._recorded_fetch(
            stream, request, results, started))

    def _recorded_fetch(self, stream: Iterator[Any], request: FetchRequest,
                        results: list[PartitionFetchResult], started: float) -> Iterator[Any]:
        """``stream``, then the fetch told to the recorder (once sent, or abandoned)."""
        try:
            yield from stream
        finally:
            self._recorder.fetched(
                request.topic, request.replica_id >= 0,
                sum(b.header.record_count for r in results for b in r.batches),
                sum(r.size_bytes for r in results), time.perf_counter() - started,
                [int(r.error.code) for r in results if r.error is not None])

    def _fetch_stream(self, schema: pa.Schema, results: list[PartitionFetchResult],
                      batches: Iterator[tuple[int, StoredBatch, pa.RecordBatch]]
                      ) -> Iterator[Any]:
        error: ApiError | None = None
        try:
            for partition, stored, batch in batches:
                yield batch, pa.py_buffer(encode_batch_metadata(partition, stored))
        except Exception as e:  # the client is told, so a partial stream never looks whole
            log.exception("fetch stream failed")
            error = e if isinstance(e, ApiError) else CorruptRecordError(
                f"a stored batch could not be decoded: {e}") if isinstance(
                e, pa.ArrowInvalid) else UnknownServerError(f"{type(e).__name__}: {e}")
        summary = self._handlers.fetch_summary(results, error)
        yield _empty(schema), pa.py_buffer(encode_summary(summary))

    # -- fetch sessions ----------------------------------------------------------------------

    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader,
                    writer: flight.MetadataRecordBatchWriter) -> None:
        """A push session (session_server.py), authorized at open and at each of the client's
        frames; what it pushes counts as fetch traffic (the recorder's ``pushed``)."""
        started = time.perf_counter()  # the opening is the request the metrics count
        try:
            request = decode_request(FetchSessionRequest, descriptor.command or b"")
            schema, session = self._handlers.open_fetch_session(request,
                                                                self._permissions(context))
        except Exception as e:
            self._recorder.action("fetch_session", time.perf_counter() - started, _code_of(e))
            raise self._flight_error(e, "fetch session") from None
        self._recorder.action("fetch_session", time.perf_counter() - started, 0)
        try:
            serve_fetch_session(
                session, STORED_MESSAGE_SCHEMA if session.is_replica else schema, reader,
                writer, lambda: self._handlers.authorize_stream(request,
                                                                self._permissions(context)),
                lambda records, size: self._recorder.pushed(
                    request.topic, session.is_replica, records, size))
        except Exception as e:
            raise self._flight_error(e, "fetch session") from None
        finally:
            self._handlers.end_fetch_session(session)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _flight_error(e: Exception, where: str) -> flight.FlightError:
        if isinstance(e, flight.FlightError):
            return e
        if isinstance(e, ApiError):
            return to_flight_error(e)
        log.exception("%s failed", where)
        return to_flight_error(UnknownServerError(f"{where}: {type(e).__name__}: {e}"))


def _code_of(error: BaseException | None) -> int:
    if error is None:
        return 0
    return int(error.code) if isinstance(error, ApiError) else int(UnknownServerError.code)


def _record_produce(recorder: RequestRecorder, topic: str, pending: PendingProduce,
                    started: float, error_code: int) -> None:
    info = pending.pending.info if pending.pending is not None else None
    records = size = 0
    if info is not None and not info.duplicate:
        records, size = info.last_offset - info.first_offset + 1, info.batch_size
    recorder.produced(topic, records, size, time.perf_counter() - started, error_code)


def _batch_metadata(raw: bytes | None, what: str) -> ProduceBatchMetadata:
    if raw is None:
        raise InvalidRequestError(f"{what}: batch carries no metadata")
    return decode_message(ProduceBatchMetadata, raw, f"{what}: batch metadata")


def _seq_of(raw: bytes | None) -> int:
    """The ``seq`` of batch metadata that does not decode as a whole, -1 if unreadable."""
    try:
        return -1 if raw is None else decode_message(BatchSeq, raw, "batch seq").seq
    except ApiError:
        return -1


def _stored_messages(results: list[PartitionFetchResult]
                     ) -> Iterator[tuple[int, StoredBatch, pa.RecordBatch]]:
    """A replica fetch's batches: each stored message's bytes as they are in the log."""
    for r in results:
        for stored in r.batches:
            yield r.tp.partition, stored, stored_message_batch(stored)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema],
                                      schema=schema)


class _AckWriter:
    """Writes the acknowledgements of one produce stream, in order, from its own thread, and
    tells the recorder of each batch once it is answered."""

    def __init__(self, writer: flight.FlightMetadataWriter, timeout_ms: int, topic: str,
                 recorder: RequestRecorder) -> None:
        self._writer = writer
        self._timeout_ms = timeout_ms
        self._topic = topic
        self._recorder = recorder
        self._queue: queue.Queue[tuple[PendingProduce, float] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="produce-acks", daemon=True)
        self._thread.start()

    def put(self, pending: PendingProduce, started: float) -> None:
        self._queue.put((pending, started))

    def close(self) -> None:
        """Write the acknowledgements still owed, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        broken = False
        while (item := self._queue.get()) is not None:
            pending, started = item
            ack = pending.ack(self._timeout_ms)
            if not broken:
                try:
                    self._writer.write(pa.py_buffer(encode(ack)))
                except (flight.FlightError, pa.ArrowException, OSError):
                    broken = True  # the client went away; its batches are appended all the same
            _record_produce(self._recorder, self._topic, pending, started, ack.error_code)
