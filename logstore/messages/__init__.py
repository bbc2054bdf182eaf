"""Every wire message LogStore speaks, declared once (Kafka's message specs, as classes).

Owns: the index of request types by action name (``REQUEST_TYPES``), and ``Route``, which pairs
a request type with the handler that answers it and with how it is authorized (an ``Access``,
``security/access.py``: a Route cannot be made without one), so that a broker's dispatch table
is typed end to end and no handler runs before its checks passed. The messages themselves live by area:

| module       | actions                                                                        |
|--------------|--------------------------------------------------------------------------------|
| topics.py    | metadata, create_topics, delete_topics, create_partitions, describe_configs,   |
|              | alter_configs                                                                  |
| log.py       | list_offsets, describe_log_dirs, await_high_watermarks, broker_stats           |
| produce.py   | init_producer_id; the DoPut descriptor (produce), batch metadata and acks       |
| fetch.py     | the DoGet ticket (fetch) and the summary that ends a fetch stream              |
| fetch_       | fetch_session: the DoExchange descriptor of a push session, its credit,        |
|  session.py  | updates and per-partition frames                                               |
| cluster.py   | leader_and_isr, alter_isr, controlled_shutdown, offsets_for_leader_epoch,      |
|              | leader_epochs                                                                  |
| tiering.py   | describe_log_tiers, list_remote_segments                                       |
| groups.py    | find_coordinator, join_group, sync_group, heartbeat, leave_group,             |
|              | offset_commit, offset_fetch, list_groups, describe_groups, delete_groups       |
| transactions | add_partitions_to_txn, add_offsets_to_txn, txn_offset_commit, end_txn,         |
|   .py        | prepare_txn, write_txn_markers, describe_transactions, list_transactions,      |
|              | describe_producers                                                             |
| security.py  | create_acls, delete_acls, describe_acls, alter_user_scram_credentials,         |
|              | describe_user_scram_credentials; the SASL handshake's messages                 |
| metrics.py   | describe_group_lag, offset_timestamps, describe_broker_metrics                  |

Must not: do I/O, or know the transport or the services behind the handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from logstore.messages import (
    cluster,
    fetch,
    fetch_session,
    groups,
    log,
    metrics,
    produce,
    security,
    tiering,
    topics,
    transactions,
)
from logstore.messages.base import (
    ErrorFields,
    Message,
    Request,
    decode_message,
    decode_request,
    decode_response,
    decode_versioned,
    encode,
    error_kw,
)
from logstore.security.access import Access, Permissions, authorize

Q = TypeVar("Q", bound=Request[Any])
R = TypeVar("R", bound=Message)


@dataclass(frozen=True, slots=True)
class Route(Generic[Q, R]):
    """A request type, the handler that answers it, and how it is authorized."""

    request_type: type[Q]
    handle: Callable[[Q], R]
    access: Access[Q, R]

    @property
    def action(self) -> str:
        return self.request_type.ACTION

    def __call__(self, body: bytes, permissions: Permissions | None = None) -> bytes:
        """Decode ``body``, authorize and handle it, encode the answer (errors propagate as
        ApiErrors). ``permissions`` None: no authorizer runs, everything is allowed."""
        request = decode_request(self.request_type, body)
        if permissions is None:
            return encode(self.handle(request))
        return encode(authorize(self.access, request, permissions, self.handle))


def _request_types(*modules: Any) -> dict[str, type[Request[Any]]]:
    found: dict[str, type[Request[Any]]] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Request) and value.ACTION:
                assert value.ACTION not in found, f"two requests named {value.ACTION!r}"
                found[value.ACTION] = value
    return found


# Every request type by action name (produce and fetch included: their bodies are versioned
# like the DoActions').
REQUEST_TYPES: dict[str, type[Request[Any]]] = _request_types(
    topics, log, produce, fetch, fetch_session, cluster, groups, transactions, tiering, security,
    metrics)

__all__ = ["REQUEST_TYPES", "ErrorFields", "Message", "Request", "Route", "decode_message",
           "decode_request", "decode_response", "decode_versioned", "encode", "error_kw"]
