"""Untyped (dict) request and response bodies: legacy, kept only for the group actions.

Every other action is a typed message (``logstore/messages``). The group actions
(``broker/group_handlers.py``, ``client/group.py`` and the group methods of ``client/admin.py``)
still build and read dict bodies through these helpers; once they are declared as messages,
this module, ``BrokerConnection.action``, ``ClusterMetadata.request`` and the server's dict
fallback go.

Owns: parsing JSON request bodies, typed access to their fields (a missing or wrongly typed
field is INVALID_REQUEST naming it), and the ``error_code``/``error_message`` fields of dict
response entries. Must not: do I/O or know about Arrow Flight.
"""

from __future__ import annotations

from typing import Any

import orjson

from logstore.errors import ApiError, InvalidRequestError, error_class


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def loads_request(data: bytes | memoryview, what: str) -> dict[str, Any]:
    """Parse a JSON request body; anything but a JSON object is INVALID_REQUEST."""
    try:
        obj = orjson.loads(bytes(data))
    except orjson.JSONDecodeError as e:
        raise InvalidRequestError(f"{what}: body is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise InvalidRequestError(f"{what}: body must be a JSON object")
    return obj


def field(req: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str,
          default: Any = ..., ) -> Any:
    """A typed field of a request; a missing or wrongly typed one is INVALID_REQUEST."""
    if name not in req or req[name] is None:
        if default is ...:
            raise InvalidRequestError(f"{what}: missing field {name!r}")
        return default
    value = req[name]
    bad_bool = isinstance(value, bool) and kind in (int, (int,))
    if not isinstance(value, kind) or bad_bool:
        raise InvalidRequestError(f"{what}: field {name!r} has the wrong type "
                                  f"({type(value).__name__})")
    return value


def error_fields(error: ApiError | None) -> dict[str, Any]:
    if error is None:
        return {"error_code": 0, "error_message": None}
    return {"error_code": int(error.code), "error_message": error.message}


def error_from_fields(d: dict[str, Any]) -> ApiError | None:
    code = d.get("error_code", 0)
    if not code:
        return None
    return error_class(code)(d.get("error_message") or "")
