"""The clients' metrics: kafka-python's ``metrics()`` figures, and an optional endpoint.

Owns: ``Sensor`` (Kafka's windowed statistics: 2 samples of 30 s, as kafka-python's defaults
``metrics_num_samples`` and ``metrics_sample_window_ms``; rates divide by the window's elapsed
time but never by less than one sample window, as Kafka's ``Rate`` does), ``ProducerMetrics``
and ``ConsumerMetrics`` (what the sender and the fetcher record, laid out as kafka-python's
``metrics()`` returns it: ``{group: {name: value}}``, e.g.
``{"producer-metrics": {"record-send-rate": ..}, "producer-topic-metrics.T": {..}}``; the
``*-total`` figures are the Java client's cumulative counts, KIP-187), and ``ClientEndpoint``,
which serves them in Prometheus's format (``kafka_producer_producer_metrics_record_send_rate
{client_id=..}``, the JMX exporter's names for the Java client's MBeans) when the client is
given a ``metrics_listener``. Must not: reach into broker internals or do I/O when no endpoint
is asked for.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

WINDOW_S = 30.0
SAMPLES = 2
Layout = dict[str, dict[str, float]]


@dataclass
class _Sample:
    start: float
    count: int = 0
    total: float = 0.0
    max: float = float("-inf")


class Sensor:
    """Windowed count, sum and max of recorded values, plus cumulative totals. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: list[_Sample] = []
        self.count = 0  # every value ever recorded
        self.total = 0.0

    def record(self, value: float = 1.0) -> None:
        now = self._clock()
        with self._lock:
            self._purge(now)
            if not self._samples or now - self._samples[-1].start >= WINDOW_S:
                self._samples.append(_Sample(now))
                del self._samples[:-SAMPLES]
            s = self._samples[-1]
            s.count, s.total, s.max = s.count + 1, s.total + value, max(s.max, value)
            self.count += 1
            self.total += value

    def _purge(self, now: float) -> None:
        self._samples = [s for s in self._samples if now - s.start < SAMPLES * WINDOW_S]

    def avg(self) -> float:
        with self._lock:
            self._purge(self._clock())
            count = sum(s.count for s in self._samples)
            return sum(s.total for s in self._samples) / count if count else 0.0

    def max(self) -> float:
        with self._lock:
            self._purge(self._clock())
            return max((s.max for s in self._samples if s.count), default=0.0)

    def rate(self, of_count: bool = False) -> float:
        """Recorded values (or events, ``of_count``) per second over the window."""
        now = self._clock()
        with self._lock:
            self._purge(now)
            if not self._samples:
                return 0.0
            elapsed = max(now - self._samples[0].start, (SAMPLES - 1) * WINDOW_S)
            summed = sum(s.count if of_count else s.total for s in self._samples)
        return summed / elapsed


class _Sensors:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sensors: dict[str, Sensor] = {}

    def get(self, name: str) -> Sensor:
        sensor = self._sensors.get(name)
        if sensor is None:
            with self._lock:
                sensor = self._sensors.setdefault(name, Sensor())
        return sensor

    def named(self, prefix: str) -> dict[str, Sensor]:
        """The sensors ``prefix + key``, by key."""
        with self._lock:
            return {n[len(prefix):]: s for n, s in self._sensors.items() if n.startswith(prefix)}


class ProducerMetrics:
    """What a producer's sender records."""

    def __init__(self) -> None:
        self._s = _Sensors()
        self.in_flight: Callable[[], int] = lambda: 0

    def batch_sent(self, topic: str, records: int, size: int) -> None:
        self._s.get("batch-size").record(size)
        self._s.get("records-per-request").record(records)
        self._s.get("bytes").record(size)
        self._s.get(f"topic.{topic}.records").record(records)
        self._s.get(f"topic.{topic}.bytes").record(size)

    def acknowledged(self, node: str, latency_ms: float) -> None:
        self._s.get("request-latency").record(latency_ms)
        self._s.get(f"node.{node}.request-latency").record(latency_ms)

    def retried(self, topic: str, records: int) -> None:
        self._s.get("record-retries").record(records)
        self._s.get(f"topic.{topic}.record-retries").record(records)

    def failed(self, topic: str, records: int) -> None:
        self._s.get("errors").record(records)
        self._s.get(f"topic.{topic}.record-errors").record(records)

    def layout(self) -> Layout:
        g = self._s.get
        batch, requests, latency = g("batch-size"), g("records-per-request"), g("request-latency")
        out: Layout = {"producer-metrics": {
            "batch-size-avg": batch.avg(), "batch-size-max": batch.max(),
            "record-send-rate": requests.rate(), "record-send-total": requests.total,
            "records-per-request-avg": requests.avg(), "byte-rate": g("bytes").rate(),
            "byte-total": g("bytes").total, "request-rate": requests.rate(of_count=True),
            "request-total": requests.count, "request-latency-avg": latency.avg(),
            "request-latency-max": latency.max(), "record-retry-rate": g("record-retries").rate(),
            "record-retry-total": g("record-retries").total,
            "record-error-rate": g("errors").rate(),
            "record-error-total": g("errors").total, "requests-in-flight": self.in_flight()}}
        for topic in {k.rsplit(".", 1)[0] for k in self._s.named("topic.")}:
            t = self._s.named(f"topic.{topic}.")
            out[f"producer-topic-metrics.{topic}"] = {
                "record-send-rate": _rate(t, "records"), "record-send-total": _total(t, "records"),
                "byte-rate": _rate(t, "bytes"), "byte-total": _total(t, "bytes"),
                "record-retry-rate": _rate(t, "record-retries"),
                "record-error-rate": _rate(t, "record-errors")}
        for node, sensor in self._s.named("node.").items():
            out[f"producer-node-metrics.node-{node.removesuffix('.request-latency')}"] = {
                "request-latency-avg": sensor.avg(), "request-latency-max": sensor.max(),
                "request-rate": sensor.rate(of_count=True), "request-total": sensor.count}
        return out


