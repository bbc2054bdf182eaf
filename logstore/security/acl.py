"""Kafka's ACL model: resources, patterns, operations, permissions, bindings and filters.

Owns: the value types of access control (``ResourcePattern``, ``AccessControlEntry``,
``AclBinding``, ``AclBindingFilter``), their validation (an error names the field at fault),
which operations apply to which resource type, and their JSON form (Kafka's names, upper case).
Must not: decide whether a request is allowed (``authorizer.py`` does) or do I/O.

| field        | values                                                                         |
|--------------|--------------------------------------------------------------------------------|
| resource     | TOPIC, GROUP, CLUSTER (named ``logstore-cluster``), TRANSACTIONAL_ID            |
| pattern type | LITERAL (the name, or ``*`` for every resource of the type), PREFIXED           |
| principal    | ``User:<name>`` (``User:*`` is everyone)                                        |
| host         | an IP address as the broker sees the peer, or ``*``                             |
| operation    | ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION,              |
|              | DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE                               |
| permission   | ALLOW, DENY                                                                     |
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from logstore.errors import InvalidRequestError

WILDCARD = "*"
CLUSTER_NAME = "logstore-cluster"
USER_TYPE = "User"
ANONYMOUS = "User:ANONYMOUS"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(Enum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class PatternType(Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(Enum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class Permission(Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"


_O = Operation
# The operations a binding on each resource type may name (Kafka's table).
OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({_O.ALL, _O.READ, _O.WRITE, _O.CREATE, _O.DELETE, _O.ALTER,
                                   _O.DESCRIBE, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_O.ALL, _O.READ, _O.DELETE, _O.DESCRIBE}),
    ResourceType.CLUSTER: frozenset({_O.ALL, _O.CREATE, _O.ALTER, _O.DESCRIBE, _O.CLUSTER_ACTION,
                                     _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS,
                                     _O.IDEMPOTENT_WRITE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.ALL, _O.WRITE, _O.DESCRIBE}),
}


def parse_enum(cls: type[Any], text: str, what: str) -> Any:
    """``text`` as a member of ``cls`` (case-insensitive, ``-`` for ``_``); INVALID_REQUEST
    naming ``what`` and the choices otherwise."""
    try:
        return cls(text.strip().upper().replace("-", "_"))
    except (ValueError, AttributeError):
        choices = ", ".join(m.value for m in cls)
        raise InvalidRequestError(f"{what}: {text!r} is not one of {choices}") from None


def check_principal(principal: str, what: str = "principal") -> str:
    kind, sep, name = principal.partition(":")
    if not sep or kind != USER_TYPE or not name:
        raise InvalidRequestError(f"{what}: {principal!r} is not 'User:<name>'")
    return principal


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        what = f"{self.resource_type.value} resource"
        if not self.name:
            raise InvalidRequestError(f"{what}: the name is empty")
        if self.pattern_type is PatternType.PREFIXED and self.name == WILDCARD:
            raise InvalidRequestError(f"{what}: '*' is a LITERAL name, not a prefix")
        if self.resource_type is ResourceType.CLUSTER and (
                self.name != CLUSTER_NAME or self.pattern_type is not PatternType.LITERAL):
            raise InvalidRequestError(f"{what}: the cluster is the LITERAL {CLUSTER_NAME!r}")

    def matches(self, name: str) -> bool:
        """Whether this pattern covers the resource named ``name`` of its type."""
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == WILDCARD or self.name == name

    def describe(self) -> str:
        kind = "" if self.pattern_type is PatternType.LITERAL else "prefixed "
        return f"{kind}{self.resource_type.value} {self.name!r}"


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def __post_init__(self) -> None:
        check_principal(self.principal)
        if not self.host:
            raise InvalidRequestError("host: empty (use '*' for any host)")


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def __post_init__(self) -> None:
        allowed = OPERATIONS[self.pattern.resource_type]
        if self.entry.operation not in allowed:
            names = ", ".join(sorted(o.value for o in allowed))
            raise InvalidRequestError(
                f"operation {self.entry.operation.value} does not apply to "
                f"{self.pattern.resource_type.value}; it takes {names}")

    def sort_key(self) -> tuple[str, ...]:
        return tuple(self.to_json().values())

    def describe(self) -> str:
        e = self.entry
        return (f"{e.permission.value} {e.principal} from {e.host} {e.operation.value} on "
                f"{self.pattern.describe()}")

    def to_json(self) -> dict[str, str]:
        p, e = self.pattern, self.entry
        return {"resource_type": p.resource_type.value, "name": p.name,
                "pattern_type": p.pattern_type.value, "principal": e.principal,
                "host": e.host, "operation": e.operation.value,
                "permission": e.permission.value}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> AclBinding:
        return cls(ResourcePattern(ResourceType(d["resource_type"]), d["name"],
                                   PatternType(d["pattern_type"])),
                   AccessControlEntry(d["principal"], d["host"], Operation(d["operation"]),
                                      Permission(d["permission"])))


# Pattern filters: the two types, plus ANY (either) and MATCH (every pattern that applies to
# the named resource: the literal name, '*' and the prefixes of the name), as in Kafka.
PATTERN_FILTERS = ("ANY", "MATCH", "LITERAL", "PREFIXED")


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings a describe or delete selects; None matches anything."""

    resource_type: ResourceType | None = None
    name: str | None = None
    pattern_type: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def __post_init__(self) -> None:
        if self.pattern_type not in PATTERN_FILTERS:
            raise InvalidRequestError(f"pattern type filter {self.pattern_type!r} is not one "
                                      f"of {', '.join(PATTERN_FILTERS)}")
        if self.principal is not None:
            check_principal(self.principal)

    def matches(self, binding: AclBinding) -> bool:
        p, e = binding.pattern, binding.entry
        return ((self.resource_type is None or p.resource_type is self.resource_type)
                and self._matches_pattern(p)
                and self.principal in (None, e.principal) and self.host in (None, e.host)
                and self.operation in (None, e.operation)
                and self.permission in (None, e.permission))

    def _matches_pattern(self, p: ResourcePattern) -> bool:
        if self.pattern_type == "MATCH":
            return self.name is None or p.matches(self.name)
        if self.pattern_type != "ANY" and p.pattern_type.value != self.pattern_type:
            return False
        return self.name in (None, p.name)
