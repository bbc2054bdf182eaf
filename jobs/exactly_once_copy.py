"""Exactly-once copy of a topic with the Python clients: consume, transform, produce.

    python -m jobs.exactly_once_copy --bootstrap-server 127.0.0.1:9092 \\
        --input events --output events-upper --group copy --transactional-id copy-0

A consumer of group ``--group`` (read_committed, no auto-commit) reads the input; each poll's
records are transformed (``--transform``: ``upper`` upper-cases UTF-8 values, ``identity``
copies), written to the output with the same keys (so a key's records stay in one output
partition, in order) inside one transaction, together with the input offsets after them
(``send_offsets_to_transaction`` with the consumer's group metadata, KIP-447). The transaction
commits both or neither: after a crash at any point the next run (same ``--transactional-id``,
which fences and aborts the dead run's open transaction) resumes from the committed offsets,
and read_committed readers of the output see every input record exactly once. A failed
transaction is aborted and the consumer rewound to the committed offsets; a fenced producer (a
newer run took over) ends the job. ``--instance-id`` makes the consumer a static member, so a
restarted run takes its predecessor's place without waiting for its session to expire.

Prints one line per committed transaction (``committed <records> <total>``); exits 0 after
``--idle-exit-ms`` without records (never by default). Builds on the public clients only.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from logstore import Consumer, Producer, TopicPartition
from logstore.errors import ApiError, ProducerFencedError
from logstore.model import OffsetAndMetadata

log = logging.getLogger("exactly_once_copy")

OUTPUT_COLUMNS = ("key", "value", "timestamp", "headers")


@dataclass(frozen=True, slots=True)
class CopyConfig:
    bootstrap_servers: str
    input_topic: str
    output_topic: str
    group_id: str
    transactional_id: str
    transform: str = "upper"
    instance_id: str | None = None
    max_records_per_transaction: int = 10_000
    transaction_timeout_ms: int = 60_000
    session_timeout_ms: int = 10_000
    idle_exit_ms: int | None = None


def upper(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """UTF-8 values upper-cased, vectorised (nulls stay null)."""
    return pc.utf8_upper(values.cast(pa.string())).cast(pa.binary())


TRANSFORMS: dict[str, Callable[[pa.ChunkedArray], pa.ChunkedArray]] = {
    "upper": upper, "identity": lambda values: values}


def transformed(table: pa.Table, transform: str) -> pa.Table:
    """The output records of one partition's polled table."""
    out = table.select(list(OUTPUT_COLUMNS))
    return out.set_column(1, "value", TRANSFORMS[transform](out.column("value")))


class CopyJob:
    def __init__(self, config: CopyConfig) -> None:
        self.config = config
        self.consumer = Consumer(
            config.bootstrap_servers, group_id=config.group_id, auto_offset_reset="earliest",
            enable_auto_commit=False, isolation_level="read_committed",
            group_instance_id=config.instance_id, session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=max(100, config.session_timeout_ms // 10),
            fetch_max_wait_ms=100)
        self.producer = Producer(config.bootstrap_servers,
                                 transactional_id=config.transactional_id,
                                 transaction_timeout_ms=config.transaction_timeout_ms,
                                 linger_ms=5)
        self.copied = 0

    def run(self) -> int:
        """Copy until idle for ``idle_exit_ms``; the records copied by this run."""
        self.producer.init_transactions()  # fences a previous run and aborts its transaction
        self.consumer.subscribe([self.config.input_topic])
        idle_since = time.monotonic()
        while True:
            polled = self.consumer.poll_arrow(timeout_ms=200,
                                              max_records=self.config.max_records_per_transaction)
            if any(t.num_rows for t in polled.values()):
                self._copy(polled)
                idle_since = time.monotonic()
            elif self._idle_for(idle_since):
                return self.copied

    def _idle_for(self, since: float) -> bool:
        limit = self.config.idle_exit_ms
        return limit is not None and (time.monotonic() - since) * 1000 >= limit

    def _copy(self, polled: dict[TopicPartition, pa.Table]) -> None:
        """One transaction: the transformed records and the offsets after them."""
        offsets = {tp: OffsetAndMetadata(int(t.column("offset")[-1].as_py()) + 1)
                   for tp, t in polled.items() if t.num_rows}
        count = sum(t.num_rows for t in polled.values())
        try:
            self.producer.begin_transaction()
            for table in polled.values():
                if table.num_rows:
                    self.producer.send_batch(self.config.output_topic,
                                             transformed(table, self.config.transform))
            self.producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata())
            self.producer.commit_transaction()
        except ProducerFencedError:
            raise
        except ApiError as e:
            log.warning("transaction failed (%s); aborting and rewinding", e)
            self.producer.abort_transaction()
            self._rewind(list(offsets))
            return
        self.copied += count
        print(f"committed {count} {self.copied}", flush=True)

    def _rewind(self, tps: list[TopicPartition]) -> None:
        """Back to the committed offsets: the aborted records are read again."""
        for tp in tps:
            committed = self.consumer.committed(tp)
            if committed is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed.offset)

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()


def parse_args(argv: list[str] | None = None) -> CopyConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--transform", choices=sorted(TRANSFORMS), default="upper")
    parser.add_argument("--instance-id")
    parser.add_argument("--max-records-per-transaction", type=int, default=10_000)
    parser.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--idle-exit-ms", type=int)
    a = parser.parse_args(argv)
    return CopyConfig(a.bootstrap_server, a.input, a.output, a.group, a.transactional_id,
                      a.transform, a.instance_id, a.max_records_per_transaction,
                      a.transaction_timeout_ms, a.session_timeout_ms, a.idle_exit_ms)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    job = CopyJob(parse_args(argv))
    try:
        job.run()
        return 0
    except ProducerFencedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        job.close()


if __name__ == "__main__":
    sys.exit(main())
