"""The SASL exchanges, both sides: SCRAM-SHA-256/512 (RFC 5802/7677, through ``scramp``) and
PLAIN (RFC 4616), as message-in, message-out state machines.

Owns: what each side sends and checks at each step, and turning every failure into
SASL_AUTHENTICATION_FAILED naming the mechanism and nothing else (not whether the user exists,
nor which check failed). The server's nonce is fresh per exchange, so a replayed client-final
message proves nothing; the client checks the server's signature, so a broker that does not
hold the user's ServerKey is refused too. Must not: do I/O or know how messages travel (the
Flight handshake carries them: ``logstore/rpc/auth.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from scramp import ScramClient, ScramMechanism

from logstore.errors import SaslAuthenticationFailedError, UnsupportedSaslMechanismError
from logstore.security.scram import (
    HASHES,
    PLAIN,
    SCRAM_MECHANISMS,
    ScramCredential,
    decoy_credential,
    plain_password_matches,
)

# user -> its credentials by mechanism (no entry: unknown user)
CredentialLookup = Callable[[str], dict[str, ScramCredential]]


def failed(mechanism: str) -> SaslAuthenticationFailedError:
    return SaslAuthenticationFailedError(
        f"authentication failed using SASL mechanism {mechanism}")


class ServerExchange(Protocol):
    """One authentication, server side: ``step`` takes the client's next message and returns
    the challenge to send back; once ``user`` is set, authentication succeeded, against
    ``credential`` (a session lives as long as that credential does)."""

    mechanism: str
    user: str | None
    credential: ScramCredential | None

    def step(self, message: bytes) -> bytes: ...


class ClientExchange(Protocol):
    """One authentication, client side: ``first()``, then ``step(challenge)`` until ``done``."""

    mechanism: str
    done: bool

    def first(self) -> bytes: ...

    def step(self, challenge: bytes) -> bytes | None: ...


class ScramServerExchange:
    def __init__(self, mechanism: str, lookup: CredentialLookup, decoy_secret: bytes) -> None:
        self.mechanism = mechanism
        self.user: str | None = None
        self.credential: ScramCredential | None = None
        self._lookup = lookup
        self._secret = decoy_secret
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._steps = 0

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self._candidate = user
        found = self._lookup(user).get(self.mechanism)
        self.credential = found
        c = found or decoy_credential(self._secret, self.mechanism, user)
        return c.salt, c.stored_key, c.server_key, c.iterations

    def step(self, message: bytes) -> bytes:
        self._steps += 1
        try:
            if self._steps == 1:
                self._server.set_client_first(message.decode("utf-8"))
                return str(self._server.get_server_first()).encode("utf-8")
            if self._steps == 2:
                self._server.set_client_final(message.decode("utf-8"))
                final = str(self._server.get_server_final()).encode("utf-8")
                if self.credential is None:  # the decoy cannot match, but be sure
                    raise failed(self.mechanism)
                self.user = self._candidate
                return final
        except SaslAuthenticationFailedError:
            raise
        except Exception:  # scramp's errors say why; the client must not learn it
            raise failed(self.mechanism) from None
        raise failed(self.mechanism)


class PlainServerExchange:
    mechanism = PLAIN

    def __init__(self, lookup: CredentialLookup) -> None:
        self.user: str | None = None
        self.credential: ScramCredential | None = None
        self._lookup = lookup

    def step(self, message: bytes) -> bytes:
        try:
            authzid, user, password = message.decode("utf-8").split("\0")
        except ValueError:
            raise failed(PLAIN) from None
        credentials = self._lookup(user)
        # The strongest stored credential; an unknown user pays the same derivation.
        credential = next((credentials[m] for m in reversed(SCRAM_MECHANISMS)
                           if m in credentials), None)
        checked = credential or decoy_credential(b"plain", SCRAM_MECHANISMS[-1], user)
        matches = plain_password_matches(checked, password)
        if credential is None or not matches or authzid not in ("", user):
            raise failed(PLAIN)
        self.user, self.credential = user, credential
        return b""


def server_exchange(mechanism: str, enabled: tuple[str, ...], lookup: CredentialLookup,
                    decoy_secret: bytes) -> ServerExchange:
    if mechanism not in enabled:
        raise UnsupportedSaslMechanismError(
            f"SASL mechanism {mechanism!r} is not enabled on this listener; enabled: "
            f"{', '.join(enabled)}")
    if mechanism == PLAIN:
        return PlainServerExchange(lookup)
    return ScramServerExchange(mechanism, lookup, decoy_secret)


class ScramClientExchange:
    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.mechanism = mechanism
        self.done = False
        self._client = ScramClient([mechanism], user, password)

    def first(self) -> bytes:
        return str(self._client.get_client_first()).encode("utf-8")

    def step(self, challenge: bytes) -> bytes | None:
        try:
            if self._client.stage is not None and self._client.stage.name == "get_client_first":
                self._client.set_server_first(challenge.decode("utf-8"))
                return str(self._client.get_client_final()).encode("utf-8")
            self._client.set_server_final(challenge.decode("utf-8"))
        except Exception:  # a broker that cannot prove it knows the user's keys
            raise failed(self.mechanism) from None
        self.done = True
        return None


class PlainClientExchange:
    mechanism = PLAIN

    def __init__(self, user: str, password: str) -> None:
        self.done = False
        self._message = f"\0{user}\0{password}".encode()

    def first(self) -> bytes:
        return self._message

    def step(self, challenge: bytes) -> bytes | None:
        self.done = True
        return None


def client_exchange(mechanism: str, user: str, password: str) -> ClientExchange:
    if mechanism == PLAIN:
        return PlainClientExchange(user, password)
    if mechanism not in HASHES:
        raise UnsupportedSaslMechanismError(
            f"SASL mechanism {mechanism!r} is not one of {', '.join((*SCRAM_MECHANISMS, PLAIN))}")
    return ScramClientExchange(mechanism, user, password)
