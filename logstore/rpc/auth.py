"""The server side of TLS and authentication on Arrow Flight: the one place that builds the
Flight server's security options, and that says who is calling.

Why SASL rides on Flight's Handshake call (a ``ServerAuthHandler``) rather than on headers with
server middleware: the handshake is one bidirectional stream, so SCRAM's two round trips are one
call, and Flight itself (C++) calls ``is_valid`` on the token of every later call of every kind
(DoAction, DoPut, DoGet, ListActions, ...) before any Python handler runs: a call without a live
session cannot reach a handler, whatever a handler forgets. Middleware would see only headers
and the method (not the action name), so the handshake's own messages would need a hole that
every handler must then respect. The token is 32 random bytes, sent once by the server over
TLS, kept by the client for its connection and sent with each call; the server keeps only its
SHA-256, with the session's user and the credential it authenticated with. A session ends when
it idles for ``SESSION_IDLE_S``, when the broker restarts (the client then authenticates again),
and at the next call after its user's credential is deleted or replaced.

Mutual TLS: with no auth handler installed, Flight fills ``ServerCallContext.peer_identity()``
from gRPC's verified peer: the first subjectAltName of the client certificate, or its subject
CN when it has none (Flight exposes nothing else of the certificate). The principal is
``User:<that identity>``, so client certificates should carry their user name as CN and no
subjectAltName. With an auth handler installed (SASL listeners) Flight replaces the identity
by the handler's, so there the principal is the SASL user's, as in Kafka's SASL_SSL; a client
certificate, when required, only authenticates the connection. Nothing a client sends in a
header is ever taken as its identity.

``ssl_client_auth = requested`` is refused at config load: Flight's server takes only
``verify_client`` (gRPC's REQUEST_AND_REQUIRE_..._AND_VERIFY or DONT_REQUEST), so "ask but do
not require" cannot be offered.

Must not: decide what a principal may do (``security/authorizer.py``) or log a secret.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from logstore.clock import Clock, SystemClock
from logstore.errors import (
    ApiError,
    IllegalSaslStateError,
    InvalidRequestError,
    SaslAuthenticationFailedError,
)
from logstore.messages import decode_message, encode
from logstore.messages.security import SaslAuthenticate, SaslSession
from logstore.security.acl import ANONYMOUS, USER_TYPE
from logstore.security.config import SecurityConfig
from logstore.security.sasl import CredentialLookup, server_exchange
from logstore.security.scram import ScramCredential

log = logging.getLogger(__name__)

SESSION_IDLE_S = 3600.0
MAX_SESSIONS = 100_000
TOKEN_BYTES = 32


@dataclass(slots=True)
class Session:
    id: str
    principal: str
    user: str
    mechanism: str  # the SASL mechanism it authenticated with
    credential: str  # the stored credential's mechanism (PLAIN checks a SCRAM credential)
    stored_key: bytes
    last_used: float


def flight_error(error: ApiError) -> flight.FlightServerError:
    """Errors raised in an auth handler lose Flight's extra_info on the way; the code travels
    as the message's ``[NAME]`` prefix, which ``codec.from_flight_error`` reads back."""
    return flight.FlightServerError(str(error))


