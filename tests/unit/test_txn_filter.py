"""The read_committed filter (logstore/txn_filter.py) and the control record encoding, as pure
rules: hypothesis against a per-record model of transactions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import errors
from logstore.records import (
    DEFAULT_SCHEMA,
    FLAG_CONTROL,
    FLAG_TRANSACTIONAL,
    BatchHeader,
    ControlType,
    EndTxnMarker,
    control_batch,
    control_marker,
    topic_schema,
)
from logstore.txn_filter import (
    AbortedTxn,
    ReadCommittedFilter,
    committed_mask,
    is_abort_marker,
    keep_mask,
    row_mask,
)

PRODUCERS = (1, 2, 3)


@dataclass
class Built:
    """A partition's batches as a transactional log would hold them, with the truth per record."""

    headers: list[BatchHeader]
    abort_markers: list[bool]
    truth: list[bool]  # per batch: does a read_committed reader keep it?
    aborted: list[AbortedTxn]  # every aborted transaction with data, with its marker offset


KINDS = ["txn", "txn", "txn", "plain", "plain_anon", "commit", "abort", "abort"]
EVENTS = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(PRODUCERS),
                            st.integers(1, 4)), min_size=1, max_size=40)


def build(events: list[tuple[str, int, int]]) -> Built:
    """Play ``events`` by Kafka's rules (a producer with an open transaction writes only
    transactional batches; a marker closes the open transaction, if any); then end every
    transaction still open with an abort, so that every record's fate is known."""
    out = Built([], [], [], [])
    open_txns: dict[int, tuple[int, list[int]]] = {}  # producer -> (first offset, batch indexes)
    offset = 0

    def add(header: BatchHeader, abort: bool, keep: bool) -> None:
        nonlocal offset
        out.headers.append(header)
        out.abort_markers.append(abort)
        out.truth.append(keep)
        offset = header.next_offset

    def end(pid: int, abort: bool) -> None:
        flags = FLAG_CONTROL | FLAG_TRANSACTIONAL
        add(BatchHeader(offset, 0, 1, 0, 0, pid, 0, -1, 0, flags), abort, False)
        first, members = open_txns.pop(pid, (None, []))
        for i in members:
            out.truth[i] = not abort
        if abort and first is not None:
            out.aborted.append(AbortedTxn(pid, first, offset - 1))

    for kind, pid, n in events:
        if kind == "txn":
            first, members = open_txns.setdefault(pid, (offset, []))
            members.append(len(out.headers))
            add(BatchHeader(offset, n - 1, n, 0, 0, pid, 0, 0, 0, FLAG_TRANSACTIONAL), False,
                False)
        elif kind in ("plain", "plain_anon") and pid not in open_txns:
            producer = pid if kind == "plain" else -1
            add(BatchHeader(offset, n - 1, n, 0, 0, producer, 0, 0, 0, 0), False, True)
        elif kind in ("commit", "abort"):
            end(pid, kind == "abort")
    for pid in list(open_txns):
        end(pid, True)
    return out


def fetched(built: Built, i: int, j: int) -> tuple[list[BatchHeader], list[AbortedTxn]]:
    """Batches i..j-1 and the aborted transactions overlapping them, as the log returns them."""
    headers = built.headers[i:j]
    start, end = headers[0].base_offset, headers[-1].next_offset
    aborted = [a for a in built.aborted
               if a.last_offset is not None and a.last_offset >= start and a.first_offset < end]
    return headers, aborted


def kafka_consumer(headers: list[BatchHeader], abort_markers: list[bool],
                   aborted: list[AbortedTxn]) -> list[bool]:
    """Kafka's consumer algorithm, batch by batch, as a second model."""
    pending = sorted(aborted, key=lambda a: a.first_offset)
    in_abort: set[int] = set()
    keep = []
    for header, abort in zip(headers, abort_markers, strict=True):
        while pending and pending[0].first_offset <= header.last_offset:
            in_abort.add(pending.pop(0).producer_id)
        if header.is_control:
            if abort:
                in_abort.discard(header.producer_id)
            keep.append(False)
        else:
            keep.append(not (header.is_transactional and header.producer_id in in_abort))
    return keep


