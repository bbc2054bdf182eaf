"""Delivery callbacks on the producer's futures (client/callbacks.py, client/batches.py), on
the chunk and future objects themselves, with no broker: the sender's part is a call to
``ProducerBatch.complete``, made here by hand, in the order a sender makes them.

Goal: kafka-python's ``add_callback``/``add_errback``/``add_both`` and concurrent.futures'
``add_done_callback`` behave as there: the outcome ``result()`` gives, chained calls, a
callback registered late runs at once, callbacks run row by row as each piece completes (so in
send order within a partition), a raising callback is logged and skips nothing, and the
chunk's ``done`` (what flush waits on) is set only once the callbacks have run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest

from logstore.client.batches import FutureBatchMetadata, FutureRecordMetadata, RecordChunk
from logstore.errors import MessageTooLargeError, RequestTimedOutError
from logstore.model import RecordMetadata

NOW_MS = 1_700_000_000_000


def _chunk(partitions: list[int]) -> tuple[RecordChunk, list[FutureRecordMetadata]]:
    """A chunk of ``len(partitions)`` records already cut (one piece per partition)."""
    chunk = RecordChunk("t")
    for i in range(len(partitions)):
        chunk.values.append(b"v%d" % i)
        chunk.keys.append(None)
    pieces = len(set(partitions))
    chunk.expect(pieces, np.array(partitions), np.full(len(partitions), NOW_MS))
    return chunk, [FutureRecordMetadata(chunk, i) for i in range(len(partitions))]


def _rows(partitions: list[int], p: int) -> np.ndarray:
    return np.flatnonzero(np.array(partitions) == p)


def test_callbacks_get_the_metadata_result_gives_row_by_row_as_each_piece_completes() -> None:
    """Records 0..5 to partitions 0,1,0,1,0,1: partition 1's piece completes first (offsets
    10..12), then partition 0's (offsets 20..22). The callbacks of a piece's rows run when it
    completes, in row order; each gets what ``result()`` returns; a record of the completed
    piece is done (and its result available) while the chunk is not."""
    partitions = [0, 1, 0, 1, 0, 1]
    chunk, futures = _chunk(partitions)
    seen: list[tuple[str, Any]] = []
    for i, f in enumerate(futures):
        assert f.add_callback(lambda m, tag: seen.append((tag, m)), tag=f"ok{i}") is f
        f.add_errback(lambda e: seen.append(("error", e)))
    chunk.batch_done(_rows(partitions, 1), 10, None)
    assert [tag for tag, _ in seen] == ["ok1", "ok3", "ok5"]
    assert futures[3].done() and not futures[0].done() and not chunk.done.is_set()
    assert futures[3].result(0) == RecordMetadata("t", 1, 11, NOW_MS)
    chunk.batch_done(_rows(partitions, 0), 20, None)
    assert [tag for tag, _ in seen] == ["ok1", "ok3", "ok5", "ok0", "ok2", "ok4"]
    assert [m for _, m in seen] == [futures[i].result(0) for i in (1, 3, 5, 0, 2, 4)]
    assert [m.offset for _, m in seen] == [10, 11, 12, 20, 21, 22]


def test_an_errback_gets_the_exception_result_raises_and_callbacks_do_not_run() -> None:
    """A failed piece: its rows' errbacks and add_both get the very exception ``result()``
    raises, add_done_callback gets the future; the success callbacks stay silent. The other
    piece's rows succeed."""
    partitions = [0, 1]
    chunk, (f0, f1) = _chunk(partitions)
    error = RequestTimedOutError("t-0: batch of 1 record(s) expired")
    calls: list[tuple[str, Any]] = []
    for f in (f0, f1):
        (f.add_callback(lambda m: calls.append(("callback", m)))
         .add_errback(lambda e: calls.append(("errback", e)))
         .add_both(lambda x: calls.append(("both", x)))
         .add_done_callback(lambda fut: calls.append(("done", fut))))
    chunk.batch_done(_rows(partitions, 0), -1, error)
    assert calls == [("errback", error), ("both", error), ("done", f0)]
    with pytest.raises(RequestTimedOutError) as raised:
        f0.result(0)
    assert raised.value is error and f0.exception(0) is error
    calls.clear()
    chunk.batch_done(_rows(partitions, 1), 7, None)
    meta = f1.result(0)
    assert calls == [("callback", meta), ("both", meta), ("done", f1)]


def test_a_chunk_failed_whole_calls_each_errback_and_a_record_failed_alone_keeps_its_own() -> None:
    """The drainer fails a record alone (too large) and then the whole chunk (the producer
    was closed): the lone record's errback got, and its result raises, its own error; the
    others' errbacks get the chunk's error, in row order."""
    partitions = [0, 0, 0]
    chunk, futures = _chunk(partitions)
    chunk._pending = 2  # the too-large row's piece and the rest's
    got: list[tuple[int, Exception]] = []
    for i, f in enumerate(futures):
        f.add_errback(lambda e, i=i: got.append((i, e)))
    too_large = MessageTooLargeError("record 1 is too large")
    chunk.batch_done(np.array([1]), -1, too_large)
    closed = RequestTimedOutError("the producer was closed before the record was sent")
    chunk.fail(closed)
    assert got == [(1, too_large), (0, closed), (2, closed)]
    assert [f.exception(0) for f in futures] == [closed, too_large, closed]


