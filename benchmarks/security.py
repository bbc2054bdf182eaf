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

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import (
    ROWS_PER_BATCH,
    Broker,
    Brokers,
    alternate,
    bench_parser,
    median_ratio,
    poll_arrow_rps,
    record_send_rps,
    report,
    send_batches_rps,
    value_batch,
)

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.controller.local import METADATA_FILE, LocalMetadataStore
from logstore.security.acl import (
    ANONYMOUS,
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from tests.certs import Pki  # tests/ makes the certificates

TOPIC = "bench"


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


def preload_acls(broker: Broker) -> None:
    """``thousand_acls()`` in the metadata of ``broker``, before it starts."""
    store = LocalMetadataStore(broker.log_dir / METADATA_FILE, 0, exclusive=True)
    store.start()
    store.add_acls(thousand_acls())
    store.close()


def columnar_produce(bootstrap: str, batches: list[pa.RecordBatch], **client: Any) -> float:
    with Producer(bootstrap, acks=1, **client) as producer:
        return send_batches_rps(producer, TOPIC, batches)


def poll_arrow(bootstrap: str, records: int, **client: Any) -> float:
    tp = TopicPartition(TOPIC, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", **client) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return poll_arrow_rps(consumer, records)


def tls_figures(workdir: Path, records: int, rounds: int) -> dict[str, float]:
    pki = Pki(workdir / "pki")
    cert = pki.broker()
    client = {"security_protocol": "SSL", "ssl_cafile": pki.cafile}
    with Brokers(workdir) as brokers:
        plain = brokers("plain")
        tls = brokers("tls", listener_security="tls", ssl_certfile=cert.certfile,
                      ssl_keyfile=cert.keyfile)
        for b, c in ((plain, {}), (tls, client)):
            with Admin(b.bootstrap, **c) as admin:
                admin.create_topics([NewTopic(TOPIC, 1)])
        batches = [value_batch()] * max(1, records // ROWS_PER_BATCH)
        produced = len(batches) * ROWS_PER_BATCH
        tls_p, plain_p, produce_ratio = median_ratio(*alternate(
            rounds, lambda: columnar_produce(tls.bootstrap, batches, **client),
            lambda: columnar_produce(plain.bootstrap, batches)))
        tls_c, plain_c, consume_ratio = median_ratio(*alternate(
            rounds, lambda: poll_arrow(tls.bootstrap, produced, **client),
            lambda: poll_arrow(plain.bootstrap, produced)))
    return {"plaintext_produce_rps": plain_p, "tls_produce_rps": tls_p,
            "tls_produce_vs_plaintext": produce_ratio,
            "plaintext_consume_rps": plain_c, "tls_consume_rps": tls_c,
            "tls_consume_vs_plaintext": consume_ratio}


def authorizer_figures(workdir: Path, sends: int, rounds: int) -> dict[str, float]:
    with Brokers(workdir) as brokers:
        with_acls = brokers("acls", prepare=preload_acls, authorizer_enable=True)
        without = brokers("open")
        for b in (with_acls, without):
            with Admin(b.bootstrap) as admin:
                admin.create_topics([NewTopic(TOPIC, 1)])
        on, off, ratio = median_ratio(*alternate(
            rounds, lambda: record_send_rps(with_acls.bootstrap, TOPIC, sends),
            lambda: record_send_rps(without.bootstrap, TOPIC, sends)))
    return {"record_send_rps_1000_acls": on, "record_send_rps_no_authorizer": off,
            "authorizer_overhead": ratio}


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--sends", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logstore-bench-security-") as tmp:
        workdir = Path(tmp)
        figures = tls_figures(workdir, args.records, args.rounds)
        figures |= authorizer_figures(workdir, args.sends, args.rounds)
    report(figures, args.json, lambda k, v: f"{k:32s} {v:>14,.2f}", digits=None, indent=2)


if __name__ == "__main__":
    main()
