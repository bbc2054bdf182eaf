"""The ``logstore groups`` commands: list, describe, reset-offsets, delete.

Owns: parsing these commands' arguments and printing their results (describe shows state,
members, and per partition the committed offset, log end offset, lag, lag in seconds and owner,
then the total lag: the figures the group's coordinator computes and exports, from
``Admin.list_consumer_group_lag``). Offsets are reset only while the group is empty (the admin
client and the coordinator both refuse otherwise with NON_EMPTY_GROUP); ``--to-offset`` is
clamped to each partition's [log start, log end] with a warning naming the partition, as
kafka-consumer-groups does. Must not: talk to brokers except through ``Admin``.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin
from logstore.model import EARLIEST, LATEST, TopicPartition

if TYPE_CHECKING:
    from logstore.client.admin import Admin


def register(commands: Any) -> None:
    groups = commands.add_parser("groups", help="list, describe, reset offsets of, delete "
                                                "consumer groups")
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every group with its state")
    listing.set_defaults(run=_cmd_list)
    describe = actions.add_parser("describe", help="state, members, offsets and lag")
    describe.add_argument("group")
    describe.set_defaults(run=_cmd_describe)
    reset = actions.add_parser("reset-offsets", help="set a group's committed offsets for a "
                                                     "topic (only while the group is empty)")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-datetime", metavar="ISO-8601", type=iso_datetime,
                        help="the first offset at or after this time (naive times are UTC)")
    target.add_argument("--to-offset", type=int, metavar="OFFSET",
                        help="this offset in every partition (clamped to the partition's "
                             "earliest and latest offsets, with a warning)")
    reset.set_defaults(run=_cmd_reset)
    delete = actions.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group")
    delete.set_defaults(run=_cmd_delete)
    for parser in (listing, describe, reset, delete):
        add_bootstrap(parser)


def _cmd_list(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        for g in client.list_groups():
            print(f"{g.group_id}\t{g.state}\t{g.protocol_type}")
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        (desc,) = client.describe_groups([args.group])
        lags = client.list_consumer_group_lag(args.group)
        owners = {tp: m for m in desc.members for tp in m.assignment}
        unowned = sorted(set(owners) - set(lags))
        ends = client.list_offsets(dict.fromkeys(unowned, LATEST)) if unowned else {}
    print(f"group {desc.group_id}: state {desc.state}, generation {desc.generation_id}, "
          f"protocol {desc.protocol or '-'}, {len(desc.members)} member(s)")
    for m in desc.members:
        print(f"  member {m.member_id} (client {m.client_id}"
              f"{', instance ' + m.group_instance_id if m.group_instance_id else ''}): "
              f"{', '.join(map(str, m.assignment)) or '-'}")
    print("TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tLAG-SECONDS\tMEMBER")
    total = 0
    for tp in sorted(set(lags) | set(owners)):
        p = lags.get(tp)
        current, end = (p.committed_offset, p.log_end_offset) if p else (None, ends[tp])
        lag = p.lag if p is not None and p.lag >= 0 else None
        total += lag or 0
        owner = owners[tp].member_id if tp in owners else "-"
        print(f"{tp.topic}\t{tp.partition}\t{_dash(current)}\t{_dash(end)}\t{_dash(lag)}\t"
              f"{_seconds(p.lag_seconds if p else None)}\t{owner}")
    print(f"total lag {total}")
    return 0


def _dash(value: int | None) -> str:
    return "-" if value is None or value < 0 else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cmd_reset(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        (topic,) = client.describe_topics([args.topic])
        tps = [TopicPartition(args.topic, p.partition) for p in topic.partitions]
        targets = _targets(client, args, tps)
        client.alter_group_offsets(args.group, {**targets})
    for tp, offset in sorted(targets.items()):
        print(f"{tp.topic}\t{tp.partition}\t{offset}")
    return 0


def iso_datetime(text: str) -> datetime:
    """An ISO-8601 time (naive: UTC), as an argparse type: a bad one is a usage error naming
    the option."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO-8601 time such as 2024-05-01T12:00:00, got {text!r}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def _targets(client: Admin, args: argparse.Namespace, tps: list[TopicPartition]
             ) -> dict[TopicPartition, int]:
    if args.to_offset is not None:
        return _in_range(client, dict.fromkeys(tps, args.to_offset))
    if args.to_earliest or args.to_latest:
        return client.list_offsets(dict.fromkeys(tps, EARLIEST if args.to_earliest else LATEST))
    when: datetime = args.to_datetime
    found = client.list_offsets(dict.fromkeys(tps, int(when.timestamp() * 1000)))
    latest = client.list_offsets(dict.fromkeys(tps, LATEST))
    return {tp: found[tp] if found[tp] >= 0 else latest[tp] for tp in tps}


def _in_range(client: Admin, requested: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """``requested`` clamped to each partition's range, a warning on stderr for each one
    moved (Kafka's ConsumerGroupCommand.checkOffsetsRange)."""
    earliest = client.list_offsets(dict.fromkeys(requested, EARLIEST))
    latest = client.list_offsets(dict.fromkeys(requested, LATEST))
    out = {}
    for tp, offset in requested.items():
        out[tp], warning = clamp_offset(tp, offset, earliest[tp], latest[tp])
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr)
    return out


def clamp_offset(tp: TopicPartition, offset: int, earliest: int, latest: int
                 ) -> tuple[int, str | None]:
    """The offset to commit for ``tp`` when ``offset`` is asked for and its log holds
    [earliest, latest): above the log end it is the log end, below the log start the log
    start (checked in that order, as Kafka does); with why, when it moved."""
    if offset > latest:
        return latest, (f"new offset {offset} is higher than the latest offset of {tp}; it "
                        f"is set to {latest}")
    if offset < earliest:
        return earliest, (f"new offset {offset} is lower than the earliest offset of {tp}; it "
                          f"is set to {earliest}")
    return offset, None


def _cmd_delete(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        client.delete_groups([args.group])
    print(f"deleted group {args.group}")
    return 0
