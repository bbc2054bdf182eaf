"""A produce stream closed from two threads at once (``rpc/client.py``'s ``ProduceStream``).

Goal: the ack reader ending the stream (it reads the server's final status by closing the
writer) and the sender breaking it (it closes the stream on a thread of its own) may meet;
gRPC aborts the whole process when two threads close one call together, so the writer must
be closed exactly once, whichever comes first. Method: a writer stand-in whose close blocks
until released, closed by ``read_ack``'s end of stream on one thread while ``close`` runs on
another.
"""

from __future__ import annotations

import threading
from typing import Any

from logstore.rpc.client import ProduceStream


class SlowWriter:
    """Counts the calls; ``close`` waits for ``release`` (a server slow to send its status)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closing = threading.Event()
        self.release = threading.Event()

    def done_writing(self) -> None:
        self.calls.append("done_writing")

    def close(self) -> None:
        self.calls.append("close")
        self.closing.set()
        assert self.release.wait(5)


class EndedReader:
    def read(self) -> Any:
        return None  # the server ended the stream


def test_the_writer_is_closed_once_when_both_ends_close_together() -> None:
    writer = SlowWriter()
    stream = ProduceStream(writer, EndedReader(), "127.0.0.1:1")  # type: ignore[arg-type]
    acks = threading.Thread(target=stream.read_ack)
    acks.start()
    assert writer.closing.wait(5)  # the ack reader is inside close()
    closer = threading.Thread(target=stream.close)
    closer.start()  # whenever it gets there, it must not close the writer again
    writer.release.set()
    acks.join(5)
    closer.join(5)
    assert writer.calls == ["close"]


def test_close_half_closes_then_closes() -> None:
    writer = SlowWriter()
    writer.release.set()
    stream = ProduceStream(writer, EndedReader(), "127.0.0.1:1")  # type: ignore[arg-type]
    stream.close()
    stream.close()
    assert stream.read_ack() is None  # the stream already closed: nothing closed again
    assert writer.calls == ["done_writing", "close"]
