"""Consumer edge cases found in review: polls that must stay bounded by their timeout."""

from __future__ import annotations

import threading
import time
import uuid

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

POLL_TIMEOUT_MS = 500
POLL_SLACK_S = 1.5  # a loaded CI machine; a spinning poll never returns at all


def test_poll_returns_within_its_timeout_when_only_a_paused_partition_has_buffered_data(
        broker) -> None:
    """Goal: data buffered for a paused partition must not keep ``poll`` from returning.

    Method: two records in one batch; ``poll(max_records=1)`` returns the first and leaves the
    second buffered (no sleep: the fetch has landed once poll returned a record). Pause the
    partition and poll with a 500 ms timeout from a helper thread; it must return ``{}`` within
    the timeout plus slack. If it does not, resuming the partition rescues the thread so the
    failure does not leave a spinning thread behind. After resume, the buffered record is
    still delivered."""
    topic = f"paused-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(broker.bootstrap, acks=1, linger_ms=50) as producer:
        for value in (b"first", b"second"):
            producer.send(topic, value=value)
        producer.flush(10)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        first = consumer.poll(timeout_ms=10_000, max_records=1)
        assert [r.value for r in first[tp]] == [b"first"]
        consumer.pause(tp)
        outcome: dict[str, object] = {}

        def paused_poll() -> None:
            started = time.monotonic()
            outcome["result"] = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            outcome["elapsed"] = time.monotonic() - started

        thread = threading.Thread(target=paused_poll, daemon=True)
        thread.start()
        thread.join(POLL_TIMEOUT_MS / 1000 + POLL_SLACK_S)
        hung = thread.is_alive()
        if hung:
            consumer.resume(tp)  # the spinning poll now finds data and returns
            thread.join(10)
        assert not hung, f"poll(timeout_ms={POLL_TIMEOUT_MS}) with only paused data buffered " \
                         f"did not return within {POLL_TIMEOUT_MS / 1000 + POLL_SLACK_S:.1f} s"
        assert outcome["result"] == {}
        consumer.resume(tp)
        rest = consumer.poll(timeout_ms=10_000)
        assert [r.value for r in rest.get(tp, [])] == [b"second"]


def test_pause_resume_and_seek_name_a_list_given_for_partitions(broker) -> None:
    """Goal: pause, resume and seek_to_* take partitions as separate arguments (as in
    kafka-python); a list given instead is a TypeError saying so, not one from deep inside
    (``TopicPartition.__new__() missing ... 'partition'``). Method: each with a list."""
    import pytest

    tp = TopicPartition(f"args-{uuid.uuid4().hex[:6]}", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(tp.topic, 1)])
    with Consumer(broker.bootstrap) as consumer:
        consumer.assign([tp])
        for call in (consumer.pause, consumer.resume, consumer.seek_to_beginning,
                     consumer.seek_to_end):
            with pytest.raises(TypeError, match="take partitions as separate arguments"):
                call([tp])
        consumer.pause(tp)
        assert consumer.paused() == {tp}
