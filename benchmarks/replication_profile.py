"""Where each broker's CPU goes while ``benchmarks/replication.py`` produces, for RF=1 and RF=3.

    .venv/bin/python benchmarks/replication_profile.py [--records N] [--json] [--keep DIR]
    (py-spy: pip install --target /tmp/pyspy py-spy, or --py-spy PATH; perf from linux-perf)

Three brokers and a real ZooKeeper, as in ``replication.py``. For each phase (RF=1 acks=1,
RF=3 acks=all, columnar produce to one partition) every broker's CPU time is read from
``/proc/<pid>/stat`` before and after, and two samplers run on it meanwhile:

- py-spy with ``--gil`` (only samples holding the GIL, so only Python actually running:
  its idle detection is unreliable here): each sample is charged to the first of ``RULES``
  any frame of its stack matches, giving the Python seconds of each path;
- ``perf record`` (cpu-clock): the share of all the process's CPU by shared object, which
  says where the time outside Python goes (gRPC and Flight are linked into
  ``libarrow_flight``, the IPC reader/writer into ``libarrow``, the loopback TCP stack and
  syscalls into the kernel).

Printed, never asserted: machines are shared.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from common import bench_parser, zk_cluster
from replication import produce_rps

SAMPLE_HZ = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# (path, substrings of a frame "function (file:line)"); the first rule any frame matches wins.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("follower fetch+append", ("replication/fetcher.py",)),
    ("ISR/HW bookkeeping", ("update_follower_fetch", "_maybe_advance_high_watermark",
                            "replication/isr.py", "_wait_for_high_watermark")),
    ("leader produce path", ("do_put", "_AckWriter", "_produce_one")),
    ("leader: serving followers", ("do_get", "_fetch_stream", "do_exchange",
                                   "broker/fetch_session", "rpc/session_server")),
    ("other", ("",)),
]
# perf's shared objects, by what they hold.
OBJECTS: list[tuple[str, str]] = [
    ("python interpreter", "libpython"), ("gRPC+Flight", "libarrow_flight"),
    ("arrow (IPC, buffers)", "libarrow"), ("kernel (TCP loopback, syscalls, page cache)",
                                           "kernel"),
    ("libc (memcpy, malloc)", "libc"), ("crc32c", "crc32c"), ("other", ""),
]
_PERF_LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S.*?)\s*$")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def python_paths(path: Path) -> Counter[str]:
    """Python seconds (GIL held) per path of ``RULES``."""
    seconds: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        name = next(n for n, keys in RULES if any(k in f for f in frames for k in keys))
        seconds[name] += int(count) / SAMPLE_HZ
    return seconds


def native_shares(perf_data: Path) -> Counter[str]:
    """Share of the process's CPU samples per kind of shared object."""
    report = subprocess.run(["perf", "report", "-i", str(perf_data), "--stdio",
                             "--sort", "dso"], capture_output=True, text=True).stdout
    shares: Counter[str] = Counter()
    for line in report.splitlines():
        m = _PERF_LINE.match(line)
        if m and not line.lstrip().startswith("#"):
            kind = next(k for k, key in OBJECTS if key in m.group(2))
            shares[kind] += float(m.group(1)) / 100
    return shares


def _samplers(py_spy: str, pid: int, out: Path, b: int) -> list[subprocess.Popen[bytes]]:
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    return [subprocess.Popen([py_spy, "record", "--gil", "--nonblocking", "-p", str(pid), "-r", str(SAMPLE_HZ),
                              "-f", "raw", "-o", str(out / f"pyspy-{b}.txt")], **quiet),
            subprocess.Popen(["perf", "record", "-F", "499", "-p", str(pid), "-o",
                              str(out / f"perf-{b}.data")], **quiet)]


def profile_phase(py_spy: str, pids: dict[int, int], run: Callable[[], float], out: Path
                  ) -> tuple[float, dict[int, dict[str, dict[str, float]]]]:
    before = {b: cpu_seconds(pid) for b, pid in pids.items()}
    samplers = [s for b, pid in pids.items() for s in _samplers(py_spy, pid, out, b)]
    time.sleep(1.0)  # the samplers attach
    start = {b: cpu_seconds(pid) for b, pid in pids.items()}
    client = time.process_time()
    rps = run()
    cpu = {b: cpu_seconds(pid) - start[b] for b, pid in pids.items()}
    cpu[0] = time.process_time() - client
    for s in samplers:
        s.send_signal(signal.SIGINT)
    for s in samplers:
        s.wait(120)
    split: dict[int, dict[str, dict[str, float]]] = {
        0: {"cpu_s": {"run": cpu[0]}, "python_s": {}, "objects_s": {}}}  # 0: the producer
    for b in pids:
        total = cpu[b] + (start[b] - before[b])
        split[b] = {"cpu_s": {"run": cpu[b], "sampled": total},
                    "python_s": dict(python_paths(out / f"pyspy-{b}.txt")),
                    "objects_s": {k: v * total for k, v in
                                  native_shares(out / f"perf-{b}.data").items()}}
    return rps, split


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--py-spy", default="/tmp/pyspy/bin/py-spy")
    parser.add_argument("--keep", type=Path, help="keep the samples in this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-repl-prof-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        with zk_cluster(root, "prof") as cluster:
            rf1 = cluster.create_topic(rf=1)
            rf3 = cluster.create_topic(rf=3, min_insync_replicas=2)
            pids = {b: p.process.pid for b, p in cluster.brokers.items()
                    if p.process is not None}
            results = {}
            for name, topic, acks in (("rf1", rf1, 1), ("rf3", rf3, "all")):
                (root / name).mkdir()
                leader = cluster.describe(topic).leader
                rps, split = profile_phase(args.py_spy, pids, lambda t=topic, a=acks: produce_rps(
                    cluster.bootstrap, t, args.records, a), root / name)
                results[name] = {"rps": rps, "leader": leader, "brokers": split}
    if args.json:
        print(json.dumps(results))
        return 0
    for name, r in results.items():
        print(f"{name}: {r['rps']:,.0f} records/s, leader broker {r['leader']}")
        for b, row in r["brokers"].items():
            role = "leader" if b == r["leader"] else "producer" if b == 0 else "other"
            print(f"  broker {b} ({role}): cpu {row['cpu_s']['run']:.2f} s")
            for table in ("python_s", "objects_s"):
                parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(
                    row[table].items(), key=lambda kv: -kv[1]) if v >= 0.01)
                print(f"    {table}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
