"""SCRAM credentials (RFC 5802, with SHA-256/SHA-512 per RFC 7677), as the broker stores them.

Owns: ``ScramCredential`` (mechanism, salt, StoredKey, ServerKey, iterations: never the password
nor the SaltedPassword, which would let its holder authenticate) with Kafka's text form
(``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=N``), deriving one from a password or
from a salted password (the admin client sends a salted password, as Kafka's
AlterUserScramCredentials does, so the password itself never crosses the wire), and checking a
PLAIN password against a stored credential in constant time. The keys never appear in
``repr()``. Must not: do I/O, or run the SASL exchanges (``sasl.py`` does).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from scramp.utils import ScramException, saslprep

from logstore.errors import UnacceptableCredentialError

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
PLAIN = "PLAIN"
HASHES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
SCRAM_MECHANISMS = tuple(HASHES)
SASL_MECHANISMS = (*SCRAM_MECHANISMS, PLAIN)
# Kafka's bounds on the iteration count; 8192 is what its documentation uses.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192
SALT_BYTES = 32


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def to_text(self) -> str:
        """Kafka's form of a SCRAM credential in ZooKeeper."""
        b64 = base64.b64encode
        return (f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
                f"server_key={b64(self.server_key).decode()},iterations={self.iterations}")

    @classmethod
    def from_text(cls, mechanism: str, text: str) -> ScramCredential:
        fields = dict(part.split("=", 1) for part in text.split(","))
        b64 = base64.b64decode
        return cls(mechanism, b64(fields["salt"]), b64(fields["stored_key"]),
                   b64(fields["server_key"]), int(fields["iterations"]))


def check_mechanism(mechanism: str) -> str:
    if mechanism not in HASHES:
        raise UnacceptableCredentialError(
            f"mechanism {mechanism!r} is not a SCRAM mechanism ({', '.join(SCRAM_MECHANISMS)})")
    return mechanism


def check_iterations(mechanism: str, iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise UnacceptableCredentialError(
            f"{mechanism}: iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, "
            f"got {iterations}")
    return iterations


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    try:
        normalized = saslprep(password).encode("utf-8")
    except ScramException:  # its message may quote the password: not passed on
        raise UnacceptableCredentialError(
            f"{mechanism}: the password holds characters SASLprep (RFC 4013) forbids") from None
    return hashlib.pbkdf2_hmac(HASHES[mechanism], normalized, salt, iterations)


def from_salted_password(mechanism: str, salt: bytes, salted: bytes, iterations: int
                         ) -> ScramCredential:
    """StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword,
    "Server Key")."""
    check_iterations(check_mechanism(mechanism), iterations)
    digest = HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return ScramCredential(mechanism, salt, hashlib.new(digest, client_key).digest(),
                           hmac.new(salted, b"Server Key", digest).digest(), iterations)


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_BYTES)


def new_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                   salt: bytes | None = None) -> ScramCredential:
    check_iterations(check_mechanism(mechanism), iterations)
    salt = new_salt() if salt is None else salt
    return from_salted_password(mechanism, salt, salted_password(mechanism, password, salt,
                                                                 iterations), iterations)


def plain_password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` derives ``credential``'s StoredKey (compared in constant time); a
    password SASLprep refuses derives nothing, so it matches no credential."""
    try:
        derived = new_credential(credential.mechanism, password, credential.iterations,
                                 credential.salt)
    except UnacceptableCredentialError:
        return False
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def decoy_credential(secret: bytes, mechanism: str, user: str) -> ScramCredential:
    """A credential no password matches, the same for the same user on every attempt: an
    unknown user gets a salt and an iteration count like a real one, and fails at the proof
    (RFC 5802 §5.1), so the exchange does not say which users exist (while the real users
    keep the default iteration count: the decoy's is that default)."""
    digest = HASHES[mechanism]
    key = hmac.new(secret, f"{mechanism}:{user}".encode(), digest).digest()
    return ScramCredential(mechanism, key[:SALT_BYTES], hashlib.new(digest, key).digest(),
                           hashlib.new(digest, key + b"server").digest(), DEFAULT_ITERATIONS)
