"""Spark through a SASL_SSL listener with the authorizer on, configured by options only
(``kafka.security.protocol``, ``kafka.ssl.truststore.location``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config``, as Spark's Kafka connector takes them): a batch read (executors
fetching over TLS), a stream, and a write, as a user whose ACLs allow exactly that; a wrong
password fails the query with SASL_AUTHENTICATION_FAILED. The session is the run's one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logstore import NewTopic, Producer
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from tests.brokers import BrokerFactory, BrokerProcess
from tests.security import SecureBrokers

QUERY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureBrokers,
                                                                        BrokerProcess]]:
    """A SASL_SSL broker; user spark may READ and WRITE topics s-* (and so DESCRIBE them)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("spark-sasl"))
    brokers = SecureBrokers(factory, "sasl_tls")
    broker = brokers.start()
    brokers.add_user(broker.bootstrap, "spark", "SCRAM-SHA-512")
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("s-in", 2), NewTopic("s-out", 2)])
        admin.create_acls([AclBinding(
            ResourcePattern(ResourceType.TOPIC, "s-", PatternType.PREFIXED),
            AccessControlEntry("User:spark", "*", op, Permission.ALLOW))
            for op in (Operation.READ, Operation.WRITE)])
    with Producer(broker.bootstrap, **brokers.client()) as producer:
        for i in range(100):
            producer.send("s-in", value=b"v%d" % i, key=b"k%d" % (i % 7))
        producer.flush(30)
    yield brokers, broker
    factory.stop_all()


def options(brokers: SecureBrokers, broker: BrokerProcess, secret: str | None = None
            ) -> dict[str, str]:
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="spark" password="{secret or brokers.passwords["spark"]}";')
    return {"bootstrap.servers": broker.bootstrap, "kafka.security.protocol": "SASL_SSL",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": brokers.pki.cafile,
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": jaas}


def _with(builder: Any, opts: dict[str, str]) -> Any:
    for key, value in opts.items():
        builder = builder.option(key, value)
    return builder


def test_batch_read_and_write_through_sasl_ssl(spark: Any, secure: tuple[SecureBrokers,
                                                                        BrokerProcess]) -> None:
    """Goal: Spark reads and writes a SASL_SSL cluster with options only. Method: read s-in
    with readMode=fetch (executors fetch over TLS, authenticated), write its values upper-cased
    to s-out, read s-out back."""
    brokers, broker = secure
    opts = options(brokers, broker)
    df = _with(spark.read.format("logstore"), {**opts, "subscribe": "s-in",
                                              "readMode": "fetch"}).load()
    assert sorted(r.v for r in df.selectExpr("CAST(value AS STRING) AS v").collect()) == \
        sorted(f"v{i}" for i in range(100))
    _with(df.selectExpr("key", "upper(CAST(value AS STRING)) AS value").write.format(
        "logstore"), {**opts, "topic": "s-out"}).mode("append").save()
    back = _with(spark.read.format("logstore"), {**opts, "subscribe": "s-out"}).load()
    assert sorted(r.v for r in back.selectExpr("CAST(value AS STRING) AS v").collect()) == \
        sorted(f"V{i}" for i in range(100))


def test_stream_through_sasl_ssl(spark: Any, secure: tuple[SecureBrokers, BrokerProcess],
                                 tmp_path: Path) -> None:
    """Goal: a streaming query on a SASL_SSL cluster with options only. Method: AvailableNow
    from the earliest offsets of s-in into Parquet; every record once."""
    brokers, broker = secure
    stream = _with(spark.readStream.format("logstore"), {
        **options(brokers, broker), "subscribe": "s-in", "startingOffsets": "earliest"}).load()
    query = (stream.selectExpr("CAST(value AS STRING) AS v").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.v for r in rows) == sorted(f"v{i}" for i in range(100))


def test_wrong_password_fails_the_read(spark: Any, secure: tuple[SecureBrokers,
                                                                BrokerProcess]) -> None:
    """Goal: a wrong password is refused with SASL_AUTHENTICATION_FAILED, and the option
    error names no password. Method: a batch read with a wrong jaas password."""
    brokers, broker = secure
    with pytest.raises(Exception, match="SASL_AUTHENTICATION_FAILED") as e:
        _with(spark.read.format("logstore"), {**options(brokers, broker, "wrong-one"),
                                             "subscribe": "s-in"}).load().collect()
    assert "wrong-one" not in str(e.value)
