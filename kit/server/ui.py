"""The status page (``/ui``, its files under ``/ui/static/``), the JSON it polls
(``/ui/data``) and ``/metrics``.

Who may read them (:func:`check_access`): with no API key, clients on this machine only
(the peer address is loopback): a server bound to the LAN with no key shows its activity to
no one else. With an API key, anyone who presents it (``Authorization: Bearer`` or
``x-api-key``, as on ``/v1``). The page's own files hold no data and are served to whoever
may reach the server when a key is set (a browser cannot send a header on navigation): the
page then asks for the key and keeps it in ``sessionStorage`` (gone when the tab closes;
never in a cookie, which a browser would send with a forged cross-site request). Host and
Origin are checked by :class:`kit.server.guard.EdgeGuard` on these routes as on every other.

Plain HTML + one script + one stylesheet, no build step, no CDN, no chart library: the two
charts are a few lines of SVG drawn by ui.js. A Content-Security-Policy keeps the page from
loading or sending anything outside this server.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from pathlib import Path

import psutil
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kit.server.auth import presented_key
from kit.server.errors import APIError
from kit.server.live import Activity
from kit.server.metrics import Metrics
from kit.server.state import ServerState

STATIC = Path(__file__).parent / "static"
#: the only files served under /ui/static/ (name -> media type)
FILES = {"ui.js": "text/javascript", "ui.css": "text/css"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _loopback_peer(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False  # a Unix socket's peer or no address: not provably this machine


def check_access(request: Request, *, data: bool = True) -> None:
    """Refuse a client that may not see the page or its data (see the module docstring).

    Args:
        data: the route returns data (``/ui/data``, ``/metrics``); False for the page's
            own files, which need no key.

    Raises:
        APIError: 403 ``not_loopback`` (no key set, peer not on this machine); 401
            ``invalid_api_key`` (a key is set and the request lacks it).
    """
    key = request.app.state.kit.api_key
    if not key:
        if not _loopback_peer(request):
            raise APIError(403, "the status page and /metrics answer only clients on this "
                           "machine when the server has no API key; start it with "
                           "--api-key-file FILE (or MLX_KIT_API_KEY) to reach them from "
                           "elsewhere",
                           type="permission_error", code="not_loopback")
        return
    if data and not hmac.compare_digest(presented_key(request.headers).encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                       type="authentication_error", code="invalid_api_key")


def wants_page(request: Request) -> bool:
    """Whether a ``GET /`` comes from a browser (its Accept names text/html), which is sent
    to the page; API clients and probes (no text/html) keep the JSON identity."""
    return "text/html" in request.headers.get("accept", "")


def add_ui(app: FastAPI, state: ServerState, metrics: Metrics, activity: Activity) -> None:
    """Add ``GET /ui``, ``/ui/static/{name}``, ``/ui/data`` and ``/metrics`` to ``app``."""

    async def page(request: Request) -> FileResponse:
        check_access(request, data=False)
        return FileResponse(STATIC / "ui.html", media_type="text/html", headers=_HEADERS)

    async def asset(request: Request, name: str) -> FileResponse:
        check_access(request, data=False)
        if name not in FILES:
            raise APIError(404, f"no status page file {name[:60]!r}", type="not_found_error")
        return FileResponse(STATIC / name, media_type=FILES[name], headers=_HEADERS)

    async def data(request: Request) -> JSONResponse:
        check_access(request)
        return JSONResponse(await ui_data(state, metrics, activity), headers=_HEADERS)

    async def scrape(request: Request) -> Response:
        check_access(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST,
                        headers={"Cache-Control": "no-store"})

    app.add_api_route("/ui", page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/static/{name}", asset, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/data", data, methods=["GET"], include_in_schema=False)
    app.add_api_route("/metrics", scrape, methods=["GET"], include_in_schema=False)


async def ui_data(state: ServerState, metrics: Metrics, activity: Activity) -> dict:
    """What the page shows, bounded (:meth:`Activity.snapshot`): ``health`` (the /health
    body), ``models`` (/v1/models' entries), ``live``/``live_total``/``samples``,
    ``totals`` (token counters since start) and ``system`` (this machine's memory, bytes:
    the reference when the engine reports no budget)."""
    health = state.health(memory=await state.engine.current_memory()).to_json()
    reg = metrics.registry
    totals = {name: int(reg.get_sample_value(f"mlx_kit_{name}_total") or 0)
              for name in ("prompt_tokens", "cached_prompt_tokens", "generated_tokens")}
    vm = psutil.virtual_memory()
    return {"now": time.time(), "health": health,
            "models": state.model_entries(await state.load_catalog()),
            **activity.snapshot(), "totals": totals,
            "system": {"total_bytes": vm.total, "available_bytes": vm.available}}
