"""The exactly-once sink's driver decisions (datasource/sink_commit.py) against a real broker,
with tasks staged by the sink's own task code (``datasource.sink.stage``) outside Spark.

Goal: a micro-batch is published once, together with its progress record; a commit repeated
with the same messages, or of a re-run of a published batch, publishes nothing again and aborts
the re-run's staging; what a dead run left Prepared or Ongoing is aborted at the next commit,
but never another sink's (even one whose id starts with this one's); a staged transaction that
was aborted meanwhile makes the commit fail with nothing decided. Method: one broker process;
"tasks" stage Arrow batches under the ids the sink gives task (partition, attempt); outputs are
read read_committed and transactions inspected with the Admin client.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from datasource.sink import stage
from datasource.sink_commit import SinkCommitError, SinkCommitter
from datasource.writer import SinkSettings, parse_sink_options
from logstore import Admin, PreparedTxnState, Producer
from logstore.client.transactions import colocated_transactional_id
from tests.brokers import BrokerFactory, BrokerProcess, new_topic
from tests.txn_reading import end_offsets, read_values


@pytest.fixture(scope="module")
def sbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("sink-commit"))
    yield factory()
    factory.stop_all()


@pytest.fixture
def topic(sbroker: BrokerProcess) -> str:
    with Admin(sbroker.bootstrap) as admin:
        return new_topic(admin, 2)


def settings(broker: BrokerProcess, topic: str) -> SinkSettings:
    return parse_sink_options({"bootstrap.servers": broker.bootstrap, "topic": topic}, True)


def task_id(broker: BrokerProcess, sink: str, partition: int, attempt: int = 0) -> str:
    with Admin(broker.bootstrap) as admin:
        n = admin.transaction_state_partitions()
    return colocated_transactional_id(sink, f"{sink}-{partition}-{attempt}", n)


def staged(broker: BrokerProcess, sink: str, topic: str, tag: str, tasks: int = 2
           ) -> list[PreparedTxnState]:
    """``tasks`` tasks of one batch, each staging 10 records ``<tag>:<task>:<i>`` on its
    output partition."""
    out = []
    for t in range(tasks):
        batch = pa.record_batch({"value": pa.array([f"{tag}:{t}:{i}".encode()
                                                    for i in range(10)]),
                                 "partition": pa.array([t % 2] * 10, pa.int32())})
        records, _, state = stage(settings(broker, topic), task_id(broker, sink, t),
                                  iter([batch]))
        assert records == 10 and state is not None
        out.append(state)
    return out


def values(broker: BrokerProcess, topic: str) -> list[bytes]:
    return sorted(v for vs in read_values(broker.bootstrap, topic, range(2)).values()
                  for v in vs)


def open_ids(broker: BrokerProcess, prefix: str) -> set[str]:
    with Admin(broker.bootstrap) as admin:
        return {t.transactional_id for t in admin.list_transactions(
            ["Prepared", "Ongoing"], transactional_id_prefix=prefix)}


def test_a_batch_is_published_once_and_a_repeated_commit_adds_nothing(
        sbroker: BrokerProcess, topic: str) -> None:
    """Goal: commit(messages, 0) publishes the staged records and records batch 0; calling it
    again with the same messages (Spark may) skips it. Method: two staged tasks; commit twice;
    read read_committed and the progress record."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    committer = SinkCommitter(settings(sbroker, topic), sink)
    states = staged(sbroker, sink, topic, "b0")
    assert values(sbroker, topic) == [] and committer.recorded_batch() is None
    assert committer.commit_batch(0, states, 20) is True
    expected = sorted(f"b0:{t}:{i}".encode() for t in range(2) for i in range(10))
    assert values(sbroker, topic) == expected and committer.recorded_batch() == 0
    assert committer.commit_batch(0, states, 20) is False
    assert values(sbroker, topic) == expected and open_ids(sbroker, sink) == set()


