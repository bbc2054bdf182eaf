"""What the ``logstore`` commands share: argument types, the ``--bootstrap-server`` and
``--command-config`` options and the admin client they name.

Owns: parsing ``KEY=VALUE``, ``--acks`` and non-negative integers (a bad one is a usage error,
exit 2), the bootstrap default (``$LOGSTORE_BOOTSTRAP``, else ``127.0.0.1:9092``), and the
client settings file of ``--command-config`` (TOML with kafka-python's names, as Kafka's tools
take a properties file: ``security_protocol``, ``ssl_cafile``, ``sasl_plain_password``...;
keep it readable by its owner only). Must not: import the clients at import time (``logstore
broker start`` does not load them), or print a setting's value.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logstore.errors import ConfigError

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
    parser.add_argument("--command-config", metavar="FILE", type=Path,
                        help="a TOML file of client settings (security_protocol, ssl_cafile, "
                             "ssl_certfile, ssl_keyfile, ssl_check_hostname, sasl_mechanism, "
                             "sasl_plain_username, sasl_plain_password)")


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--command-config`` (validated), as client keyword arguments."""
    path: Path | None = getattr(args, "command_config", None)
    if path is None:
        return {}
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--command-config {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--command-config {path}: not valid TOML: {e}") from None
    from logstore.security.config import client_security

    return client_security(raw, f"--command-config {path}").settings()


def admin(args: argparse.Namespace) -> Admin:
    from logstore import Admin

    return Admin(bootstrap_servers=args.bootstrap_server, **client_settings(args))


def describe_topic(args: argparse.Namespace, name: str) -> TopicDescription:
    with closing(admin(args)) as client:
        (topic,) = client.describe_topics([name])
    return topic
