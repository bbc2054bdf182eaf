"""zk_set_acl on a real ZooKeeper: the znodes LogStore writes can be changed only by the
brokers' digest identity (from the environment), and users' credentials cannot even be read
by anyone else; a user written with ``logstore users add --zookeeper`` under the same identity
is picked up by the running broker."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError

from logstore import Admin, NewTopic
from logstore.security.config import ZK_DIGEST_PASSWORD_ENV, ZK_DIGEST_USERNAME_ENV
from tests.brokers import BrokerFactory
from tests.security import add_user, password
from tests.zookeeper import zk_client


def test_only_brokers_change_cluster_state_and_credentials_are_hidden(
        broker_factory: BrokerFactory, zk_connect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Goal: with zk_set_acl a ZooKeeper client without the brokers' digest can read topics
    but not change, create or delete anything, and cannot read a user's credential. Method: a
    cluster-mode broker with zk_set_acl; the admin creates a topic, a user is added straight
    into ZooKeeper; an unauthenticated kazoo client tries to write, create, delete, read."""
    monkeypatch.setenv(ZK_DIGEST_USERNAME_ENV, "logstore-brokers")
    monkeypatch.setenv(ZK_DIGEST_PASSWORD_ENV, password("zk"))
    broker = broker_factory(zk_connect=zk_connect, zk_set_acl=True,
                            zk_session_timeout_ms=6000)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("guarded", 1)])
    add_user("alice", password("alice"), "--zookeeper", zk_connect)
    with zk_client(zk_connect) as anyone:
        data, _ = anyone.get("/brokers/topics/guarded")
        assert b"guarded" in data
        for attempt in (lambda: anyone.set("/brokers/topics/guarded", b"{}"),
                        lambda: anyone.create("/brokers/topics/evil", b"{}"),
                        lambda: anyone.delete("/brokers/topics/guarded/partitions/0/state"),
                        lambda: anyone.create("/controller", b"{}", ephemeral=True),
                        lambda: anyone.set("/controller_epoch", b"{}"),
                        lambda: anyone.get("/config/users/alice"),
                        lambda: anyone.create("/config/users/mallory", b"{}")):
            with pytest.raises(NoAuthError):
                attempt()
    with Admin(broker.bootstrap) as admin:
        assert "alice" in admin.describe_user_scram_credentials()
        admin.delete_topics(["guarded"])
        assert admin.list_topics() == []
