"""SASL on real broker processes: SCRAM-SHA-256/512 and PLAIN with good and bad passwords,
unknown users, PLAIN on a plaintext listener, users added, changed and deleted while clients
are connected (no restart), a replayed handshake, a broker restart, and the users command."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

from logstore import Admin, NewTopic, Producer
from logstore.client.admin import UserScramCredentialDeletion, UserScramCredentialUpsertion
from logstore.errors import (
    ClusterAuthorizationFailedError,
    IllegalSaslStateError,
    NetworkError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from logstore.messages import decode_message, encode
from logstore.messages.security import SaslAuthenticate, SaslSession
from logstore.rpc.codec import from_flight_error
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.sasl import client_exchange
from tests.brokers import BrokerFactory, BrokerProcess
from tests.security import ADMIN, SecureBrokers, add_user, logstore_cli, password


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureBrokers,
                                                                        BrokerProcess]]:
    """One SASL_SSL broker for the module (tests use their own users)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("sasl"))
    brokers = SecureBrokers(factory, "sasl_tls")
    broker = brokers.start()
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("shared", 1)])
    yield brokers, broker
    factory.stop_all()


def admin_as(brokers: SecureBrokers, broker: BrokerProcess, user: str | None,
             secret: str | None = None, **settings: Any) -> Admin:
    return Admin(broker.bootstrap, request_timeout_ms=10_000,
                 **brokers.client(user, secret, **settings))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_good_password_authenticates_bad_one_and_unknown_user_fail_alike(
        secure: tuple[SecureBrokers, BrokerProcess], mechanism: str) -> None:
    """Goal: each mechanism lets the right password in and refuses a wrong one and an unknown
    user with the same SASL_AUTHENTICATION_FAILED, which names the mechanism and no reason.
    Method: a user with a credential of the mechanism (PLAIN checks the SCRAM credential)."""
    brokers, broker = secure
    user = f"u-{mechanism.lower()}"
    stored = "SCRAM-SHA-512" if mechanism == "PLAIN" else mechanism
    brokers.add_user(broker.bootstrap, user, stored)
    with admin_as(brokers, broker, user, mechanism=mechanism) as admin:
        admin.list_topics()
    messages = set()
    for who, secret in ((user, "wrong"), ("nobody", brokers.passwords[user])):
        with pytest.raises(SaslAuthenticationFailedError) as e, admin_as(
                brokers, broker, who, secret, mechanism=mechanism) as admin:
            admin.list_topics()
        messages.add(e.value.message.split(": ", 1)[1])
    assert messages == {f"authentication failed using SASL mechanism {mechanism}"}


def test_no_credentials_get_no_answer(secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: on a SASL listener nothing is answered before authentication. Method: a TLS
    client without SASL asks for metadata: ILLEGAL_SASL_STATE."""
    brokers, broker = secure
    with pytest.raises(IllegalSaslStateError), admin_as(brokers, broker, None) as admin:
        admin.list_topics()


def test_deleted_user_is_refused_at_its_next_request(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: deleting a user takes effect on its open connections, without a restart.
    Method: alice's client works; the admin deletes her credential; her very next request
    fails with SASL_AUTHENTICATION_FAILED, and so does a new connection."""
    brokers, broker = secure
    brokers.add_user(broker.bootstrap, "alice")
    with admin_as(brokers, broker, "alice") as alice:
        alice.list_topics()
        with brokers.admin(broker.bootstrap) as admin:
            admin.alter_user_scram_credentials(deletions=[UserScramCredentialDeletion("alice")])
        with pytest.raises(SaslAuthenticationFailedError):
            alice.list_topics()
    with pytest.raises(SaslAuthenticationFailedError), admin_as(brokers, broker,
                                                                "alice") as again:
        again.list_topics()


def test_changed_password_ends_old_sessions_and_the_new_one_works(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: a new password applies at once: old sessions end, the old password fails, the
    new one works. Method: replace carol's credential while her client is connected."""
    brokers, broker = secure
    old = brokers.add_user(broker.bootstrap, "carol")
    new = password("carol")
    with admin_as(brokers, broker, "carol") as carol:
        carol.list_topics()
        with brokers.admin(broker.bootstrap) as admin:
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "carol", new, iterations=4096)])
        with pytest.raises(SaslAuthenticationFailedError):
            carol.list_topics()
    with pytest.raises(SaslAuthenticationFailedError), admin_as(brokers, broker, "carol",
                                                                old) as stale:
        stale.list_topics()
    with admin_as(brokers, broker, "carol", new) as fresh:
        fresh.list_topics()


class _Recording(flight.ClientAuthHandler):  # type: ignore[misc]
    """A client handler that sends ``script`` (or a real exchange, recorded into it)."""

    def __init__(self, script: list[bytes], user: str = "", secret: str = "") -> None:
        super().__init__()
        self.script, self.user, self.secret, self.token = script, user, secret, b""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        if self.script:  # replay: send what was captured, whatever the server says
            for message in self.script:
                outgoing.write(message)
                incoming.read()
            self.token = decode_message(SaslSession, incoming.read(), "session").token
            return
        exchange = client_exchange("SCRAM-SHA-256", self.user, self.secret)
        message: bytes | None = encode(SaslAuthenticate(mechanism="SCRAM-SHA-256",
                                                        auth_bytes=exchange.first()))
        while message is not None:
            self.script.append(message)
            outgoing.write(message)
            message = exchange.step(incoming.read())
        self.token = decode_message(SaslSession, incoming.read(), "session").token

    def get_token(self) -> bytes:
        return self.token


