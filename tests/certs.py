"""Certificates made by the tests, with ``cryptography`` (never committed): a CA, broker
certificates for 127.0.0.1/localhost, client certificates whose CN is the user, an expired one,
one for the wrong host, and one signed by another CA.

``Pki(root)`` writes PEM files under ``root`` and returns their paths; keys are P-256 (fast to
make). ``ClientFiles``/``broker_files`` are what a broker TOML or a client's settings name.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertFiles:
    certfile: str
    keyfile: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


class Pki:
    """A CA under ``root`` that issues certificates as files."""

    def __init__(self, root: Path, name: str = "logstore-test-ca") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (x509.CertificateBuilder().subject_name(_name(name))
                      .issuer_name(_name(name)).public_key(self._key.public_key())
                      .serial_number(x509.random_serial_number())
                      .not_valid_before(now - DAY).not_valid_after(now + 30 * DAY)
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                      .sign(self._key, hashes.SHA256()))
        self.cafile = str(self._write(f"{name}.pem", self._cert.public_bytes(
            serialization.Encoding.PEM)))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(self, cn: str, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (),
              valid_days: tuple[int, int] = (-1, 30)) -> CertFiles:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(_name(cn))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now + valid_days[0] * DAY)
                   .not_valid_after(now + valid_days[1] * DAY))
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = f"{cn}-{x509.random_serial_number() % 10**8}"
        certfile = self._write(f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM))
        keyfile = self._write(f"{stem}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return CertFiles(str(certfile), str(keyfile))

    def broker(self, cn: str = "broker") -> CertFiles:
        """A broker certificate for 127.0.0.1 and localhost. Its first subjectAltName is its
        CN: a broker presents it to the others too, and gRPC names a peer by its first SAN
        (rpc/auth.py), so the brokers' principal is ``User:<cn>``."""
        return self.issue(cn, dns=(cn, "localhost"), ips=("127.0.0.1",))

    def client(self, user: str) -> CertFiles:
        """A client certificate whose subject CN is the user (no subjectAltName)."""
        return self.issue(user)

    def expired(self, cn: str = "expired") -> CertFiles:
        return self.issue(cn, dns=("localhost",), ips=("127.0.0.1",), valid_days=(-30, -1))

    def wrong_host(self) -> CertFiles:
        return self.issue("elsewhere", dns=("elsewhere.example",))


def broker_tls_settings(pki: Pki, cert: CertFiles, **more: object) -> dict[str, object]:
    """Broker TOML settings of a TLS listener with ``cert`` and ``pki``'s CA."""
    return {"listener_security": "tls", "ssl_certfile": cert.certfile,
            "ssl_keyfile": cert.keyfile, "ssl_cafile": pki.cafile, **more}
