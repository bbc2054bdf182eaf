"""An ACL removed while a produce stream or a fetch session is open refuses what that stream
does next (issue 13).

Goal: a DoPut stream lives as long as its producer, so its permissions must be those of the
broker's current Authorizer at each batch, not of the moment the stream opened (Authorizers
are immutable and swapped on each ACL change). Method: a real SASL_SSL broker (local metadata
store: an ACL change is applied before delete_acls answers); a raw stream and a Producer each
write once, the WRITE ACL is removed, and the next batch on the same stream must be refused
with TOPIC_AUTHORIZATION_FAILED; an ACL added back is seen by the same stream too. A fetch
session opened with a credit it never needs to renew (so the client sends no frame) is ended
with TOPIC_AUTHORIZATION_FAILED at its first push after its READ is removed, and pushes no
record written after the removal.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from logstore import NewTopic, Producer
from logstore.errors import ErrorCode, TopicAuthorizationFailedError
from logstore.messages.fetch import FetchPartition
from logstore.messages.fetch_session import FetchSessionRequest
from logstore.messages.produce import ProduceBatchMetadata, ProduceRequest
from logstore.records import DEFAULT_SCHEMA
from logstore.rpc.client import BrokerConnection
from logstore.rpc.session_client import PartitionNews
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.config import client_security
from tests.brokers import BrokerFactory
from tests.security import SecureBrokers

BINDING = AclBinding(ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL),
                     AccessControlEntry("User:writer", "*", Operation.WRITE, Permission.ALLOW))
FILTER = AclBindingFilter(resource_type=ResourceType.TOPIC, name="orders",
                          pattern_type="LITERAL", principal="User:writer")


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"key": None, "value": b"v", "timestamp": 0,
                                        "headers": []}], schema=DEFAULT_SCHEMA)


def _secure(tmp_path: Path) -> tuple[BrokerFactory, SecureBrokers, str]:
    factory = BrokerFactory(tmp_path)
    brokers = SecureBrokers(factory, "sasl_tls")
    broker = brokers.start()
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("orders", 1)])
        brokers.add_user(broker.bootstrap, "writer")
        admin.create_acls([BINDING])
    return factory, brokers, broker.bootstrap


def test_revoked_write_refuses_the_next_batch_of_an_open_stream(tmp_path: Path) -> None:
    factory, brokers, bootstrap = _secure(tmp_path)
    try:
        conn = BrokerConnection(bootstrap, security=client_security(brokers.client("writer")))
        stream = conn.open_produce(ProduceRequest(topic="orders", acks=-1), DEFAULT_SCHEMA)
        acks = []
        for seq in range(3):
            if seq == 1:
                with brokers.admin(bootstrap) as admin:
                    assert admin.delete_acls([FILTER])
            if seq == 2:
                with brokers.admin(bootstrap) as admin:
                    admin.create_acls([BINDING])
            stream.send(_batch(), ProduceBatchMetadata(seq=seq, partition=0))
            acks.append(stream.read_ack())
        stream.close()
        conn.close()
        assert [a.error_code if a else None for a in acks] == [
            0, int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), 0]
        assert acks[1] is not None and "User:writer" in (acks[1].error_message or "")
        assert acks[2] is not None and acks[2].base_offset == 1  # the refused batch: no offset
    finally:
        factory.stop_all()


def test_revoked_write_stops_a_running_producer(tmp_path: Path) -> None:
    factory, brokers, bootstrap = _secure(tmp_path)
    try:
        with Producer(bootstrap, retries=0, delivery_timeout_ms=20_000,
                      **brokers.client("writer")) as producer:
            producer.send("orders", b"before", partition=0).result(15)
            with brokers.admin(bootstrap) as admin:
                assert admin.delete_acls([FILTER])
            with pytest.raises(TopicAuthorizationFailedError, match="orders"):
                producer.send("orders", b"after", partition=0).result(15)
    finally:
        factory.stop_all()


def test_revoked_read_ends_a_fetch_session_that_sends_no_frame(tmp_path: Path) -> None:
    factory, brokers, bootstrap = _secure(tmp_path)
    read = AclBinding(ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL),
                      AccessControlEntry("User:writer", "*", Operation.READ, Permission.ALLOW))
    try:
        with brokers.admin(bootstrap) as admin:
            admin.create_acls([read])
        conn = BrokerConnection(bootstrap, security=client_security(brokers.client("writer")))
        stream = conn.open_fetch_session(FetchSessionRequest(
            topic="orders", partitions=[FetchPartition(partition=0, offset=0)],
            credit_bytes=1 << 40))  # never runs out: the client has no frame to send
        frames: queue.Queue[object] = queue.Queue()

        def read_all() -> None:
            try:
                while (frame := stream.read()) is not None:
                    frames.put(frame)
            except Exception as e:  # the session's end
                frames.put(e)

        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()
        try:
            with Producer(bootstrap, **brokers.client()) as producer:
                producer.send("orders", b"before", partition=0).result(15)
                while not getattr(first := frames.get(timeout=30), "batches", None):
                    assert isinstance(first, PartitionNews), first  # its state, then "before"
                with brokers.admin(bootstrap) as admin:
                    assert admin.delete_acls([AclBindingFilter(
                        resource_type=ResourceType.TOPIC, name="orders", pattern_type="LITERAL",
                        principal="User:writer", operation=Operation.READ)])
                producer.send("orders", b"after", partition=0).result(15)
            after = []
            while not isinstance(frame := frames.get(timeout=30), Exception):
                after.append(frame)
            assert isinstance(frame, TopicAuthorizationFailedError), frame
            assert "orders" in str(frame)
            assert not [f for f in after if isinstance(f, PartitionNews) and f.batches]
        finally:
            stream.close()
            conn.close()
            reader.join(10)
    finally:
        factory.stop_all()
