"""``BrokerMetrics``: one broker's request recorder, registry and (with ``metrics_listener``)
Prometheus endpoint, put together (the composition root, ``main.py``, makes it): the recorder
is always on (a dict lookup per request), the endpoint only with ``metrics_listener``. Must not:
be imported by the layers below (it reads the broker, never the reverse).
"""

from __future__ import annotations

from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from logstore.broker.broker import Broker
from logstore.metrics.broker_collector import BrokerCollector
from logstore.metrics.http import MetricsServer
from logstore.metrics.requests import RequestMetrics
from logstore.metrics.snapshot import BrokerSnapshot


class BrokerMetrics:
    """One broker's recorder, registry and (with a listener) endpoint."""

    def __init__(self, metrics_listener: str | None = None) -> None:
        self.requests = RequestMetrics()
        self.registry = CollectorRegistry()
        self.registry.register(self.requests)
        ProcessCollector(registry=self.registry)
        self.server = MetricsServer(metrics_listener, self.registry) \
            if metrics_listener else None

    def attach(self, broker: Broker) -> None:
        """Read ``broker``'s state on each scrape, answer ``describe_broker_metrics`` on it,
        and start the endpoint with it."""
        self.registry.register(BrokerCollector(broker, self.requests))
        snapshot = BrokerSnapshot(broker, self.requests)
        broker.handlers.add_routes([snapshot.route()])
        self.requests.know_actions(broker.handlers.routes)
        if self.server is not None:
            broker.endpoints.append(_Endpoint(self.server, snapshot))


class _Endpoint:
    """The server as a broker endpoint; once listening, the snapshot says where."""

    def __init__(self, server: MetricsServer, snapshot: BrokerSnapshot) -> None:
        self._server = server
        self._snapshot = snapshot

    def start(self) -> None:
        self._server.start()
        self._snapshot.listener = self._server.address

    def close(self) -> None:
        self._server.close()
