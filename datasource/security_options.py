"""The source's and sink's security options, named as Spark's Kafka connector names them
(``kafka.``-prefixed Kafka client settings), turned into the clients' ``ClientSecurity``.

Owns: the option table below, its parsing, and errors naming the option (never its value, which
may be a password). Must not: import pyspark or talk to a broker.

| option                                       | meaning                                      |
|----------------------------------------------|----------------------------------------------|
| ``kafka.security.protocol``                  | PLAINTEXT (default), SSL, SASL_PLAINTEXT,    |
|                                              | SASL_SSL                                     |
| ``kafka.ssl.truststore.location``            | PEM file of the CA(s) that sign the brokers  |
| ``kafka.ssl.truststore.type``                | PEM (the only type taken)                    |
| ``kafka.ssl.keystore.location``              | PEM file with the client's certificate chain |
|                                              | and private key (mutual TLS)                 |
| ``kafka.ssl.keystore.type``                  | PEM (the only type taken)                    |
| ``kafka.ssl.endpoint.identification.algorithm`` | ``https`` (default): check the broker's name; |
|                                              | empty: verify its certificate, not its name  |
| ``kafka.sasl.mechanism``                     | SCRAM-SHA-256, SCRAM-SHA-512 (default), PLAIN|
| ``kafka.sasl.jaas.config``                   | ``<LoginModule> required username="..."      |
|                                              | password="...";`` (Scram- or PlainLoginModule)|
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from logstore.errors import LogstoreError
from logstore.security.config import PLAINTEXT, ClientSecurity, client_security

SECURITY_OPTIONS = ("kafka.security.protocol", "kafka.ssl.truststore.location",
                    "kafka.ssl.truststore.type", "kafka.ssl.keystore.location",
                    "kafka.ssl.keystore.type", "kafka.ssl.endpoint.identification.algorithm",
                    "kafka.sasl.mechanism", "kafka.sasl.jaas.config")
_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class SecurityOptionError(LogstoreError, ValueError):
    """A bad security option; the message names the option, not its value."""


def parse_security(opts: Mapping[str, str]) -> ClientSecurity:
    """``ClientSecurity`` from lower-cased options (PLAINTEXT when none is given)."""
    get = opts.get
    if not any(key in opts for key in SECURITY_OPTIONS):
        return PLAINTEXT
    for kind in ("truststore", "keystore"):
        store_type = get(f"kafka.ssl.{kind}.type", "PEM").strip().upper()
        if store_type != "PEM":
            raise SecurityOptionError(f"kafka.ssl.{kind}.type must be PEM (JKS and PKCS12 "
                                      f"stores are not read), got {store_type!r}")
    settings: dict[str, object] = {
        "security_protocol": get("kafka.security.protocol", "PLAINTEXT").strip().upper(),
        "ssl_cafile": get("kafka.ssl.truststore.location"),
        "ssl_certfile": get("kafka.ssl.keystore.location"),
        "ssl_keyfile": get("kafka.ssl.keystore.location"),
        "ssl_check_hostname": get("kafka.ssl.endpoint.identification.algorithm",
                                  "https").strip() != ""}
    if "kafka.sasl.mechanism" in opts:
        settings["sasl_mechanism"] = opts["kafka.sasl.mechanism"].strip().upper()
    if "kafka.sasl.jaas.config" in opts:
        fields = dict(_JAAS_FIELD.findall(opts["kafka.sasl.jaas.config"]))
        if "username" not in fields or "password" not in fields:
            raise SecurityOptionError('kafka.sasl.jaas.config needs username="..." and '
                                      'password="..."')
        settings["sasl_plain_username"] = fields["username"]
        settings["sasl_plain_password"] = fields["password"].replace('\\"', '"')
    try:
        return client_security({k: v for k, v in settings.items() if v is not None},
                               "format('logstore') security options")
    except ValueError as e:
        raise SecurityOptionError(str(e)) from None
