"""The authorizer: whether a principal, from a host, may perform an operation on a resource.

Owns: Kafka's rules (``AclAuthorizer``/``StandardAuthorizer``): super users may do anything; a
resource with no binding at all allows everyone only with ``allow_everyone_if_no_acl_found``;
otherwise a matching DENY (for the operation or ALL) wins over any ALLOW, and an ALLOW for the
operation, for ALL, or for an operation that implies it (READ, WRITE, DELETE and ALTER imply
DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows. A binding matches a principal when it
names it or ``User:*``, and a host when it names it or ``*``; its pattern matches a resource
when it is the literal name, the literal ``*``, or a prefix of the name.

An ``Authorizer`` is immutable: the broker builds a new one when the bindings change and swaps
it in, so a request is judged against one consistent set. Lookups are indexed (a literal name
is a dict lookup, prefixes are found by the name's own prefixes) and decisions are cached, so
1,000 bindings cost a request about what ten do. Must not: do I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from logstore.security.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

_O = Operation
IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    _O.DESCRIBE: frozenset({_O.READ, _O.WRITE, _O.DELETE, _O.ALTER}),
    _O.DESCRIBE_CONFIGS: frozenset({_O.ALTER_CONFIGS}),
}
CACHE_LIMIT = 100_000
_Key = tuple[str, str, Operation, ResourceType, str]


class _TypeIndex:
    """The bindings of one resource type, by literal name and by prefix."""

    def __init__(self) -> None:
        self.literal: dict[str, list[AclBinding]] = defaultdict(list)
        self.prefixed: dict[str, list[AclBinding]] = defaultdict(list)
        self.longest_prefix = 0

    def add(self, b: AclBinding) -> None:
        if b.pattern.pattern_type is PatternType.PREFIXED:
            self.prefixed[b.pattern.name].append(b)
            self.longest_prefix = max(self.longest_prefix, len(b.pattern.name))
        else:
            self.literal[b.pattern.name].append(b)

    def covering(self, name: str) -> Iterator[AclBinding]:
        """Every binding whose pattern covers ``name``."""
        yield from self.literal.get(name, ())
        if name != WILDCARD:
            yield from self.literal.get(WILDCARD, ())
        for end in range(1, min(len(name), self.longest_prefix) + 1):
            yield from self.prefixed.get(name[:end], ())

    def all(self) -> Iterator[AclBinding]:
        for group in (*self.literal.values(), *self.prefixed.values()):
            yield from group


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection authenticated as, and from where (for host-bound bindings)."""

    name: str
    host: str


class Authorizer:
    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.bindings = tuple(sorted(set(bindings), key=AclBinding.sort_key))
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._index: dict[ResourceType, _TypeIndex] = {t: _TypeIndex() for t in ResourceType}
        for b in self.bindings:
            self._index[b.pattern.resource_type].add(b)
        self._cache: dict[_Key, bool] = {}

    def with_bindings(self, bindings: Iterable[AclBinding]) -> Authorizer:
        """The same settings over new bindings."""
        return Authorizer(bindings, self.super_users, self.allow_everyone_if_no_acl_found)

    def authorize(self, who: Principal, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        key = (who.name, who.host, operation, resource_type, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(who, operation, resource_type, name)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def _decide(self, who: Principal, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:
        if who.name in self.super_users:
            return True
        covering = list(self._index[resource_type].covering(name))
        if not covering:
            return self.allow_everyone_if_no_acl_found
        applying = [b for b in covering if _applies_to(b, who)]
        if any(b.entry.permission is Permission.DENY and _names(b, operation)
               for b in applying):
            return False
        granting = {operation, _O.ALL} | IMPLIED_BY.get(operation, frozenset())
        return any(b.entry.permission is Permission.ALLOW and b.entry.operation in granting
                   for b in applying)

    def authorize_any(self, who: Principal, operation: Operation,
                      resource_type: ResourceType) -> bool:
        """Whether ``who`` may perform ``operation`` on some resource of the type (Kafka's
        ``authorizeByResourceType``: an ALLOW that no DENY covers). A producer with WRITE on
        any topic may ask for an idempotent producer id."""
        if who.name in self.super_users:
            return True
        index = self._index[resource_type]
        applying = [b for b in index.all() if _applies_to(b, who) and _names(b, operation)]
        if not any(True for _ in index.all()):
            return self.allow_everyone_if_no_acl_found
        denies = [b for b in applying if b.entry.permission is Permission.DENY]
        if any(d.pattern.name == WILDCARD for d in denies):
            return False
        return any(b.entry.permission is Permission.ALLOW
                   and not any(_covers(d, b) for d in denies) for b in applying)


def _applies_to(b: AclBinding, who: Principal) -> bool:
    return b.entry.principal in (who.name, WILDCARD_PRINCIPAL) and b.entry.host in (
        who.host, WILDCARD)


def _names(b: AclBinding, operation: Operation) -> bool:
    return b.entry.operation in (operation, _O.ALL)


def _covers(deny: AclBinding, allow: AclBinding) -> bool:
    """Whether the DENY's pattern covers every resource the ALLOW's does."""
    if deny.pattern.pattern_type is PatternType.PREFIXED:
        return allow.pattern.name.startswith(deny.pattern.name)
    return allow.pattern.pattern_type is PatternType.LITERAL and \
        allow.pattern.name == deny.pattern.name
