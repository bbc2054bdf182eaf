"""``logstore acls add|remove|list``: ACL bindings, with ``kafka-acls``' flags.

Owns: the commands, their flags (``--allow-principal``, ``--deny-principal``, ``--allow-host``,
``--deny-host``, ``--operation``, ``--topic``, ``--group``, ``--cluster``,
``--transactional-id``, ``--resource-pattern-type``) and output. As in Kafka, ``add`` makes the
cross product of the principals, hosts, operations and resources given; ``remove`` and ``list``
take the same flags as filters (a flag not given matches anything, except
``--resource-pattern-type``: as in ``kafka-acls`` it defaults to ``literal``, so ``remove
--topic x`` never removes a PREFIXED binding named ``x``; it also takes ``any`` and ``match``;
with no resource given, ``list`` and ``remove`` match every pattern). Must not: talk to brokers except through ``Admin``.
"""

from __future__ import annotations

import argparse
from contextlib import closing
from itertools import product
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin

if TYPE_CHECKING:
    from logstore.security.acl import AclBinding, AclBindingFilter, ResourceType


def register(commands: Any) -> None:
    acls = commands.add_parser("acls", help="ACL bindings (add, remove, list)")
    verbs = acls.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, run, text in (("add", _cmd_add, "add bindings"),
                            ("remove", _cmd_remove, "remove the bindings that match"),
                            ("list", _cmd_list, "list the bindings that match")):
        parser = verbs.add_parser(verb, help=text)
        _add_flags(parser, filtering=verb != "add")
        add_bootstrap(parser)
        parser.set_defaults(run=run)


def _add_flags(parser: argparse.ArgumentParser, filtering: bool) -> None:
    many: dict[str, Any] = {"action": "append", "default": []}
    parser.add_argument("--allow-principal", metavar="User:NAME", **many)
    parser.add_argument("--deny-principal", metavar="User:NAME", **many)
    parser.add_argument("--allow-host", metavar="HOST", **many)
    parser.add_argument("--deny-host", metavar="HOST", **many)
    parser.add_argument("--operation", metavar="OP", type=str.upper, **many,
                        help="ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, "
                             "CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE")
    parser.add_argument("--topic", **many)
    parser.add_argument("--group", **many)
    parser.add_argument("--transactional-id", **many)
    parser.add_argument("--cluster", action="store_true")
    if filtering:
        parser.add_argument("--principal", metavar="User:NAME", **many,
                            help="match bindings of this principal, allowed or denied")
    choices = ("literal", "prefixed", "any", "match") if filtering else ("literal", "prefixed")
    parser.add_argument("--resource-pattern-type", type=str.lower, choices=choices,
                        default=None if filtering else "literal",
                        help="default: literal (any when no resource is given to filter on)")


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    from logstore.security.acl import CLUSTER_NAME, ResourceType

    found = [(ResourceType.TOPIC, n) for n in args.topic]
    found += [(ResourceType.GROUP, n) for n in args.group]
    found += [(ResourceType.TRANSACTIONAL_ID, n) for n in args.transactional_id]
    if args.cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return found


def _bindings(args: argparse.Namespace) -> list[AclBinding]:
    from logstore.security.acl import (
        AccessControlEntry,
        AclBinding,
        Operation,
        PatternType,
        Permission,
        ResourcePattern,
        parse_enum,
    )

    resources = _resources(args)
    if not resources or not args.operation or not (args.allow_principal or args.deny_principal):
        raise ValueError("acls add needs a resource (--topic, --group, --cluster, "
                         "--transactional-id), an --operation and a principal "
                         "(--allow-principal or --deny-principal)")
    pattern = PatternType.PREFIXED if args.resource_pattern_type == "prefixed" else \
        PatternType.LITERAL
    out = []
    for permission, principals, hosts in ((Permission.ALLOW, args.allow_principal,
                                           args.allow_host or ["*"]),
                                          (Permission.DENY, args.deny_principal,
                                           args.deny_host or ["*"])):
        for (rtype, name), principal, host, op in product(resources, principals, hosts,
                                                          args.operation):
            cluster = rtype.value == "CLUSTER"  # the cluster is always a LITERAL name
            out.append(AclBinding(
                ResourcePattern(rtype, name, PatternType.LITERAL if cluster else pattern),
                AccessControlEntry(principal, host, parse_enum(Operation, op, "--operation"),
                                   permission)))
    return out


def _filters(args: argparse.Namespace) -> list[AclBindingFilter]:
    from logstore.security.acl import AclBindingFilter, Operation, Permission, parse_enum

    resources: list[tuple[Any, Any]] = list(_resources(args)) or [(None, None)]
    principals: list[tuple[str | None, Permission | None]] = [
        (p, Permission.ALLOW) for p in args.allow_principal]
    principals += [(p, Permission.DENY) for p in args.deny_principal]
    principals += [(p, None) for p in args.principal]
    operations = [parse_enum(Operation, op, "--operation") for op in args.operation] or [None]
    hosts = args.allow_host + args.deny_host or [None]
    # kafka-acls: LITERAL unless told; without a resource, every binding's pattern matches.
    pattern = args.resource_pattern_type or ("literal" if _resources(args) else "any")
    return [AclBindingFilter(rtype, name, pattern.upper(), principal,
                             host, op, permission)
            for (rtype, name), (principal, permission), host, op in product(
                resources, principals or [(None, None)], hosts, operations)]


def _print(bindings: list[AclBinding]) -> None:
    from logstore.security.acl import AclBinding

    for b in sorted(bindings, key=AclBinding.sort_key):
        p, e = b.pattern, b.entry
        print(f"{p.resource_type.value}\t{p.name}\t{p.pattern_type.value}\t"
              f"{e.permission.value}\t{e.principal}\t{e.host}\t{e.operation.value}")


def _cmd_add(args: argparse.Namespace) -> int:
    bindings = _bindings(args)
    with closing(admin(args)) as client:
        client.create_acls(bindings)
    print(f"added {len(bindings)} binding(s):")
    _print(bindings)
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    if not _resources(args) and not (args.allow_principal or args.deny_principal
                                     or args.principal):
        raise ValueError("acls remove needs a resource (--topic, --group, --cluster, "
                         "--transactional-id) or a principal; it never removes every binding")
    with closing(admin(args)) as client:
        removed = client.delete_acls(_filters(args))
    print(f"removed {len(removed)} binding(s):")
    _print(removed)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    filters = _filters(args)
    found: dict[str, AclBinding] = {}
    with closing(admin(args)) as client:
        for f in filters:
            for b in client.describe_acls(f):
                found[repr(b.sort_key())] = b
    _print(list(found.values()))
    return 0
