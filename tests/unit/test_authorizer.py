"""The ACL model and the authorizer: Kafka's rules (DENY beats ALLOW, implied DESCRIBE, super
users, allow_everyone_if_no_acl_found, literal/wildcard/prefixed patterns, host binding),
checked against a direct model with hypothesis, and the declarations runner."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import (
    ClusterAuthorizationFailedError,
    InvalidRequestError,
    TopicAuthorizationFailedError,
)
from logstore.security.access import (
    Access,
    AuthorizerPermissions,
    Entities,
    authorize,
    on_any,
    on_cluster,
    on_topic,
)
from logstore.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.authorizer import IMPLIED_BY, Authorizer, Principal

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
ALICE = Principal("User:alice", "127.0.0.1")
BOB = Principal("User:bob", "10.0.0.2")


def binding(name: str, op: Operation, principal: str = "User:alice",
            permission: Permission = Permission.ALLOW, rtype: ResourceType = T,
            pattern: PatternType = PatternType.LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(ResourcePattern(rtype, name, pattern),
                      AccessControlEntry(principal, host, op, permission))


def test_literal_allow_grants_only_that_topic_and_operation() -> None:
    """Goal: an ALLOW binds one principal, one operation, one name. Method: READ on 'orders'
    for alice; READ on 'orders' allowed, WRITE and another topic and another user refused."""
    a = Authorizer([binding("orders", Operation.READ)])
    assert a.authorize(ALICE, Operation.READ, T, "orders")
    assert not a.authorize(ALICE, Operation.WRITE, T, "orders")
    assert not a.authorize(ALICE, Operation.READ, T, "payments")
    assert not a.authorize(BOB, Operation.READ, T, "orders")


def test_deny_beats_allow_and_all_covers_every_operation() -> None:
    """Goal: DENY wins over ALLOW, ALL allows and denies everything. Method: ALLOW ALL on a
    prefix plus DENY WRITE on one topic under it."""
    a = Authorizer([binding("sales-", Operation.ALL, pattern=PatternType.PREFIXED),
                    binding("sales-eu", Operation.WRITE, permission=Permission.DENY)])
    assert a.authorize(ALICE, Operation.WRITE, T, "sales-us")
    assert a.authorize(ALICE, Operation.DELETE, T, "sales-eu")
    assert not a.authorize(ALICE, Operation.WRITE, T, "sales-eu")


@pytest.mark.parametrize("granted", [Operation.READ, Operation.WRITE, Operation.DELETE,
                                     Operation.ALTER])
def test_read_write_delete_alter_imply_describe(granted: Operation) -> None:
    """Goal: Kafka's implication table. Method: each granting operation alone allows
    DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS; DESCRIBE implies nothing."""
    assert Authorizer([binding("t", granted)]).authorize(ALICE, Operation.DESCRIBE, T, "t")
    assert Authorizer([binding("t", Operation.ALTER_CONFIGS)]).authorize(
        ALICE, Operation.DESCRIBE_CONFIGS, T, "t")
    assert not Authorizer([binding("t", Operation.DESCRIBE)]).authorize(
        ALICE, Operation.READ, T, "t")


def test_super_users_bypass_and_no_acl_found_follows_the_setting() -> None:
    """Goal: super users pass everything; a resource without bindings allows everyone only
    with allow_everyone_if_no_acl_found. Method: a DENY for the super user does not stop it."""
    a = Authorizer([binding("t", Operation.ALL, "User:root", Permission.DENY)],
                   super_users=["User:root"])
    assert a.authorize(Principal("User:root", "h"), Operation.DELETE, T, "t")
    assert not a.authorize(ALICE, Operation.READ, T, "untouched")
    open_ = Authorizer([binding("t", Operation.READ)], allow_everyone_if_no_acl_found=True)
    assert open_.authorize(ALICE, Operation.WRITE, T, "untouched")
    assert not open_.authorize(ALICE, Operation.WRITE, T, "t")  # t has bindings


def test_wildcards_of_principal_resource_and_host() -> None:
    """Goal: User:*, the literal '*' resource and '*' host match anything; a named host only
    itself."""
    a = Authorizer([binding("*", Operation.READ, "User:*"),
                    binding("secret", Operation.WRITE, host="127.0.0.1")])
    assert a.authorize(BOB, Operation.READ, T, "anything")
    assert a.authorize(ALICE, Operation.WRITE, T, "secret")
    assert not a.authorize(Principal("User:alice", "10.0.0.9"), Operation.WRITE, T, "secret")


def test_authorize_any_needs_an_allow_no_deny_covers() -> None:
    """Goal: Kafka's authorizeByResourceType: WRITE on some topic allows an idempotent producer
    id; a DENY covering every ALLOW, or a wildcard DENY, refuses."""
    assert Authorizer([binding("a", Operation.WRITE)]).authorize_any(ALICE, Operation.WRITE, T)
    assert not Authorizer([binding("a", Operation.WRITE), binding(
        "a", Operation.WRITE, permission=Permission.DENY)]).authorize_any(
        ALICE, Operation.WRITE, T)
    assert not Authorizer([binding("a", Operation.WRITE), binding(
        "*", Operation.ALL, permission=Permission.DENY)]).authorize_any(
        ALICE, Operation.WRITE, T)
    assert not Authorizer([binding("a", Operation.READ)]).authorize_any(
        ALICE, Operation.WRITE, T)


def test_invalid_bindings_are_refused_naming_the_field() -> None:
    """Goal: a binding that cannot mean anything is INVALID_REQUEST naming what is wrong."""
    with pytest.raises(InvalidRequestError, match="does not apply to GROUP"):
        binding("g", Operation.WRITE, rtype=G)
    with pytest.raises(InvalidRequestError, match="User:<name>"):
        binding("t", Operation.READ, principal="alice")
    with pytest.raises(InvalidRequestError, match="cluster"):
        binding("other", Operation.ALTER, rtype=C)
    with pytest.raises(InvalidRequestError, match="LITERAL name"):
        binding("*", Operation.READ, pattern=PatternType.PREFIXED)


def test_filters_select_by_every_field_and_match_patterns() -> None:
    """Goal: describe/delete filters as Kafka's: None is any, MATCH finds every pattern that
    applies to a name (literal, wildcard, prefixes)."""
    bs = [binding("orders", Operation.READ), binding("ord", Operation.READ,
                                                     pattern=PatternType.PREFIXED),
          binding("*", Operation.WRITE, "User:bob"), binding("other", Operation.READ)]
    match = AclBindingFilter(T, "orders", "MATCH")
    assert [b for b in bs if match.matches(b)] == bs[:3]
    assert [b for b in bs if AclBindingFilter(principal="User:bob").matches(b)] == [bs[2]]
    assert [b for b in bs if AclBindingFilter(pattern_type="PREFIXED").matches(b)] == [bs[1]]
    assert AclBinding.from_json(bs[1].to_json()) == bs[1]


NAMES = st.sampled_from(["a", "ab", "abc", "b", "*"])
PREFIXES = st.sampled_from(["a", "ab", "b"])
OPS = st.sampled_from([Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.ALL,
                       Operation.DELETE])
BINDINGS = st.builds(
    lambda name, prefixed, op, deny, who, host: binding(
        name if not prefixed or name == "*" else name[:1], op,
        who, Permission.DENY if deny else Permission.ALLOW,
        pattern=PatternType.PREFIXED if prefixed and name != "*" else PatternType.LITERAL,
        host=host),
    NAMES, st.booleans(), OPS, st.booleans(),
    st.sampled_from(["User:alice", "User:bob", "User:*"]), st.sampled_from(["*", "127.0.0.1"]))


def model(bindings: list[AclBinding], who: Principal, op: Operation, name: str) -> bool:
    """Kafka's rule written out plainly, over every binding, with no index or cache."""
    covering = [b for b in bindings if b.pattern.matches(name)]
    if not covering:
        return False
    mine = [b for b in covering if b.entry.principal in (who.name, "User:*")
            and b.entry.host in (who.host, "*")]
    if any(b.entry.permission is Permission.DENY and b.entry.operation in (op, Operation.ALL)
           for b in mine):
        return False
    granting = {op, Operation.ALL, *IMPLIED_BY.get(op, ())}
    return any(b.entry.permission is Permission.ALLOW and b.entry.operation in granting
               for b in mine)


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, max_size=12), OPS, st.sampled_from(["a", "ab", "abc", "b", "c"]))
def test_indexed_authorizer_agrees_with_the_plain_rule(bindings: list[AclBinding],
                                                      op: Operation, name: str) -> None:
    """Goal: the index and cache change nothing. Method: hypothesis draws bindings, compares
    the authorizer (asked twice, so the cached answer counts too) with ``model``."""
    a = Authorizer(bindings)
    for who in (ALICE, Principal("User:bob", "127.0.0.1")):
        expected = model(list(set(bindings)), who, op, name)
        assert a.authorize(who, op, T, name) == expected
        assert a.authorize(who, op, T, name) == expected