class Sessions:
    """The live SASL sessions of one broker, by the SHA-256 of their tokens."""

    def __init__(self, credentials: CredentialLookup, clock: Clock | None = None) -> None:
        self._credentials = credentials
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._by_hash: dict[bytes, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._swept = self._now()

    def _now(self) -> float:
        return self._clock.monotonic_ms() / 1000.0

    def open(self, user: str, mechanism: str, credential: ScramCredential) -> bytes:
        token = secrets.token_bytes(TOKEN_BYTES)
        digest = hashlib.sha256(token).digest()
        session = Session(digest.hex()[:32], f"{USER_TYPE}:{user}", user, mechanism,
                          credential.mechanism, credential.stored_key, self._now())
        with self._lock:
            self._sweep(session.last_used)
            self._by_hash[digest] = session
            self._by_id[session.id] = session
        return token

    def validate(self, token: bytes) -> Session:
        """The live session of ``token``: ILLEGAL_SASL_STATE if there is none (never
        authenticated, expired, or the broker restarted), SASL_AUTHENTICATION_FAILED if its
        user's credential was deleted or replaced since."""
        session = self._by_hash.get(hashlib.sha256(token).digest()) if token else None
        return self.check(session)

    def check(self, session: Session | None) -> Session:
        if session is None:
            raise IllegalSaslStateError("no authenticated SASL session on this broker for "
                                        "the call; authenticate first")
        now = self._now()
        if now - session.last_used > SESSION_IDLE_S:  # the sweep runs only on open
            self._drop(session)
            raise IllegalSaslStateError(
                f"the SASL session of {session.principal} expired after more than "
                f"{SESSION_IDLE_S:.0f} s idle; authenticate again")
        current = self._credentials(session.user).get(session.credential)
        if current is None or not secrets.compare_digest(current.stored_key,
                                                          session.stored_key):
            self._drop(session)
            raise SaslAuthenticationFailedError(
                f"authentication failed using SASL mechanism {session.mechanism}")
        session.last_used = now
        return session

    def by_id(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def _drop(self, session: Session) -> None:
        with self._lock:
            self._by_id.pop(session.id, None)
            self._by_hash = {d: s for d, s in self._by_hash.items() if s is not session}

    def _sweep(self, now: float) -> None:
        """Drop idle sessions (at most once a minute), and the oldest beyond the limit."""
        if now - self._swept < 60.0 and len(self._by_hash) < MAX_SESSIONS:
            return
        self._swept = now
        live = sorted(((d, s) for d, s in self._by_hash.items()
                       if now - s.last_used <= SESSION_IDLE_S), key=lambda i: i[1].last_used)
        self._by_hash = dict(live[-(MAX_SESSIONS - 1):])
        self._by_id = {s.id: s for s in self._by_hash.values()}


class SaslServerAuthHandler(flight.ServerAuthHandler):  # type: ignore[misc]  # untyped
    """SASL on Flight's Handshake: ``SaslAuthenticate`` (mechanism + first message), the
    mechanism's challenges and responses, then ``SaslSession`` with the token."""

    def __init__(self, mechanisms: tuple[str, ...], credentials: CredentialLookup,
                 sessions: Sessions) -> None:
        super().__init__()
        self._mechanisms = mechanisms
        self._credentials = credentials
        self._sessions = sessions
        self._decoy = secrets.token_bytes(32)

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        try:
            first = decode_message(SaslAuthenticate, incoming.read(), "SASL handshake")
            exchange = server_exchange(first.mechanism, self._mechanisms, self._credentials,
                                       self._decoy)
            outgoing.write(exchange.step(first.auth_bytes))
            while exchange.user is None:
                outgoing.write(exchange.step(incoming.read()))
            assert exchange.credential is not None
            token = self._sessions.open(exchange.user, exchange.mechanism, exchange.credential)
            outgoing.write(encode(SaslSession(token=token, principal=f"User:{exchange.user}")))
        except ApiError as e:
            log.info("SASL authentication refused: %s", e.message)
            raise flight_error(e) from None
        except (flight.FlightError, OSError):
            raise flight_error(SaslAuthenticationFailedError(
                "the SASL handshake ended before it completed")) from None
        except Exception as e:  # boundary: no traceback (or secret) for an unknown client
            log.error("SASL authentication failed unexpectedly (%s)", type(e).__name__)
            raise flight_error(SaslAuthenticationFailedError(
                "SASL authentication failed")) from None

    def is_valid(self, token: bytes) -> bytes:
        try:
            return self._sessions.validate(token).id.encode()
        except ApiError as e:
            raise flight_error(e) from None


class ServerSecurity:
    """One listener's security: the Flight server's options, and each call's principal."""

    def __init__(self, config: SecurityConfig, credentials: CredentialLookup) -> None:
        self.config = config
        self.sessions = Sessions(credentials)
        self._credentials = credentials

    def location(self, listener: str) -> str:
        return f"grpc+tls://{listener}" if self.config.tls else f"grpc://{listener}"

    def flight_options(self) -> dict[str, Any]:
        """The keyword arguments of ``FlightServerBase.__init__`` beyond the location."""
        c = self.config
        options: dict[str, Any] = {}
        if c.tls:
            assert c.ssl_certfile is not None and c.ssl_keyfile is not None
            options["tls_certificates"] = [flight.CertKeyPair(
                Path(c.ssl_certfile).read_bytes(), Path(c.ssl_keyfile).read_bytes())]
            if c.ssl_client_auth == "required":
                assert c.ssl_cafile is not None
                options["verify_client"] = True
                options["root_certificates"] = Path(c.ssl_cafile).read_bytes()
        if c.sasl:
            options["auth_handler"] = SaslServerAuthHandler(c.mechanisms, self._credentials,
                                                            self.sessions)
        return options

    def principal(self, context: Any) -> tuple[str, str]:
        """(principal, host) of a call: the SASL session's user, the verified certificate's
        identity, or ANONYMOUS."""
        name, host = _identity(context), peer_host(context.peer())
        if self.config.sasl:
            return self.sessions.check(self.sessions.by_id(name)).principal, host
        return (f"{USER_TYPE}:{name}" if name else ANONYMOUS), host

    def check_session(self, context: Any) -> None:
        """Between the batches of a long stream: its session must still be valid."""
        if self.config.sasl:
            self.sessions.check(self.sessions.by_id(_identity(context)))


def _identity(context: Any) -> str:
    identity = context.peer_identity()
    return identity.decode() if isinstance(identity, bytes) else str(identity or "")


def peer_host(peer: str | bytes) -> str:
    """The address in gRPC's peer string (``ipv4:127.0.0.1:5123``, ``ipv6:[::1]:5123``)."""
    text = peer.decode() if isinstance(peer, bytes) else peer
    _, _, rest = text.partition(":")
    if rest.startswith("["):
        return rest[1:rest.index("]")]
    host, _, _ = rest.rpartition(":")
    if not host:
        raise InvalidRequestError(f"unreadable peer address {text!r}")
    return host
