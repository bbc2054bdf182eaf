"""A broker's metrics: Prometheus's text format over HTTP, named after Kafka's JMX metrics.

| module              | owns                                                                   |
|---------------------|------------------------------------------------------------------------|
| requests.py         | what the Flight server records: latency and errors per request, traffic |
|                     | per topic                                                              |
| broker_collector.py | the broker's state read at scrape time: partitions, replication,       |
|                     | controller, group coordinator, consumer lag                            |
| snapshot.py         | the same figures as one typed answer (``describe_broker_metrics``)     |
| broker_metrics.py   | ``BrokerMetrics``: the above put together for one broker               |
| http.py             | the HTTP endpoint (404 off /metrics, scrapes share one rendering); the |
|                     | clients' endpoints use it too, so it imports nothing of the broker     |

Names map Kafka's JMX MBeans the way Prometheus's JMX exporter does
(``kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=T`` is
``kafka_server_brokertopicmetrics_messagesin_total{topic="T"}``), the lag series are
kafka-lag-exporter's, process figures prometheus_client's ``process_*``; README.md has the
table. This package imports nothing at import time: its modules are imported by name.
"""
