"""Secrets stay secret: a full secure run (a SASL_SSL broker in cluster mode with ACLs, its
inter-broker password and ZooKeeper digest from the environment, users and ACLs made with the
CLI, produce and consume with --command-config, a failed login, the clients in process), then
every broker log, every CLI output and the repr() of every client and config are searched for
every password, salted password, stored and server key and private key used."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest

from datasource.options import parse_read_options
from logstore import Admin, Consumer, Producer, TopicPartition
from logstore.client.admin import UserScramCredentialUpsertion
from logstore.config import load_broker_config
from logstore.controller.zk_paths import decode_user, user_path
from logstore.security.config import (
    INTER_BROKER_PASSWORD_ENV,
    ZK_DIGEST_PASSWORD_ENV,
    ZK_DIGEST_USERNAME_ENV,
    client_security,
)
from tests.brokers import BrokerFactory
from tests.security import ADMIN, SecureBrokers, add_user, logstore_cli, password


def _key_lines(path: str) -> list[str]:
    """The base64 lines of a PEM private key (any one of them in an output is a leak)."""
    return [line for line in Path(path).read_text().splitlines()
            if line and not line.startswith("-----")]


def _stored_keys(zk: str, username: str, secret: str, user: str) -> list[str]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk, auth_data=[("digest", f"{username}:{secret}")])
    client.start(timeout=10)
    try:
        data, _ = client.get(user_path(user))
    finally:
        client.stop()
        client.close()
    return [base64.b64encode(k).decode() for c in decode_user(data).values()
            for k in (c.stored_key, c.server_key)]


def test_no_secret_in_logs_cli_output_or_repr(broker_factory: BrokerFactory, zookeeper: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: passwords and keys appear nowhere but where they are kept. Method: the run the
    module docstring describes; then a search of every text it produced."""
    zk = f"{zookeeper.connect}/secrets-{uuid.uuid4().hex[:8]}"
    secrets = {name: password(name) for name in ("broker", "zk", "alice", "wrong", "erin")}
    monkeypatch.setenv(INTER_BROKER_PASSWORD_ENV, secrets["broker"])
    monkeypatch.setenv(ZK_DIGEST_USERNAME_ENV, "logstore-brokers")
    monkeypatch.setenv(ZK_DIGEST_PASSWORD_ENV, secrets["zk"])
    brokers = SecureBrokers(broker_factory, "sasl_tls", zk_connect=zk, zk_set_acl=True,
                            inter_broker_sasl_username="broker",
                            super_users=["User:admin", "User:broker"])
    secrets["admin"] = brokers.admin_password
    outputs = [add_user("broker", secrets["broker"], "--zookeeper", zk),
               add_user(ADMIN, secrets["admin"], "--zookeeper", zk)]
    broker = broker_factory(1, **brokers.settings)
    where = ["--bootstrap-server", broker.bootstrap, "--command-config",
             str(brokers.command_config())]
    outputs += _cli_run(where, secrets)
    texts = [o.stdout + o.stderr for o in outputs] + _clients(brokers, broker.bootstrap, secrets)
    texts.append(repr(load_broker_config(broker.config_path)))
    texts.append(repr(parse_read_options({
        "bootstrap.servers": broker.bootstrap, "subscribe": "s", "kafka.security.protocol":
        "SASL_SSL", "kafka.sasl.jaas.config": f'x required username="alice" '
        f'password="{secrets["alice"]}";'}, streaming=False)))
    broker.stop()
    texts += [p.read_text() for p in broker_factory.root.glob("*.stderr")]
    leaks = list(secrets.values()) + _key_lines(brokers.broker_cert.keyfile)
    leaks += _stored_keys(zk, "logstore-brokers", secrets["zk"], "alice")
    found = [(secret, text[max(0, text.find(secret) - 80):text.find(secret) + 80])
             for secret in leaks for text in texts if secret in text]
    assert found == []
    assert any("SASL_AUTHENTICATION_FAILED" in t for t in texts)  # the run did fail a login


def _cli_run(where: list[str], secrets: dict[str, str]) -> list[Any]:
    out = [add_user("alice", secrets["alice"], *where),
           logstore_cli("users", "list", *where),
           logstore_cli("topics", "create", "vault", "--partitions", "1", *where),
           logstore_cli("acls", "add", "--allow-principal", "User:alice", "--operation",
                        "READ", "--operation", "WRITE", "--topic", "vault", *where),
           logstore_cli("acls", "list", *where),
           logstore_cli("produce", "vault", *where, stdin="one\ntwo\n"),
           logstore_cli("consume", "vault", "--from-beginning", "--max-messages", "2", *where)]
    assert "one" in out[-1].stdout and "READ" in out[4].stdout
    wrong = Path(where[-1]).with_name("wrong.toml")
    wrong.write_text(Path(where[-1]).read_text().replace(
        secrets["admin"], secrets["wrong"]))
    out.append(logstore_cli("topics", "list", *where[:-1], str(wrong), check=False))
    assert out[-1].returncode == 1
    return out


def _clients(brokers: SecureBrokers, bootstrap: str, secrets: dict[str, str]) -> list[str]:
    """Clients as alice, used, then their repr()s and their settings'."""
    alice = brokers.client("alice", secrets["alice"])
    texts = []
    with Producer(bootstrap, **alice) as producer:
        producer.send("vault", b"three", partition=0).result(10)
        texts.append(repr(producer))
    with Consumer(bootstrap, auto_offset_reset="earliest", **alice) as consumer:
        consumer.assign([TopicPartition("vault", 0)])
        consumer.poll(2000)
        texts.append(repr(consumer))
    with Admin(bootstrap, **brokers.client()) as admin:
        upsert = UserScramCredentialUpsertion("erin", secrets["erin"], iterations=4096)
        admin.alter_user_scram_credentials([upsert])
        texts += [repr(admin), repr(upsert), repr(admin.describe_user_scram_credentials())]
    texts.append(repr(client_security(alice)))
    return texts