def test_authorize_runs_the_handler_only_for_permitted_entities() -> None:
    """Goal: a declaration refuses a request before its handler runs, and per entity answers
    the refused ones and handles the rest. Method: a fake handler records what it got."""
    perms = AuthorizerPermissions(Authorizer([binding("ok", Operation.DELETE)]), ALICE)
    handled: list[list[str]] = []

    def handle(names: list[str]) -> list[str]:
        handled.append(names)
        return [f"{n}:done" for n in names]

    whole: Access[list[str], list[str]] = Access("x", require=lambda r: [on_cluster(
        Operation.ALTER)])
    with pytest.raises(ClusterAuthorizationFailedError, match=f"ALTER on CLUSTER '{CLUSTER_NAME}'"):
        authorize(whole, ["ok"], perms, handle)
    assert handled == []
    each: Access[list[str], list[str]] = Access("x", entities=Entities(
        checks=lambda r: [(n, on_topic(n, Operation.DELETE)) for n in r],
        narrow=lambda r, keep: [n for n in r if n in keep],
        refuse=lambda resp, refused: resp + [f"{k}:{e.code.name}" for k, e in refused.items()]))
    assert authorize(each, ["ok", "no"], perms, handle) == [
        "ok:done", "no:TOPIC_AUTHORIZATION_FAILED"]
    assert handled == [["ok"]]
    with pytest.raises(TopicAuthorizationFailedError, match="WRITE on any TOPIC"):
        authorize(Access("x", require=lambda r: [on_any(T, Operation.WRITE)]), [], perms,
                  handle)
