"""``/docs``: Swagger UI served from this server's own files, never from a CDN.

The page runs in the server's origin, which the Origin guard trusts (its "try it out"
requests carry it), so a script loaded from elsewhere would get the whole API; and a CDN
does not work offline. The assets (Swagger UI 5, which renders FastAPI's OpenAPI 3.1
schema; ``swagger-ui-bundle`` on PyPI ships 4.x, which cannot) come from the
``fastapi-offline`` package (MIT), which exists to ship them; only its static files are used.
A Content-Security-Policy on the page keeps the browser from loading anything else.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from kit.server.errors import APIError

ASSETS = "/docs/assets"
#: the only files served under :data:`ASSETS` (name -> media type)
_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "favicon.png": "image/png"}
# FastAPI's page starts Swagger UI with an inline script; everything else is this origin.
CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' "
       "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; font-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _static_dir() -> Path:
    import fastapi_offline  # lazy: only a server with docs on needs it

    return Path(fastapi_offline.__file__).parent / "static"


def add_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Add ``GET /docs`` (the Swagger UI page for ``openapi_url``) and its three assets
    under ``/docs/assets/`` to ``app``. No URL in the page leaves this server.

    Raises:
        ImportError: ``fastapi-offline`` is not installed (a main dependency).
    """
    static = _static_dir()
    missing = [name for name in _FILES if not (static / name).is_file()]
    if missing:
        raise ImportError(f"fastapi-offline ships no {', '.join(missing)} in {static}")

    async def docs() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            # no badge from validator.swagger.io
            swagger_ui_parameters={"validatorUrl": None})
        page.headers["Content-Security-Policy"] = CSP
        return page

    async def asset(name: str) -> FileResponse:
        if name not in _FILES:
            raise APIError(404, f"no docs asset {name[:60]!r}", type="not_found_error")
        return FileResponse(static / name, media_type=_FILES[name],
                            headers={"Cache-Control": "public, max-age=86400"})

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{ASSETS}/{{name}}", asset, methods=["GET"], include_in_schema=False)
