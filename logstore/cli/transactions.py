"""``logstore transactions``: Kafka's ``kafka-transactions.sh`` verbs.

Owns: the arguments and output of ``list`` (filters by state, producer id and id prefix),
``describe`` (one transactional id), ``describe-producers`` (a partition's active producers),
``find-hanging`` (by ``--broker-id``, or ``--topic`` with an optional ``--partition``, and
``--max-transaction-timeout`` in minutes, Kafka's unit) and ``abort`` (``--topic --partition``
with ``--producer-id --producer-epoch --coordinator-epoch``, or ``--start-offset`` to look them
up among the partition's producers). Output is tab-separated with a header line, as Kafka's
tool prints it. Must not: talk to brokers except through the public ``Admin``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import closing
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin, non_negative
from logstore.errors import InvalidRequestError
from logstore.messages.transactions import TRANSACTION_STATES

if TYPE_CHECKING:
    from logstore.client.admin import Admin
    from logstore.model import TopicPartition

MINUTE_MS = 60_000


def register(commands: Any) -> None:
    txn = commands.add_parser("transactions", help="list, describe, find and abort "
                                                   "(hanging) transactions")
    actions = txn.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="transactional ids, their producer and state")
    listing.add_argument("--state", action="append", default=[], choices=TRANSACTION_STATES)
    listing.add_argument("--producer-id", action="append", default=[], type=int)
    listing.add_argument("--prefix", default="", help="transactional ids starting with this")
    listing.set_defaults(run=_cmd_list)
    describe = actions.add_parser("describe", help="one transactional id's transaction")
    describe.add_argument("--transactional-id", required=True)
    describe.set_defaults(run=_cmd_describe)
    producers = actions.add_parser("describe-producers", help="a partition's active producers")
    producers.add_argument("--topic", required=True)
    producers.add_argument("--partition", type=non_negative, required=True)
    producers.set_defaults(run=_cmd_producers)
    hanging = actions.add_parser("find-hanging", help="open transactions no coordinator "
                                                      "will end")
    where = hanging.add_mutually_exclusive_group(required=True)
    where.add_argument("--broker-id", type=int, help="the partitions this broker leads")
    where.add_argument("--topic")
    hanging.add_argument("--partition", type=non_negative, help="with --topic: one partition")
    hanging.add_argument("--max-transaction-timeout", type=non_negative, default=15,
                         metavar="MINUTES", help="open longer than this (default 15, the "
                                                 "broker's transaction_max_timeout_ms)")
    hanging.set_defaults(run=_cmd_find_hanging, usage_problem=_hanging_problem)
    abort = actions.add_parser("abort", help="write an ABORT marker for a hanging "
                                             "transaction")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=non_negative, required=True)
    abort.add_argument("--start-offset", type=non_negative,
                       help="look the producer up by its transaction's first offset")
    abort.add_argument("--producer-id", type=int)
    abort.add_argument("--producer-epoch", type=int)
    abort.add_argument("--coordinator-epoch", type=int)
    abort.set_defaults(run=_cmd_abort, usage_problem=_abort_problem)
    for parser in (listing, describe, producers, hanging, abort):
        add_bootstrap(parser)


def _hanging_problem(args: argparse.Namespace) -> str | None:
    if args.partition is not None and args.topic is None:
        return "--partition needs --topic"
    return None


def _abort_problem(args: argparse.Namespace) -> str | None:
    ids = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is None and None in ids:
        return "abort needs --start-offset, or --producer-id, --producer-epoch and " \
               "--coordinator-epoch"
    if args.start_offset is not None and any(v is not None for v in ids):
        return "give either --start-offset or the producer's ids, not both"
    return None


def _cmd_list(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        listed = client.list_transactions(args.state, args.producer_id, args.prefix)
    print("TransactionalId\tProducerId\tTransactionState")
    for t in listed:
        print(f"{t.transactional_id}\t{t.producer_id}\t{t.state}")
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        (d,) = client.describe_transactions([args.transactional_id])
    now = int(time.time() * 1000)
    duration = now - d.transaction_start_time_ms if d.transaction_start_time_ms >= 0 else None
    print("TransactionalId\tProducerId\tProducerEpoch\tTransactionState\t"
          "TransactionTimeoutMs\tCurrentTransactionStartTimeMs\tTransactionDurationMs\t"
          "TwoPhaseCommit\tTopicPartitions")
    print(f"{d.transactional_id}\t{d.producer_id}\t{d.producer_epoch}\t{d.state}\t"
          f"{d.transaction_timeout_ms}\t{_dash(d.transaction_start_time_ms)}\t"
          f"{_dash(duration)}\t{str(d.two_phase_commit).lower()}\t"
          f"{','.join(map(str, d.partitions)) or '-'}")
    return 0


def _cmd_producers(args: argparse.Namespace) -> int:
    from logstore.model import TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    with closing(admin(args)) as client:
        producers = client.describe_producers([tp])[tp]
    print("ProducerId\tProducerEpoch\tLatestCoordinatorEpoch\tLastSequence\tLastTimestamp\t"
          "CurrentTransactionStartOffset")
    for p in producers:
        print(f"{p.producer_id}\t{p.producer_epoch}\t{p.coordinator_epoch}\t{p.last_sequence}"
              f"\t{p.last_timestamp}\t{_dash(p.current_transaction_start_offset)}")
    return 0


def _cmd_find_hanging(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        tps = _partitions(client, args)
        hanging = client.find_hanging_transactions(
            tps, args.max_transaction_timeout * MINUTE_MS)
    now = int(time.time() * 1000)
    print("Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\t"
          "LastTimestamp\tDuration(min)")
    for h in hanging:
        p = h.producer
        print(f"{h.partition.topic}\t{h.partition.partition}\t{p.producer_id}\t"
              f"{p.producer_epoch}\t{p.coordinator_epoch}\t"
              f"{p.current_transaction_start_offset}\t{p.last_timestamp}\t"
              f"{(now - p.last_timestamp) // MINUTE_MS}")
    return 0


def _partitions(client: Admin, args: argparse.Namespace) -> list[TopicPartition]:
    from logstore.model import TopicPartition

    if args.topic is not None:
        if args.partition is not None:
            return [TopicPartition(args.topic, args.partition)]
        (topic,) = client.describe_topics([args.topic])
        return [TopicPartition(args.topic, p.partition) for p in topic.partitions]
    return [TopicPartition(t.name, p.partition) for t in client.describe_topics()
            for p in t.partitions if p.leader == args.broker_id]


def _cmd_abort(args: argparse.Namespace) -> int:
    from logstore.model import TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    with closing(admin(args)) as client:
        if args.start_offset is not None:
            ids = _by_start_offset(client, tp, args.start_offset)
        else:
            ids = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
        client.abort_transaction(tp.topic, tp.partition, *ids)
    print(f"aborted the transaction of producer {ids[0]} (epoch {ids[1]}) on {tp}")
    return 0


def _by_start_offset(client: Admin, tp: TopicPartition, start_offset: int
                     ) -> tuple[int, int, int]:
    for p in client.describe_producers([tp])[tp]:
        if p.current_transaction_start_offset == start_offset:
            return p.producer_id, p.producer_epoch, p.coordinator_epoch
    raise InvalidRequestError(f"{tp}: no producer has a transaction open at offset "
                              f"{start_offset}; see 'logstore transactions find-hanging'")


def _dash(value: int | None) -> str:
    return "-" if value is None or value < 0 else str(value)
