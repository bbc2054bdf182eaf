"""``logstore users add|delete|list``: SCRAM users (Kafka's ``kafka-configs --entity-type users
--alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'``).

Owns: the commands and their output. The password is read from standard input (first line) or,
at a terminal, asked twice without echo; it is never an argument (it would show in ``ps``) and
never printed. Through a broker (``--bootstrap-server``, with ``--command-config``) the admin
client sends a salted password, never the password. Before any broker can authenticate anyone,
the first users are written straight into the metadata store, as Kafka's tools do: ZooKeeper
(``--zookeeper``; with ``zk_set_acl`` the digest identity comes from the same environment as
the brokers') or a stopped embedded broker's log directory (``--log-dir``: the one holding its
metadata file; ``users add --init`` creates that file for a broker not yet started, so a
mistyped directory is refused instead of getting a store of its own). Must not: talk to brokers
except through ``Admin``.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin
from logstore.errors import ConfigError

if TYPE_CHECKING:
    from logstore.controller.store import MetadataStore

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def register(commands: Any) -> None:
    users = commands.add_parser("users", help="SCRAM users (add, delete, list)")
    verbs = users.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", help="add a user or set its password (read from stdin)")
    add.add_argument("name")
    add.add_argument("--mechanism", choices=MECHANISMS, default="SCRAM-SHA-256")
    add.add_argument("--iterations", type=int, default=8192,
                     help="PBKDF2 iterations, 4096..16384 (default 8192)")
    delete = verbs.add_parser("delete", help="delete a user's credential")
    delete.add_argument("name")
    delete.add_argument("--mechanism", choices=MECHANISMS, default="SCRAM-SHA-256")
    listing = verbs.add_parser("list", help="users, their mechanisms and iterations")
    for parser, run in ((add, _cmd_add), (delete, _cmd_delete), (listing, _cmd_list)):
        add_bootstrap(parser)
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--zookeeper", metavar="ZK_CONNECT",
                           help="write to the cluster's ZooKeeper directly (the first users)")
        where.add_argument("--log-dir", type=Path, metavar="DIR",
                           help="write to a stopped embedded broker's log directory (the one "
                                "holding its __cluster_metadata.json)")
        parser.set_defaults(run=run)
    add.add_argument("--init", action="store_true",
                     help="with --log-dir: create the metadata store there if it has none (the "
                          "first users of a broker not yet started)")


def _password(name: str) -> str:
    if not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != password:
            raise ValueError("the two passwords differ")
    if not password:
        raise ValueError(f"no password for user {name!r} on standard input")
    return password


def _direct_store(args: argparse.Namespace) -> MetadataStore | None:
    """The metadata store itself, for --zookeeper and --log-dir (None: through a broker)."""
    if args.zookeeper is not None:
        from logstore.controller.zookeeper import KazooMetadataStore
        from logstore.main import zk_digest
        from logstore.security.config import ZK_DIGEST_USERNAME_ENV

        store: MetadataStore = KazooMetadataStore(
            args.zookeeper, -1, digest=zk_digest(ZK_DIGEST_USERNAME_ENV in os.environ))
    elif args.log_dir is not None:
        from logstore.controller.local import METADATA_FILE, LocalMetadataStore

        path = args.log_dir / METADATA_FILE
        if not path.is_file() and not getattr(args, "init", False):
            raise ConfigError(
                f"{args.log_dir} holds no {METADATA_FILE}: it is not the log directory of an "
                "embedded broker that has run (of several log_dirs, the one holding that "
                "file); for a broker not yet started, add its first users with --init")
        store = LocalMetadataStore(path, -1, exclusive=True)
    else:
        return None
    store.start()
    return store


def _cmd_add(args: argparse.Namespace) -> int:
    from logstore.client.admin import UserScramCredentialUpsertion
    from logstore.security.scram import new_credential

    password = _password(args.name)
    store = _direct_store(args)
    if store is None:
        with closing(admin(args)) as client:
            client.alter_user_scram_credentials([UserScramCredentialUpsertion(
                args.name, password, args.mechanism, args.iterations)])
    else:
        try:
            store.put_scram_credential(args.name, new_credential(args.mechanism, password,
                                                                 args.iterations))
        finally:
            store.close()
    print(f"user {args.name!r}: {args.mechanism} credential set ({args.iterations} iterations)")
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    from logstore.client.admin import UserScramCredentialDeletion
    from logstore.errors import ResourceNotFoundError

    store = _direct_store(args)
    if store is None:
        with closing(admin(args)) as client:
            client.alter_user_scram_credentials(
                deletions=[UserScramCredentialDeletion(args.name, args.mechanism)])
    else:
        try:
            if not store.delete_scram_credential(args.name, args.mechanism):
                raise ResourceNotFoundError(f"user {args.name!r} has no {args.mechanism} "
                                            "credential")
        finally:
            store.close()
    print(f"user {args.name!r}: {args.mechanism} credential deleted")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    store = _direct_store(args)
    if store is None:
        with closing(admin(args)) as client:
            users = client.describe_user_scram_credentials()
    else:
        try:
            users = {u: {m: c.iterations for m, c in creds.items()}
                     for u, creds in store.scram_credentials().items()}
        finally:
            store.close()
    for user, creds in sorted(users.items()):
        described = ", ".join(f"{m} (iterations={i})" for m, i in sorted(creds.items()))
        print(f"{user}\t{described}")
    return 0
