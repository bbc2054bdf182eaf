"""What security costs: TLS against plaintext, and an authorizer with 1,000 ACLs against none.

    .venv/bin/python benchmarks/security.py [--records N] [--sends N] [--rounds R] [--json]

Four embedded brokers run as separate processes on loopback: plaintext, TLS (certificates made
for the run), and two plaintext ones for the authorizer figure, one with ``authorizer_enable``
and 1,000 ACL bindings (999 on other principals and topics, literal and prefixed, and the one
that lets ``User:ANONYMOUS`` write the benchmark topic), loaded into its metadata before it
starts, the other without an authorizer. Each figure is measured ``--rounds`` times, the two
sides alternating, and the median of each side is compared (ratios from one run):

| figure                     | what                                                  | target |
|----------------------------|-------------------------------------------------------|--------|
| tls_produce_vs_plaintext   | columnar produce (``send_batch``, 10k-row batches)    | >= 0.7 |
| tls_consume_vs_plaintext   | ``poll_arrow`` of the same records                    | >= 0.7 |
| authorizer_overhead        | per-record ``send()``, 1,000 ACLs against none        | >= 0.95|

Figures are printed, never asserted: machines are shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ makes the certificates

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from logstore.controller.local import METADATA_FILE, LocalMetadataStore  # noqa: E402
from logstore.security.acl import (  # noqa: E402
    ANONYMOUS,
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from tests.brokers import free_port, write_broker_toml  # noqa: E402
from tests.certs import Pki  # noqa: E402

VALUE = b"x" * 100
ROWS_PER_BATCH = 10_000
TOPIC = "bench"


class Broker:
    def __init__(self, workdir: Path, name: str, **settings: Any) -> None:
        self.bootstrap = f"127.0.0.1:{free_port()}"
        self.log_dir = workdir / name
        conf = write_broker_toml(workdir / f"{name}.toml", {
            "broker_id": 0, "listener": self.bootstrap, "log_dirs": [str(self.log_dir)],
            **settings})
        self.proc = subprocess.Popen([sys.executable, "-m", "logstore", "broker", "start",
                                      "--config", str(conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"broker {name} did not start: {line!r}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def thousand_acls() -> list[AclBinding]:
    """998 bindings for other principals and topics, and the two the benchmark needs (CREATE
    and WRITE on its topic for User:ANONYMOUS, the principal of a plaintext connection)."""
    out = [AclBinding(ResourcePattern(ResourceType.TOPIC, TOPIC),
                      AccessControlEntry(ANONYMOUS, "*", op, Permission.ALLOW))
           for op in (Operation.CREATE, Operation.WRITE)]
    for i in range(998):
        pattern = PatternType.PREFIXED if i % 3 == 0 else PatternType.LITERAL
        op = (Operation.READ, Operation.WRITE, Operation.DESCRIBE)[i % 3]
        out.append(AclBinding(ResourcePattern(ResourceType.TOPIC, f"other-{i}-", pattern),
                              AccessControlEntry(f"User:user-{i}", "*", op, Permission.ALLOW)))
    return out


def preload_acls(log_dir: Path, bindings: list[AclBinding]) -> None:
    store = LocalMetadataStore(log_dir / METADATA_FILE, 0, exclusive=True)
    store.start()
    store.add_acls(bindings)
    store.close()


def columnar_produce(bootstrap: str, batches: list[pa.RecordBatch], **client: Any) -> float:
    with Producer(bootstrap, acks=1, **client) as producer:
        start = time.perf_counter()
        futures = [producer.send_batch(TOPIC, b, partition=0) for b in batches]
        for f in futures:
            f.result(300)
        elapsed = time.perf_counter() - start
    return sum(b.num_rows for b in batches) / elapsed


def poll_arrow(bootstrap: str, records: int, **client: Any) -> float:
    tp = TopicPartition(TOPIC, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", **client) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        start, got = time.perf_counter(), 0
        while got < records:
            for table in consumer.poll_arrow(timeout_ms=1000).values():
                got += table.num_rows
        return got / (time.perf_counter() - start)


def record_sends(bootstrap: str, n: int) -> float:
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        send = producer.send
        start = time.perf_counter()
        for _ in range(n):
            send(TOPIC, VALUE)
        producer.flush(300)
        return n / (time.perf_counter() - start)


def alternate(rounds: int, secure: Callable[[], float], plain: Callable[[], float]
              ) -> tuple[float, float, float]:
    """Medians of ``rounds`` alternating measurements of each side, and of their ratios."""
    a, b = [], []
    for _ in range(rounds):
        a.append(secure())
        b.append(plain())
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


def tls_figures(workdir: Path, records: int, rounds: int) -> dict[str, float]:
    pki = Pki(workdir / "pki")
    cert = pki.broker()
    plain = Broker(workdir, "plain")
    tls = Broker(workdir, "tls", listener_security="tls", ssl_certfile=cert.certfile,
                 ssl_keyfile=cert.keyfile)
    client = {"security_protocol": "SSL", "ssl_cafile": pki.cafile}
    try:
        for b, c in ((plain, {}), (tls, client)):
            with Admin(b.bootstrap, **c) as admin:
                admin.create_topics([NewTopic(TOPIC, 1)])
        batch = pa.record_batch({"key": pa.nulls(ROWS_PER_BATCH, pa.binary()),
                                 "value": pa.array([VALUE] * ROWS_PER_BATCH, pa.binary())})
        batches = [batch] * max(1, records // ROWS_PER_BATCH)
        produced = len(batches) * ROWS_PER_BATCH
        tls_p, plain_p, produce_ratio = alternate(
            rounds, lambda: columnar_produce(tls.bootstrap, batches, **client),
            lambda: columnar_produce(plain.bootstrap, batches))
        tls_c, plain_c, consume_ratio = alternate(
            rounds, lambda: poll_arrow(tls.bootstrap, produced, **client),
            lambda: poll_arrow(plain.bootstrap, produced))
    finally:
        plain.stop()
        tls.stop()
    return {"plaintext_produce_rps": plain_p, "tls_produce_rps": tls_p,
            "tls_produce_vs_plaintext": produce_ratio,
            "plaintext_consume_rps": plain_c, "tls_consume_rps": tls_c,
            "tls_consume_vs_plaintext": consume_ratio}


def authorizer_figures(workdir: Path, sends: int, rounds: int) -> dict[str, float]:
    preload_acls(workdir / "acls", thousand_acls())
    with_acls = Broker(workdir, "acls", authorizer_enable=True)
    without = Broker(workdir, "open")
    try:
        for b in (with_acls, without):
            with Admin(b.bootstrap) as admin:
                admin.create_topics([NewTopic(TOPIC, 1)])
        on, off, ratio = alternate(rounds, lambda: record_sends(with_acls.bootstrap, sends),
                                   lambda: record_sends(without.bootstrap, sends))
    finally:
        with_acls.stop()
        without.stop()
    return {"record_send_rps_1000_acls": on, "record_send_rps_no_authorizer": off,
            "authorizer_overhead": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--sends", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-bench-security-") as tmp:
        workdir = Path(tmp)
        figures = tls_figures(workdir, args.records, args.rounds)
        figures |= authorizer_figures(workdir, args.sends, args.rounds)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, value in figures.items():
        print(f"{name:32s} {value:>14,.2f}")


if __name__ == "__main__":
    main()
