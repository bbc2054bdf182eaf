"""``logstore cluster``: the brokers (id, listener, rack) and which one is the controller.

Owns: the command and its output. Must not: talk to brokers except through ``Admin``.
"""

from __future__ import annotations

import argparse
from contextlib import closing
from typing import Any

from logstore.cli.arguments import add_bootstrap, admin


def register(commands: Any) -> None:
    cluster = commands.add_parser("cluster", help="brokers (id, listener, rack) and the controller")
    add_bootstrap(cluster)
    cluster.set_defaults(run=_cmd_cluster)


def _cmd_cluster(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        cluster = client.describe_cluster()
    controller = "-" if cluster.controller_id is None else cluster.controller_id
    print(f"Brokers: {len(cluster.brokers)}\tController: {controller}")
    for b in cluster.brokers:
        mark = "\t(controller)" if b.broker_id == cluster.controller_id else ""
        print(f"\tBroker: {b.broker_id}\tListener: {b.host}:{b.port}\t"
              f"Rack: {b.rack or '-'}{mark}")
    return 0
