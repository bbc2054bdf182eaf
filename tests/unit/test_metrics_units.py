"""The pure parts of metrics: the clients' windowed statistics and Prometheus names, the
broker's request recorder, and how scrapes share renderings."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from logstore.client import metrics as client_metrics
from logstore.client.metrics import LayoutCollector, ProducerMetrics, Sensor
from logstore.metrics.http import Renderer
from logstore.metrics.requests import RequestMetrics
from tests.helpers import wait_for


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sensor_keeps_two_windows_and_rates_over_at_least_one_window() -> None:
    """Goal: Kafka's windowed stats (2 samples of 30 s; a rate never divides by less than one
    window). Method: a fake clock; record 10 and 30, then move past both windows."""
    clock = FakeClock()
    sensor = Sensor(clock)
    sensor.record(10)
    clock.now += 5
    sensor.record(30)
    assert (sensor.avg(), sensor.max(), sensor.count, sensor.total) == (20, 30, 2, 40)
    assert sensor.rate() == 40 / client_metrics.WINDOW_S  # 5 s elapsed, divided by 30
    assert sensor.rate(of_count=True) == 2 / client_metrics.WINDOW_S
    clock.now += client_metrics.SAMPLES * client_metrics.WINDOW_S
    assert (sensor.avg(), sensor.max(), sensor.rate()) == (0.0, 0.0, 0.0)
    assert (sensor.count, sensor.total) == (2, 40)  # the cumulative totals stay


def test_producer_layout_is_kafka_pythons_and_its_prometheus_names_the_java_clients() -> None:
    """Goal: ``metrics()`` has kafka-python's groups and names, and the endpoint the names the
    JMX exporter gives the Java client's MBeans. Method: record two batches of a dotted topic
    and an ack; read the layout, then collect and render it."""
    m = ProducerMetrics()
    m.batch_sent("a.b", 10, 1000)
    m.batch_sent("a.b", 30, 3000)
    m.acknowledged("2", 4.0)
    layout = m.layout()
    assert layout["producer-metrics"]["record-send-total"] == 40
    assert layout["producer-metrics"]["batch-size-avg"] == 2000
    assert layout["producer-metrics"]["batch-size-max"] == 3000
    assert layout["producer-topic-metrics.a.b"]["byte-total"] == 4000
    assert layout["producer-node-metrics.node-2"]["request-latency-avg"] == 4.0
    registry = CollectorRegistry()
    registry.register(LayoutCollector("producer", "p1", m.layout))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(_text(registry)) for s in f.samples}
    assert samples[("kafka_producer_producer_metrics_record_send_total",
                    (("client_id", "p1"),))] == 40
    assert samples[("kafka_producer_producer_topic_metrics_byte_total",
                    (("client_id", "p1"), ("topic", "a.b")))] == 4000
    assert samples[("kafka_producer_producer_node_metrics_request_latency_avg",
                    (("client_id", "p1"), ("node_id", "2")))] == 4.0


def test_request_recorder_counts_by_request_and_error_and_forgets_deleted_topics() -> None:
    """Goal: per-topic counters and per-request errors, bounded by what exists. Method: record
    a produce, a failed one, a fetch with two partition errors and an unknown action; drop the
    topic."""
    r = RequestMetrics(known_actions=["metadata"])
    r.produced("t", 5, 500, 0.001, 0)
    r.produced("t", 0, 0, 0.001, 6)
    r.fetched("t", False, 5, 500, 0.01, [1, 3])
    r.action("made_up", 0.001, 35)
    assert r.topic_counters()["t"] == {
        "messagesin": 5, "bytesin": 500, "messagesout": 5, "bytesout": 500,
        "replicationbytesout": 0, "totalproducerequests": 2, "totalfetchrequests": 1,
        "failedproducerequests": 1, "failedfetchrequests": 1}
    registry = CollectorRegistry()
    registry.register(r)
    text = _text(registry)
    assert 'errors_total{error="NOT_LEADER_OR_FOLLOWER",request="produce"} 1.0' in text
    assert 'errors_total{error="OFFSET_OUT_OF_RANGE",request="fetch_consumer"} 1.0' in text
    assert 'request="unknown"' in text and "made_up" not in text
    r.retain_topics([])
    assert r.topic_counters() == {}


class BlockingCollector:
    """Counts collections; the first one waits until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        self.entered.set()
        self.release.wait(30)
        yield GaugeMetricFamily("calls", "collections so far", value=self.calls)


def test_concurrent_scrapes_share_one_rendering_begun_after_they_arrived() -> None:
    """Goal: many scrapers cost one rendering, and none gets figures older than its arrival.
    Method: hold the first rendering open; 8 more scrapes arrive meanwhile; release it; the
    8 share exactly one second rendering (calls == 2) and all see it."""
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    renderer = Renderer(registry, min_interval_s=0.0)
    outputs: list[bytes] = []
    first = threading.Thread(target=lambda: outputs.append(renderer.render()))
    first.start()
    assert collector.entered.wait(30)
    late = [threading.Thread(target=lambda: outputs.append(renderer.render()))
            for _ in range(8)]
    for t in late:
        t.start()
    wait_for(lambda: renderer.waiting == 9, "the 8 late scrapes to wait")
    collector.release.set()
    for t in (first, *late):
        t.join(30)
    assert collector.calls == 2
    assert sorted(o.count(b"calls 2.0") for o in outputs) == [0] + [1] * 8


def _text(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()
