"""A broker's figures as one typed answer: the ``describe_broker_metrics`` action.

Owns: building ``DescribeBrokerMetricsResponse`` from the same sources the Prometheus endpoint
reads (the request recorder's topic counters, the hosted partitions, the controller, the group
coordinator and its lag), so ``logstore top`` shows what a dashboard would, whether or not the
broker has a metrics listener. Counters are totals; the reader turns two snapshots into rates.
Must not: change broker state.
"""

from __future__ import annotations

import time

from logstore.broker import acl_rules as rules
from logstore.broker.broker import Broker
from logstore.messages import Route
from logstore.messages.metrics import (
    DescribeBrokerMetricsRequest,
    DescribeBrokerMetricsResponse,
    GroupLagSummary,
    TopicCounters,
)
from logstore.metrics.broker_collector import offline_partitions
from logstore.metrics.requests import RequestMetrics


class BrokerSnapshot:
    def __init__(self, broker: Broker, requests: RequestMetrics,
                 listener: str | None = None) -> None:
        self._broker = broker
        self._requests = requests
        self.listener = listener  # where the endpoint listens, once started

    def route(self) -> Route[DescribeBrokerMetricsRequest, DescribeBrokerMetricsResponse]:
        return Route(DescribeBrokerMetricsRequest, self.describe, rules.BROKER_STATS)

    def describe(self, req: DescribeBrokerMetricsRequest) -> DescribeBrokerMetricsResponse:
        broker, store = self._broker, self._broker.store
        hosted = broker.replicas.hosted().values()
        leaders = [p for p in hosted if p.is_leader]
        active = store.is_controller()
        self._requests.retain_topics(store.topics())
        return DescribeBrokerMetricsResponse(
            broker_id=broker.config.broker_id, active_controller=active,
            controller_epoch=store.controller_epoch, partitions=len(hosted),
            leaders=len(leaders),
            under_replicated=sum(1 for p in leaders if len(p.isr) < len(p.replicas)),
            offline=offline_partitions(broker) if active else 0,
            topics=[TopicCounters(topic=t, messages_in=c["messagesin"], bytes_in=c["bytesin"],
                                  messages_out=c["messagesout"], bytes_out=c["bytesout"])
                    for t, c in sorted(self._requests.topic_counters().items())],
            groups=self._groups(req.max_groups), metrics_listener=self.listener)

    def _groups(self, limit: int) -> list[GroupLagSummary]:
        """The groups coordinated here with the largest lag, largest first."""
        lag = self._broker.lag
        now_ms = int(time.time() * 1000)
        sums: dict[str, tuple[int, float | None]] = {}
        for p in lag.lag(lag.committed()):
            if p.lag < 0:
                continue
            total, oldest = sums.get(p.group_id, (0, None))
            age = p.lag_seconds(now_ms)
            sums[p.group_id] = (total + p.lag, age if oldest is None else max(
                oldest, age or 0.0))
        try:
            states = {g.group_id: g.state
                      for g in self._broker.groups.coordinator.list_groups().groups}
        except Exception:  # no offsets topic yet: no groups here
            states = {}
        ranked = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))[:max(limit, 0)]
        return [GroupLagSummary(group_id=g, state=states.get(g, "Unknown"), lag=total,
                                lag_seconds=age) for g, (total, age) in ranked]
