"""Every request declares how it is authorized: a Route cannot be made without an Access, every
Route a broker registers carries the rule ``acl_rules.RULES`` gives its request type, and every
request type (transactions' included, before they are served) has a rule. Some rules, run
with a stand-in for a principal's permissions: an AddPartitionsToTxn naming one partition the
principal may not write changes nothing; a group's lag and a transaction's partitions show
only the topics the principal may describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.broker import acl_rules
from logstore.broker.broker import Broker
from logstore.config import BrokerConfig
from logstore.errors import ErrorCode
from logstore.messages import REQUEST_TYPES, Route
from logstore.messages import metrics as mt
from logstore.messages import transactions as tx
from logstore.messages.topics import MetadataRequest
from logstore.security.access import Access, Check, authorize
from logstore.security.acl import ResourceType


def test_a_route_cannot_be_made_without_an_access() -> None:
    """Goal: forgetting the declaration is an error at registration, not a hole at run time.
    Method: build a Route the old way, with a request type and a handler only."""
    with pytest.raises(TypeError):
        Route(MetadataRequest, lambda req: req)  # type: ignore[call-arg]


def test_every_route_a_broker_serves_carries_its_request_types_rule(tmp_path: Path) -> None:
    """Goal: no action is served without the rule Kafka's mapping gives it. Method: build a
    broker in cluster mode (so the cluster actions are registered too; nothing is started)
    and compare each registered Route's Access with RULES; produce and fetch, which are
    streams rather than Routes, have their rules too."""
    broker = Broker(BrokerConfig(log_dirs=(str(tmp_path),), zk_connect="127.0.0.1:1"),
                    serve=lambda listener, handlers: None,  # type: ignore[arg-type,return-value]
                    connect=lambda address: None)  # type: ignore[arg-type,return-value]
    routes = broker.handlers.routes
    assert {"metadata", "leader_and_isr", "join_group", "create_acls"} <= set(routes)
    for name, route in routes.items():
        assert isinstance(route.access, Access) and route.access.summary, name
        assert route.access is acl_rules.RULES[route.request_type], name
    assert {"produce", "fetch"} <= {t.ACTION for t in acl_rules.RULES}


def test_every_request_type_has_a_rule() -> None:
    """Goal: a new message type cannot arrive without its authorization rule (the transaction
    actions have theirs before they are served). Method: RULES against REQUEST_TYPES."""
    missing = sorted(name for name, t in REQUEST_TYPES.items() if t not in acl_rules.RULES)
    assert missing == []
    assert set(acl_rules.RULES) == set(REQUEST_TYPES.values())


class OnlyTopics:
    """Permissions that allow everything but the topics not named."""

    principal = "User:eve"

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)

    def allows(self, check: Check) -> bool:
        return check.resource_type != ResourceType.TOPIC or check.name in self.topics


def _add_partitions(*topics: tuple[str, list[int]]) -> tx.AddPartitionsToTxnRequest:
    return tx.AddPartitionsToTxnRequest(
        transactional_id="t1", producer_id=7, producer_epoch=0,
        topics=[tx.TxnTopicPartitions(topic=t, partitions=ps) for t, ps in topics])


def test_add_partitions_to_txn_naming_a_refused_partition_adds_none() -> None:
    """Goal: Kafka's rule: an AddPartitionsToTxn with a partition the principal may not write
    is not handled at all (before, the allowed partitions were added, and a request whose
    every partition was refused still opened the transaction); the refused partitions answer
    TOPIC_AUTHORIZATION_FAILED first (the client raises the first error), the others
    OPERATION_NOT_ATTEMPTED. Method: the rule run over a recording handler."""
    handled: list[tx.AddPartitionsToTxnRequest] = []

    def handle(req: tx.AddPartitionsToTxnRequest) -> tx.AddPartitionsToTxnResponse:
        handled.append(req)
        return tx.AddPartitionsToTxnResponse(results=[
            tx.TxnPartitionResult(topic=t.topic, partition=p) for t in req.topics
            for p in t.partitions])

    rule = acl_rules.ADD_PARTITIONS_TO_TXN
    mixed = authorize(rule, _add_partitions(("mine", [1, 0]), ("secret", [0])),
                      OnlyTopics("mine"), handle)
    refused = authorize(rule, _add_partitions(("secret", [0])), OnlyTopics("mine"), handle)
    assert handled == []
    assert [(r.topic, r.partition, r.error_code) for r in mixed.results] == [
        ("secret", 0, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        ("mine", 0, ErrorCode.OPERATION_NOT_ATTEMPTED),
        ("mine", 1, ErrorCode.OPERATION_NOT_ATTEMPTED)]
    assert [(r.topic, r.error_code) for r in refused.results] == [
        ("secret", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    allowed = authorize(rule, _add_partitions(("mine", [0])), OnlyTopics("mine"), handle)
    assert len(handled) == 1 and [r.error_code for r in allowed.results] == [0]


def test_group_lag_and_transactions_show_only_topics_the_principal_may_describe() -> None:
    """Goal: describing a group's lag or a transaction does not reveal a topic that metadata
    hides from the same principal. Method: the two rules over handlers that answer with a
    visible and a hidden topic."""
    lag = authorize(acl_rules.DESCRIBE_GROUP_LAG, mt.DescribeGroupLagRequest(group_id="g"),
                    OnlyTopics("mine"), lambda req: mt.DescribeGroupLagResponse(
                        group_id="g", partitions=[mt.PartitionLagEntry(
                            topic=t, partition=0, committed_offset=1, log_end_offset=2, lag=1)
                            for t in ("mine", "payroll")]))
    assert [x.topic for x in lag.partitions] == ["mine"]
    txns = authorize(acl_rules.DESCRIBE_TRANSACTIONS,
                     tx.DescribeTransactionsRequest(transactional_ids=["t1"]),
                     OnlyTopics("mine"), lambda req: tx.DescribeTransactionsResponse(
                         transactions=[tx.TransactionDescription(
                             transactional_id="t1", state="Ongoing", topics=[
                                 tx.TxnTopicPartitions(topic=t, partitions=[0])
                                 for t in ("mine", "payroll")])]))
    assert [t.topic for t in txns.transactions[0].topics] == ["mine"]
