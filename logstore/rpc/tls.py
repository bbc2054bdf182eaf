"""A client's TLS options for Arrow Flight, from its security settings.

Owns: reading the PEM files a client names (a certificate file and a key file may be one file
holding both, as Kafka's PEM keystores do) and ``ssl_check_hostname = False``. gRPC always
checks the broker's name against its certificate; to verify the certificate chain without the
name, the broker's certificate is first fetched and verified against ``ssl_cafile`` with
Python's ``ssl`` (no name check), and gRPC is then told to expect the name that certificate
carries (``override_hostname``). The chain is thus checked twice and the name never, which is
what the setting means. Must not: build the Flight client (``client.py`` does) or accept a
certificate nobody verified.
"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError, NetworkError
from logstore.security.config import ClientSecurity

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----\s*", re.DOTALL)
CONNECT_TIMEOUT_S = 10.0


def pem_blocks(path: str, kind: str) -> bytes:
    """The PEM blocks of ``path`` whose type ends with ``kind`` (CERTIFICATE, PRIVATE KEY)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    found = b"".join(m.group(0) for m in _PEM_BLOCK.finditer(data)
                     if m.group(1).decode().endswith(kind))
    if not found:
        raise ConfigError(f"{path} holds no PEM {kind}")
    return found


def client_tls_options(address: str, security: ClientSecurity) -> dict[str, Any]:
    """Keyword arguments of ``flight.connect`` for a TLS connection to ``address``."""
    options: dict[str, Any] = {}
    if security.ssl_cafile is not None:
        options["tls_root_certs"] = pem_blocks(security.ssl_cafile, "CERTIFICATE")
    if security.ssl_certfile is not None and security.ssl_keyfile is not None:
        options["cert_chain"] = pem_blocks(security.ssl_certfile, "CERTIFICATE")
        options["private_key"] = pem_blocks(security.ssl_keyfile, "PRIVATE KEY")
    if not security.ssl_check_hostname:
        options["override_hostname"] = verified_server_name(address, security.ssl_cafile)
    return options


def verified_server_name(address: str, cafile: str | None) -> str:
    """A name the broker's certificate carries, from a certificate verified against
    ``cafile`` (or the system's CAs) without checking it against ``address``."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            cert = tls.getpeercert()
    except (OSError, ssl.SSLError) as e:
        raise NetworkError(f"TLS to {address}: {e}") from None
    if not cert:
        raise NetworkError(f"TLS to {address}: the broker sent no certificate")
    fields: dict[str, Any] = dict(cert)
    names = [str(pair[1]) for pair in fields.get("subjectAltName", ())
             if pair[0] in ("DNS", "IP Address")]
    names += [str(pair[1]) for rdn in fields.get("subject", ()) for pair in rdn
              if pair[0] == "commonName"]
    if not names:
        raise NetworkError(f"TLS to {address}: the broker's certificate names nothing")
    return names[0]
