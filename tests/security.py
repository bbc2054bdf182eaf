"""Helpers of the security tests: secure brokers, users made with the ``logstore users`` command,
and clients' settings.

``SecureBrokers`` starts brokers (real processes, tests/brokers.py) on a TLS, SASL_SSL or
SASL_PLAINTEXT listener with the authorizer on and ``User:admin`` as super user, whose SCRAM
credential is written into the broker's log directory before it starts (``logstore users add
--log-dir``, as an operator bootstraps a broker). Passwords are random per run, so the secrets
test can look for them in every output.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from logstore import Admin
from tests.brokers import REPO_ROOT, BrokerFactory, BrokerProcess, subprocess_env
from tests.certs import CertFiles, Pki

ADMIN = "admin"
SCRAM = "SCRAM-SHA-256"
CLI_TIMEOUT_S = 60


def password(user: str) -> str:
    return f"{user}-{secrets.token_urlsafe(12)}"


def logstore_cli(*args: str, stdin: str = "", check: bool = True
                 ) -> subprocess.CompletedProcess[str]:
    """``python -m logstore ARGS`` with ``stdin``; the completed process (output captured)."""
    result = subprocess.run([sys.executable, "-m", "logstore", *args], input=stdin,
                            capture_output=True, text=True, env=subprocess_env(),
                            cwd=REPO_ROOT, timeout=CLI_TIMEOUT_S, check=False)
    if check:
        assert result.returncode == 0, f"logstore {' '.join(args)}: {result.stderr}"
    return result


def add_user(user: str, secret: str, *where: str, mechanism: str = SCRAM
             ) -> subprocess.CompletedProcess[str]:
    """``logstore users add USER --mechanism M WHERE...`` with the password on stdin."""
    return logstore_cli("users", "add", user, "--mechanism", mechanism, *where,
                        stdin=secret + "\n")


def cluster_security(kind: str, root: Path, zk_connect: str, monkeypatch: Any
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(every broker's settings, the admin's client settings) of a cluster whose brokers
    authenticate to each other as User:broker: by certificate (``tls``, mutual) or by SCRAM
    with the password in the environment (``sasl_tls``); the authorizer is on."""
    if kind == "plaintext":
        return {}, {}
    pki = Pki(root / "pki")
    cert = pki.broker("broker")
    settings: dict[str, Any] = {
        "listener_security": kind, "ssl_certfile": cert.certfile, "ssl_keyfile": cert.keyfile,
        "ssl_cafile": pki.cafile, "authorizer_enable": True,
        "super_users": ["User:broker", f"User:{ADMIN}"]}
    client: dict[str, Any] = {"ssl_cafile": pki.cafile}
    if kind == "tls":
        admin_cert = pki.client(ADMIN)
        settings["ssl_client_auth"] = "required"
        client.update(security_protocol="SSL", ssl_certfile=admin_cert.certfile,
                      ssl_keyfile=admin_cert.keyfile)
    else:
        from logstore.security.config import INTER_BROKER_PASSWORD_ENV

        broker_password, admin_password = password("broker"), password(ADMIN)
        monkeypatch.setenv(INTER_BROKER_PASSWORD_ENV, broker_password)
        add_user("broker", broker_password, "--zookeeper", zk_connect,
                 mechanism="SCRAM-SHA-512")
        add_user(ADMIN, admin_password, "--zookeeper", zk_connect)
        settings["inter_broker_sasl_username"] = "broker"
        client.update(security_protocol="SASL_SSL", sasl_mechanism=SCRAM,
                      sasl_plain_username=ADMIN, sasl_plain_password=admin_password)
    return settings, client


class SecureBrokers:
    """Brokers of one security kind, and the client settings to reach them."""

    def __init__(self, factory: BrokerFactory, kind: str = "sasl_tls",
                 **settings: Any) -> None:
        self.factory = factory
        self.kind = kind
        self.pki = Pki(factory.root / "pki")
        self.broker_cert = self.pki.broker()
        self.admin_password = password(ADMIN)
        self.passwords: dict[str, str] = {ADMIN: self.admin_password}
        self.settings = {"listener_security": kind, "authorizer_enable": True,
                         "super_users": [f"User:{ADMIN}"], **settings}
        if kind in ("tls", "sasl_tls"):
            self.settings.update(ssl_certfile=self.broker_cert.certfile,
                                 ssl_keyfile=self.broker_cert.keyfile,
                                 ssl_cafile=self.pki.cafile)

    def start(self, broker_id: int = 0, **settings: Any) -> BrokerProcess:
        if self.kind.startswith("sasl"):
            add_user(ADMIN, self.admin_password, "--init", "--log-dir",
                     str(self.factory.root / f"broker-{broker_id}"))
        return self.factory(broker_id, **{**self.settings, **settings})

    def client(self, user: str | None = ADMIN, secret: str | None = None,
               mechanism: str = SCRAM, cert: CertFiles | None = None,
               **more: Any) -> dict[str, Any]:
        """Client settings for ``user`` (None: no credentials)."""
        tls = self.kind in ("tls", "sasl_tls")
        sasl = self.kind.startswith("sasl") and user is not None
        protocol = {(False, False): "PLAINTEXT", (True, False): "SSL",
                    (False, True): "SASL_PLAINTEXT", (True, True): "SASL_SSL"}[(tls, sasl)]
        out: dict[str, Any] = {"security_protocol": protocol}
        if tls:
            out["ssl_cafile"] = self.pki.cafile
        if cert is not None:
            out.update(ssl_certfile=cert.certfile, ssl_keyfile=cert.keyfile)
        if sasl:
            assert user is not None
            out.update(sasl_mechanism=mechanism, sasl_plain_username=user,
                       sasl_plain_password=secret or self.passwords[user])
        return {**out, **more}

    def admin(self, bootstrap: str) -> Admin:
        return Admin(bootstrap, **self.client())

    def add_user(self, bootstrap: str, user: str, mechanism: str = SCRAM) -> str:
        """A new user with a random password, through the broker (as the admin)."""
        from logstore.client.admin import UserScramCredentialUpsertion

        secret = self.passwords.setdefault(user, password(user))
        with self.admin(bootstrap) as admin:
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                user, secret, mechanism, 4096)])
        return secret

    def command_config(self, user: str = ADMIN) -> Path:
        """A --command-config file for ``user`` (readable by its owner only)."""
        path = self.factory.root / f"{user}-client.toml"
        lines = [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {str(v).lower()}"
                 for k, v in self.client(user).items()]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path
