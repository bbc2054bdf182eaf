"""Messages of security administration: ACLs (create_acls, delete_acls, describe_acls) and SCRAM
users (alter_user_scram_credentials, describe_user_scram_credentials), after Kafka's
CreateAcls/DeleteAcls/DescribeAcls and KIP-554's AlterUserScramCredentials; and the SASL
handshake's own messages (``SaslAuthenticate``, ``SaslSession``), which travel on Flight's
Handshake call, not as actions.

Owns: the declaration of these bodies. Enumerations travel as Kafka's names (``TOPIC``,
``PREFIXED``, ``READ``, ``ALLOW``); a user credential travels as its salt and salted password
(never the password), and is described by mechanism and iterations only. Must not: do I/O or
hold ACL rules (``security/`` does).
"""

from __future__ import annotations

from typing import ClassVar

from logstore.messages.base import ErrorFields, Message, Request
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    parse_enum,
)

# -- ACLs ------------------------------------------------------------------------------------


class AclEntry(Message, frozen=True, kw_only=True):
    """One binding: a resource pattern and an access control entry (``security/acl.py``)."""

    resource_type: str
    name: str
    pattern_type: str = "LITERAL"
    principal: str
    host: str = "*"
    operation: str
    permission: str = "ALLOW"


def binding_of(e: AclEntry) -> AclBinding:
    """The binding a wire entry describes (INVALID_REQUEST naming the bad field)."""
    return AclBinding(
        ResourcePattern(parse_enum(ResourceType, e.resource_type, "resource_type"), e.name,
                        parse_enum(PatternType, e.pattern_type, "pattern_type")),
        AccessControlEntry(e.principal, e.host, parse_enum(Operation, e.operation, "operation"),
                           parse_enum(Permission, e.permission, "permission")))


def entry_of(b: AclBinding) -> AclEntry:
    return AclEntry(**b.to_json())


class AclFilter(Message, frozen=True, kw_only=True):
    """Which bindings to describe or delete; None matches anything. ``pattern_type`` is ANY,
    MATCH (every pattern that applies to ``name``), LITERAL or PREFIXED."""

    resource_type: str | None = None
    name: str | None = None
    pattern_type: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None


def filter_of(f: AclFilter) -> AclBindingFilter:
    return AclBindingFilter(
        None if f.resource_type is None else parse_enum(ResourceType, f.resource_type,
                                                        "resource_type"),
        f.name, f.pattern_type.upper(), f.principal, f.host,
        None if f.operation is None else parse_enum(Operation, f.operation, "operation"),
        None if f.permission is None else parse_enum(Permission, f.permission, "permission"))


def filter_entry_of(f: AclBindingFilter) -> AclFilter:
    return AclFilter(
        resource_type=None if f.resource_type is None else f.resource_type.value, name=f.name,
        pattern_type=f.pattern_type, principal=f.principal, host=f.host,
        operation=None if f.operation is None else f.operation.value,
        permission=None if f.permission is None else f.permission.value)


class AclCreationResult(ErrorFields, frozen=True, kw_only=True):
    pass


class CreateAclsResponse(Message, frozen=True, kw_only=True):
    results: list[AclCreationResult]  # one per creation, in order


class CreateAclsRequest(Request[CreateAclsResponse], frozen=True, kw_only=True, tag=0):
    """Add bindings (ALTER on the cluster). Each is validated on its own; an invalid one gets
    its error and the others are added."""

    ACTION: ClassVar[str] = "create_acls"
    RESPONSE: ClassVar[type[Message]] = CreateAclsResponse
    creations: list[AclEntry]


class DeleteAclsFilterResult(ErrorFields, frozen=True, kw_only=True):
    matching: list[AclEntry] = []  # the bindings this filter deleted


class DeleteAclsResponse(Message, frozen=True, kw_only=True):
    results: list[DeleteAclsFilterResult]  # one per filter, in order


class DeleteAclsRequest(Request[DeleteAclsResponse], frozen=True, kw_only=True, tag=0):
    """Remove every binding that matches one of the filters (ALTER on the cluster)."""

    ACTION: ClassVar[str] = "delete_acls"
    RESPONSE: ClassVar[type[Message]] = DeleteAclsResponse
    filters: list[AclFilter]


class DescribeAclsResponse(ErrorFields, frozen=True, kw_only=True):
    acls: list[AclEntry] = []


class DescribeAclsRequest(Request[DescribeAclsResponse], frozen=True, kw_only=True, tag=0):
    """The bindings that match the filter (DESCRIBE on the cluster)."""

    ACTION: ClassVar[str] = "describe_acls"
    RESPONSE: ClassVar[type[Message]] = DescribeAclsResponse
    filter: AclFilter = AclFilter()


# -- SCRAM users -----------------------------------------------------------------------------


class ScramCredentialUpsertion(Message, frozen=True, kw_only=True):
    """Set ``name``'s credential for ``mechanism``: the broker derives and stores StoredKey and
    ServerKey from the salted password and keeps neither it nor the password."""

    name: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes


class ScramCredentialDeletion(Message, frozen=True, kw_only=True):
    name: str
    mechanism: str


class AlterUserScramCredentialsResult(ErrorFields, frozen=True, kw_only=True):
    user: str


class AlterUserScramCredentialsResponse(Message, frozen=True, kw_only=True):
    results: list[AlterUserScramCredentialsResult]


class AlterUserScramCredentialsRequest(Request[AlterUserScramCredentialsResponse], frozen=True,
                                       kw_only=True, tag=0):
    """Add, replace or delete users' SCRAM credentials (ALTER on the cluster)."""

    ACTION: ClassVar[str] = "alter_user_scram_credentials"
    RESPONSE: ClassVar[type[Message]] = AlterUserScramCredentialsResponse
    deletions: list[ScramCredentialDeletion] = []
    upsertions: list[ScramCredentialUpsertion] = []


class ScramCredentialInfo(Message, frozen=True, kw_only=True):
    mechanism: str
    iterations: int


class UserScramCredentials(ErrorFields, frozen=True, kw_only=True):
    user: str
    credentials: list[ScramCredentialInfo] = []


class DescribeUserScramCredentialsResponse(Message, frozen=True, kw_only=True):
    results: list[UserScramCredentials]


class DescribeUserScramCredentialsRequest(Request[DescribeUserScramCredentialsResponse],
                                          frozen=True, kw_only=True, tag=0):
    """Users' mechanisms and iteration counts (all users when ``users`` is None; an unknown
    one gets RESOURCE_NOT_FOUND). DESCRIBE on the cluster."""

    ACTION: ClassVar[str] = "describe_user_scram_credentials"
    RESPONSE: ClassVar[type[Message]] = DescribeUserScramCredentialsResponse
    users: list[str] | None = None


# -- the SASL handshake (Flight's Handshake call, rpc/auth.py) ---------------------------------


class SaslAuthenticate(Message, frozen=True, kw_only=True):
    """The client's first handshake message: its mechanism and first SASL message; later
    messages are the bare SASL bytes."""

    mechanism: str
    auth_bytes: bytes


class SaslSession(Message, frozen=True, kw_only=True):
    """The server's last handshake message: the session token every later call carries, and
    the principal it stands for."""

    token: bytes
    principal: str
