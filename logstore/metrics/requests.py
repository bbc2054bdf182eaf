"""What the Flight server observed: requests, their latency and errors, and traffic per topic.

Owns: ``RequestMetrics``, the recorder the Flight server calls once per answered request
(``rpc.server.RequestRecorder``): per request (``produce`` per batch, ``fetch_consumer`` and
``fetch_follower`` per fetch stream, every action by name) a latency histogram and the errors
by code; per topic the messages and bytes in (appended by producers) and out (sent to
consumers; to followers separately), and the produce and fetch requests, failed or not. It is
itself a prometheus_client collector. Recording costs a dict lookup and a short lock; series
are exported only for names the broker knows: an unknown action is counted as ``unknown``, and
a topic's counters are dropped once the topic is gone (``retain_topics``), so nothing grows
without bound. Must not: read broker state (``broker_collector.py`` does).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

from logstore.errors import ErrorCode

# Seconds; a produce batch acked with acks=1 takes about a millisecond, a long-poll fetch up
# to its max_wait_ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0)
PRODUCE = "produce"
FETCH_CONSUMER = "fetch_consumer"
FETCH_FOLLOWER = "fetch_follower"
FETCH_SESSION = "fetch_session"  # the opening of a push session (what it pushes: ``pushed``)
UNKNOWN = "unknown"
_STREAMS = (PRODUCE, FETCH_CONSUMER, FETCH_FOLLOWER, FETCH_SESSION)
_ERROR_NAMES = {int(c): c.name for c in ErrorCode}

# The per-topic counters: Kafka's BrokerTopicMetrics (MessagesOut is LogStore's own).
TOPIC_COUNTERS: dict[str, str] = {
    "messagesin": "Records appended by producers (Kafka's MessagesInPerSec)",
    "bytesin": "Bytes of record batches appended by producers (BytesInPerSec)",
    "messagesout": "Records sent to consumers",
    "bytesout": "Bytes of record batches sent to consumers (BytesOutPerSec)",
    "replicationbytesout": "Bytes sent to follower replicas (ReplicationBytesOutPerSec)",
    "totalproducerequests": "Produce requests (batches) for the topic",
    "totalfetchrequests": "Consumer fetch requests naming the topic",
    "failedproducerequests": "Produce batches that failed",
    "failedfetchrequests": "Consumer fetches of the topic with a partition error",
}
_FIELDS = tuple(TOPIC_COUNTERS)


@dataclass
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.buckets, strict=True):
            total += count
            out.append((bound, float(total)))
        return out


class RequestMetrics:
    """Thread-safe recorder and collector of one broker's requests."""

    def __init__(self, known_actions: Collection[str] = ()) -> None:
        self._lock = threading.Lock()
        self._known = set(known_actions) | set(_STREAMS)
        self._latency: dict[str, _Histogram] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._topics: dict[str, list[int]] = {}

    def know_actions(self, names: Collection[str]) -> None:
        with self._lock:
            self._known |= set(names)

    # -- recording (rpc.server.RequestRecorder) ----------------------------------------------

    def action(self, name: str, seconds: float, error_code: int) -> None:
        request = name if name in self._known else UNKNOWN
        with self._lock:
            self._observe(request, seconds, error_code)

    def produced(self, topic: str, records: int, size: int, seconds: float,
                 error_code: int) -> None:
        """One produce batch: ``records`` and ``size`` appended (0 if it failed before)."""
        with self._lock:
            self._observe(PRODUCE, seconds, error_code)
            counters = self._topic(topic, create=records > 0)
            if counters is not None:
                counters[0] += records
                counters[1] += size
                counters[5] += 1
                counters[7] += error_code != 0

    def fetched(self, topic: str, follower: bool, records: int, size: int, seconds: float,
                error_codes: list[int]) -> None:
        """One fetch stream: what it sent and the error of each partition that had one."""
        request = FETCH_FOLLOWER if follower else FETCH_CONSUMER
        with self._lock:
            self._observe(request, seconds, error_codes[0] if error_codes else 0)
            for code in error_codes[1:]:
                self._count_error(request, code)
            counters = self._sent(topic, follower, records, size)
            if counters is not None and not follower:
                counters[6] += 1
                counters[8] += bool(error_codes)

    def pushed(self, topic: str, follower: bool, records: int, size: int) -> None:
        """What a fetch session pushed: traffic out, like a fetch's, but no request (so no
        request count or latency) of its own."""
        with self._lock:
            self._sent(topic, follower, records, size)

    def _sent(self, topic: str, follower: bool, records: int, size: int) -> list[int] | None:
        """Count traffic out of ``topic`` (caller holds the lock): replication bytes for a
        follower, else messages and bytes out; the topic's counters, if it has any."""
        counters = self._topic(topic, create=records > 0)
        if counters is None:
            return None
        if follower:
            counters[4] += size
        else:
            counters[2] += records
            counters[3] += size
        return counters

    def _observe(self, request: str, seconds: float, error_code: int) -> None:
        histogram = self._latency.get(request)
        if histogram is None:
            histogram = self._latency[request] = _Histogram()
        histogram.observe(seconds)
        if error_code:
            self._count_error(request, error_code)

    def _count_error(self, request: str, code: int) -> None:
        key = (request, _ERROR_NAMES.get(code, str(code)))
        self._errors[key] = self._errors.get(key, 0) + 1

    def _topic(self, topic: str, create: bool) -> list[int] | None:
        counters = self._topics.get(topic)
        if counters is None and create:
            counters = self._topics[topic] = [0] * len(_FIELDS)
        return counters

    # -- reading -----------------------------------------------------------------------------

    def retain_topics(self, topics: Collection[str]) -> None:
        """Forget the counters of topics that no longer exist."""
        with self._lock:
            for gone in [t for t in self._topics if t not in topics]:
                del self._topics[gone]

    def topic_counters(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {t: dict(zip(_FIELDS, c, strict=True)) for t, c in self._topics.items()}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latency = {r: (h.cumulative(), h.sum_s) for r, h in self._latency.items()}
            errors = dict(self._errors)
            topics = {t: list(c) for t, c in self._topics.items()}
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests", "Requests answered, by request "
            "(produce: per batch; fetch_consumer, fetch_follower: per fetch; actions by name)",
            labels=["request"])
        histogram = HistogramMetricFamily(
            "kafka_network_requestmetrics_totaltime_seconds",
            "Time from a request's arrival to its answer (Kafka's TotalTimeMs), by request",
            labels=["request"])
        for request, (buckets, sum_s) in sorted(latency.items()):
            requests.add_metric([request], buckets[-1][1])
            histogram.add_metric([request], buckets, sum_s)
        errors_family = CounterMetricFamily(
            "kafka_network_requestmetrics_errors", "Errors answered, by request and error "
            "code name (Kafka's ErrorsPerSec; a fetch counts each failed partition)",
            labels=["request", "error"])
        for (request, error), count in sorted(errors.items()):
            errors_family.add_metric([request, error], count)
        yield from (requests, histogram, errors_family)
        yield from _topic_families(topics)


def _topic_families(topics: dict[str, list[int]]) -> Iterator[Metric]:
    for i, (name, doc) in enumerate(TOPIC_COUNTERS.items()):
        family = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{name}", doc,
                                     labels=["topic"])
        for topic, counters in sorted(topics.items()):
            family.add_metric([topic], counters[i])
        yield family
