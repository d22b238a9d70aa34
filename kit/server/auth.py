"""Key checks: the API key on ``/v1/*`` and ``/v1beta/*`` (when the server has one) and
the admin token on ``/admin/*``. A pure ASGI middleware, so it leaves the request's receive channel alone
(request.is_disconnected() must keep working in the routes)."""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kit.server.errors import APIError, is_gemini_path
from kit.server.state import ServerState


def presented_key(headers: Headers) -> str:
    """The key a client sent: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return headers.get("x-api-key") or ""


def gemini_key(headers: Headers, query_string: bytes) -> str:
    """The key a Gemini API client sent: ``x-goog-api-key: KEY``, ``?key=KEY`` (Google's
    two ways), or one of :func:`presented_key`'s."""
    query = parse_qs(query_string.decode("latin-1")).get("key") or [""]
    return headers.get("x-goog-api-key") or query[0] or presented_key(headers)


class AuthMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope["path"], Headers(scope=scope), scope["query_string"])
            if error is not None:
                await error.response(scope["path"])(scope, receive, send)
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
        key = gemini_key(headers, query) if is_gemini_path(path) else presented_key(headers)
        if needed and not hmac.compare_digest(key.encode(), needed.encode()):
            return APIError(401, "invalid or missing API key", type="authentication_error",
                            code="invalid_api_key")
        return None
