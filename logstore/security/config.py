"""Security settings: the broker's listener, authentication and authorization keys, and the
clients' connection settings.

Owns: ``SecurityConfig`` (the broker's keys, read from its TOML file by ``config.py``) and
``ClientSecurity`` (kafka-python's names: ``security_protocol``, ``ssl_*``, ``sasl_*``), their
validation with errors naming the key, and where secrets come from: never from ``conf/``. A
broker's inter-broker SASL password and its ZooKeeper digest credentials come from the
environment (names below); a client's password is a constructor argument (or the CLI's
``--command-config`` file, which the operator keeps private). Secrets never appear in
``repr()``. Must not: read files or the environment at import time, or open connections.

| broker key                     | values (default first)                                          |
|--------------------------------|-----------------------------------------------------------------|
| listener_security              | plaintext, tls, sasl_plaintext, sasl_tls (Kafka's PLAINTEXT,   |
|                                | SSL, SASL_PLAINTEXT, SASL_SSL)                                  |
| ssl_certfile / ssl_keyfile     | PEM files of the broker's certificate chain and key (tls, sasl_tls)|
| ssl_cafile                     | PEM CA bundle: verifies client certificates (mutual TLS) and, as |
|                                | a client, the other brokers                                     |
| ssl_client_auth                | none, required (``requested`` cannot be offered: Flight's server |
|                                | either does not ask for a certificate or requires a valid one)  |
| sasl_enabled_mechanisms        | SCRAM-SHA-256, SCRAM-SHA-512, PLAIN (PLAIN only with TLS, unless |
|                                | sasl_plain_allow_plaintext = true)                             |
| inter_broker_sasl_mechanism    | SCRAM-SHA-512; the user is inter_broker_sasl_username, the      |
|                                | password $LOGSTORE_INTER_BROKER_SASL_PASSWORD                   |
| authorizer_enable              | false; true judges every request by the ACLs                    |
| super_users                    | principals that bypass the ACLs (the brokers, the first admin)  |
| allow_everyone_if_no_acl_found | false                                                           |
| zk_set_acl                     | false; true gives the znodes LogStore writes ZooKeeper ACLs     |
|                                | (digest $LOGSTORE_ZK_DIGEST_USERNAME / _PASSWORD)               |
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError
from logstore.security.acl import check_principal
from logstore.security.scram import PLAIN, SASL_MECHANISMS, SCRAM_MECHANISMS, SCRAM_SHA_512

LISTENER_SECURITY = ("plaintext", "tls", "sasl_plaintext", "sasl_tls")
CLIENT_AUTH = ("none", "required")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
PROTOCOL_OF_LISTENER = dict(zip(LISTENER_SECURITY, PROTOCOLS, strict=True))
INTER_BROKER_PASSWORD_ENV = "LOGSTORE_INTER_BROKER_SASL_PASSWORD"
ZK_DIGEST_USERNAME_ENV = "LOGSTORE_ZK_DIGEST_USERNAME"
ZK_DIGEST_PASSWORD_ENV = "LOGSTORE_ZK_DIGEST_PASSWORD"
REQUESTED_EXPLAINED = (
    "ssl_client_auth = 'requested' cannot be offered: Arrow Flight's server (gRPC) either "
    "does not ask for a client certificate (verify_client=False) or requires a valid one "
    "(verify_client=True), nothing in between; use 'none' or 'required'")


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityConfig:
    listener_security: str = "plaintext"
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cafile: str | None = None
    ssl_client_auth: str = "none"
    sasl_enabled_mechanisms: tuple[str, ...] = SASL_MECHANISMS
    sasl_plain_allow_plaintext: bool = False
    inter_broker_sasl_mechanism: str = SCRAM_SHA_512
    inter_broker_sasl_username: str | None = None
    authorizer_enable: bool = False
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False
    zk_set_acl: bool = False

    @property
    def tls(self) -> bool:
        return self.listener_security in ("tls", "sasl_tls")

    @property
    def sasl(self) -> bool:
        return self.listener_security.startswith("sasl_")

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms this listener offers (PLAIN only where it may be)."""
        if self.tls or self.sasl_plain_allow_plaintext:
            return self.sasl_enabled_mechanisms
        return tuple(m for m in self.sasl_enabled_mechanisms if m != PLAIN)

    def inter_broker_client(self, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """How this broker connects to the others: its listener's protocol, with its own
        certificate and key, and (SASL) its own user, whose password is in the environment."""
        env = os.environ if environ is None else environ
        password = None
        if self.sasl:
            password = env.get(INTER_BROKER_PASSWORD_ENV)
            if not password or not self.inter_broker_sasl_username:
                raise ConfigError(
                    f"listener_security = {self.listener_security!r} needs "
                    f"inter_broker_sasl_username in the config and the password in "
                    f"${INTER_BROKER_PASSWORD_ENV}, for the brokers to reach each other")
        return ClientSecurity(
            security_protocol=PROTOCOL_OF_LISTENER[self.listener_security],
            ssl_cafile=self.ssl_cafile, ssl_certfile=self.ssl_certfile,
            ssl_keyfile=self.ssl_keyfile, sasl_mechanism=self.inter_broker_sasl_mechanism,
            sasl_plain_username=self.inter_broker_sasl_username, sasl_plain_password=password)


SECURITY_TYPES: dict[str, tuple[type, ...]] = {
    "listener_security": (str,), "ssl_certfile": (str,), "ssl_keyfile": (str,),
    "ssl_cafile": (str,), "ssl_client_auth": (str,), "sasl_enabled_mechanisms": (list,),
    "sasl_plain_allow_plaintext": (bool,), "inter_broker_sasl_mechanism": (str,),
    "inter_broker_sasl_username": (str,), "authorizer_enable": (bool,),
    "super_users": (list,), "allow_everyone_if_no_acl_found": (bool,), "zk_set_acl": (bool,),
}


def security_config_from_dict(values: dict[str, Any], source: str) -> SecurityConfig:
    """The security keys of a broker file (already type-checked by ``config.py``)."""
    for key in ("sasl_enabled_mechanisms", "super_users"):
        if key in values:
            values[key] = tuple(str(v) for v in values[key])
    config = SecurityConfig(**values)
    _check_listener(config, source)
    _check_sasl(config, source, explicit="sasl_enabled_mechanisms" in values)
    for principal in config.super_users:
        try:
            check_principal(principal, "super_users")
        except Exception as e:
            raise ConfigError(f"{source}: {e}") from None
    return config


def _check_listener(c: SecurityConfig, source: str) -> None:
    if c.listener_security not in LISTENER_SECURITY:
        raise ConfigError(f"{source}: listener_security must be one of {LISTENER_SECURITY}, "
                          f"got {c.listener_security!r}")
    if c.ssl_client_auth == "requested":
        raise ConfigError(f"{source}: {REQUESTED_EXPLAINED}")
    if c.ssl_client_auth not in CLIENT_AUTH:
        raise ConfigError(f"{source}: ssl_client_auth must be one of {CLIENT_AUTH}, "
                          f"got {c.ssl_client_auth!r}")
    if c.tls:
        for key in ("ssl_certfile", "ssl_keyfile"):
            _check_file(getattr(c, key), key, c.listener_security, source)
    if c.ssl_client_auth == "required":
        if not c.tls:
            raise ConfigError(f"{source}: ssl_client_auth = 'required' needs a TLS listener "
                              f"(tls or sasl_tls), not {c.listener_security!r}")
        _check_file(c.ssl_cafile, "ssl_cafile", "ssl_client_auth = 'required'", source)
    elif c.ssl_cafile is not None:
        _check_file(c.ssl_cafile, "ssl_cafile", "ssl_cafile", source)


def _check_file(path: str | None, key: str, needed_by: str, source: str) -> None:
    if path is None:
        raise ConfigError(f"{source}: {needed_by} needs {key}")
    if not Path(path).is_file():
        raise ConfigError(f"{source}: {key} {path!r} is not a readable file")


def _check_sasl(c: SecurityConfig, source: str, explicit: bool) -> None:
    unknown = [m for m in c.sasl_enabled_mechanisms if m not in SASL_MECHANISMS]
    if unknown:
        raise ConfigError(f"{source}: sasl_enabled_mechanisms {unknown} not among "
                          f"{list(SASL_MECHANISMS)}")
    if c.inter_broker_sasl_mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"{source}: inter_broker_sasl_mechanism must be one of "
                          f"{list(SASL_MECHANISMS)}")
    if explicit and c.sasl and not c.tls and PLAIN in c.sasl_enabled_mechanisms and \
            not c.sasl_plain_allow_plaintext:
        raise ConfigError(
            f"{source}: PLAIN sends passwords as they are; on listener_security = "
            "'sasl_plaintext' it needs sasl_plain_allow_plaintext = true (or use SCRAM, or "
            "sasl_tls)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSecurity:
    """How a client connects (kafka-python's names). ``ssl_check_hostname`` False still
    verifies the broker's certificate against ``ssl_cafile``, only not its name."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str = SCRAM_SHA_512
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise ConfigError(f"security_protocol must be one of {PROTOCOLS}, "
                              f"got {self.security_protocol!r}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl_certfile and ssl_keyfile go together (mutual TLS)")
        if self.sasl:
            if self.sasl_mechanism not in (*SCRAM_MECHANISMS, PLAIN):
                raise ConfigError(f"sasl_mechanism must be one of {list(SASL_MECHANISMS)}, "
                                  f"got {self.sasl_mechanism!r}")
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise ConfigError(f"security_protocol {self.security_protocol} needs "
                                  "sasl_plain_username and sasl_plain_password")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def settings(self) -> dict[str, Any]:
        """These settings as client keyword arguments (``Producer(..., **settings())``)."""
        return {key: getattr(self, key) for key in CLIENT_KEYS}

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")


PLAINTEXT = ClientSecurity()
CLIENT_KEYS = ("security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
               "ssl_check_hostname", "sasl_mechanism", "sasl_plain_username",
               "sasl_plain_password")


def settings_of(constructor: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword settings ``constructor`` takes by name (for the hint of an unknown one)."""
    return tuple(name for name, p in inspect.signature(constructor).parameters.items()
                 if p.kind == inspect.Parameter.KEYWORD_ONLY)


def client_security(settings: Mapping[str, Any], source: str = "client settings",
                    parameters: Sequence[str] = ()) -> ClientSecurity:
    """``ClientSecurity`` from kafka-python-named settings (Kafka's dotted spelling of the same
    names too: ``security.protocol``); an unknown key is an error naming it and ``source``,
    the closest known names, and every setting ``source`` takes (``parameters``, its own,
    and the security keys)."""
    values: dict[str, Any] = {}
    for key, value in settings.items():
        name = key.replace(".", "_").replace("-", "_").lower()
        if name not in CLIENT_KEYS:
            known = [*parameters, *CLIENT_KEYS]
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ConfigError(f"{source}: unknown setting {key!r}; {hint}known settings: "
                              f"{', '.join(known)}")
        values[name] = value
    if isinstance(values.get("ssl_check_hostname"), str):
        values["ssl_check_hostname"] = values["ssl_check_hostname"].strip().lower() != "false"
    if "security_protocol" in values:
        values["security_protocol"] = str(values["security_protocol"]).upper()
    try:
        return ClientSecurity(**values)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
