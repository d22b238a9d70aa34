"""The FastAPI application: service routes (/, /health, /v1/models and one model of it) +
protocol routers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, RedirectResponse

from kit import __version__
from kit.errors import ModelNotFoundError
from kit.health import HealthBody
from kit.server import admin
from kit.server.adapter import MAX_TOKENS_HEADER
from kit.server.auth import AuthMiddleware
from kit.server.docs_ui import add_docs
from kit.server.errors import (
    ERROR_RESPONSES,
    UnexpectedErrors,
    api_error,
    install_error_handlers,
)
from kit.server.guard import EdgeGuard, EdgePolicy
from kit.server.live import Activity
from kit.server.metrics import Metrics, RequestCounter
from kit.server.protocols import PROTOCOLS
from kit.server.state import ServerState
from kit.server.ui import add_ui, wants_page


def create_app(state: ServerState, on_shutdown: Callable[[], None] | None = None, *,
               edge: EdgePolicy | None = None, docs: bool = False) -> FastAPI:
    """Build the app around a started engine.

    Args:
        state: the server state (engine, keys, aliases).
        on_shutdown: runs when the server shuts down gracefully.
        edge: the Host/Origin/body-size policy (default: loopback names only, port 8090,
            32 MiB bodies).
        docs: serve ``/openapi.json`` and ``/docs``.

    Routes: ``GET /`` and ``GET /health`` (no auth, identify the server as mlx-kit),
    ``GET /v1/models`` (+ ``/{id}``), ``POST /v1/chat/completions``, ``POST /v1/completions``,
    ``POST /v1/messages`` (+ ``/count_tokens``), ``POST /v1/responses`` (API key if set),
    ``POST /admin/swap`` (admin token), ``GET /ui`` (the status page; ``GET /`` from a
    browser redirects there) and ``GET /metrics`` (:mod:`kit.server.ui`: loopback only
    unless an API key is set); every route refuses a foreign Host or Origin.
    """
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if on_shutdown is not None:  # graceful shutdown (SIGINT/SIGTERM), before uvicorn
            on_shutdown()            # re-raises the signal and the process ends

    edge = edge or EdgePolicy(port=8090)
    app = FastAPI(title="mlx-kit", version=__version__, lifespan=lifespan,
                  description="OpenAI- and Anthropic-compatible API of a local MLX server. "
                              "Errors are 4xx/5xx with an `{\"error\": {...}}` body "
                              "(Anthropic's shape under /v1/messages), never 422.",
                  docs_url=None, redoc_url=None,  # /docs: kit.server.docs_ui, no CDN
                  openapi_url="/openapi.json" if docs else None)
    app.state.kit = state
    app.state.metrics = metrics = Metrics(state)
    app.state.activity = Activity(metrics, PROTOCOLS)  # read by adapter.begin
    install_error_handlers(app, PROTOCOLS)

    # Innermost first (add_middleware wraps): the key check, CORS for explicitly allowed
    # origins (it answers their preflight, which carries no key), the Host/Origin/depth
    # guard, and outermost the one place a stray exception is logged.
    app.add_middleware(AuthMiddleware, state=state, protocols=PROTOCOLS)
    explicit = sorted(edge.origins)
    if explicit:
        app.add_middleware(CORSMiddleware, allow_origins=explicit,
                           allow_methods=["GET", "POST", "HEAD", "OPTIONS"],
                           allow_headers=["*"], max_age=600,
                           expose_headers=[MAX_TOKENS_HEADER])  # a memory clamp, readable
    app.add_middleware(EdgeGuard, policy=edge, protocols=PROTOCOLS)
    routers = (*(p.router for p in PROTOCOLS), admin.router)
    app.add_middleware(RequestCounter, metrics=metrics, routes=lambda: [
        *app.router.routes, *(r for router in routers for r in router.routes)])
    app.add_middleware(UnexpectedErrors, protocols=PROTOCOLS)

    @app.get("/")
    async def root(request: Request) -> dict:
        if request.method == "GET" and wants_page(request):  # a browser: the status page
            return RedirectResponse("/ui", status_code=303)
        return {"service": "mlx-kit", "version": __version__}

    # Claude Code probes HEAD / first; one operation in the schema (no duplicate id)
    app.add_api_route("/", root, methods=["HEAD"], include_in_schema=False)

    @app.get("/health", response_model=HealthBody,
             responses={503: {"model": HealthBody, "description": "Not ready: loading, "
                              "failed, restarting or stopped (the same body)."}})
    async def health() -> JSONResponse:
        """Whether the server is mlx-kit and ready, and the engine's state
        (:class:`kit.health.HealthBody`). No auth."""
        body = state.health(memory=await state.engine.current_memory())
        return JSONResponse(body.to_json(), status_code=200 if body.ok else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        # the catalog's last snapshot: rescans run in a background thread, never here
        return {"object": "list", "data": state.model_entries(await state.load_catalog())}

    @app.get("/v1/models/{model_id:path}", responses=ERROR_RESPONSES)
    async def model(model_id: str) -> dict:
        """One entry of ``/v1/models`` by id (OpenAI's retrieve-model: ``local`` or any
        listed id); 404 ``model_not_found`` for any other."""
        entries = state.model_entries(await state.load_catalog())
        entry = next((e for e in entries if e["id"] == model_id), None)
        if entry is None:
            raise api_error(ModelNotFoundError(model_id[:200], [e["id"] for e in entries]))
        return entry

    for router in routers:
        app.include_router(router, responses=ERROR_RESPONSES)
    add_ui(app, state, metrics, app.state.activity)
    app.openapi = lambda: _openapi(app)
    if docs:
        add_docs(app)
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema without the 422 it adds to every route with a body: validation
    errors are 400s here (documented by ERROR_RESPONSES)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version,
                             description=app.description, routes=app.routes)
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema
