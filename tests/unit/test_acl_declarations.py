"""Every request declares how it is authorized: a Route cannot be made without an Access, every
Route a broker registers carries the rule ``acl_rules.RULES`` gives its request type, and every
request type (transactions' included, before they are served) has a rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.broker import acl_rules
from logstore.broker.broker import Broker
from logstore.config import BrokerConfig
from logstore.messages import REQUEST_TYPES, Route
from logstore.messages.topics import MetadataRequest
from logstore.security.access import Access


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