def test_a_rerun_of_a_published_batch_is_skipped_and_its_staging_aborted(
        sbroker: BrokerProcess, topic: str) -> None:
    """Goal: after a restart Spark re-runs a batch the sink already published (its commit
    log entry was lost): the re-run's staged records never become visible, and the LSO moves
    past them. Method: publish batch 3, stage it again under the same task ids, commit."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    committer = SinkCommitter(settings(sbroker, topic), sink)
    committer.commit_batch(3, staged(sbroker, sink, topic, "first"), 20)
    rerun = staged(sbroker, sink, topic, "rerun")
    assert open_ids(sbroker, sink) == {s.transactional_id for s in rerun}
    assert committer.commit_batch(3, rerun, 20) is False
    assert not any(v.startswith(b"rerun") for v in values(sbroker, topic))
    assert len(values(sbroker, topic)) == 20 and open_ids(sbroker, sink) == set()
    lso, hw = (end_offsets(sbroker.bootstrap, topic, range(2), level) for level in
               ("read_committed", "read_uncommitted"))
    assert lso == hw  # nothing open pins the last stable offset


def test_leftovers_are_aborted_at_the_next_commit_but_never_another_sinks(
        sbroker: BrokerProcess, topic: str) -> None:
    """Goal: a dead run's staging (Prepared) and a task that died writing (Ongoing) are
    aborted by the next commit; a sink whose id starts with this one's keeps its Prepared
    transaction. Method: stage for sink S (attempt 1), leave an Ongoing transaction on S's
    task id of partition 5, stage for sink S-1; commit a new batch of S; inspect."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    other = f"{sink}-1"  # its task ids start with "<sink>-" too
    dead = staged(sbroker, sink, topic, "dead")
    ongoing = Producer(sbroker.bootstrap, transactional_id=task_id(sbroker, sink, 5),
                       transaction_two_phase_commit=True)
    ongoing.init_transactions()
    ongoing.begin_transaction()
    ongoing.send(topic, value=b"ongoing", partition=0).result(30)
    neighbour = staged(sbroker, other, topic, "other", tasks=1)
    fresh = [stage(settings(sbroker, topic), task_id(sbroker, sink, 0, attempt=1),
                   iter([pa.record_batch({"value": pa.array([b"new"])})]))[2]]
    assert fresh[0] is not None
    committer = SinkCommitter(settings(sbroker, topic), sink)
    assert committer.commit_batch(0, [s for s in fresh if s is not None], 1)
    assert open_ids(sbroker, sink) == {s.transactional_id for s in neighbour}
    assert {s.transactional_id for s in dead}.isdisjoint(open_ids(sbroker, sink))
    ongoing.close()
    SinkCommitter(settings(sbroker, topic), other).abort_leftovers()  # it pins the LSO
    assert values(sbroker, topic) == [b"new"]


def test_a_staged_transaction_aborted_meanwhile_fails_the_commit_deciding_nothing(
        sbroker: BrokerProcess, topic: str) -> None:
    """Goal: if one task's staged transaction was aborted (a timeout, a fence) before the
    commit, the commit fails naming the sink and the batch, publishes no task's records and
    records no progress; Spark then re-runs the batch. Method: fence one of two staged tasks,
    commit, then read."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    states = staged(sbroker, sink, topic, "b7")
    with Admin(sbroker.bootstrap) as admin:
        admin.fence_producers([states[1].transactional_id])
    committer = SinkCommitter(settings(sbroker, topic), sink)
    with pytest.raises(SinkCommitError, match=rf"sink {sink}: batch 7 was not committed"):
        committer.commit_batch(7, states, 20)
    assert committer.recorded_batch() is None
    assert open_ids(sbroker, sink) == {states[0].transactional_id}
    committer.abort_leftovers()
    assert values(sbroker, topic) == [] and open_ids(sbroker, sink) == set()


def test_a_new_checkpoint_under_the_same_sink_id_fails_instead_of_writing_nothing(
        sbroker: BrokerProcess, topic: str) -> None:
    """Goal: a query whose checkpoint was deleted (or another query given the same sinkId)
    restarts at batch 0; before, every such batch looked published and was skipped, so the
    query ran on writing nothing. Now a batch of another query at or below the recorded one,
    or any batch below it, fails naming the sink, both queries and the way out, aborting its
    staging; the same query's re-run is still skipped, and once the sink's progress group is
    deleted the new query starts over. Method: query A publishes batch 2; batches of query B
    (and of an unknown query) are committed against it; then the group is deleted."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    committer = SinkCommitter(settings(sbroker, topic), sink)
    assert committer.commit_batch(2, staged(sbroker, sink, topic, "a"), 20, "query-a")
    assert committer.recorded() is not None and committer.recorded().query_id == "query-a"
    for batch, query in ((0, "query-b"), (2, "query-b"), (1, None)):
        states = staged(sbroker, sink, topic, "b")
        with pytest.raises(SinkCommitError, match=(
                rf"sink {sink}: batch {batch}.* is not a re-run: the sink was last committed "
                rf"by query query-a at batch 2.*logstore groups delete {sink}")):
            committer.commit_batch(batch, states, 20, query)
        assert open_ids(sbroker, sink) == set()
    assert committer.commit_batch(2, staged(sbroker, sink, topic, "again"), 20, "query-a") \
        is False  # the same query's re-run
    assert committer.commit_batch(2, staged(sbroker, sink, topic, "again"), 20) is False
    assert {v.split(b":")[0] for v in values(sbroker, topic)} == {b"a"}
    with Admin(sbroker.bootstrap) as admin:
        admin.delete_groups([sink])
    assert committer.recorded() is None
    assert committer.commit_batch(0, staged(sbroker, sink, topic, "b"), 20, "query-b")
    assert {v.split(b":")[0] for v in values(sbroker, topic)} == {b"a", b"b"}