def without_ends(aborted: list[AbortedTxn]) -> list[AbortedTxn]:
    return [AbortedTxn(a.producer_id, a.first_offset) for a in aborted]


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, data=st.data())
def test_filter_keeps_exactly_the_committed_and_plain_batches(events: list[tuple[str, int, int]],
                                                              data: st.DataObject) -> None:
    """Goal: for any fetched range, the filter keeps every non-transactional batch and every
    batch of a committed transaction, and drops control batches and the batches of aborted
    transactions, whether or not the aborted list carries the markers' offsets, and agrees
    with Kafka's batch-by-batch consumer algorithm. Method: random interleavings of
    transactional and plain writes and markers of three producers (with markers that close
    nothing); a random batch range; compare with the per-record truth."""
    built = build(events)
    n = len(built.headers)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(i + 1, n))
    headers, aborted = fetched(built, i, j)
    markers = built.abort_markers[i:j]
    truth = built.truth[i:j]
    assert committed_mask(headers, markers, aborted).tolist() == truth
    assert committed_mask(headers, markers, without_ends(aborted)).tolist() == truth
    assert kafka_consumer(headers, markers, without_ends(aborted)) == truth


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, data=st.data())
def test_filter_gives_the_same_answer_chunk_by_chunk(events: list[tuple[str, int, int]],
                                                     data: st.DataObject) -> None:
    """Goal: ReadCommittedFilter fed a range in chunks (a segment or a response at a time)
    decides as on the whole range, even when the markers' offsets are unknown. Method: random
    chunk boundaries over the whole log; concatenate the chunk masks."""
    built = build(events)
    n = len(built.headers)
    cut_after = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    bounds = [0, *[i + 1 for i, cut in enumerate(cut_after) if cut], n]
    for aborted in (built.aborted, without_ends(built.aborted)):
        chunked = ReadCommittedFilter(aborted)
        masks = [chunked.keep(built.headers[a:b], built.abort_markers[a:b])
                 for a, b in zip(bounds, bounds[1:], strict=False)]
        assert np.concatenate(masks).tolist() == built.truth


def test_filter_remembers_an_abort_marker_from_an_earlier_chunk() -> None:
    """Goal: a producer leaves the aborted set at its ABORT marker even when the marker came in
    an earlier chunk and the aborted list has no marker offsets (Kafka's wire form). Method: an
    aborted then a committed transaction of one producer, cut between them."""
    built = build([("txn", 1, 2), ("abort", 1, 1), ("txn", 1, 2), ("commit", 1, 1)])
    chunked = ReadCommittedFilter(without_ends(built.aborted))
    first = chunked.keep(built.headers[:2], built.abort_markers[:2])
    second = chunked.keep(built.headers[2:], built.abort_markers[2:])
    assert [*first.tolist(), *second.tolist()] == built.truth == [False, False, True, False]


@settings(max_examples=100, deadline=None)
@given(events=EVENTS)
def test_row_mask_spreads_the_batch_decision_over_records(
        events: list[tuple[str, int, int]]) -> None:
    """Goal: the row mask keeps exactly the records of kept batches, in order. Method: compare
    with the per-record truth expanded by hand."""
    built = build(events)
    mask = committed_mask(built.headers, built.abort_markers, built.aborted)
    rows = row_mask(mask, [h.record_count for h in built.headers])
    expected = [keep for h, keep in zip(built.headers, built.truth, strict=True)
                for _ in range(h.record_count)]
    assert rows.tolist() == expected


def test_filter_without_aborted_transactions_only_drops_control_batches() -> None:
    """Goal: the common case costs no sort and keeps every data batch. Method: three batches,
    one control, no aborted transaction."""
    mask = keep_mask([1, 1, 2], [0, 3, 4], [FLAG_TRANSACTIONAL, FLAG_CONTROL, 0],
                     [False, False, False], [])
    assert mask.tolist() == [True, False, True]


@given(kind=st.sampled_from(list(ControlType)), epoch=st.integers(-(2**31), 2**31 - 1))
def test_control_record_round_trips(kind: ControlType, epoch: int) -> None:
    """Goal: a marker survives its encoding in a control batch of any topic schema. Method:
    encode into the default and a typed schema, decode."""
    marker = EndTxnMarker(kind, epoch)
    import pyarrow as pa
    typed = topic_schema(pa.schema([pa.field("n", pa.int64())]))
    for schema in (DEFAULT_SCHEMA, typed):
        batch = control_batch(schema, marker, 1_000)
        assert batch.num_rows == 1 and batch.schema.equals(schema)
        assert control_marker(batch) == marker
        header = BatchHeader(0, 0, 1, 0, 0, 5, 0, -1, 0, FLAG_CONTROL | FLAG_TRANSACTIONAL)
        assert is_abort_marker(header, lambda b=batch: b) == (kind is ControlType.ABORT)


def test_control_marker_refuses_a_record_that_is_not_one() -> None:
    """Goal: a control batch whose key is not a control record is CorruptRecordError, not a
    silent COMMIT. Method: decode a data batch and a wrong version."""
    from segment_helpers import make_batch
    with pytest.raises(errors.CorruptRecordError, match="control record"):
        control_marker(make_batch([b"k"]))
    with pytest.raises(errors.CorruptRecordError, match="version 7"):
        EndTxnMarker.unpack(b"\x07\x00\x01\x00\x00\x00\x00\x00")
