"""Ask an address whether an mlx-kit server is there (httpx, short timeouts)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx

from kit.urls import ServerURL

if TYPE_CHECKING:
    from kit.health import HealthBody


@dataclass(frozen=True)
class Probe:
    """What answers at a URL.

    Attributes:
        kind: ``ours`` (an mlx-kit server, maybe still loading), ``other`` (something else
            holds the port) or ``none`` (nothing listens).
        health: our /health body (:class:`kit.health.HealthBody`) when ``kind == "ours"``.
        detail: what the other thing said, for messages.
    """

    kind: Literal["ours", "other", "none"]
    health: HealthBody | None = None
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.kind == "ours" and self.health is not None and self.health.ok


#: The largest body read from what answers at a URL (our /health is ~2 KiB, /v1/models a
#: few KiB per model): whatever holds the port may be another user's program.
MAX_BODY_BYTES = 4 * 2**20


def _get_json(address: str, timeout: float, headers: dict[str, str] | None = None
              ) -> tuple[httpx.Response, Any]:
    """GET ``address``: the response and its JSON body (None when it is not JSON, is over
    :data:`MAX_BODY_BYTES`, is compressed, or takes past ``timeout`` seconds in all:
    httpx's timeout is per read, so a body sent a byte at a time would never end; the
    whole read ends within ``2 * timeout``, the deadline plus one read). Bounded while it
    reads: the body is asked for uncompressed and read raw, since one compressed chunk
    could inflate to hundreds of MB before a bound after decoding saw it.

    Raises:
        httpx.HTTPError: no HTTP answer.
    """
    deadline = time.monotonic() + timeout
    headers = {**(headers or {}), "Accept-Encoding": "identity"}
    with httpx.stream("GET", address, timeout=timeout, headers=headers) as r:
        if r.headers.get("content-encoding", "identity").lower() != "identity":
            return r, None  # not asked for: not us
        body = bytearray()
        for chunk in r.iter_raw():
            body += chunk
            if len(body) > MAX_BODY_BYTES or time.monotonic() > deadline:
                return r, None
    try:
        return r, json.loads(body)
    except ValueError:
        return r, None


def probe(url: ServerURL, timeout: float = 2.0) -> Probe:
    """GET ``<root>/health`` and classify the answer. Never raises."""
    try:
        r, body = _get_json(url.root + "/health", timeout)
    except httpx.ConnectError:
        return Probe("none")
    except httpx.HTTPError as e:
        return Probe("other", detail=f"no HTTP answer ({type(e).__name__})")
    if isinstance(body, dict) and body.get("service") == "mlx-kit":
        from kit.health import parse_health  # pydantic: only once something answered

        health = parse_health(body)
        if health is None:
            return Probe("other", detail="an mlx-kit /health this version cannot read")
        return Probe("ours", health=health)
    server = r.headers.get("server", "unknown server")
    return Probe("other", detail=f"HTTP {r.status_code} from {server}")


def fetch_models(url: ServerURL, timeout: float = 2.0, api_key: str | None = None
                 ) -> list[dict[str, Any]] | None:
    """The server's /v1/models entries, or None if it does not answer with a list."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r, body = _get_json(url.v1 + "/models", timeout, headers)
        data = body.get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, AttributeError):
        return None
    return data if isinstance(data, list) and data else None


def fetch_status(url: ServerURL, api_key: str | None = None, timeout: float = 2.0) -> int | None:
    """The HTTP status of GET /v1/models (e.g. 401 when a key is needed), None if no answer.
    Only the status line and headers are read: the body, whatever its size, never is."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.stream("GET", url.v1 + "/models", timeout=timeout, headers=headers) as r:
            return r.status_code
    except httpx.HTTPError:
        return None