def test_a_chunk_failed_before_it_was_cut_calls_errbacks_naming_no_partition(
        caplog: pytest.LogCaptureFixture) -> None:
    """``fail`` before ``expect`` (an aborted transaction's chunk never drained): errbacks run
    with the error; a raising one is logged naming the topic."""
    chunk = RecordChunk("t")
    chunk.values.append(b"v")
    chunk.keys.append(None)
    future = FutureRecordMetadata(chunk, 0)
    got: list[Exception] = []
    future.add_errback(lambda e: 1 / 0).add_errback(got.append)
    error = RequestTimedOutError("aborted")
    with caplog.at_level(logging.ERROR, logger="logstore.client.callbacks"):
        chunk.fail(error)
    assert got == [error] and future.done()
    assert "topic 't'" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_raising_callback_is_logged_with_its_partition_and_skips_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every record's first callback raises: the record's later callbacks and the other
    records' callbacks all run, the piece completes (the chunk is done), and each failure
    is logged naming the topic-partition."""
    partitions = [2, 2, 2]
    chunk, futures = _chunk(partitions)
    ran: list[int] = []
    for i, f in enumerate(futures):
        f.add_callback(lambda m: {}["missing"]).add_callback(lambda m, i=i: ran.append(i))
    with caplog.at_level(logging.ERROR, logger="logstore.client.callbacks"):
        chunk.batch_done(_rows(partitions, 2), 0, None)
    assert ran == [0, 1, 2] and chunk.done.is_set()
    failures = [r for r in caplog.records if r.name == "logstore.client.callbacks"]
    assert len(failures) == 3 and all("t-2" in r.getMessage() for r in failures)
    assert all(r.exc_info and r.exc_info[0] is KeyError for r in failures)


def test_a_callback_added_after_completion_runs_at_once_on_the_callers_thread() -> None:
    """Registered on a completed future, each kind runs before the add returns, on the
    calling thread, with the same outcome; the chain still returns the future."""
    partitions = [0]
    chunk, (future,) = _chunk(partitions)
    chunk.batch_done(_rows(partitions, 0), 5, None)
    calls: list[tuple[str, Any, threading.Thread]] = []
    here = threading.current_thread()
    chained = (future
               .add_callback(lambda m: calls.append(("callback", m, threading.current_thread())))
               .add_errback(lambda e: calls.append(("errback", e, threading.current_thread())))
               .add_done_callback(lambda f: calls.append(("done", f, threading.current_thread()))))
    assert chained is future
    assert calls == [("callback", future.result(0), here), ("done", future, here)]


def test_chunk_done_is_set_only_after_the_last_pieces_callbacks_ran() -> None:
    """flush() waits on the chunk's ``done``: inside a callback of the last piece it is not
    set yet (so flush returns after the callbacks), while the record's own future is done and
    its ``result()`` answers without waiting (no deadlock on the completing thread)."""
    partitions = [0]
    chunk, (future,) = _chunk(partitions)
    inside: list[tuple[bool, bool, int]] = []
    future.add_done_callback(
        lambda f: inside.append((chunk.done.is_set(), f.done(), f.result(0).offset)))
    chunk.batch_done(_rows(partitions, 0), 3, None)
    assert inside == [(False, True, 3)] and chunk.done.is_set()


def test_a_send_batch_future_takes_the_same_callbacks() -> None:
    """``send_batch``'s future: callbacks run once the sealed batch's last piece is done, with
    the list ``result()`` returns; the first failed piece is its errbacks' exception; one
    added afterwards runs at once."""
    ok = FutureBatchMetadata("t")
    results: list[Any] = []
    ok.add_piece()
    ok.add_piece()
    assert ok.add_callback(results.append).add_errback(results.append) is ok
    ok.piece_done(1, 0, 4, None)
    ok.seal()
    assert results == [] and not ok.done()
    ok.piece_done(0, 10, 3, None)
    assert results == [ok.result(0)] and [m.partition for m in results[0]] == [0, 1]
    ok.add_done_callback(results.append)
    assert results[-1] is ok

    failed = FutureBatchMetadata("t")
    errors: list[Exception] = []
    failed.add_piece()
    failed.add_errback(errors.append).add_callback(errors.append)
    error = RequestTimedOutError("expired")
    failed.piece_done(0, -1, 2, error)
    failed.seal()
    assert errors == [error]
    with pytest.raises(RequestTimedOutError) as raised:
        failed.result(0)
    assert raised.value is error
