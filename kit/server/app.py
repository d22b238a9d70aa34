"""The FastAPI application: service routes (/, /health, /v1/models) + protocol routers."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kit import __version__
from kit.server import admin, openai_chat, openai_completions
from kit.server.errors import APIError, install_error_handlers
from kit.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    """Build the app around a started engine.

    Routes: ``GET /`` and ``GET /health`` (no auth, identify the server as mlx-kit),
    ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (API key if set), ``POST
    /admin/swap`` (admin token).
    """
    app = FastAPI(title="mlx-kit", version=__version__, docs_url=None, redoc_url=None)
    app.state.kit = state
    install_error_handlers(app)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        path = request.url.path
        needed = state.api_key if path.startswith("/v1") else \
            state.admin_token if path.startswith("/admin") else None
        if path.startswith("/admin") and not state.admin_token:
            return APIError(403, "the admin API is disabled", type="permission_error").response()
        if needed:
            given = request.headers.get("x-api-key") or ""
            auth = request.headers.get("authorization") or ""
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not hmac.compare_digest(given.encode(), needed.encode()):
                return APIError(401, "invalid or missing API key", type="authentication_error",
                                code="invalid_api_key").response()
        return await call_next(request)

    @app.get("/")
    async def root() -> dict:
        return {"service": "mlx-kit", "version": __version__}

    @app.get("/health")
    async def health() -> JSONResponse:
        body = state.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": state.model_entries()}

    app.include_router(openai_chat.router)
    app.include_router(openai_completions.router)
    app.include_router(admin.router)
    return app
