"""Clients never write or manage the internal topics (issue 13 review).

Goal: a principal with WRITE on topic '*' but no right on any group must not append to
``__consumer_offsets`` (it would set any group's committed offsets, which the coordinator
replays after a reload) nor to ``__transaction_state``; Kafka refuses client produce to internal
topics whatever the ACLs (INVALID_TOPIC_EXCEPTION). Creating, deleting, growing or reconfiguring
them is refused to every client, super users included: the coordinators own them.
Method: a real SASL_SSL broker with the authorizer on; a raw produce stream as a topic writer;
the admin (a super user) for the topic calls; a restart to make the coordinator reload.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore import Admin, NewTopic
from logstore.errors import GroupAuthorizationFailedError, InvalidTopicError
from logstore.groups.offsets import encode_batch, offset_key, offset_value, partition_for
from logstore.messages.produce import ProduceBatchMetadata, ProduceRequest
from logstore.model import (
    INTERNAL_TOPICS,
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    OffsetAndMetadata,
    TopicPartition,
)
from logstore.records import DEFAULT_SCHEMA
from logstore.rpc.client import BrokerConnection
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.config import client_security
from tests.brokers import BrokerFactory, BrokerProcess
from tests.security import SecureBrokers

TP = TopicPartition("orders", 0)
WRITE_ALL = AclBinding(ResourcePattern(ResourceType.TOPIC, "*", PatternType.LITERAL),
                       AccessControlEntry("User:mallory", "*", Operation.WRITE, Permission.ALLOW))


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[SecureBrokers, BrokerProcess]]:
    factory = BrokerFactory(tmp_path)
    brokers = SecureBrokers(factory, "sasl_tls", offsets_topic_num_partitions=1,
                            group_initial_rebalance_delay_ms=0)
    broker = brokers.start()
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("orders", 1)])
        admin.alter_group_offsets("victim", {TP: OffsetAndMetadata(5)})
        brokers.add_user(broker.bootstrap, "mallory")
        admin.create_acls([WRITE_ALL])
    yield brokers, broker
    factory.stop_all()


def _forge(brokers: SecureBrokers, broker: BrokerProcess, user: str, topic: str) -> None:
    """Append a commit of offset 999 for group 'victim' to ``topic`` as ``user``."""
    conn = BrokerConnection(broker.bootstrap, security=client_security(brokers.client(user)))
    try:
        stream = conn.open_produce(ProduceRequest(topic=topic, acks=-1), DEFAULT_SCHEMA)
        try:
            stream.send(encode_batch([(offset_key("victim", TP),
                                       offset_value(OffsetAndMetadata(999)))],
                                     int(time.time() * 1000)),
                        ProduceBatchMetadata(seq=0, partition=partition_for("victim", 1)))
            ack = stream.read_ack()
            assert ack is not None and ack.error_code != 0, f"appended: {ack}"
        finally:
            stream.close()
    finally:
        conn.close()


@pytest.mark.parametrize("user", ["mallory", "admin"])
@pytest.mark.parametrize("topic", INTERNAL_TOPICS)
def test_client_produce_to_an_internal_topic_is_refused(
        secure: tuple[SecureBrokers, BrokerProcess], user: str, topic: str) -> None:
    brokers, broker = secure
    with pytest.raises(InvalidTopicError, match=topic):
        _forge(brokers, broker, user, topic)


def test_a_topic_writer_cannot_forge_group_offsets(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    brokers, broker = secure
    with Admin(broker.bootstrap, **brokers.client("mallory")) as m, \
            pytest.raises(GroupAuthorizationFailedError):
        m.alter_group_offsets("victim", {TP: OffsetAndMetadata(999)})
    with pytest.raises(InvalidTopicError):
        _forge(brokers, broker, "mallory", OFFSETS_TOPIC)
    broker.restart()  # the coordinator replays __consumer_offsets
    with brokers.admin(broker.bootstrap) as admin:
        assert admin.list_group_offsets("victim")[TP].offset == 5
        # The coordinator itself still writes there.
        admin.alter_group_offsets("victim", {TP: OffsetAndMetadata(7)})
        assert admin.list_group_offsets("victim")[TP].offset == 7


def test_clients_cannot_manage_the_internal_topics(
        secure: tuple[SecureBrokers, BrokerProcess]) -> None:
    brokers, broker = secure
    with brokers.admin(broker.bootstrap) as admin:  # a super user
        for call in (lambda: admin.delete_topics([OFFSETS_TOPIC]),
                     lambda: admin.create_partitions({OFFSETS_TOPIC: 4}),
                     lambda: admin.alter_configs({OFFSETS_TOPIC: {"retention_ms": 1000}}),
                     lambda: admin.create_topics([NewTopic(TRANSACTION_STATE_TOPIC, 2)])):
            with pytest.raises(InvalidTopicError, match="internal"):
                call()
        assert OFFSETS_TOPIC in admin.list_topics(include_internal=True)
        (offsets,) = admin.describe_topics([OFFSETS_TOPIC])
        assert len(offsets.partitions) == 1
        assert admin.describe_configs([OFFSETS_TOPIC])[OFFSETS_TOPIC]["retention_ms"] is None
