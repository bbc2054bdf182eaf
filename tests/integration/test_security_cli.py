"""``logstore acls`` and ``logstore users`` against a real SASL_SSL broker, as an operator runs
them: Kafka's flags, the cross product ``acls add`` makes, filters for ``list`` and
``remove``, each change taking effect on the next request, and the embedded bootstrap path
refused while the broker runs."""

from __future__ import annotations

import pytest

from logstore import Admin, NewTopic
from logstore.errors import TopicAuthorizationFailedError
from tests.brokers import BrokerFactory
from tests.security import SecureBrokers, logstore_cli, password


def test_acls_command_adds_lists_and_removes_with_kafkas_flags(broker_factory: BrokerFactory
                                                               ) -> None:
    """Goal: ``acls add`` makes one binding per (principal, host, operation, resource),
    ``list`` and ``remove`` filter, and alice's rights follow at once. Method: an embedded
    SASL_SSL broker; the admin adds READ and WRITE on two topics for alice plus a prefixed
    DESCRIBE for bob, lists them by topic and by principal, removes alice's WRITE."""
    brokers = SecureBrokers(broker_factory, "sasl_tls")
    broker = brokers.start()
    brokers.add_user(broker.bootstrap, "alice")
    where = ["--bootstrap-server", broker.bootstrap, "--command-config",
             str(brokers.command_config())]
    logstore_cli("topics", "create", "orders", "--partitions", "1", *where)
    added = logstore_cli("acls", "add", "--allow-principal", "User:alice", "--operation",
                         "read", "--operation", "WRITE", "--topic", "orders", "--topic",
                         "payments", *where)
    assert "added 4 binding(s)" in added.stdout
    logstore_cli("acls", "add", "--allow-principal", "User:bob", "--allow-host", "127.0.0.1",
                 "--operation", "DESCRIBE", "--topic", "ord", "--resource-pattern-type",
                 "prefixed", *where)
    listed = logstore_cli("acls", "list", "--topic", "orders", *where).stdout.splitlines()
    assert listed == ["TOPIC\torders\tLITERAL\tALLOW\tUser:alice\t*\tREAD",
                      "TOPIC\torders\tLITERAL\tALLOW\tUser:alice\t*\tWRITE"]
    matching = logstore_cli("acls", "list", "--topic", "orders", "--resource-pattern-type",
                            "match", *where).stdout
    assert "User:bob\t127.0.0.1\tDESCRIBE" in matching
    with Admin(broker.bootstrap, **brokers.client("alice")) as alice:
        assert alice.list_topics() == ["orders"]
        removed = logstore_cli("acls", "remove", "--principal", "User:alice", "--operation",
                               "WRITE", *where)
        assert "removed 2 binding(s)" in removed.stdout
        with pytest.raises(TopicAuthorizationFailedError, match="CREATE"):
            alice.create_topics([NewTopic("orders-2", 1)])
        assert alice.list_topics() == ["orders"]  # READ still implies DESCRIBE
    everything = logstore_cli("acls", "remove", *where, check=False)
    assert everything.returncode == 1 and "never removes every binding" in everything.stderr


def test_users_bootstrap_into_a_running_brokers_log_dir_is_refused(
        broker_factory: BrokerFactory) -> None:
    """Goal: the offline path (``--log-dir``) cannot race a running broker's own writes.
    Method: start a broker, then ``users add --log-dir`` its directory: exit 1, naming the
    way through the broker."""
    brokers = SecureBrokers(broker_factory, "sasl_tls")
    broker = brokers.start()
    out = logstore_cli("users", "add", "late", "--log-dir", str(broker.log_dir),
                       stdin=password("late") + "\n", check=False)
    assert out.returncode == 1 and "in use by a running broker" in out.stderr
