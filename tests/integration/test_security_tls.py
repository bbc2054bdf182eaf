"""TLS listeners on real broker processes, with certificates the tests make: who is refused
(no CA, wrong hostname, expired certificates, no client certificate where one is required, a
plaintext client), and mutual TLS's principal (the certificate's CN) as the ACLs see it."""

from __future__ import annotations

import pytest

from logstore import Admin, NewTopic
from logstore.errors import ConfigError, NetworkError, TopicAuthorizationFailedError
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    Permission,
    ResourcePattern,
    ResourceType,
)
from tests.brokers import BrokerFactory
from tests.certs import Pki, broker_tls_settings

TIMEOUT_MS = 5000


def refused(bootstrap: str, **settings: object) -> str:
    """The error text of a client that cannot get an answer from the broker."""
    with pytest.raises(NetworkError) as e, Admin(bootstrap, request_timeout_ms=TIMEOUT_MS,
                                                 **settings) as admin:
        admin.list_topics()
    return e.value.message


def test_tls_listener_refuses_clients_without_the_ca_and_plaintext_clients(
        broker_factory: BrokerFactory) -> None:
    """Goal: a TLS listener talks only to clients that verified it. Method: one broker with a
    certificate of the tests' CA; a client trusting the system CAs only, a client trusting
    another CA, and a plaintext client are all refused; one with the CA is answered."""
    pki = Pki(broker_factory.root / "pki")
    broker = broker_factory(**broker_tls_settings(pki, pki.broker()))
    other = Pki(broker_factory.root / "other", "other-ca")
    assert "certificate verify failed" in refused(broker.bootstrap, security_protocol="SSL")
    assert "certificate verify failed" in refused(broker.bootstrap, security_protocol="SSL",
                                                  ssl_cafile=other.cafile)
    refused(broker.bootstrap)
    with Admin(broker.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile) as admin:
        assert admin.list_topics() == []


def test_wrong_hostname_is_refused_unless_hostname_checks_are_off(
        broker_factory: BrokerFactory) -> None:
    """Goal: a broker certificate for another name is refused; ssl_check_hostname=False still
    verifies its chain. Method: the broker serves a certificate for elsewhere.example; the
    client with the CA is refused, then accepted with ssl_check_hostname=False, while a
    client without the CA stays refused even so."""
    pki = Pki(broker_factory.root / "pki")
    broker = broker_factory(**broker_tls_settings(pki, pki.wrong_host()))
    assert "not in peer certificate" in refused(broker.bootstrap, security_protocol="SSL",
                                                ssl_cafile=pki.cafile)
    with Admin(broker.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile,
               ssl_check_hostname=False) as admin:
        assert admin.list_topics() == []
    other = Pki(broker_factory.root / "other", "other-ca")
    refused(broker.bootstrap, security_protocol="SSL", ssl_cafile=other.cafile,
            ssl_check_hostname=False)


def test_expired_certificates_are_refused_on_both_sides(broker_factory: BrokerFactory) -> None:
    """Goal: expiry counts. Method: a broker with an expired certificate is refused by its
    clients; a mutual-TLS broker refuses a client whose certificate expired, and answers one
    whose certificate is valid."""
    pki = Pki(broker_factory.root / "pki")
    stale = broker_factory(**broker_tls_settings(pki, pki.expired()))
    assert "certificate" in refused(stale.bootstrap, security_protocol="SSL",
                                    ssl_cafile=pki.cafile)
    mutual = broker_factory(**broker_tls_settings(pki, pki.broker(), ssl_client_auth="required"))
    old = pki.expired("alice")
    refused(mutual.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile,
            ssl_certfile=old.certfile, ssl_keyfile=old.keyfile)
    refused(mutual.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile)  # no cert at all
    good = pki.client("alice")
    with Admin(mutual.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile,
               ssl_certfile=good.certfile, ssl_keyfile=good.keyfile) as admin:
        assert admin.list_topics() == []


def test_mutual_tls_principal_is_the_certificate_cn(broker_factory: BrokerFactory) -> None:
    """Goal: with ssl_client_auth=required the principal is User:<subject CN> and the ACLs
    judge it; a certificate of another CA is refused. Method: an authorizing broker with
    super user User:admin (by certificate); admin creates a topic and lets User:alice WRITE
    (so also DESCRIBE) it; alice sees it and may not delete it; bob sees nothing."""
    pki = Pki(broker_factory.root / "pki")
    broker = broker_factory(**broker_tls_settings(
        pki, pki.broker(), ssl_client_auth="required", authorizer_enable=True,
        super_users=["User:admin"]))

    def as_user(user: str, ca: Pki = pki) -> Admin:
        cert = ca.client(user)
        return Admin(broker.bootstrap, security_protocol="SSL", ssl_cafile=pki.cafile,
                     ssl_certfile=cert.certfile, ssl_keyfile=cert.keyfile,
                     request_timeout_ms=TIMEOUT_MS)

    with as_user("admin") as admin:
        admin.create_topics([NewTopic("orders", 1)])
        admin.create_acls([AclBinding(ResourcePattern(ResourceType.TOPIC, "orders"),
                                      AccessControlEntry("User:alice", "*", Operation.WRITE,
                                                         Permission.ALLOW))])
    with as_user("alice") as alice:
        assert alice.list_topics() == ["orders"]
        with pytest.raises(TopicAuthorizationFailedError, match="User:alice .* DELETE"):
            alice.delete_topics(["orders"])
    with as_user("bob") as bob:
        assert bob.list_topics() == []
    other = Pki(broker_factory.root / "other", "other-ca")
    with pytest.raises(NetworkError), as_user("admin", other) as forged:
        forged.list_topics()


def test_requested_client_auth_is_refused_with_the_reason(broker_factory: BrokerFactory
                                                          ) -> None:
    """Goal: ssl_client_auth='requested' is refused at load, saying why (Flight's server cannot
    ask for a certificate without requiring it). Method: parse such a config."""
    from logstore.config import broker_config_from_dict

    pki = Pki(broker_factory.root / "pki")
    with pytest.raises(ConfigError, match="verify_client"):
        broker_config_from_dict(broker_tls_settings(pki, pki.broker(),
                                                    ssl_client_auth="requested"))
