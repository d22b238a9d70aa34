"""The FastAPI application: service routes (/, /health, /v1/models) + protocol routers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kit import __version__
from kit.server import admin, anthropic, openai_chat, openai_completions, openai_responses
from kit.server import gemini
from kit.server.auth import AuthMiddleware
from kit.server.errors import install_error_handlers
from kit.server.state import ServerState


def create_app(state: ServerState, on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """Build the app around a started engine.

    ``on_shutdown`` runs when the server shuts down gracefully.

    Routes: ``GET /`` and ``GET /health`` (no auth, identify the server as mlx-kit),
    ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
    ``POST /v1/messages`` (+ ``/count_tokens``), ``POST /v1/responses`` (API key if set),
    ``POST /admin/swap`` (admin token).
    """
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if on_shutdown is not None:  # graceful shutdown (SIGINT/SIGTERM), before uvicorn
            on_shutdown()            # re-raises the signal and the process ends

    app = FastAPI(title="mlx-kit", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.kit = state
    install_error_handlers(app)

    app.add_middleware(AuthMiddleware, state=state)

    @app.api_route("/", methods=["GET", "HEAD"])  # Claude Code probes HEAD / first
    async def root() -> dict:
        return {"service": "mlx-kit", "version": __version__}

    @app.get("/health")
    async def health() -> JSONResponse:
        body = state.health(memory=await state.engine.current_memory())
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": state.model_entries()}

    app.include_router(openai_chat.router)
    app.include_router(openai_completions.router)
    app.include_router(anthropic.router)
    app.include_router(openai_responses.router)
    app.include_router(gemini.router)
    app.include_router(admin.router)
    return app