def test_replayed_handshake_is_refused(secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: a captured SCRAM handshake is worthless (the server's nonce is new each time).
    Method: record the client's messages of a successful handshake on a raw Flight client,
    then send the same bytes on a new connection: SASL_AUTHENTICATION_FAILED."""
    brokers, broker = secure
    secret = brokers.add_user(broker.bootstrap, "dave")
    location = f"grpc+tls://{broker.bootstrap}"
    ca = Path(brokers.pki.cafile).read_bytes()
    recorded = _Recording([], "dave", secret)
    with flight.connect(location, tls_root_certs=ca) as client:
        client.authenticate(recorded)
    assert len(recorded.script) == 2
    with flight.connect(location, tls_root_certs=ca) as client, pytest.raises(
            flight.FlightError) as e:
        client.authenticate(_Recording(list(recorded.script)))
    assert isinstance(from_flight_error(e.value, "replay"), SaslAuthenticationFailedError)


def test_plain_is_not_offered_on_a_plaintext_listener_unless_allowed(
        broker_factory: BrokerFactory) -> None:
    """Goal: PLAIN sends the password as it is, so a SASL_PLAINTEXT listener offers it only
    with sasl_plain_allow_plaintext; SCRAM works there. Method: two sasl_plaintext brokers."""
    for allow in (False, True):
        brokers = SecureBrokers(broker_factory, "sasl_plaintext",
                                sasl_plain_allow_plaintext=allow)
        broker = brokers.start(int(allow))
        with admin_as(brokers, broker, ADMIN) as admin:
            admin.list_topics()
        with admin_as(brokers, broker, ADMIN, mechanism="PLAIN") as plain:
            if allow:
                plain.list_topics()
            else:
                with pytest.raises(UnsupportedSaslMechanismError, match="not enabled"):
                    plain.list_topics()


def test_clients_authenticate_again_after_a_broker_restart(broker_factory: BrokerFactory
                                                           ) -> None:
    """Goal: sessions die with the broker, clients do not: a client whose broker restarted
    authenticates again by itself. Method: the same Admin before and after a restart."""
    brokers = SecureBrokers(broker_factory, "sasl_tls")
    broker = brokers.start()
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("before", 1)])
        broker.restart()
        assert admin.list_topics() == ["before"]


def test_users_command_adds_lists_and_deletes_without_printing_the_password(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: ``logstore users`` through a broker, with --command-config. Method: add erin with
    SCRAM-SHA-512 (password on stdin), list, authenticate as her, delete; no output carries
    the password."""
    brokers, broker = secure
    where = ["--bootstrap-server", broker.bootstrap, "--command-config",
             str(brokers.command_config())]
    secret = password("erin")
    outputs = [add_user("erin", secret, *where, mechanism="SCRAM-SHA-512")]
    outputs.append(logstore_cli("users", "list", *where))
    assert "erin\tSCRAM-SHA-512 (iterations=8192)" in outputs[-1].stdout
    with admin_as(brokers, broker, "erin", secret, mechanism="SCRAM-SHA-512") as erin:
        erin.list_topics()
    outputs.append(logstore_cli("users", "delete", "erin", "--mechanism", "SCRAM-SHA-512",
                                *where))
    outputs.append(logstore_cli("users", "delete", "erin", *where, check=False))
    assert outputs[-1].returncode == 1 and "RESOURCE_NOT_FOUND" in outputs[-1].stderr
    for out in outputs:
        assert secret not in out.stdout + out.stderr
        assert brokers.admin_password not in out.stdout + out.stderr


def test_producer_without_rights_fails_fast_with_the_authorization_error(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    """Goal: a producer that may not write fails with the authorization error at once, not
    after delivery_timeout_ms of retries. Method: frank may not even DESCRIBE the topic:
    TOPIC_AUTHORIZATION_FAILED (not "unknown topic"); then he may DESCRIBE it only: an
    idempotent producer fails with CLUSTER_AUTHORIZATION_FAILED (no producer id), a
    non-idempotent one with TOPIC_AUTHORIZATION_FAILED (its produce stream is refused), all
    well inside the 10-minute delivery timeout."""
    brokers, broker = secure
    brokers.add_user(broker.bootstrap, "frank")
    cases = [(None, True, TopicAuthorizationFailedError),
             (Operation.DESCRIBE, True, ClusterAuthorizationFailedError),
             (None, False, TopicAuthorizationFailedError)]
    for grant, idempotent, error in cases:
        if grant is not None:
            with brokers.admin(broker.bootstrap) as admin:
                admin.create_acls([AclBinding(ResourcePattern(ResourceType.TOPIC, "shared"),
                                              AccessControlEntry("User:frank", "*", grant,
                                                                 Permission.ALLOW))])
        with Producer(broker.bootstrap, delivery_timeout_ms=600_000,
                      enable_idempotence=idempotent, **brokers.client("frank")) as producer, \
                pytest.raises(error):
            producer.send("shared", b"x", partition=0).result(30)


def test_sasl_ssl_with_required_client_certificates_takes_the_sasl_principal(
        broker_factory: BrokerFactory) -> None:
    """Goal: on sasl_tls with ssl_client_auth=required the certificate only admits the
    connection and the principal is the SASL user's (as Kafka's SASL_SSL). Method: without a
    client certificate the admin is refused; with a certificate whose CN is 'mallory' the
    admin (a super user by SASL) still creates a topic."""
    brokers = SecureBrokers(broker_factory, "sasl_tls", ssl_client_auth="required")
    broker = brokers.start()
    with pytest.raises(NetworkError), Admin(broker.bootstrap, request_timeout_ms=5000,
                                            **brokers.client()) as admin:
        admin.list_topics()
    cert = brokers.pki.client("mallory")
    with Admin(broker.bootstrap, **brokers.client(cert=cert)) as admin:
        admin.create_topics([NewTopic("by-admin", 1)])
        assert admin.list_topics() == ["by-admin"]
