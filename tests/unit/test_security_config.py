"""Security settings as parsed: the broker's keys (listener, TLS files, SASL mechanisms,
authorizer), the clients' kafka-python names and the Spark options (Spark's Kafka connector
names); secrets never in repr() nor in an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from datasource.security_options import SecurityOptionError, parse_security
from logstore.config import broker_config_from_dict
from logstore.errors import ConfigError
from logstore.security.config import PLAINTEXT, ClientSecurity, client_security

SECRET = "s3cret-Pa55"


@pytest.fixture
def pem(tmp_path: Path) -> str:
    path = tmp_path / "x.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")
    return str(path)


def test_broker_security_keys_parse_and_default_to_plaintext(pem: str) -> None:
    """Goal: the flat keys land in BrokerConfig.security; plaintext is the default; PLAIN is
    not offered on sasl_plaintext unless allowed. Method: parse three configs."""
    assert broker_config_from_dict({}).security.listener_security == "plaintext"
    c = broker_config_from_dict({"listener_security": "sasl_tls", "ssl_certfile": pem,
                                 "ssl_keyfile": pem, "authorizer_enable": True,
                                 "super_users": ["User:admin"]}).security
    assert c.tls and c.sasl and c.authorizer_enable and c.mechanisms[-1] == "PLAIN"
    plain = broker_config_from_dict({"listener_security": "sasl_plaintext"}).security
    assert "PLAIN" not in plain.mechanisms


@pytest.mark.parametrize(("settings", "message"), [
    ({"listener_security": "ssl"}, "listener_security must be one of"),
    ({"listener_security": "tls"}, "needs ssl_certfile"),
    ({"listener_security": "tls", "ssl_certfile": "/nope", "ssl_keyfile": "/nope"},
     "ssl_certfile '/nope' is not a readable file"),
    ({"ssl_client_auth": "required"}, "needs a TLS listener"),
    ({"listener_security": "sasl_plaintext", "sasl_enabled_mechanisms": ["PLAIN"]},
     "sasl_plain_allow_plaintext"),
    ({"sasl_enabled_mechanisms": ["GSSAPI"]}, "not among"),
    ({"super_users": ["admin"]}, "User:<name>"),
    ({"authorizer_enable": "yes"}, "must be bool"),
])
def test_bad_broker_security_is_refused_naming_the_key(settings: dict[str, object],
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        broker_config_from_dict(settings, "broker.toml")


def test_client_settings_take_kafka_python_and_dotted_names_and_hide_the_password() -> None:
    """Goal: kafka-python's names and Kafka's dotted ones; an unknown key is named; the
    password is in no repr. Method: parse, repr, and mistakes."""
    s = client_security({"security.protocol": "sasl_ssl", "sasl_plain_username": "alice",
                         "sasl_plain_password": SECRET, "ssl_check_hostname": "false"})
    assert s.security_protocol == "SASL_SSL" and not s.ssl_check_hostname and s.tls and s.sasl
    assert SECRET not in repr(s) and SECRET not in str(s.__class__)
    with pytest.raises(ConfigError, match="unknown setting 'sasl_password'"):
        client_security({"sasl_password": SECRET})
    with pytest.raises(ConfigError, match="needs sasl_plain_username") as e:
        ClientSecurity(security_protocol="SASL_SSL", sasl_plain_password=SECRET)
    assert SECRET not in str(e.value)


def test_spark_options_mirror_the_kafka_connector(pem: str) -> None:
    """Goal: Spark's Kafka connector option names give the same ClientSecurity; a JKS store is
    refused; a jaas config without a password is refused without echoing it."""
    assert parse_security({}) is PLAINTEXT
    s = parse_security({
        "kafka.security.protocol": "SASL_SSL", "kafka.ssl.truststore.location": pem,
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.sasl.mechanism": "scram-sha-256",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                  f'required username="bob" password="{SECRET}";'})
    assert (s.ssl_cafile, s.ssl_check_hostname, s.sasl_mechanism, s.sasl_plain_username,
            s.sasl_plain_password) == (pem, False, "SCRAM-SHA-256", "bob", SECRET)
    with pytest.raises(SecurityOptionError, match="PEM"):
        parse_security({"kafka.ssl.truststore.type": "JKS"})
    with pytest.raises(SecurityOptionError, match="password") as e:
        parse_security({"kafka.security.protocol": "SASL_SSL",
                        "kafka.sasl.jaas.config": f'x required username="{SECRET}";'})
    assert SECRET not in str(e.value)
