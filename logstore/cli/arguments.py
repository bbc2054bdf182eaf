"""What the ``logstore`` commands share: argument types, the ``--bootstrap-server`` option and
the admin client it names.

Owns: parsing ``KEY=VALUE``, ``--acks`` and non-negative integers (a bad one is a usage error,
exit 2), and the bootstrap default (``$LOGSTORE_BOOTSTRAP``, else ``127.0.0.1:9092``). Must not:
import the clients at import time (``logstore broker start`` does not load them).
"""

from __future__ import annotations

import argparse
import os
from contextlib import closing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logstore.client.admin import Admin, TopicDescription

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "LOGSTORE_BOOTSTRAP"


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def acks(text: str) -> str | int:
    if text == "all" or text == "-1":
        return "all"
    if text in ("0", "1"):
        return int(text)
    raise argparse.ArgumentTypeError(f"acks must be all, 1 or 0, got {text!r}")


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def add_bootstrap(parser: Any) -> None:
    default = os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP)
    parser.add_argument("--bootstrap-server", default=default, metavar="HOST:PORT",
                        help=f"a broker to contact (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP};"
                             f" now {default})")


def admin(args: argparse.Namespace) -> Admin:
    from logstore import Admin

    return Admin(bootstrap_servers=args.bootstrap_server)


def describe_topic(args: argparse.Namespace, name: str) -> TopicDescription:
    with closing(admin(args)) as client:
        (topic,) = client.describe_topics([name])
    return topic
