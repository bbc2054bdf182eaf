"""Consumer-group benchmark: rebalance time, commit rate, and group vs single consume rate.

    .venv/bin/python benchmarks/groups.py [--records N] [--json]

- ``rebalance_s``: nine members (threads, heartbeat 100 ms) are stable over 20 partitions; a
  tenth subscribes; the time until all ten have polled in the new generation with partitions.
  The broker runs with ``group_initial_rebalance_delay_ms = 0``. Target <= 0.5 s.
- ``commit_rps``: synchronous commits per second from one consumer.
- ``group_vs_single``: the consume rate of 4 group members (separate processes) over 8
  partitions divided by that of one consumer assigned all 8 (a process too). Target >= 1.0.

One broker process; figures are printed, never asserted (machines are shared).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from common import Brokers, bench_parser, report

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

GROUP_CONF = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 100}
TARGETS = {"rebalance_s": "<= 0.5", "group_vs_single": ">= 1.0"}
FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 100,
        "auto_offset_reset": "earliest", "fetch_max_wait_ms": 50}
WAIT_S = 60.0

READER = r'''
import sys, threading, time
from logstore import Consumer, TopicPartition
bootstrap, topic, group, partitions, expected = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5])
if group == "-":
    c = Consumer(bootstrap, auto_offset_reset="earliest")
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
else:
    c = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest",
                 session_timeout_ms=6000, heartbeat_interval_ms=200)
    c.subscribe([topic])
go = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
share = partitions if group == "-" else partitions // 4
ready = False
deadline = time.time() + 120
while not go.is_set() and time.time() < deadline:  # settle the group on the empty topic
    c.poll(50)
    if not ready and len(c.assignment()) == share:
        ready = True
        c.pause(*c.assignment())  # the data arrives next; reading starts on "go"
        print("ready", flush=True)
c.resume(*c.assignment())
count, first, last = 0, time.time(), time.time()
while count < expected and time.time() < deadline:
    count += sum(t.num_rows for t in c.poll_arrow(100).values())
    last = time.time()
print(count, first, last, flush=True)
c.close()
'''


def rebalance_s(bootstrap: str, admin: Admin) -> float:
    topic, group = f"reb-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 20)])
    stop = threading.Event()
    state: dict[int, tuple[int, int, float]] = {}  # member -> (generation, owned, polled at)
    consumers: list[Consumer] = []

    def member(i: int) -> None:
        c = Consumer(bootstrap, group_id=group, **FAST)
        consumers.append(c)
        c.subscribe([topic])
        while not stop.is_set():
            c.poll(20)
            state[i] = (c._group.generation_id, len(c._assignment), time.monotonic())

    def stable(n: int, since: float) -> bool:
        gens = {g for g, _, _ in state.values()}
        return len(state) == n and len(gens) == 1 and all(
            owned > 0 and at > since for _, owned, at in state.values())

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(10)]
    for t in threads[:9]:
        t.start()
    _wait(lambda: stable(9, 0.0), "nine stable members")
    start = time.monotonic()
    threads[9].start()
    _wait(lambda: stable(10, start), "ten stable members")
    elapsed = max(at for _, _, at in state.values()) - start
    stop.set()
    for t in threads:
        t.join(WAIT_S)
    for c in consumers:
        c.close()
    return elapsed


def commit_rps(bootstrap: str, admin: Admin, seconds: float = 2.0) -> float:
    topic = f"com-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1)])
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap, group_id=f"g-{uuid.uuid4().hex[:6]}") as c:
        c.assign([tp])
        c.commit({tp: 0})  # the coordinator lookup and offsets topic creation: not timed
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            n += 1
            c.commit({tp: n})
        return n / (time.monotonic() - start)


def group_vs_single(bootstrap: str, admin: Admin, records: int) -> dict[str, float]:
    records -= records % 80_000  # whole 10k-row batches, the same number in every partition
    rates = []
    for group, members in (("-", 1), (f"g-{uuid.uuid4().hex[:6]}", 4)):
        topic = f"gvs-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(topic, 8)])
        rates.append(_readers(bootstrap, topic, group, members, records,
                              lambda topic=topic: _produce(bootstrap, topic, records)))
    single, group = rates
    return {"single_rps": single, "group_rps": group, "group_vs_single": group / single}


def _produce(bootstrap: str, topic: str, records: int) -> None:
    with Producer(bootstrap, linger_ms=5) as producer:
        batch = pa.record_batch({"value": pa.array([b"x" * 100] * 10_000, pa.binary())})
        for i in range(records // 10_000):
            producer.send_batch(topic, batch, partition=i % 8)
        producer.flush()


def _readers(bootstrap: str, topic: str, group: str, n: int, total: int,
             produce: Callable[[], None]) -> float:
    """Start ``n`` readers, wait until each owns its share, then let them read ``total``
    records in all; records per second from the first start to the last finish."""
    procs = [subprocess.Popen([sys.executable, "-c", READER, bootstrap, topic, group, "8",
                               str(total // n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    produce()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [tuple(map(float, p.communicate(timeout=180)[0].split())) for p in procs]
    count = sum(r[0] for r in results)
    return count / max(max(r[2] for r in results) - min(r[1] for r in results), 1e-6)


def _wait(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)  # the members run on their own threads


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Brokers(Path(tmp)) as brokers:
        broker = brokers(**GROUP_CONF)
        with Admin(broker.bootstrap) as admin:
            results = {"rebalance_s": rebalance_s(broker.bootstrap, admin),
                       "commit_rps": commit_rps(broker.bootstrap, admin),
                       **group_vs_single(broker.bootstrap, admin, args.records)}
    report(results, args.json, lambda k, v: f"{k:<18}{v:>14.3f}  {TARGETS.get(k, '')}",
           header=f"{'metric':<18}{'value':>14}  target", digits=None, indent=2)


if __name__ == "__main__":
    main()
