"""How each request is authorized: the declaration every Route carries.

Owns: ``Access``, which says which (resource, operation) checks a request needs, in Kafka's
three shapes: checks the whole request needs (``require``: refused outright, nothing handled);
checks per entity of the request (``entities``: a topic of ``create_topics``, a group of
``delete_groups``; the refused entries are answered with an authorization error, the others
handled); and entries of the response the principal may not see (``visible``: ``metadata``
without topic names lists only the topics it may DESCRIBE). ``Permissions`` is what a handler
run asks (bound to one connection's principal and host); ``authorize`` runs a handler under a
declaration, so that nothing is handled before its checks passed. The refusal error names the
principal, the operation and the resource, with the code of the resource type (TOPIC_, GROUP_,
CLUSTER_, TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

Must not: know the transport, the broker's services or where bindings are stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from logstore.errors import (
    ApiError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    OperationNotAttemptedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from logstore.security.acl import CLUSTER_NAME, Operation, ResourceType
from logstore.security.authorizer import Authorizer, Principal

Q = TypeVar("Q")
R = TypeVar("R")
K = TypeVar("K")

REFUSALS: dict[ResourceType, type[ApiError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
}


@dataclass(frozen=True, slots=True)
class Check:
    """One (resource, operation) a request needs; any of ``alternatives`` passing is enough
    too (``create_topics``: CREATE on the topic, or on the cluster). ``any_name``: the
    operation on any resource of the type will do (an idempotent producer id needs WRITE on
    some topic, as in Kafka)."""

    resource_type: ResourceType
    name: str
    operation: Operation
    alternatives: tuple[Check, ...] = ()
    any_name: bool = False

    def describe(self) -> str:
        if self.any_name:
            return f"{self.operation.value} on any {self.resource_type.value}"
        return f"{self.operation.value} on {self.resource_type.value} {self.name!r}"


def on_topic(name: str, operation: Operation, *alternatives: Check) -> Check:
    return Check(ResourceType.TOPIC, name, operation, alternatives)


def on_group(name: str, operation: Operation) -> Check:
    return Check(ResourceType.GROUP, name, operation)


def on_cluster(operation: Operation, *alternatives: Check) -> Check:
    return Check(ResourceType.CLUSTER, CLUSTER_NAME, operation, alternatives)


def on_any(resource_type: ResourceType, operation: Operation) -> Check:
    return Check(resource_type, "*", operation, any_name=True)


def on_transactional_id(name: str, operation: Operation) -> Check:
    return Check(ResourceType.TRANSACTIONAL_ID, name, operation)


class Permissions(Protocol):
    """What one connection may do (its principal and host are bound in)."""

    @property
    def principal(self) -> str: ...

    def allows(self, check: Check) -> bool: ...


@dataclass(frozen=True, slots=True)
class AuthorizerPermissions:
    """``Permissions`` judged by an ``Authorizer``."""

    authorizer: Authorizer
    who: Principal

    @property
    def principal(self) -> str:
        return self.who.name

    def allows(self, check: Check) -> bool:
        return _allows(self.authorizer, self.who, check)


@dataclass(frozen=True, slots=True)
class CurrentPermissions:
    """``Permissions`` judged by whichever ``Authorizer`` is current at each check: ACL
    changes swap the broker's (immutable) Authorizer, so a long-lived stream holding these
    sees a revoked ACL at its next batch. Each Authorizer caches its decisions, so a check
    stays a dictionary lookup."""

    current: Callable[[], Authorizer]
    who: Principal

    @property
    def principal(self) -> str:
        return self.who.name

    def allows(self, check: Check) -> bool:
        return _allows(self.current(), self.who, check)


def _allows(authorizer: Authorizer, who: Principal, check: Check) -> bool:
    if check.any_name:
        allowed = authorizer.authorize_any(who, check.operation, check.resource_type)
    else:
        allowed = authorizer.authorize(who, check.operation, check.resource_type, check.name)
    return allowed or any(_allows(authorizer, who, alt) for alt in check.alternatives)


def refusal(check: Check, principal: str) -> ApiError:
    """The authorization error for a failed check (its resource type's code)."""
    return REFUSALS[check.resource_type](
        f"{principal} is not authorized to {check.describe()}")


@dataclass(frozen=True, slots=True)
class Entities(Generic[Q, R, K]):
    """The per-entity part of a declaration: ``checks`` lists (key, check) per entity of the
    request; ``narrow`` keeps the entities whose keys are given; ``refuse`` adds an entry per
    refused key (with its error) to the response. With ``all_or_nothing`` (an empty
    response), a request with any refused entity is not handled at all: the refused keys get
    their errors first, the others OPERATION_NOT_ATTEMPTED (Kafka's AddPartitionsToTxn)."""

    checks: Callable[[Q], Iterable[tuple[K, Check]]]
    narrow: Callable[[Q, set[K]], Q]
    refuse: Callable[[R, dict[K, ApiError]], R]
    all_or_nothing: Callable[[], R] | None = None


def _nothing(request: Any) -> Iterable[Check]:
    return ()


@dataclass(frozen=True, slots=True)
class Access(Generic[Q, R]):
    """How a request is authorized (see the module docstring). ``summary`` says it in Kafka's
    words, for the docs and for the test that lists every action's rule."""

    summary: str
    require: Callable[[Q], Iterable[Check]] = field(default=_nothing)
    entities: Entities[Q, R, Any] | None = None
    visible: Callable[[R, Permissions], R] | None = None


def authorize(access: Access[Q, R], request: Q, permissions: Permissions,
              handle: Callable[[Q], R]) -> R:
    """``handle(request)`` under ``access``: raises the refusal of the first whole-request
    check that fails, handles only the permitted entities, and hides what may not be seen."""
    principal = permissions.principal
    for check in access.require(request):
        if not permissions.allows(check):
            raise refusal(check, principal)
    if access.entities is None:
        response = handle(request)
    else:
        response = _per_entity(access.entities, request, permissions, handle)
    if access.visible is not None:
        response = access.visible(response, permissions)
    return response


def _per_entity(entities: Entities[Q, R, Any], request: Q, permissions: Permissions,
                handle: Callable[[Q], R]) -> R:
    refused: dict[Any, ApiError] = {}
    allowed: set[Any] = set()
    for key, check in entities.checks(request):
        if permissions.allows(check):
            allowed.add(key)
        elif key not in refused:
            refused[key] = refusal(check, permissions.principal)
    allowed -= set(refused)
    if refused and entities.all_or_nothing is not None:
        untried = OperationNotAttemptedError(
            f"not attempted: the request also names what {permissions.principal} may not use")
        return entities.refuse(entities.all_or_nothing(),
                               {**refused, **{key: untried for key in sorted(allowed)}})
    if refused:
        request = entities.narrow(request, allowed)
    return entities.refuse(handle(request), refused)
