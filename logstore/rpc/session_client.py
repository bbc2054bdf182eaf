"""The client's end of a fetch session's DoExchange (frames: ``codec.py``'s table).

Owns: sending credit and updates (from any thread, one frame at a time), reading the broker's
frames on one thread and grouping each partition's state with the batches that follow it,
turning Flight failures back into ApiErrors (a broker that no longer knows the SASL session
makes the connection authenticate again, and the session ends as a lost connection would),
and closing by cancelling the call (closing a writer whose call is still pushing would wait
for it). Must not: contain client policy (what to subscribe, when to grant); that is
``client/fetch_session.py`` and ``replication/fetcher.py``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as flight

from logstore.errors import ApiError, IllegalSaslStateError, NetworkError, UnknownServerError
from logstore.messages.fetch_session import (
    FetchSessionCredit,
    FetchSessionEnd,
    FetchSessionPartitionEnd,
    FetchSessionPartitionState,
    FetchSessionUpdate,
    FetchSessionUpdated,
)
from logstore.rpc.codec import (
    BATCH_TAG,
    FIRST_TAG,
    REPLICA_TAG,
    FetchedBatch,
    decode_batch_metadata,
    decode_broker_frame,
    decode_first_frame,
    encode_client_frame,
    from_flight_error,
    stored_messages,
)


@dataclass(frozen=True, slots=True)
class PartitionNews:
    """A partition's state as the broker pushed it, and what followed: its batches, or for a
    replica the stored messages themselves."""

    state: FetchSessionPartitionState
    batches: list[FetchedBatch] = field(default_factory=list)
    messages: list[pa.Buffer] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(b.header.batch_size for b in self.batches) + sum(
            int(m.size) for m in self.messages)


SessionFrame = PartitionNews | FetchSessionUpdated | FetchSessionPartitionEnd


class FetchSessionStream:
    """One open fetch session. ``send`` may run on any thread; ``read`` on one."""

    def __init__(self, writer: flight.FlightStreamWriter, reader: flight.FlightStreamReader,
                 where: str, session_lost: Callable[[], None] | None = None) -> None:
        self._writer = writer
        self._reader = reader
        self.where = where
        self.session_lost = session_lost
        self._lock = threading.Lock()  # one frame at a time
        self._closing = threading.Lock()
        self._closed = False

    @property
    def schema(self) -> pa.Schema:
        """The pushed batches' schema (waits for the broker to accept the session)."""
        try:
            return self._reader.schema
        except flight.FlightError as e:
            raise self._error(e) from None

    def _error(self, e: flight.FlightError) -> ApiError:
        error = from_flight_error(e, self.where)
        if isinstance(error, IllegalSaslStateError) and self.session_lost is not None:
            self.session_lost()
            return NetworkError(error.message)
        return error

    def send(self, frame: FetchSessionCredit | FetchSessionUpdate) -> None:
        try:
            with self._lock:
                self._writer.write_metadata(pa.py_buffer(encode_client_frame(frame)))
        except flight.FlightError as e:
            raise self._error(e) from None
        except (pa.ArrowException, OSError) as e:
            raise NetworkError(f"{self.where}: {e}") from None

    def read(self) -> SessionFrame | None:
        """The next frame (a state with its batches as one); the broker's end of the session
        raises its error; None when the call ended without one (the client closed it)."""
        chunk = self._next()
        if chunk is None:
            return None
        meta = _metadata(chunk)
        if meta[:1] == FIRST_TAG:  # a state with its first batch
            state, meta = decode_first_frame(meta, self.where)
            news = PartitionNews(state)
            self._add_batches(news, chunk, meta)
        else:
            frame = decode_broker_frame(meta, self.where)
            if isinstance(frame, FetchSessionEnd):
                self.close()  # the broker waits for our side to close
                frame.raise_error(self.where)
                raise UnknownServerError(f"{self.where}: ended without an error code")
            if not isinstance(frame, FetchSessionPartitionState):
                return frame
            news = PartitionNews(frame)
        while len(news.batches) + len(news.messages) < news.state.batches:
            chunk = self._next()
            self._add_batches(news, chunk, _metadata(chunk) if chunk is not None else b"")
        return news

    def _add_batches(self, news: PartitionNews, chunk: flight.FlightStreamChunk | None,
                     meta: bytes) -> None:
        """Add a B or R frame's batches to ``news`` (a missing or foreign frame, or more
        batches than its state announced, is the broker's fault)."""
        state = news.state
        if chunk is None or meta[:1] not in (BATCH_TAG, REPLICA_TAG) or chunk.data is None:
            raise UnknownServerError(f"{self.where}: partition {state.partition}'s state "
                                     f"announced {state.batches} batches; some are missing")
        if meta[:1] == REPLICA_TAG:
            news.messages.extend(stored_messages(chunk.data))
        else:
            partition, header, deltas = decode_batch_metadata(meta, self.where)
            news.batches.append(FetchedBatch(partition, header, deltas, chunk.data))
        if len(news.batches) + len(news.messages) > state.batches:
            raise UnknownServerError(f"{self.where}: partition {state.partition}'s state "
                                     f"announced {state.batches} batches; more came")

    def _next(self) -> flight.FlightStreamChunk | None:
        try:
            return self._reader.read_chunk()
        except StopIteration:
            self.close()
            return None
        except flight.FlightError as e:
            self.close()
            raise self._error(e) from None
        except (pa.ArrowException, OSError) as e:
            self.close()
            raise NetworkError(f"{self.where}: {e}") from None

    def close(self) -> None:
        """Cancel the call (a pushing broker sees the client gone) and release it."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
            self._reader.cancel()
        with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
            self._writer.close()


def _metadata(chunk: flight.FlightStreamChunk) -> bytes:
    meta = chunk.app_metadata
    return meta.to_pybytes() if meta is not None else b""
