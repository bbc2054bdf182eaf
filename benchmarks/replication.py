"""Replication cost and failover time on three local brokers and a real ZooKeeper.

    .venv/bin/python benchmarks/replication.py [--records N] [--catchup-records N] [--rounds R] [--json]

Figures (printed, never asserted: machines are shared):
- ``rf1_acks1_rps`` and ``rf3_acks_all_rps``: columnar produce (``send_batch``) to one
  partition, unreplicated with acks=1 against RF=3, min_insync_replicas=2 with acks=all,
  measured ``--rounds`` times, the two alternating (so that a burst of load on a shared
  machine does not land on one side only); the median of each, and ``rf3_vs_rf1`` the median
  of the rounds' ratios (target >= 0.5);
- ``failover_s``: from kill -9 of the leader to the first acks=all write the new leader
  acknowledges (target <= ZooKeeper session timeout + 1 s);
- ``replica_catchup_rps``: records per second a restarted follower copies until it is back
  in the ISR, after missing ``--catchup-records`` records.
Brokers and ZooKeeper are the test suite's helpers (tests/brokers.py, tests/zookeeper.py).
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

from common import (
    ROWS_PER_BATCH,
    VALUE,
    alternate,
    bench_parser,
    median_ratio,
    report,
    send_batches_rps,
    value_batch,
    zk_cluster,
)

from logstore import Producer
from tests.faults.cluster import SESSION_TIMEOUT_MS, Cluster, wait_for


def produce_rps(bootstrap: list[str], topic: str, records: int, acks: object) -> float:
    batches = [value_batch()] * max(records // ROWS_PER_BATCH, 1)
    with Producer(bootstrap, acks=acks) as producer:
        producer.send_batch(topic, batches[0], partition=0).result(60)  # warm up
        return send_batches_rps(producer, topic, batches)


def failover_s(cluster: Cluster, topic: str) -> float:
    victim = cluster.leader(topic)
    with Producer(cluster.bootstrap, acks="all", request_timeout_ms=2000) as producer:
        producer.send(topic, VALUE, partition=0).result(30)
        victim.kill(signal.SIGKILL)
        start = time.perf_counter()
        producer.send(topic, VALUE, partition=0).result(60)
        elapsed = time.perf_counter() - start
    victim.start()
    cluster.wait_for_isr(topic, 0, 3, timeout_s=120)
    return elapsed


def catchup_rps(cluster: Cluster, topic: str, records: int) -> float:
    leader = cluster.describe(topic).leader
    follower = next(b for i, b in cluster.brokers.items() if i != leader)
    assert follower.stop() == 0
    wait_for(lambda: follower.broker_id not in cluster.describe(topic).isr, "isr shrink")
    produce_rps(cluster.live_bootstrap(), topic, records, 1)
    start = time.perf_counter()
    follower.start()
    cluster.wait_for_isr(topic, 0, 3, timeout_s=600)
    return records / (time.perf_counter() - start)


def run(records: int, catchup_records: int, rounds: int, root: Path) -> dict[str, float]:
    with zk_cluster(root) as cluster:
        # A new pair of topics per round: each round writes to empty logs, as the first does.
        rf1 = iter([cluster.create_topic(rf=1) for _ in range(rounds)])
        rf3_topics = [cluster.create_topic(rf=3, min_insync_replicas=2) for _ in range(rounds)]
        rf3 = iter(rf3_topics)
        rf3_rps, rf1_rps, ratio = median_ratio(*alternate(
            rounds, lambda: produce_rps(cluster.bootstrap, next(rf3), records, "all"),
            lambda: produce_rps(cluster.bootstrap, next(rf1), records, 1), swap=True))
        results = {"rf1_acks1_rps": rf1_rps, "rf3_acks_all_rps": rf3_rps, "rf3_vs_rf1": ratio}
        results["failover_s"] = failover_s(cluster, rf3_topics[0])
        results["failover_target_s"] = SESSION_TIMEOUT_MS / 1000 + 1
        results["replica_catchup_rps"] = catchup_rps(cluster, rf3_topics[0], catchup_records)
        return results


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--catchup-records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="measurements of each side of rf3_vs_rf1, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-repl-bench-") as tmp:
        results = run(args.records, args.catchup_records, max(args.rounds, 1), Path(tmp))
    report(results, args.json, lambda k, v: f"{k:<22} {v:>14,.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
