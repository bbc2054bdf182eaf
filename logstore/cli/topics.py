"""``logstore topics``: create, list, describe, alter and delete topics.

Owns: these commands' arguments and output (describe prints the configs that differ from the
defaults, a typed topic's value columns in ``--value-schema`` syntax, and per partition its
leader, replicas, ISR, log start offset (over both tiers), local log start offset, log end
offset (the high watermark) and last stable offset, and for a tiered topic its remote segments
and bytes and its copy lag). Must not: talk to brokers except through the public clients.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from contextlib import closing
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin, key_value
from logstore.cli.schema_spec import VALUE_SCHEMA_HELP, type_spec, value_schema_arg

if TYPE_CHECKING:
    from logstore.client.admin import PartitionDescription, TopicDescription


def register(commands: Any) -> None:
    topics = commands.add_parser("topics", help="create, list, describe, alter, delete topics")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, required=True)
    create.add_argument("--replication-factor", type=int, default=1)
    create.add_argument("--config", type=key_value, action="append", default=[],
                        metavar="KEY=VALUE", help="topic config (repeatable), e.g. retention_ms=60000")
    create.add_argument("--value-schema", type=value_schema_arg, metavar="SPEC",
                        help=VALUE_SCHEMA_HELP)
    create.set_defaults(run=_cmd_create)
    listing = actions.add_parser("list", help="list topic names")
    listing.add_argument("--include-internal", action="store_true")
    listing.set_defaults(run=_cmd_list)
    describe = actions.add_parser("describe", help="partitions, leaders, replicas, ISR, offsets")
    describe.add_argument("name", nargs="?", help="a topic (default: every topic)")
    describe.set_defaults(run=_cmd_describe)
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(run=_cmd_delete)
    alter = actions.add_parser("alter", help="change topic configs")
    alter.add_argument("name")
    alter.add_argument("--config", type=key_value, action="append", required=True,
                       metavar="KEY=VALUE", help="topic config to set (repeatable)")
    alter.set_defaults(run=_cmd_alter)
    for sub in (create, listing, describe, delete, alter):
        add_bootstrap(sub)


def _cmd_create(args: argparse.Namespace) -> int:
    from logstore import NewTopic

    topic = NewTopic(args.name, args.partitions, replication_factor=args.replication_factor,
                     config=dict(args.config), value_schema=args.value_schema)
    with closing(admin(args)) as client:
        client.create_topics([topic])
    typed = "" if args.value_schema is None else f" and {len(args.value_schema)} value column(s)"
    print(f"created topic {args.name} with {args.partitions} partition(s){typed}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        for name in client.list_topics(include_internal=args.include_internal):
            print(name)
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        client.delete_topics([args.name])
    print(f"deleted topic {args.name}")
    return 0


def _cmd_alter(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        client.alter_configs({args.name: dict(args.config)})
    print(f"altered topic {args.name}: " + ", ".join(f"{k}={v}" for k, v in args.config))
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        topics = client.describe_topics([args.name] if args.name else None,
                                        include_log_tiers=True)
        configs = client.describe_configs([t.name for t in topics]) if topics else {}
    missing = [f"{t.name}-{p.partition}" for t in topics for p in t.partitions
               if p.log_tiers is None]
    if missing:
        print(f"warning: log offsets unavailable for {', '.join(missing)} (no leader "
              "answered)", file=sys.stderr)
    for topic in topics:
        _print_topic(topic, configs.get(topic.name, {}))
    return 0


def _print_topic(topic: TopicDescription, config: dict[str, Any]) -> None:
    overrides = ", ".join(f"{k}={v}" for k, v in _non_default(config).items()) or "-"
    print(f"Topic: {topic.name}\tPartitionCount: {len(topic.partitions)}\tConfigs: {overrides}")
    if topic.value_schema is not None:
        print("\tValueColumns:")
        for f in topic.value_schema:
            print(f"\t\t{f.name}: {type_spec(f.type)}")
    for p in sorted(topic.partitions, key=lambda p: p.partition):
        print(f"\tPartition: {p.partition}\tLeader: {p.leader}\t"
              f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t{_log_columns(p)}")


def _log_columns(p: PartitionDescription) -> str:
    t = p.log_tiers
    if t is None:
        return ("LogStartOffset: -\tLocalLogStartOffset: -\tLogEndOffset: -\t"
                "LastStableOffset: -")
    text = (f"LogStartOffset: {t.log_start_offset}\tLocalLogStartOffset: "
            f"{t.local_log_start_offset}\tLogEndOffset: {t.high_watermark}\t"
            f"LastStableOffset: {t.last_stable_offset}")
    if t.remote_storage_enable:
        text += (f"\tRemoteSegments: {t.remote_segments}\tRemoteBytes: {t.remote_bytes}\t"
                 f"CopyLagSegments: {t.copy_lag_segments}\tCopyLagBytes: {t.copy_lag_bytes}")
    return text


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _non_default(config: dict[str, Any]) -> dict[str, Any]:
    from logstore.config import TopicConfig

    defaults = TopicConfig().to_dict()
    return {k: v for k, v in sorted(config.items()) if defaults.get(k, object()) != v}
