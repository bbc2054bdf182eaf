"""Consumer throughput by ``max_partition_fetch_bytes``, against a bare DoGet of the same files.

    .venv/bin/python benchmarks/fetch_size.py [--records N] [--partitions P] [--rounds R]
        [--sizes-mib 1,8] [--json]

One broker in its own process; ``--records`` 100-byte records in 10k-row batches, spread over
``--partitions``; then ``--rounds`` rounds, each reading everything once per size with
``poll_arrow`` (a new consumer each time, on a push session) and once with a bare Arrow
Flight client streaming the partitions' segment files with DoGet (the baseline). Figures
(printed, never asserted): ``consume_rps_<size>mib`` and ``raw_flight_get_rps``, the medians of
the rounds, and ``<size>mib_vs_raw``, the median of the rounds' ratios. This is what chose the
consumer's default (1 MiB, Kafka's): README "Benchmarks".
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from common import (
    ROWS_PER_BATCH,
    Brokers,
    bench_parser,
    poll_arrow_rps,
    report,
    send_batches_rps,
    value_batch,
)
from produce_consume import bench_raw_flight_get

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

MiB = 1024 * 1024
TOPIC = "fetch-size"


def consume_rps(bootstrap: str, partitions: int, records: int, size: int) -> float:
    with Consumer(bootstrap, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=size) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
        return poll_arrow_rps(consumer, records)


def raw_rps(log_dir: Path, partitions: int) -> float:
    """Records/s of bare DoGets of every partition's files, one after another (the records
    are spread evenly, so the rate is the partitions over the sum of each one's 1/rate)."""
    return partitions / sum(1.0 / bench_raw_flight_get(log_dir / f"{TOPIC}-{p}")
                            for p in range(partitions))


def run(records: int, partitions: int, rounds: int, sizes: list[int], root: Path
        ) -> dict[str, float]:
    runs: dict[str, list[float]] = {f"{s}mib": [] for s in sizes}
    raw: list[float] = []
    batches = max(records // ROWS_PER_BATCH, 1)
    records = batches * ROWS_PER_BATCH  # what is produced is what each read waits for
    with Brokers(root) as brokers:
        broker = brokers()
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, partitions)])
        with Producer(broker.bootstrap, acks=1) as producer:
            send_batches_rps(producer, TOPIC, [value_batch()] * batches, partitions=partitions)
        for _ in range(rounds):
            for s in sizes:
                runs[f"{s}mib"].append(consume_rps(broker.bootstrap, partitions, records,
                                                   s * MiB))
            raw.append(raw_rps(broker.log_dir, partitions))
    results = {f"consume_rps_{k}": statistics.median(v) for k, v in runs.items()}
    results["raw_flight_get_rps"] = statistics.median(raw)
    for k, v in runs.items():
        results[f"{k}_vs_raw"] = statistics.median(a / b for a, b in zip(v, raw, strict=True))
    return results


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sizes-mib", default="1,8",
                        help="max_partition_fetch_bytes values to compare, in MiB")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    with tempfile.TemporaryDirectory(prefix="logstore-fetch-size-") as tmp:
        results = run(args.records, args.partitions, max(args.rounds, 1), sizes, Path(tmp))
    report(results, args.json, lambda k, v: f"{k:<24} {v:>14,.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
