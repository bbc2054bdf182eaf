"""The broker's end of a fetch session's DoExchange (frames: ``codec.py``'s table).

Owns: running one session's stream. The call's own thread reads the client's frames (credit,
a follower's acknowledgements, updates, each frame re-authorized first) and hands them to
the session; a pushing thread writes the pushes ``broker/fetch_session.py`` makes (each push
of records re-authorized first: a client that never sends a frame, its first credit large,
is still cut off when its READ is revoked or its user deleted), and, when the broker ends
the session, a last X frame with the error. The call returns only once the
client's side is closed and the pushing thread joined, so no thread is left on a finished
call. Must not: contain business logic, or buffer: a push is written as it is made, and the
next one is not made before the client's credit allows it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from logstore.broker.fetch_session import FetchSession, PartitionPush, Push
from logstore.errors import ApiError, CorruptRecordError, UnknownServerError
from logstore.messages import error_kw
from logstore.messages.fetch_session import FetchSessionEnd, FetchSessionUpdate, FetchSessionUpdated
from logstore.records import StoredBatch
from logstore.rpc.codec import (
    decode_client_frame,
    encode_batch_metadata,
    encode_broker_frame,
    encode_first_frame,
    encode_replica_metadata,
    stored_messages_batch,
)

log = logging.getLogger(__name__)

_GONE = (flight.FlightError, pa.ArrowException, OSError)  # the client went away


def serve_fetch_session(session: FetchSession, schema: pa.Schema,
                        reader: flight.MetadataRecordBatchReader,
                        writer: flight.MetadataRecordBatchWriter,
                        authorize: Callable[[], None],
                        on_push: Callable[[int, int], None] = lambda records, size: None
                        ) -> None:
    """Serve ``session`` until the client's side closes (``on_push(records, bytes)`` told of
    each push). ``authorize`` runs before each of the client's frames, credit and updates,
    and before each push of records (the connection's SASL session and ACLs now: a refusal
    ends the session with its error).
    Raises the ApiError that ended the session (the client read it in the X frame already)."""
    writer.begin(schema)
    pusher = threading.Thread(target=_push, args=(session, writer, schema, authorize, on_push),
                              name=f"fetch-session-{session.topic}", daemon=True)
    pusher.start()
    try:
        _read_frames(session, reader, authorize)
    finally:
        session.close()
        pusher.join()
    if session.error is not None:
        raise session.error


def _push(session: FetchSession, writer: flight.MetadataRecordBatchWriter,
          schema: pa.Schema, authorize: Callable[[], None],
          on_push: Callable[[int, int], None]) -> None:
    try:
        while (push := session.next_push()) is not None:
            if push.partitions:
                authorize()  # records go out only as the ACLs and the SASL session are now
            _write(writer, push, schema, session.is_replica,
                   session.request.state_with_first_batch)
            if push.partitions:
                on_push(sum(b.header.record_count for p in push.partitions for b in p.batches),
                        sum(b.header.batch_size for p in push.partitions for b in p.batches))
    except _GONE as e:
        log.debug("fetch session on %r: the client went away (%s)", session.topic, e)
        session.close()
        return
    except ApiError as e:
        session.close(e)
    except Exception as e:  # boundary: logged, and the session ends with it
        log.exception("fetch session on %r: pushing failed", session.topic)
        session.close(UnknownServerError(f"{type(e).__name__}: {e}"))
    if session.error is not None:  # the broker ends it: the client is told, then closes
        with contextlib.suppress(*_GONE):
            writer.write_metadata(pa.py_buffer(encode_broker_frame(
                FetchSessionEnd(**error_kw(session.error)))))


def _write(writer: flight.MetadataRecordBatchWriter, push: Push, schema: pa.Schema,
           replica: bool, with_state: bool) -> None:
    for seq in push.updated:
        writer.write_metadata(pa.py_buffer(encode_broker_frame(FetchSessionUpdated(seq=seq))))
    for end in push.ended:
        writer.write_metadata(pa.py_buffer(encode_broker_frame(end)))
    for p in push.partitions:
        if not p.batches or not with_state:
            writer.write_metadata(pa.py_buffer(encode_broker_frame(p.state)))
        first = with_state  # the first batch's frame carries the state (an F frame)
        for data, meta in _batch_frames(p, schema, replica):
            if first:
                meta, first = encode_first_frame(p.state, meta), False
            writer.write_with_metadata(data, pa.py_buffer(meta))


def _batch_frames(p: PartitionPush, schema: pa.Schema, replica: bool
                  ) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """A partition push's batch frames (data, metadata): a replica's stored messages as they
    are in one R frame, else one B frame per batch."""
    partition = p.state.partition
    if replica:
        if p.batches:
            yield stored_messages_batch(p.batches), encode_replica_metadata(partition)
        return
    for stored in p.batches:
        yield _batch(stored, schema, partition), encode_batch_metadata(partition, stored)


def _batch(stored: StoredBatch, schema: pa.Schema, partition: int) -> pa.RecordBatch:
    """What a B frame carries: the batch decoded (zero-copy) under the topic's schema."""
    try:
        return stored.record_batch(schema)
    except pa.ArrowInvalid as e:
        raise CorruptRecordError(f"partition {partition}: the stored batch at offset "
                                 f"{stored.header.base_offset} could not be decoded: {e}"
                                 ) from None


def _read_frames(session: FetchSession, reader: flight.MetadataRecordBatchReader,
                 authorize: Callable[[], None]) -> None:
    """The client's frames, until it closes its side or goes away; an ApiError (a refused
    update, a malformed frame) ends the session with it, and reading goes on until the
    client, told, closes."""
    where = f"fetch session on {session.topic!r}"
    try:
        while True:
            chunk = reader.read_chunk()
            meta = chunk.app_metadata
            try:
                frame = decode_client_frame(meta.to_pybytes() if meta is not None else b"",
                                            where)
                # Every frame is judged by the ACLs as they are now (and so is every push:
                # a revoked READ ends the session at its next push or frame).
                authorize()
                if isinstance(frame, FetchSessionUpdate):
                    session.update(frame)
                else:
                    session.grant(frame)
            except ApiError as e:
                session.close(e)
    except StopIteration:
        pass
    except _GONE as e:
        log.debug("%s: the client's side ended (%s)", where, e)
    except Exception as e:  # boundary: logged, and the session ends with it
        log.exception("%s: reading the client's frames failed", where)
        session.close(UnknownServerError(f"{where}: {type(e).__name__}: {e}"))
