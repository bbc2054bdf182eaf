"""Producer state expiry (``logstore/segments/producer_state.py``): a producer with no open
transaction is forgotten once it wrote nothing for producer_id_expiration_ms (never because the
log start passed its records); snapshots keep what expiry needs and older ones still load.

Goal: every short-lived idempotent producer used to stay in the partition's state and in every
snapshot forever (100k of them: a 23.8 MB snapshot rewritten at every roll). Method: a real
Log in tmp_path with transactional and plain producers (tests/unit/txn_helpers.py), the log
start moved and the clock advanced by hand; the retention pass (``Log.remove_expired_producers``)
expires idle producers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from segment_helpers import open_log, reopen
from txn_helpers import COMMIT, Producer

from logstore import errors
from logstore.clock import FakeClock
from logstore.config import DAY_MS, TopicConfig, validate_topic_config
from logstore.segments import format as fmt

EXPIRATION_MS = 60_000


def test_a_producer_is_kept_when_the_log_start_passes_its_records(tmp_path: Path) -> None:
    """A retry of a batch whose acknowledgement was lost must still be found a duplicate after
    the log start moved past it (delete_records, a tiered topic's local retention): the
    producer is not forgotten then, only when idle for producer_id_expiration_ms (Kafka's
    KIP-360). Method: producer 1 writes 3 records, the log start moves past them, the same
    batch is sent again."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    producer = Producer(log, 1)
    producer.send(3, transactional=False)
    log.maybe_increment_log_start_offset(3)
    assert [e.producer_id for e in log.producer_state.producers()] == [1]
    producer.sequence -= 3  # the retry of the same batch
    assert producer.send(3, transactional=False).duplicate


def test_a_producer_idle_for_the_expiration_time_is_forgotten(tmp_path: Path) -> None:
    """Idle time counts on the broker's clock from the first check after a producer's last
    batch: a plain producer idle for producer_id_expiration_ms goes, one that wrote since
    stays, one with an open transaction stays however long it idles; once its marker is
    written it expires like the others."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    idle, busy, txn = Producer(log, 1), Producer(log, 2), Producer(log, 3)
    idle.send(1, transactional=False)
    busy.send(1, transactional=False)
    txn.send(1)
    state = log.producer_state
    now = clock.time_ms()
    assert state.remove_expired_producers(now, EXPIRATION_MS) == 0  # stamps all three
    busy.send(1, transactional=False)
    assert state.remove_expired_producers(now + EXPIRATION_MS - 1, EXPIRATION_MS) == 0
    assert state.remove_expired_producers(now + EXPIRATION_MS, EXPIRATION_MS) == 1
    assert sorted(e.producer_id for e in state.producers()) == [2, 3]
    later = now + 10 * EXPIRATION_MS
    assert state.remove_expired_producers(later, EXPIRATION_MS) == 1  # busy, idle since
    txn.end(COMMIT)
    assert [e.producer_id for e in state.producers()] == [3]
    assert state.remove_expired_producers(later, EXPIRATION_MS) == 0  # stamped now
    assert state.remove_expired_producers(later + EXPIRATION_MS, EXPIRATION_MS) == 1
    assert not state.has_producers


@pytest.mark.parametrize("written_before_expiry", [False, True])
def test_snapshots_keep_the_expiry_fields_and_older_snapshots_still_load(
        tmp_path: Path, written_before_expiry: bool) -> None:
    """A clean close's snapshot carries each producer's last offset and last-seen time; one
    written before expiry existed (without them) loads with its last offset just below the
    snapshot's and its idle time counted from the next check, and still detects duplicates.
    Method: close, optionally strip the keys, reopen clean, check and expire."""
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    p = Producer(log, 7)
    p.send(3, transactional=False)
    log.producer_state.remove_expired_producers(1_000, EXPIRATION_MS)
    log.close()
    (path,) = log.dir.glob("*" + fmt.SNAPSHOT_SUFFIX)
    body = json.loads(path.read_text())
    [raw] = body["producers"]
    assert (raw["last_offset"], raw["last_seen_ms"]) == (2, 1_000)
    if written_before_expiry:
        del raw["last_offset"], raw["last_seen_ms"]
        path.write_text(json.dumps(body))
    log = reopen(log, clock, clean=True)
    [entry] = log.producer_state.producers()
    assert (entry.last_offset, entry.last_seen_ms) == (
        (2, -1) if written_before_expiry else (2, 1_000))
    p.log, p.sequence = log, 0
    assert p.send(3, transactional=False).duplicate


def test_producer_id_expiration_ms_is_a_validated_topic_config_with_kafkas_default() -> None:
    assert TopicConfig().producer_id_expiration_ms == DAY_MS == 86_400_000
    assert validate_topic_config({"producer.id.expiration.ms": "1000"}) == {
        "producer_id_expiration_ms": 1000}
    for bad in (0, -1, "soon"):
        with pytest.raises(errors.InvalidConfigError, match="producer_id_expiration_ms|"
                                                            "producer.id.expiration.ms"):
            validate_topic_config({"producer.id.expiration.ms": bad})


def test_the_retention_pass_expires_idle_producers(tmp_path: Path) -> None:
    """``Log.remove_expired_producers`` (called by every retention pass) uses the topic's
    producer_id_expiration_ms and the log's clock."""
    clock = FakeClock()
    log = open_log(tmp_path, clock, producer_id_expiration_ms=EXPIRATION_MS)
    Producer(log, 1).send(1, transactional=False)
    assert log.remove_expired_producers() == 0  # the first check stamps it
    clock.advance(EXPIRATION_MS)
    assert log.remove_expired_producers() == 1 and not log.producer_state.has_producers
