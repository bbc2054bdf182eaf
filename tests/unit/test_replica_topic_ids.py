"""A leader answers a follower only from a replica of the follower's topic incarnation.

Goal: a topic deleted and created again under its name starts again at leader epoch 0, so
truncation by epoch cannot tell the two incarnations apart; the follower's requests carry its
replica's topic id (KIP-516) and a leader whose replica is of another id answers
INCONSISTENT_TOPIC_ID (Kafka's code 103) instead of epochs, batches or acknowledgements of the
other incarnation, whatever the metadata of either broker says. A request without a topic id
(a peer that predates the field) is served as before. Method: the real ReplicaManager,
Partition, Log and broker-side FetchSession in one process with a FakeClock (no network); the
leader's replica is of topic id OLD, with records.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from segment_helpers import DEFAULT_SCHEMA, keyed

from logstore.broker.fetch_session import FetchSession
from logstore.broker.replica_manager import FetchPartition, ReplicaManager
from logstore.clock import FakeClock
from logstore.config import TopicConfig
from logstore.errors import ErrorCode, InconsistentTopicIdError
from logstore.messages.fetch import FetchPartition as FetchPartitionMessage
from logstore.messages.fetch_session import FetchSessionCredit, FetchSessionRequest, PartitionOffset
from logstore.model import TopicPartition
from logstore.segments.log_manager import LogManager

TP = TopicPartition("t", 0)
CONFIG = TopicConfig(min_insync_replicas=2)
OLD, NEW = "0" * 32, "1" * 32
RECORDS = 10


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    """Broker 1 leading t-0 (topic id OLD) at epoch 0 with followers 2 and 3, 10 records
    in its log and none acknowledged."""
    manager = LogManager([tmp_path], FakeClock(), lambda topic: TopicConfig())
    manager.startup()
    try:
        replicas = ReplicaManager(1, manager, FakeClock())
        replicas.make_leader(TP, CONFIG, DEFAULT_SCHEMA, 0, (1, 2, 3), (1, 2, 3), OLD)
        replicas.append_records(TP, keyed(0, RECORDS), 1)
        yield replicas
    finally:
        manager.shutdown()


def test_epoch_requests_of_another_topic_id_are_inconsistent(
        replicas: ReplicaManager) -> None:
    """offsets_for_leader_epoch and leader_epochs from a follower whose replica is of NEW
    are INCONSISTENT_TOPIC_ID (retriable): the leader's epoch 0 ends at 10 in its log, which
    says nothing of NEW's; of OLD, or without an id, they are answered."""
    for call in (lambda tid: replicas.offsets_for_leader_epoch(TP, 0, 0, tid),
                 lambda tid: replicas.leader_epochs(TP, 0, tid)):
        with pytest.raises(InconsistentTopicIdError, match=f"topic id {NEW}.*{OLD}") as e:
            call(NEW)
        assert e.value.code == ErrorCode.INCONSISTENT_TOPIC_ID == 103 and e.value.retriable
        assert call(OLD) == call(None)
    assert replicas.offsets_for_leader_epoch(TP, 0, 0, OLD) == (0, RECORDS)


def test_a_fetch_of_another_topic_id_reads_nothing(replicas: ReplicaManager) -> None:
    """A follower's plain fetch for NEW at offset 0 and the leader's epoch gets the partition's
    error and no batch, and does not count as the follower's position; for OLD it reads."""
    wrong, right = (FetchPartition(TP, 0, 1 << 20, 0, topic_id=tid) for tid in (NEW, OLD))
    (result,) = replicas.fetch([wrong], 0, 1, 1 << 20, replica_id=2)
    assert isinstance(result.error, InconsistentTopicIdError) and result.batches == []
    (result,) = replicas.fetch([right], 0, 1, 1 << 20, replica_id=2)
    assert result.error is None and result.batches[-1].header.next_offset == RECORDS


def _session(replicas: ReplicaManager, topic_id: str | None, offset: int = 0) -> FetchSession:
    """Follower 2's session on t-0 from ``offset`` at epoch 0, for a replica of
    ``topic_id``."""
    return FetchSession(replicas, FetchSessionRequest(
        topic="t", replica_id=2, credit_bytes=1 << 20, partitions=[FetchPartitionMessage(
            partition=0, offset=offset, current_leader_epoch=0, topic_id=topic_id)]))


def test_a_session_partition_of_another_topic_id_ends_and_is_not_acknowledged(
        replicas: ReplicaManager) -> None:
    """A follower whose replica is of NEW subscribes at offset 0: the partition ends with
    INCONSISTENT_TOPIC_ID at the first push, nothing of OLD's log is pushed, and neither
    its subscription nor a later acknowledgement of offset 10 (what a follower that had
    replicated OLD's records into NEW's log would say) moves the high watermark; a follower
    of OLD gets the records, and its acknowledgement does."""
    p = replicas.partition(TP)
    replicas.acknowledge_follower(TP, 3, RECORDS, 0)
    wrong = _session(replicas, NEW)
    push = wrong.next_push()
    assert push is not None and push.partitions == []
    assert [end.error_code for end in push.ended] == [ErrorCode.INCONSISTENT_TOPIC_ID]
    wrong.grant(FetchSessionCredit(log_end_offsets=[PartitionOffset(partition=0,
                                                                    offset=RECORDS)]))
    replicas.acknowledge_follower(TP, 2, RECORDS, 0, NEW)
    assert p.log.high_watermark == 0

    right = _session(replicas, OLD)
    push = right.next_push()
    assert push is not None and push.ended == []
    assert [len(part.batches) > 0 for part in push.partitions] == [True]
    right.grant(FetchSessionCredit(log_end_offsets=[PartitionOffset(partition=0,
                                                                    offset=RECORDS)]))
    assert p.log.high_watermark == RECORDS


@pytest.mark.parametrize("topic_id", [OLD, None], ids=["with-id", "older-peer"])
def test_a_follower_partition_ends_when_the_leader_replaces_its_replica(
        replicas: ReplicaManager, topic_id: str | None) -> None:
    """Follower 2, caught up on OLD's 10 records, holds t-0 subscribed when the leader's
    sync replaces its replica by NEW's (deleted, created again, 20 records produced, and
    follower 3 has them): at the next push the partition ends with UNKNOWN_TOPIC_ID, as a
    consumer's session does, and nothing of NEW's log is pushed to it or counted of its
    acknowledgements, whether its subscription carries its replica's topic id or, from a
    peer that predates the field, none (before, such a follower went on from offset 10 in
    the new log, and its acknowledgement of 20 moved the high watermark)."""
    session = _session(replicas, topic_id, offset=RECORDS)  # caught up
    push = session.next_push()
    assert push is not None and push.ended == []

    replicas.stop_replica(TP, delete=True)
    replicas.make_leader(TP, CONFIG, DEFAULT_SCHEMA, 0, (1, 2, 3), (1, 2, 3), NEW)
    replicas.append_records(TP, keyed(0, 2 * RECORDS), 1)
    replicas.acknowledge_follower(TP, 3, 2 * RECORDS, 0, NEW)
    push = session.next_push()
    assert push is not None and [p.batches for p in push.partitions if p.batches] == []
    assert [end.error_code for end in push.ended] == [ErrorCode.UNKNOWN_TOPIC_ID]
    session.grant(FetchSessionCredit(log_end_offsets=[PartitionOffset(partition=0,
                                                                      offset=2 * RECORDS)]))
    assert replicas.partition(TP).log.high_watermark == 0
