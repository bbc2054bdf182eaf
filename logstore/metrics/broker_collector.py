"""The broker's state as Prometheus metrics, read at scrape time.

Owns: ``BrokerCollector``, a prometheus_client collector that reads the broker's own state
each time it is scraped: every hosted partition's log (start and end offsets, high watermark,
last stable offset, size, segments), the replication figures of the partitions it leads
(under-replicated; tiered partitions' remote bytes and copy lag), the broker's
totals (partitions, leaders, under-replicated, ISR shrinks and expands, segment files), the
controller's (active controller, epoch, offline partitions), the group coordinator's (groups
by state, offsets, rebalances, commits) and the consumer lag of the groups it coordinates
(kafka-lag-exporter's names). Nothing per partition is stored between scrapes, so a deleted
topic's series vanish with it. Must not: change broker state, or hold the lock of anything it
reads longer than one read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from logstore.broker.broker import Broker
from logstore.broker.lag import PartitionLag
from logstore.groups.state import GroupState
from logstore.metrics.requests import RequestMetrics
from logstore.model import TopicPartition
from logstore.replication.partition import Partition

log = logging.getLogger(__name__)

TP = ["topic", "partition"]
GTP = ["group", "topic", "partition"]

# name -> help of the per-partition log gauges (every hosted replica, leader or follower).
LOG_GAUGES = {
    "kafka_log_log_logstartoffset": "First offset of the partition's log (over both tiers)",
    "kafka_log_log_logendoffset": "Offset the next record appended gets",
    "kafka_log_log_highwatermark": "First offset not yet on every in-sync replica",
    "kafka_log_log_laststableoffset": "First offset of an undecided transaction, else the HW",
    "kafka_log_log_size": "Bytes of the partition's local segment files",
    "kafka_log_log_numlogsegments": "Local segment files of the partition",
}
# ... and of the partitions this broker leads (Kafka's InSyncReplicasCount and ReplicasCount
# are left out: two more series per partition, and the ISR is in `topics describe`).
LEADER_GAUGES = {
    "kafka_cluster_partition_underreplicated": "1 if the ISR is smaller than the replica set",
}
TIER_GAUGES = {
    "kafka_server_brokertopicmetrics_remotelogsizebytes": "Bytes of FINISHED remote segments",
    "kafka_server_brokertopicmetrics_remotelogmetadatacount": "FINISHED remote segments",
    "kafka_server_brokertopicmetrics_remotecopylagbytes": "Bytes of sealed segments not copied",
    "kafka_server_brokertopicmetrics_remotecopylagsegments": "Sealed segments not yet copied",
}


@dataclass
class _Totals:
    partitions: int = 0
    leaders: int = 0
    under_replicated: int = 0
    segments: int = 0
    families: dict[str, GaugeMetricFamily] = field(default_factory=dict)


class BrokerCollector:
    """Collects one broker's figures (register it in a CollectorRegistry)."""

    def __init__(self, broker: Broker, requests: RequestMetrics) -> None:
        self._broker = broker
        self._requests = requests

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except Exception:  # boundary: a scrape during startup or shutdown answers what it can
            log.exception("broker %d: collecting metrics failed", self._broker.config.broker_id)

    def _collect(self) -> Iterator[Metric]:
        topics = set(self._broker.store.topics())
        self._requests.retain_topics(topics)
        totals = self._partitions()
        yield from totals.families.values()
        yield from self._replica_manager(totals)
        yield from self._controller()
        # Offsets a group still holds for a deleted topic are not exported (Kafka drops them).
        committed = [c for c in self._broker.lag.committed() if c[1].topic in topics]
        lags = self._broker.lag.lag(committed)  # loads the groups too
        yield from self._groups()
        yield from lag_families(lags, int(time.time() * 1000))

    # -- partitions --------------------------------------------------------------------------

    def _partitions(self) -> _Totals:
        totals = _Totals(families={name: GaugeMetricFamily(name, doc, labels=TP) for name, doc
                                   in {**LOG_GAUGES, **LEADER_GAUGES, **TIER_GAUGES}.items()})
        for tp, p in sorted(self._broker.replicas.hosted().items()):
            self._partition(tp, p, totals)
        return totals

    def _partition(self, tp: TopicPartition, p: Partition, totals: _Totals) -> None:
        # The hot loop of a scrape (10,000 partitions: 70,000 samples): one labels dict per
        # partition, shared by its samples, which are appended as they are (add_metric would
        # build a dict per sample).
        f, log_ = totals.families, p.log
        labels = {"topic": tp.topic, "partition": str(tp.partition)}
        size, segments = log_.disk_usage()
        # A log not opened since the start (lazy loading) has no LSO yet: not reported until
        # its first use, rather than opened by a scrape.
        lso = log_.last_stable_offset if log_.is_loaded else None
        values = (self._broker.replicas.log_start_offset(tp, log_), log_.log_end_offset,
                  log_.high_watermark, lso, size, segments)
        for name, value in zip(LOG_GAUGES, values, strict=True):
            if value is not None:
                f[name].samples.append(Sample(name, labels, value))
        totals.partitions += 1
        totals.segments += segments
        if not p.is_leader:
            return
        under = len(p.isr) < len(p.replicas)
        totals.leaders += 1
        totals.under_replicated += under
        f["kafka_cluster_partition_underreplicated"].samples.append(
            Sample("kafka_cluster_partition_underreplicated", labels, int(under)))
        tier = self._broker.tier
        stats = tier.stats(tp) if tier is not None else None
        if stats is not None:
            for name, value in zip(TIER_GAUGES, (stats.remote_bytes, stats.remote_segments,
                                                 stats.copy_lag_bytes, stats.copy_lag_segments),
                                   strict=True):
                f[name].samples.append(Sample(name, labels, value))

    def _replica_manager(self, totals: _Totals) -> Iterator[Metric]:
        isr = self._broker.replicas.isr_stats
        yield _gauge("kafka_server_replicamanager_partitioncount", "Partitions hosted",
                     totals.partitions)
        yield _gauge("kafka_server_replicamanager_leadercount", "Partitions led",
                     totals.leaders)
        yield _gauge("kafka_server_replicamanager_underreplicatedpartitions",
                     "Led partitions whose ISR is smaller than their replica set",
                     totals.under_replicated)
        yield _counter("kafka_server_replicamanager_isrshrinks", "ISR shrinks committed",
                       isr.shrinks)
        yield _counter("kafka_server_replicamanager_isrexpands", "ISR expansions committed",
                       isr.expands)
        yield _gauge("kafka_log_logmanager_numlogsegments",
                     "Segment files of every hosted partition", totals.segments)

    # -- controller and groups ---------------------------------------------------------------

    def _controller(self) -> Iterator[Metric]:
        store = self._broker.store
        active = store.is_controller()
        yield _gauge("kafka_controller_kafkacontroller_activecontrollercount",
                     "1 on the broker that is the controller, else 0", int(active))
        yield _gauge("kafka_controller_kafkacontroller_controllerepoch",
                     "The epoch at which this broker last became controller (0: never)",
                     store.controller_epoch)
        yield _gauge("kafka_controller_kafkacontroller_offlinepartitionscount",
                     "Partitions without a live leader (reported by the controller only)",
                     offline_partitions(self._broker) if active else 0)

    def _groups(self) -> Iterator[Metric]:
        coordinator = self._broker.groups.coordinator
        states = {s.value: 0 for s in GroupState}
        try:
            for g in coordinator.list_groups().groups:
                states[g.state] = states.get(g.state, 0) + 1
        except Exception as e:  # no offsets topic yet, or a shard loading: no groups here
            log.debug("groups not listed: %s", e)
        by_state = GaugeMetricFamily(
            "kafka_coordinator_group_groupmetadatamanager_numgroups",
            "Groups this broker coordinates, by state", labels=["state"])
        for state, count in sorted(states.items()):
            by_state.add_metric([state], count)
        yield by_state
        stats = coordinator.stats
        yield _counter("kafka_coordinator_group_groupmetadatamanager_offsetcommits",
                       "Offsets committed to groups this broker coordinates",
                       stats.offset_commits)
        yield _counter("kafka_coordinator_group_groupmetadatamanager_completedrebalances",
                       "Rebalances completed (one per generation)",
                       stats.completed_rebalances)


