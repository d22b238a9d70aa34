"""Protocol-shaped error objects with honest status codes.

Every error the server returns has OpenAI's body
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``, or
the shape the request's protocol registers (:attr:`kit.server.protocol.Protocol.error_body`:
Anthropic's under ``/v1/messages``, Google's for the Gemini API); no traceback ever
reaches a client (unexpected errors are logged and reported as 500).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kit.errors import (
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    KitError,
    ModelDoesNotFitError,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailable,
)
from kit.models.resolve import InvalidModelSpec
from kit.server.protocol import Protocol, protocol_for

log = logging.getLogger("mlx_kit.server")

#: Longest error message sent (characters): a message quoting the client's input (a
#: 1 MB model name) must not send the megabyte back.
MAX_MESSAGE = 1000


def excerpt(text: object, limit: int = 80) -> str:
    """``text`` (``str()`` of it) cut to ``limit`` characters, marked with an ellipsis when
    cut: what an error message may quote of a client's input."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class ErrorDetail(BaseModel):
    """The ``error`` member of an OpenAI-shaped error body."""

    message: str = Field(description="What went wrong, in words; quotes at most a short "
                                     "excerpt of the request.")
    type: str = Field(description="invalid_request_error, authentication_error, "
                                  "permission_error, not_found_error, server_error...")
    param: str | None = Field(None, description="The request field at fault (dotted path, "
                                                "e.g. messages.0.content), if any.")
    code: str | None = Field(None, description="A machine-readable code, e.g. "
                                               "model_not_found, context_length_exceeded.")


class ErrorBody(BaseModel):
    """Every error response's body (under /v1/messages: Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` instead)."""

    error: ErrorDetail


#: The ``responses=`` of every route: the error statuses the server answers with (400
#: where FastAPI would advertise 422).
ERROR_RESPONSES = {
    400: {"model": ErrorBody, "description": "Malformed request: bad JSON, a wrong type or "
                                             "value (param names the field), nesting too deep"},
    401: {"model": ErrorBody, "description": "Missing or wrong API key"},
    403: {"model": ErrorBody, "description": "Host or Origin not allowed (a web page)"},
    404: {"model": ErrorBody, "description": "Unknown model"},
    413: {"model": ErrorBody, "description": "Body larger than --max-body-size"},
    500: {"model": ErrorBody, "description": "The server's own failure (logged)"},
}


class APIError(Exception):
    """An error to send to the client.

    Args:
        status: HTTP status (4xx for the client's mistakes, 5xx for ours).
        message: human-readable message.
        type: OpenAI error type (``invalid_request_error``, ``not_found_error``,
            ``authentication_error``, ``server_error``...).
        param: the request field at fault, if any.
        code: a machine-readable code (``model_not_found``...), if any.
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        if len(message) > MAX_MESSAGE:
            message = excerpt(message, MAX_MESSAGE)
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code)

    def body(self) -> dict:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def response(self, path: str = "", protocols: Iterable[Protocol] = ()) -> JSONResponse:
        """The error as a response in the shape of the protocol of ``path`` among
        ``protocols`` (its :attr:`~kit.server.protocol.Protocol.error_body`), else
        OpenAI's (:meth:`body`)."""
        protocol = protocol_for(path, protocols)
        shape = protocol.error_body if protocol and protocol.error_body else APIError.body
        return JSONResponse(shape(self), status_code=self.status)


_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                 413: "invalid_request_error", 422: "invalid_request_error",
                 429: "rate_limit_error"}


# Each cause in the one error tree (kit/errors.py) -> (HTTP status, error type, code).
# Looked up along the exception's MRO, so the most specific class wins; every protocol
# renders the resulting APIError in its own shape (body(), or its Protocol.error_body).
_STATUS: dict[type, tuple[int, str, str | None]] = {
    InvalidRequest: (400, "invalid_request_error", None),
    InvalidModelSpec: (400, "invalid_request_error", "invalid_model"),
    ModelNotFoundError: (404, "not_found_error", "model_not_found"),
    ModelUnavailable: (404, "not_found_error", "model_not_found"),
    ModelDoesNotFitError: (507, "server_error", "insufficient_memory"),
    ModelLoadError: (503, "server_error", "model_load_failed"),
    EngineUnavailable: (503, "server_error", None),
    ModelError: (500, "server_error", "model_load_failed"),
    EngineError: (500, "server_error", None),
    KitError: (500, "server_error", None),
}
# Causes that concern the model rather than a field of the request body.
_MODEL_CAUSES = (InvalidModelSpec, ModelNotFoundError, ModelUnavailable, ModelError,
                 ModelLoadError)