class ConsumerMetrics:
    """What a consumer's fetcher records."""

    def __init__(self) -> None:
        self._s = _Sensors()
        self._lags: dict[str, int] = {}  # "topic-partition" -> its lag after the last fetch
        self._lock = threading.Lock()

    def fetched(self, topic: str, latency_ms: float, size: int, records: int) -> None:
        for name, value in (("fetch-latency", latency_ms), ("bytes-fetched", size),
                            ("records-fetched", records), (f"topic.{topic}.bytes", size),
                            (f"topic.{topic}.records", records)):
            self._s.get(name).record(value)

    def pushed(self, topic: str, size: int, records: int) -> None:
        """Records a fetch session pushed: counted like fetched ones, each push as one fetch
        response, with no request (and so no latency) of their own."""
        for name, value in (("pushes", 1), ("bytes-fetched", size), ("records-fetched", records),
                            (f"topic.{topic}.bytes", size), (f"topic.{topic}.records", records)):
            self._s.get(name).record(value)

    def lag(self, topic: str, partition: int, lag: int) -> None:
        self._s.get("records-lag").record(lag)
        with self._lock:
            self._lags[f"{topic}-{partition}"] = lag

    def forget(self, topic: str, partition: int) -> None:
        """No longer assigned: its lag is not the consumer's any more."""
        with self._lock:
            self._lags.pop(f"{topic}-{partition}", None)

    def layout(self) -> Layout:
        g = self._s.get
        size, records, latency = g("bytes-fetched"), g("records-fetched"), g("fetch-latency")
        fetch: dict[str, float] = {
            "fetch-size-avg": size.avg(), "fetch-size-max": size.max(),
            "bytes-consumed-rate": size.rate(), "bytes-consumed-total": size.total,
            "records-per-request-avg": records.avg(), "records-consumed-rate": records.rate(),
            "records-consumed-total": records.total, "fetch-latency-avg": latency.avg(),
            "fetch-latency-max": latency.max(),
            # fetch responses: requests answered, and pushes of a fetch session
            "fetch-rate": latency.rate(of_count=True) + g("pushes").rate(of_count=True),
            "fetch-total": latency.count + g("pushes").count,
            "records-lag-max": g("records-lag").max()}
        with self._lock:
            fetch.update({f"{tp}.records-lag": float(v) for tp, v in self._lags.items()})
        out: Layout = {"consumer-fetch-manager-metrics": fetch}
        for topic in {k.rsplit(".", 1)[0] for k in self._s.named("topic.")}:
            t = self._s.named(f"topic.{topic}.")
            out[f"consumer-fetch-manager-metrics.{topic}"] = {
                "bytes-consumed-rate": _rate(t, "bytes"), "records-consumed-rate": _rate(
                    t, "records"), "fetch-size-avg": t["bytes"].avg() if "bytes" in t else 0.0}
        return out


def _rate(sensors: dict[str, Sensor], name: str) -> float:
    return sensors[name].rate() if name in sensors else 0.0


def _total(sensors: dict[str, Sensor], name: str) -> float:
    return sensors[name].total if name in sensors else 0.0


# -- the endpoint ----------------------------------------------------------------------------

# kafka-python's group suffixes -> (the group's base, the label the suffix becomes)
_GROUP_LABELS = (("-topic-metrics.", "-topic-metrics", "topic"),
                 ("-node-metrics.node-", "-node-metrics", "node_id"),
                 ("-fetch-manager-metrics.", "-fetch-manager-metrics", "topic"))
_PARTITION_LAG = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)\.records-lag$")


class LayoutCollector:
    """A client's ``metrics()`` as Prometheus gauges: ``kafka_<kind>_<group>_<name>``."""

    def __init__(self, kind: str, client_id: str, layout: Callable[[], Layout]) -> None:
        self._kind, self._client_id, self._layout = kind, client_id, layout

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for group, values in sorted(self._layout().items()):
            base, labels = _split_group(group)
            for name, value in sorted(values.items()):
                extra = dict(labels)
                if (m := _PARTITION_LAG.match(name)) is not None:
                    name, extra = "records-lag", {**extra, **m.groupdict()}
                metric = _metric_name(self._kind, base, name)
                keys = ["client_id", *sorted(extra)]
                family = families.get(metric)
                if family is None:
                    family = families[metric] = GaugeMetricFamily(
                        metric, f"kafka-python's {group} {name}", labels=keys)
                family.add_metric([self._client_id, *(extra[k] for k in sorted(extra))], value)
        yield from families.values()


def _split_group(group: str) -> tuple[str, dict[str, str]]:
    for marker, base, label in _GROUP_LABELS:
        head, sep, tail = group.partition(marker)
        if sep:
            return head + base, {label: tail}
    return group, {}


def _metric_name(kind: str, group: str, name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", f"kafka_{kind}_{group}_{name}")


class ClientEndpoint:
    """A client's own Prometheus endpoint (``metrics_listener="host:port"``)."""

    def __init__(self, listener: str, kind: str, client_id: str,
                 layout: Callable[[], Layout]) -> None:
        from logstore.metrics.http import MetricsServer  # only clients that ask pay for it

        registry = CollectorRegistry()
        registry.register(LayoutCollector(kind, client_id, layout))
        self.server = MetricsServer(listener, registry)
        self.server.start()

    @property
    def port(self) -> int:
        return self.server.port

    def close(self) -> None:
        self.server.close()
