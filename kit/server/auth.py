"""Key checks: the API key on ``/v1/*`` and ``/v1beta/*`` (when the server has one) and
the admin token on ``/admin/*``. A pure ASGI middleware, so it leaves the request's receive channel alone
(request.is_disconnected() must keep working in the routes)."""

from __future__ import annotations

import hmac
import logging
from typing import NamedTuple
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kit.server.errors import APIError
from kit.server.protocol import Protocol, protocol_for
from kit.server.protocols import PROTOCOLS
from kit.server.state import ServerState

#: what a redacted query value reads in the access log
REDACTED = "REDACTED"


def presented_key(headers: Headers) -> str:
    """The key a client sent: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return headers.get("x-api-key") or ""


class QueryField(NamedTuple):
    """One ``&``-separated field of a query string: ``name`` and ``value`` decoded,
    ``start:end`` the raw value's place in the query (``start == end``: no value)."""

    name: str
    value: str
    start: int
    end: int


def query_fields(query: str) -> list[QueryField]:
    """The fields of ``query`` (the raw text after ``?``), decoded one by one by
    :func:`urllib.parse.parse_qsl` (``+`` as a space, then percent-escapes as UTF-8), which
    splits on ``&`` only: so each field's name and value are exactly what parsing the
    whole query gives, in order (empty fields left out). The one decoding of the key's
    check (:func:`key_of`) and of its redaction (:func:`redact_query`), so whatever
    spelling authenticates (percent-encoded, ``+``, repeated) is redacted."""
    fields, pos = [], 0
    for raw in query.split("&"):
        start, pos = pos, pos + len(raw) + 1
        pairs = parse_qsl(raw, keep_blank_values=True)
        if pairs:
            eq = raw.find("=")
            value_at = start + (eq + 1 if eq >= 0 else len(raw))
            fields.append(QueryField(pairs[0][0], pairs[0][1], value_at, start + len(raw)))
    return fields


def key_of(protocol: Protocol | None, headers: Headers, query_string: bytes) -> str:
    """The key a client of ``protocol`` sent: in one of its
    :attr:`~kit.server.protocol.Protocol.key_headers`, then one of its ``key_query``
    fields (the first non-empty one, see :func:`query_fields`), else one of
    :func:`presented_key`'s (every protocol's)."""
    if protocol is None:
        return presented_key(headers)
    header = next((headers[h] for h in protocol.key_headers if headers.get(h)), "")
    names = protocol.key_query
    query = next((f.value for f in query_fields(query_string.decode("latin-1"))
                  if f.name in names and f.value), "") if names else ""
    return header or query or presented_key(headers)


#: the query fields any protocol reads a key from (redacted from the access log)
KEY_FIELDS = frozenset(name.casefold() for p in PROTOCOLS for name in p.key_query)


def redact_query(path: str) -> str:
    """``path`` (``/path?query``, as uvicorn's access log writes it) with the value of every
    field :func:`query_fields` names as one of :data:`KEY_FIELDS` (any case: a client that
    misspelled the name may still have sent the real key) replaced by :data:`REDACTED`."""
    head, sep, query = path.partition("?")
    if not sep:
        return path
    for f in reversed(query_fields(query)):
        if f.name.casefold() in KEY_FIELDS and f.start < f.end:  # an empty value shows nothing
            query = query[:f.start] + REDACTED + query[f.end:]
    return head + sep + query


class RedactKeys(logging.Filter):
    """Google's ``?key=KEY`` would put the API key into uvicorn's access log: redacted
    (:func:`redact_query`), on every route. Reads the record's args, ``(client, method,
    path, http_version, status)``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) \
                and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


logging.getLogger("uvicorn.access").addFilter(RedactKeys())


class AuthMiddleware:
    """The key check of every request (the protocol's key, :func:`key_of`), answered in
    the protocol's error shape."""

    def __init__(self, app: ASGIApp, state: ServerState,
                 protocols: tuple[Protocol, ...] = PROTOCOLS) -> None:
        self.app, self.state, self.protocols = app, state, protocols

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope["path"], Headers(scope=scope), scope["query_string"])
            if error is not None:
                await error.response(scope["path"], self.protocols)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, path: str, headers: Headers, query: bytes = b"") -> APIError | None:
        if path.startswith("/admin"):
            if not self.state.admin_token:
                return APIError(403, "the admin API is disabled", type="permission_error")
            needed = self.state.admin_token
        elif path.startswith("/v1"):
            needed = self.state.api_key
        else:
            return None
        key = key_of(protocol_for(path, self.protocols), headers, query)
        if needed and not hmac.compare_digest(key.encode(), needed.encode()):
            return APIError(401, "invalid or missing API key", type="authentication_error",
                            code="invalid_api_key")
        return None
