"""Ask an address whether an mlx-kit server is there (httpx, short timeouts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx

from kit.urls import ServerURL


@dataclass(frozen=True)
class Probe:
    """What answers at a URL.

    Attributes:
        kind: ``ours`` (an mlx-kit server, maybe still loading), ``other`` (something else
            holds the port) or ``none`` (nothing listens).
        health: our /health body when ``kind == "ours"``.
        detail: what the other thing said, for messages.
    """

    kind: Literal["ours", "other", "none"]
    health: dict[str, Any] | None = None
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.kind == "ours" and bool(self.health) and self.health.get("status") == "ok"


def probe(url: ServerURL, timeout: float = 2.0) -> Probe:
    """GET ``<root>/health`` and classify the answer. Never raises."""
    try:
        r = httpx.get(url.root + "/health", timeout=timeout)
    except httpx.ConnectError:
        return Probe("none")
    except httpx.HTTPError as e:
        return Probe("other", detail=f"no HTTP answer ({type(e).__name__})")
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("service") == "mlx-kit":
        return Probe("ours", health=body)
    server = r.headers.get("server", "unknown server")
    return Probe("other", detail=f"HTTP {r.status_code} from {server}")


def fetch_models(url: ServerURL, timeout: float = 2.0, api_key: str | None = None
                 ) -> list[dict[str, Any]] | None:
    """The server's /v1/models entries, or None if it does not answer with a list."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.v1 + "/models", timeout=timeout, headers=headers)
        data = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return data if isinstance(data, list) and data else None


def fetch_status(url: ServerURL, api_key: str | None = None, timeout: float = 2.0) -> int | None:
    """The HTTP status of GET /v1/models (e.g. 401 when a key is needed), None if no answer."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return httpx.get(url.v1 + "/models", timeout=timeout, headers=headers).status_code
    except httpx.HTTPError:
        return None
