"""Produce/consume throughput and latency over loopback, against baselines from the same run.

    .venv/bin/python benchmarks/produce_consume.py [--records N] [--repeat R] [--json]

Brokers run as separate processes (as in production), so client and broker do not share a GIL.
Baselines: a bare Arrow Flight server that appends DoPut batches to one Arrow IPC file, fed the
same batches by a bare Flight client (produce); a bare Arrow Flight server that streams the
broker's own segment files of the columnar topic with DoGet, read by a bare Flight client
(consume). Each figure of a ratio (columnar produce and its raw baseline, columnar consume and
its) is the best of ``--repeat`` runs alternating with its baseline's, so a burst of load on a
shared machine does not land on one side of a ratio only. Latency is measured twice: with the
consumer on a thread of the producing process (``latency_p50_ms``, the target figure, as
before) and in a process of its own (``latency_consumer_process_*``: two applications, so the
two clients share no GIL). Figures are printed, never asserted: machines are shared.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from common import (
    ROWS_PER_BATCH,
    Brokers,
    alternate,
    bench_parser,
    free_port,
    poll_arrow_rps,
    ready_process,
    record_send_rps,
    report,
    send_batches_rps,
    value_batch,
)

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition

TARGETS = {"columnar_produce_rps": ">= 2.0M", "columnar_produce_vs_raw": ">= 0.95",
           "record_send_rps": ">= 1.2M", "columnar_consume_rps": ">= 5M",
           "columnar_consume_vs_raw": ">= 0.9",
           "record_consume_rps": ">= 2M", "latency_p50_ms": "<= 1.5",
           "latency_p99_ms": "<= 5", "fsync_group_commit_vs_none": ">= 0.5"}

RAW_SERVER = r'''
import sys, pyarrow as pa, pyarrow.flight as fl
class S(fl.FlightServerBase):
    def do_put(self, ctx, desc, reader, writer):
        with pa.OSFile(sys.argv[2], "ab") as sink:
            w = pa.ipc.new_stream(sink, reader.schema)
            for chunk in reader:
                w.write_batch(chunk.data)
                writer.write(pa.py_buffer(b"ok"))
s = S(f"grpc://127.0.0.1:{sys.argv[1]}")
print("ready", flush=True)
s.serve()
'''

RAW_GET_SERVER = r'''
import sys, glob, pyarrow as pa, pyarrow.flight as fl
files = sorted(glob.glob(sys.argv[2] + "/*.arrow"))
class S(fl.FlightServerBase):
    def do_get(self, ctx, ticket):
        schema = pa.ipc.open_stream(pa.memory_map(files[0])).schema
        def batches():
            for f in files:
                yield from pa.ipc.open_stream(pa.memory_map(f))
        return fl.GeneratorStream(schema, batches())
s = S(f"grpc://127.0.0.1:{sys.argv[1]}")
print("ready", flush=True)
s.serve()
'''


def bench_raw_flight_put(workdir: Path, batches: list[pa.RecordBatch]) -> float:
    port = free_port()
    proc = ready_process(RAW_SERVER, str(port), str(workdir / f"raw-{port}.arrow"))
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    start = time.perf_counter()
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(b"x"), batches[0].schema)
    for b in batches:
        writer.write_with_metadata(b, pa.py_buffer(b"m"))
    for _ in batches:
        reader.read()
    writer.done_writing()
    writer.close()
    elapsed = time.perf_counter() - start
    proc.terminate()
    proc.wait()
    return sum(b.num_rows for b in batches) / elapsed


def bench_raw_flight_get(segment_dir: Path) -> float:
    """Records/s of a bare DoGet streaming the segment files in ``segment_dir`` as they are."""
    port = free_port()
    proc = ready_process(RAW_GET_SERVER, str(port), str(segment_dir))
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    start = time.perf_counter()
    rows = sum(chunk.data.num_rows for chunk in client.do_get(flight.Ticket(b"all")))
    elapsed = time.perf_counter() - start
    proc.terminate()
    proc.wait()
    return rows / elapsed


def bench_columnar_produce(bootstrap: str, topic: str, batches: list[pa.RecordBatch]) -> float:
    with Producer(bootstrap, acks=1) as producer:
        return send_batches_rps(producer, topic, batches, timeout_s=120)


def bench_consume(bootstrap: str, topic: str, total: int, arrow: bool) -> float:
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        if arrow:
            return poll_arrow_rps(consumer, total)
        got = 0
        start = time.perf_counter()
        while got < total:
            for records in consumer.poll(timeout_ms=1000, max_records=50_000).values():
                for _record in records:
                    got += 1
        return got / (time.perf_counter() - start)


def consume_latencies(bootstrap: str, topic: str, total: int, ready: Callable[[], None],
                      done: threading.Event, out: list[float]) -> None:
    """Append to ``out`` the milliseconds from each record's send (its value is
    ``time.perf_counter_ns()`` at the send, a clock every process of the machine shares) to
    its arrival in ``poll_arrow``, for ``total`` records from the end of ``topic`` (or until
    ``done``, or for LATENCY_WAIT_S at most); ``ready()`` once positioned."""
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + LATENCY_WAIT_S
    with Consumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=100) as c:
        c.assign([tp])
        c.position(tp)
        ready()
        while len(out) < total and not done.is_set() and time.monotonic() < deadline:
            for table in c.poll_arrow(timeout_ms=200).values():
                now = time.perf_counter_ns()
                sent = np.frombuffer(b"".join(table.column("value").to_pylist()),
                                     dtype=np.int64)
                out.extend(((now - sent) / 1e6).tolist())


LATENCY_WAIT_S = 30.0  # the longest a latency consumer reads (its producer sends for 3 s)

# The consumer of bench_latency(own_process=True): consume_latencies in a process of its own,
# its latencies on one line after "result ".
LATENCY_CONSUMER = r'''
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from produce_consume import consume_latencies
found = []
consume_latencies(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                  lambda: print("ready", flush=True), threading.Event(), found)
print("result " + json.dumps(found), flush=True)
'''


def bench_latency(bootstrap: str, topic: str, rate: int = 10_000, seconds: float = 3.0,
                  own_process: bool = False) -> tuple[float, float]:
    """Produce-to-consume latency (p50, p99) at ``rate`` records/s with acks=1 and
    linger_ms=0; the consumer runs on a thread of this process, or with ``own_process`` in a
    process of its own (so that it shares no GIL with the producer, as two applications)."""
    total = int(rate * seconds)
    found: list[float] = []
    if own_process:
        helper = ready_process(LATENCY_CONSUMER, str(Path(__file__).parent), bootstrap, topic,
                               str(total))
        try:
            _produce_ticks(bootstrap, topic, rate, total)
            assert helper.stdout is not None
            line = helper.stdout.readline()  # it stops within LATENCY_WAIT_S of its start
            if not line.startswith("result "):
                raise RuntimeError(f"the latency consumer ended without its result "
                                   f"(exit code {helper.wait(10)})")
            found = json.loads(line.removeprefix("result "))
        finally:
            if helper.poll() is None:
                helper.kill()
            helper.wait(10)
    else:
        ready, done = threading.Event(), threading.Event()
        thread = threading.Thread(target=consume_latencies,
                                  args=(bootstrap, topic, total, ready.set, done, found))
        thread.start()
        try:
            ready.wait(30)
            _produce_ticks(bootstrap, topic, rate, total)
            thread.join(LATENCY_WAIT_S)
        finally:
            done.set()
            thread.join(10)
    if not found:
        raise RuntimeError(f"no record of {topic!r} reached the latency consumer")
    arr = np.array(found)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _produce_ticks(bootstrap: str, topic: str, rate: int, total: int) -> None:
    """``total`` records at ``rate`` per second, each value the send's perf_counter_ns."""
    per_tick = max(1, rate // 1000)  # records per millisecond
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        start = time.perf_counter()
        for tick in range(total // per_tick):
            # Sleep (which releases the GIL) to each millisecond tick, then send that tick's
            # records; a busy-wait here would starve the producer's own sender thread.
            delay = start + tick / 1000.0 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            for _ in range(per_tick):
                producer.send(topic, np.int64(time.perf_counter_ns()).tobytes(), partition=0)
        producer.flush(60)


def row(name: str, value: float) -> str:
    shown = f"{value:,.0f}" if value > 100 else f"{value:.3f}"
    return f"{name:32} {shown:>14}  {TARGETS.get(name, '')}"


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--per-record", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each figure of a ratio, alternating with its baseline's")
    args = parser.parse_args()
    batches = [value_batch() for _ in range(args.records // ROWS_PER_BATCH)]
    results: dict[str, float] = {}
    rounds = max(args.repeat, 1)
    with tempfile.TemporaryDirectory() as tmp, Brokers(Path(tmp)) as brokers:
        workdir = Path(tmp)
        broker = brokers()
        columnar = [f"columnar-{i}" for i in range(rounds)]  # the first is read back
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic(t, 1) for t in (*columnar, "records", "latency",
                                                          "acks-all", "acks-all-fsync")])
            admin.alter_configs({"acks-all-fsync": {"flush_ms": 0}})
        topics = iter(columnar)
        raw_put, put = alternate(
            rounds, lambda: bench_raw_flight_put(workdir, batches),
            lambda: bench_columnar_produce(broker.bootstrap, next(topics), batches))
        results["raw_flight_put_rps"] = max(raw_put)
        results["columnar_produce_rps"] = max(put)
        results["record_send_rps"] = record_send_rps(broker.bootstrap, "records",
                                                     args.per_record)
        get, raw_get = alternate(
            rounds, lambda: bench_consume(broker.bootstrap, columnar[0], args.records,
                                          arrow=True),
            lambda: bench_raw_flight_get(broker.log_dir / f"{columnar[0]}-0"))
        results["columnar_consume_rps"] = max(get)
        results["raw_flight_get_rps"] = max(raw_get)
        results["record_consume_rps"] = bench_consume(broker.bootstrap, "records",
                                                      args.per_record, arrow=False)
        p50, p99 = bench_latency(broker.bootstrap, "latency")
        results["latency_p50_ms"], results["latency_p99_ms"] = p50, p99
        p50, p99 = bench_latency(broker.bootstrap, "latency", own_process=True)
        results["latency_consumer_process_p50_ms"] = p50
        results["latency_consumer_process_p99_ms"] = p99
        n = args.per_record // 2
        no_fsync = record_send_rps(broker.bootstrap, "acks-all", n, acks="all")
        fsync = record_send_rps(broker.bootstrap, "acks-all-fsync", n, acks="all")
        results["acks_all_rps"], results["acks_all_fsync_rps"] = no_fsync, fsync
        results["fsync_group_commit_vs_none"] = fsync / no_fsync
    results["columnar_produce_vs_raw"] = (results["columnar_produce_rps"]
                                          / results["raw_flight_put_rps"])
    results["columnar_consume_vs_raw"] = (results["columnar_consume_rps"]
                                          / results["raw_flight_get_rps"])
    report(results, args.json, row, header=f"{'figure':32} {'measured':>14}  target")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
