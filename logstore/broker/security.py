"""A broker's security state and the security administration actions.

Owns: the current users' credentials and ``Authorizer``, both rebuilt from the metadata store
whenever it reports a change (another broker's through a ZooKeeper watch), so a new user, a
deleted one or a new ACL takes effect without a restart; the ``Permissions`` of a connection
(None when ``authorizer_enable`` is off: every request is allowed, as before); and the Routes of
create_acls, delete_acls, describe_acls (SECURITY_DISABLED without an authorizer, as in Kafka),
alter_user_scram_credentials and describe_user_scram_credentials. Must not: know the transport
(the handshake is ``rpc/auth.py``'s, which asks ``credentials`` here) or log a credential.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from logstore.broker import acl_rules as rules
from logstore.controller.store import Credentials, MetadataStore
from logstore.errors import (
    ApiError,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnacceptableCredentialError,
    UnknownServerError,
)
from logstore.messages import Route, error_kw
from logstore.messages import security as m
from logstore.messages.security import binding_of, entry_of, filter_of
from logstore.security.access import CurrentPermissions, Permissions
from logstore.security.acl import AclBinding
from logstore.security.authorizer import Authorizer, Principal
from logstore.security.config import SecurityConfig
from logstore.security.scram import (
    ScramCredential,
    check_mechanism,
    from_salted_password,
)

log = logging.getLogger(__name__)


class SecurityManager:
    def __init__(self, config: SecurityConfig, store: MetadataStore) -> None:
        self.config = config
        self._store = store
        self._lock = threading.Lock()
        self._credentials: Credentials = {}
        self._authorizer: Authorizer | None = None

    def start(self) -> None:
        """Read the users and ACLs, and follow every later change."""
        self._store.add_security_listener(self.reload)
        self.reload()

    def reload(self) -> None:
        credentials, bindings = self._store.scram_credentials(), self._store.acls()
        authorizer = None
        if self.config.authorizer_enable:
            authorizer = Authorizer(bindings, self.config.super_users,
                                    self.config.allow_everyone_if_no_acl_found)
        with self._lock:
            self._credentials, self._authorizer = credentials, authorizer
        log.info("security metadata: %d user(s), %d ACL binding(s)", len(credentials),
                 len(bindings))

    def credentials(self, user: str) -> dict[str, ScramCredential]:
        """``user``'s credentials by mechanism ({} for an unknown user)."""
        return self._credentials.get(user, {})

    def permissions(self, principal: str, host: str) -> Permissions | None:
        """What a connection may do, judged at each check by the Authorizer current then (a
        produce stream keeps its Permissions for its life, and must see an ACL removed
        meanwhile); None when no authorizer runs (everything is allowed)."""
        if self._authorizer is None:
            return None
        return CurrentPermissions(self._current_authorizer, Principal(principal, host))

    def _current_authorizer(self) -> Authorizer:
        authorizer = self._authorizer
        if authorizer is None:  # authorizer_enable is fixed for the broker's life
            raise UnknownServerError("the authorizer was switched off")
        return authorizer

    def routes(self) -> list[Route[Any, Any]]:
        return [Route(m.CreateAclsRequest, self.create_acls, rules.ALTER_SECURITY),
                Route(m.DeleteAclsRequest, self.delete_acls, rules.ALTER_SECURITY),
                Route(m.DescribeAclsRequest, self.describe_acls, rules.DESCRIBE_SECURITY),
                Route(m.AlterUserScramCredentialsRequest, self.alter_user_scram_credentials,
                      rules.ALTER_SECURITY),
                Route(m.DescribeUserScramCredentialsRequest,
                      self.describe_user_scram_credentials, rules.DESCRIBE_SECURITY)]

    # -- ACLs --------------------------------------------------------------------------------

    def _require_authorizer(self, what: str) -> None:
        if not self.config.authorizer_enable:
            raise SecurityDisabledError(
                f"{what}: no authorizer runs on this broker (authorizer_enable = false)")

    def create_acls(self, req: m.CreateAclsRequest) -> m.CreateAclsResponse:
        self._require_authorizer("create_acls")
        results, valid = [], []
        for entry in req.creations:
            try:
                valid.append(binding_of(entry))
                results.append(m.AclCreationResult())
            except ApiError as e:
                results.append(m.AclCreationResult(**error_kw(e)))
        if valid:
            self._store.add_acls(valid)
            log.info("ACLs added: %s", "; ".join(b.describe() for b in valid))
        return m.CreateAclsResponse(results=results)

    def delete_acls(self, req: m.DeleteAclsRequest) -> m.DeleteAclsResponse:
        self._require_authorizer("delete_acls")
        current, results, gone = self._store.acls(), [], set()
        for raw in req.filters:
            try:
                f = filter_of(raw)
            except ApiError as e:
                results.append(m.DeleteAclsFilterResult(**error_kw(e)))
                continue
            matching = sorted((b for b in current if f.matches(b)), key=AclBinding.sort_key)
            gone.update(matching)
            results.append(m.DeleteAclsFilterResult(matching=[entry_of(b) for b in matching]))
        if gone:
            self._store.remove_acls(list(gone))
            log.info("ACLs removed: %s", "; ".join(b.describe() for b in gone))
        return m.DeleteAclsResponse(results=results)

    def describe_acls(self, req: m.DescribeAclsRequest) -> m.DescribeAclsResponse:
        self._require_authorizer("describe_acls")
        f = filter_of(req.filter)
        found = sorted((b for b in self._store.acls() if f.matches(b)), key=AclBinding.sort_key)
        return m.DescribeAclsResponse(acls=[entry_of(b) for b in found])

    # -- users -------------------------------------------------------------------------------

    def alter_user_scram_credentials(self, req: m.AlterUserScramCredentialsRequest
                                     ) -> m.AlterUserScramCredentialsResponse:
        results = [self._delete_credential(d) for d in req.deletions]
        results += [self._put_credential(u) for u in req.upsertions]
        return m.AlterUserScramCredentialsResponse(results=results)

    def _delete_credential(self, d: m.ScramCredentialDeletion
                           ) -> m.AlterUserScramCredentialsResult:
        try:
            check_mechanism(d.mechanism)
            if not self._store.delete_scram_credential(d.name, d.mechanism):
                raise ResourceNotFoundError(f"user {d.name!r} has no {d.mechanism} credential")
        except ApiError as e:
            return m.AlterUserScramCredentialsResult(user=d.name, **error_kw(e))
        log.info("user %r: %s credential deleted", d.name, d.mechanism)
        return m.AlterUserScramCredentialsResult(user=d.name)

    def _put_credential(self, u: m.ScramCredentialUpsertion) -> m.AlterUserScramCredentialsResult:
        try:
            if not u.name:
                raise UnacceptableCredentialError("a user name is required")
            if len(u.salt) < 16 or not u.salted_password:
                raise UnacceptableCredentialError(
                    f"user {u.name!r}: a salt of 16 bytes or more and a salted password "
                    "are required")
            credential = from_salted_password(u.mechanism, u.salt, u.salted_password,
                                              u.iterations)
            self._store.put_scram_credential(u.name, credential)
        except ApiError as e:
            return m.AlterUserScramCredentialsResult(user=u.name, **error_kw(e))
        log.info("user %r: %s credential set (%d iterations)", u.name, u.mechanism,
                 u.iterations)
        return m.AlterUserScramCredentialsResult(user=u.name)

    def describe_user_scram_credentials(self, req: m.DescribeUserScramCredentialsRequest
                                        ) -> m.DescribeUserScramCredentialsResponse:
        users = self._store.scram_credentials()
        names = sorted(users) if req.users is None else req.users
        return m.DescribeUserScramCredentialsResponse(results=[
            _describe_user(name, users.get(name)) for name in names])


def _describe_user(name: str, creds: dict[str, ScramCredential] | None
                   ) -> m.UserScramCredentials:
    if not creds:
        return m.UserScramCredentials(user=name, **error_kw(
            ResourceNotFoundError(f"user {name!r} has no SCRAM credential")))
    return m.UserScramCredentials(user=name, credentials=[
        m.ScramCredentialInfo(mechanism=c.mechanism, iterations=c.iterations)
        for c in sorted(creds.values(), key=lambda c: c.mechanism)])
