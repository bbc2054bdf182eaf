"""SCRAM credentials and the SASL exchanges, both sides in one process: RFC 7677's test vector,
good and bad passwords, unknown users that look like known ones, replayed messages, PLAIN,
and that no secret shows in repr() or in an error; idle sessions expire."""

from __future__ import annotations

import base64

import pytest

from logstore.clock import FakeClock
from logstore.errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from logstore.rpc import auth
from logstore.security.sasl import client_exchange, server_exchange
from logstore.security.scram import (
    PLAIN,
    SASL_MECHANISMS,
    SCRAM_MECHANISMS,
    SCRAM_SHA_256,
    ScramCredential,
    new_credential,
)

PASSWORD = "pencil-Zeta-93"


def run(mechanism: str, user: str, password: str, users: dict[str, dict[str, ScramCredential]]
        ) -> str | None:
    """One whole exchange; the authenticated user (the server's view)."""
    server = server_exchange(mechanism, SASL_MECHANISMS, lambda u: users.get(u, {}), b"decoy")
    client = client_exchange(mechanism, user, password)
    message: bytes | None = client.first()
    while message is not None:
        challenge = server.step(message)
        message = client.step(challenge)
    assert client.done
    return server.user


def test_stored_key_matches_rfc_7677_test_vector() -> None:
    """Goal: the credential derivation is RFC 7677's. Method: its example (user, pencil,
    salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations) gives its StoredKey and ServerKey, which
    are what verifies its ClientProof."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    c = new_credential(SCRAM_SHA_256, "pencil", 4096, salt)
    assert base64.b64encode(c.server_key) == b"wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
    assert ScramCredential.from_text(SCRAM_SHA_256, c.to_text()) == c


@pytest.mark.parametrize("mechanism", [*SCRAM_MECHANISMS, PLAIN])
def test_good_password_authenticates_and_bad_or_unknown_fail_alike(mechanism: str) -> None:
    """Goal: the right password authenticates; a wrong one and an unknown user fail with the
    same SASL_AUTHENTICATION_FAILED message naming only the mechanism."""
    stored = SCRAM_MECHANISMS[-1] if mechanism == PLAIN else mechanism
    users = {"alice": {stored: new_credential(stored, PASSWORD)}}
    assert run(mechanism, "alice", PASSWORD, users) == "alice"
    messages = set()
    for user, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        with pytest.raises(SaslAuthenticationFailedError) as e:
            run(mechanism, user, password, users)
        messages.add(e.value.message)
    assert messages == {f"authentication failed using SASL mechanism {mechanism}"}


def test_a_password_saslprep_refuses_fails_plain_like_a_wrong_one() -> None:
    """Goal: a PLAIN password with a character SASLprep forbids (a control character, a
    mixed-direction string) fails as a wrong password does, not with an unknown error and
    scramp's reason; a new credential with one is refused without quoting it. Method: the
    exchange, both sides in this process, for a known and an unknown user."""
    users = {"alice": {SCRAM_MECHANISMS[-1]: new_credential(SCRAM_MECHANISMS[-1], PASSWORD)}}
    for user, password in (("alice", "Secret\x07Pw-XYZZY"), ("mallory", "\u0627abc-XYZZY")):
        with pytest.raises(SaslAuthenticationFailedError) as e:
            run(PLAIN, user, password, users)
        assert e.value.message == f"authentication failed using SASL mechanism {PLAIN}"
    with pytest.raises(UnacceptableCredentialError, match="SASLprep") as refused:
        new_credential(SCRAM_SHA_256, "Secret\x07Pw-XYZZY")
    assert "XYZZY" not in str(refused.value)


def test_replayed_client_final_is_refused() -> None:
    """Goal: a captured exchange cannot be replayed (SCRAM nonces). Method: record a good
    exchange's client messages, then send them to a fresh server exchange, whose nonce
    differs."""
    users = {"alice": {SCRAM_SHA_256: new_credential(SCRAM_SHA_256, PASSWORD)}}
    lookup = users.get
    server = server_exchange(SCRAM_SHA_256, SASL_MECHANISMS, lambda u: lookup(u) or {}, b"d")
    client = client_exchange(SCRAM_SHA_256, "alice", PASSWORD)
    first = client.first()
    final = client.step(server.step(first))
    assert final is not None
    client.step(server.step(final))
    replay = server_exchange(SCRAM_SHA_256, SASL_MECHANISMS, lambda u: lookup(u) or {}, b"d")
    replay.step(first)
    with pytest.raises(SaslAuthenticationFailedError):
        replay.step(final)
    assert replay.user is None


def test_unknown_user_gets_the_same_salt_every_time() -> None:
    """Goal: the decoy salt of an unknown user is stable, so asking twice does not reveal that
    the user does not exist (a real user's salt is stable too)."""
    def salt_of(user: str) -> bytes:
        server = server_exchange(SCRAM_SHA_256, SASL_MECHANISMS, lambda u: {}, b"decoy")
        first = server.step(client_exchange(SCRAM_SHA_256, user, "x").first()).decode()
        return dict(p.split("=", 1) for p in first.split(","))["s"].encode()
    assert salt_of("ghost") == salt_of("ghost") != salt_of("other")


def test_disabled_mechanism_is_unsupported_and_secrets_stay_out_of_repr() -> None:
    """Goal: a mechanism the listener does not enable is UNSUPPORTED_SASL_MECHANISM; a
    credential's repr shows no key material."""
    with pytest.raises(UnsupportedSaslMechanismError, match="enabled: SCRAM-SHA-512"):
        server_exchange(PLAIN, ("SCRAM-SHA-512",), lambda u: {}, b"d")
    c = new_credential(SCRAM_SHA_256, PASSWORD)
    text = repr(c)
    assert "iterations=8192" in text
    for secret in (c.salt, c.stored_key, c.server_key):
        assert repr(secret) not in text and base64.b64encode(secret).decode() not in text


def test_an_idle_session_expires_on_its_next_use_not_only_on_a_sweep() -> None:
    """Goal: a SASL session unused for longer than SESSION_IDLE_S is refused when next used
    (ILLEGAL_SASL_STATE: the client authenticates again), though no new session was opened
    meanwhile (the sweep of idle sessions runs only when one opens); a session in use stays."""
    cred = new_credential("SCRAM-SHA-256", "pw", 4096)
    clock = FakeClock()
    sessions = auth.Sessions(lambda user: {"SCRAM-SHA-256": cred} if user == "alice" else {},
                             clock)
    busy = sessions.open("alice", "SCRAM-SHA-256", cred)
    idle = sessions.open("alice", "SCRAM-SHA-256", cred)
    for _ in range(3):  # busy is used every half idle period, for 1.5 idle periods
        clock.advance(int(auth.SESSION_IDLE_S * 500))
        assert sessions.validate(busy).user == "alice"
    with pytest.raises(IllegalSaslStateError, match="User:alice.*idle"):
        sessions.validate(idle)
    with pytest.raises(IllegalSaslStateError, match="no authenticated SASL session"):
        sessions.validate(idle)  # dropped
    clock.advance(int(auth.SESSION_IDLE_S * 1000) + 1)
    with pytest.raises(IllegalSaslStateError):
        sessions.validate(busy)