def offline_partitions(broker: Broker) -> int:
    """Partitions whose leader is none or not a live broker (the controller's view)."""
    live = set(broker.store.brokers())
    return sum(1 for topic in broker.store.topics()
               for st in broker.store.partition_states(topic).values() if st.leader not in live)


def lag_families(lags: list[PartitionLag], now_ms: int) -> Iterator[Metric]:
    """kafka-lag-exporter's series for ``lags``."""
    offset = GaugeMetricFamily("kafka_consumergroup_group_offset",
                               "Committed offset of the group", labels=GTP)
    lag = GaugeMetricFamily("kafka_consumergroup_group_lag",
                            "Log end offset (high watermark) minus the committed offset",
                            labels=GTP)
    seconds = GaugeMetricFamily("kafka_consumergroup_group_lag_seconds",
                                "Age of the first record not yet committed", labels=GTP)
    latest = GaugeMetricFamily("kafka_partition_latest_offset",
                               "Log end offset (high watermark) of the partition", labels=TP)
    groups: dict[str, tuple[int, float, int]] = {}  # max lag, max lag seconds, sum lag
    seen: set[TopicPartition] = set()
    for p in lags:
        labels = [p.group_id, p.tp.topic, str(p.tp.partition)]
        offset.add_metric(labels, p.committed_offset)
        if p.lag < 0:
            continue
        age = p.lag_seconds(now_ms)
        lag.add_metric(labels, p.lag)
        if age is not None:
            seconds.add_metric(labels, age)
        if p.tp not in seen:
            seen.add(p.tp)
            latest.add_metric([p.tp.topic, str(p.tp.partition)], p.log_end_offset)
        most, oldest, total = groups.get(p.group_id, (0, 0.0, 0))
        groups[p.group_id] = (max(most, p.lag), max(oldest, age or 0.0), total + p.lag)
    yield from (offset, lag, seconds, latest)
    yield from _group_lag_families(groups)


def _group_lag_families(groups: dict[str, tuple[int, float, int]]) -> Iterator[Metric]:
    names = (("kafka_consumergroup_group_max_lag", "Largest partition lag of the group"),
             ("kafka_consumergroup_group_max_lag_seconds", "Largest lag in seconds"),
             ("kafka_consumergroup_group_sum_lag", "Sum of the group's partition lags"))
    for i, (name, doc) in enumerate(names):
        family = GaugeMetricFamily(name, doc, labels=["group"])
        for group, values in sorted(groups.items()):
            family.add_metric([group], values[i])
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