def api_error(e: KitError, fields: dict[str, str] | None = None) -> APIError:
    """The API error a client sees for ``e``, a cause from the one error tree.

    Args:
        e: the error; an ``InvalidRequest``'s ``code`` and ``field`` are kept.
        fields: the protocol's names for the engine's neutral field names (``schema`` ->
            ``response_format``...), matched on the first dotted segment; unnamed ones
            pass through unchanged.
    Returns:
        An ``APIError`` whose status, type and code come from ``_STATUS``; the message
        carries the hint in parentheses, if there is one.
    """
    status, kind, code = next(_STATUS[c] for c in type(e).__mro__ if c in _STATUS)
    message = e.message + (f" ({e.hint})" if e.hint else "")
    param: str | None = None
    if isinstance(e, InvalidRequest):
        code, param = e.code or code, e.field
        if param and fields:
            head, dot, rest = param.partition(".")
            param = fields.get(head, head) + dot + rest
    elif isinstance(e, _MODEL_CAUSES):
        param = "model"
    return APIError(status, message, type=kind, param=param, code=code)


def field_path(loc: tuple | list, body: Any, missing: bool = True) -> str | None:
    """The dotted path into ``body`` that a pydantic error ``loc`` names, without the
    union tags pydantic adds (``str``, ``other``, model names): a segment counts only where
    it indexes the input, or names the missing field at the end (``missing``: the error
    is pydantic's ``missing``; otherwise a last segment absent from an object is a union
    tag too: ``{"content": {"a": 1}}`` is ``content``, not ``content.other``).

    E.g. ``("body", "messages", 0, "content", "other", 0, "TextBlock", "text")`` ->
    ``"messages.0.content.0.text"``.
    """
    segments = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    if not isinstance(body, (dict, list)):  # no body to walk: the loc as it is
        return ".".join(str(s) for s in segments)[:200] or None
    parts: list[str] = []
    cur = body
    for i, seg in enumerate(segments):
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            parts.append(seg)
            cur = cur[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cur):
            parts.append(str(seg))
            cur = cur[seg]
        elif i == len(segments) - 1 and isinstance(cur, dict) and missing:
            parts.append(str(seg))  # a missing field
    return ".".join(parts)[:200] or None


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = field_path(first.get("loc", ()), exc.body, missing=first.get("type") == "missing")
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    msg = first.get("msg", "invalid request")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param,
                    code="invalid_value" if param else None)


def install_error_handlers(app: FastAPI, protocols: Iterable[Protocol] = ()) -> None:
    """Make every error response of ``app`` an error object in the shape of the
    request's protocol among ``protocols`` (OpenAI's for any other path)."""
    protocols = tuple(protocols)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path, protocols)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response(request.url.path, protocols)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _STATUS_TYPES.get(exc.status_code, "server_error")
        return APIError(exc.status_code, str(exc.detail), type=kind).response(
            request.url.path, protocols)


class UnexpectedErrors:
    """Outermost pure ASGI middleware: an exception no handler took is logged once, with
    its traceback, and answered with our 500 (before the response started; after, the
    connection just ends). Starlette's own 500 handler re-raises, so uvicorn logged every
    traceback a second time."""

    def __init__(self, app: ASGIApp, protocols: Iterable[Protocol] = ()) -> None:
        self.app, self.protocols = app, tuple(protocols)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unexpected error in %s %s", scope["method"], scope["path"])
            if not started:
                await APIError(500, "internal server error; see the server log",
                               type="server_error").response(scope["path"], self.protocols)(
                    scope, receive, send)
