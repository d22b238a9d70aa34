"""The HTTP edge: which Host and Origin a request may carry, and how deep its JSON may nest.

Browsers are the threat: a web page can make the user's browser send requests to
127.0.0.1 (CSRF), and with DNS rebinding it can even read the answers, because its own
domain then resolves to 127.0.0.1. Both are stopped here, before any route runs:

* **Host** must name this server: a loopback name (``localhost``, ``*.localhost``,
  127.0.0.0/8, ``::1``), the bound address, this machine's addresses and names for a
  wildcard bind, or a name given with ``--allow-host`` / ``MLX_KIT_HOSTS``. A rebinding page
  sends its own domain as Host, so it is refused (403) on every route, ``/health`` included.
  The patterns follow Django's ``ALLOWED_HOSTS``: ``.example.com`` is the domain and its
  subdomains, ``*`` turns the check off.
* **Origin** (browsers send it on cross-origin requests and on every POST) must be absent,
  this server's own origin (a page it served: ``/docs``), or listed with ``--allow-origin`` /
  ``MLX_KIT_ORIGINS`` (the way ``OLLAMA_ORIGINS`` works; ``*`` allows every origin). CLI
  agents (Node/Bun fetch, Rust and Python HTTP clients) send no Origin. A page on another
  local port is foreign too: loopback is not a trust boundary between local apps.
* **JSON nesting** deeper than :data:`MAX_JSON_DEPTH` is a 400 before the body is parsed:
  deep nesting made pydantic and the pickling to the engine hit Python's recursion limit.

* **Body size** over ``--max-body-size`` is a 413, at once when Content-Length says so,
  else as soon as the bytes received pass it (chunked bodies too): a 20 MB body is never
  read whole. Own code rather than Starlette's ``RequestBodyLimitMiddleware`` (FastAPI's
  ``max_body_size``), which answers a plain-text 413 in place of any response we send.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from urllib.parse import urlsplit

import anyio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kit.server.errors import APIError, excerpt
from kit.server.protocol import Protocol

#: Default request-body limit in bytes (``--max-body-size``): 32 MiB, so that one image of
#: the default --max-image-bytes (20 MiB, ~27 MiB in base64) fits beside a long context; a
#: coding agent's largest text request (200k tokens of context, tool schemas) is ~1 MB.
DEFAULT_MAX_BODY = 32 * 1024 * 1024

#: Deepest JSON nesting accepted (arrays and objects), serde_json's default. Real requests
#: nest ~10 levels (messages / content blocks / tool schemas); Python's recursion limit
#: breaks somewhere under 1000.
MAX_JSON_DEPTH = 128

WILDCARD_BINDS = ("0.0.0.0", "::", "")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _strip_port(host: str) -> str:
    """``[::1]:8090`` -> ``::1``, ``Example.COM.:80`` -> ``example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback_name(host: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761: they resolve to loopback), 127.0.0.0/8, ::1."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def machine_names() -> set[str]:
    """This machine's host names and the addresses of its interfaces (for a wildcard bind:
    clients on the LAN name the server by one of these)."""
    import psutil

    names = {socket.gethostname().lower()}
    names.add(socket.getfqdn().lower())
    names.add(socket.gethostname().lower().split(".")[0] + ".local")  # mDNS
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                names.add(a.address.split("%")[0].lower())  # drop an IPv6 zone (%eth0)
    return {n.rstrip(".") for n in names if n}


@dataclass(frozen=True)
class EdgePolicy:
    """What the edge lets in.

    Attributes:
        port: the port we listen on (a page we served has Origin ``http://HOST:port``).
        hosts: extra allowed Host names (lowercase, no port): the bound address, this
            machine's names for a wildcard bind, ``--allow-host`` values; ``.example.com``
            matches the domain and its subdomains, ``*`` anything.
        origins: allowed foreign origins, ``scheme://host[:port]`` normalised by
            :func:`normalize_origin`; ``*`` allows every origin.
        max_body_size: largest request body in bytes.
        max_json_depth: deepest JSON nesting accepted.
    """

    port: int
    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    max_body_size: int = DEFAULT_MAX_BODY
    max_json_depth: int = MAX_JSON_DEPTH
    _any_host: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_any_host", "*" in self.hosts)

    @classmethod
    def build(cls, bind: str, port: int, allow_hosts: Iterable[str] = (),
              allow_origins: Iterable[str] = (),
              max_body_size: int = DEFAULT_MAX_BODY) -> EdgePolicy:
        """The policy for a server bound to ``bind``:``port``.

        Raises:
            ValueError: an ``allow_origins`` entry is not ``scheme://host[:port]`` or ``*``.
        """
        hosts = set()
        for h in (h.strip().lower() for h in allow_hosts):
            hosts.add(h if h == "*" or h.startswith(".") else _strip_port(h))
        if bind in WILDCARD_BINDS:
            hosts |= machine_names()
        else:
            hosts.add(_strip_port(bind))
        hosts.discard("")
        origins = {normalize_origin(o) for o in allow_origins if o.strip()}
        return cls(port=port, hosts=frozenset(hosts), origins=frozenset(origins),
                   max_body_size=max_body_size)

    def host_allowed(self, host: str) -> bool:
        """Whether a Host header value (port included or not) names this server."""
        name = _strip_port(host)
        if self._any_host or is_loopback_name(name) or name in self.hosts:
            return True
        return any(h.startswith(".") and (name == h[1:] or name.endswith(h))
                   for h in self.hosts)

    def origin_allowed(self, origin: str) -> bool:
        """Whether a request carrying ``Origin: origin`` may go on: our own origin (a page
        this server served) or one listed explicitly."""
        if "*" in self.origins:
            return True
        try:
            normal = normalize_origin(origin)
        except ValueError:
            return False  # "null" (sandboxed pages, file://) and garbage
        if normal in self.origins:
            return True
        parts = urlsplit(normal)
        port = parts.port or _DEFAULT_PORTS["http"]  # normalised: no port means 80
        return (parts.scheme == "http" and port == self.port
                and self.host_allowed(parts.hostname or ""))


def normalize_origin(origin: str) -> str:
    """``HTTP://Example.com:80/`` -> ``http://example.com``; ``*`` stays ``*``.

    Raises:
        ValueError: not ``scheme://host[:port]``.
    """
    origin = origin.strip()
    if origin == "*":
        return origin
    parts = urlsplit(origin)
    if not parts.scheme or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"not an origin (scheme://host[:port]): {excerpt(origin)}")
    port = parts.port  # raises ValueError on a bad port
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS.get(parts.scheme.lower()):
        return f"{parts.scheme.lower()}://{host}"
    return f"{parts.scheme.lower()}://{host}:{port}"


# A JSON string with its escapes (the unrolled form: no backtracking per character).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether the JSON text ``body`` nests arrays/objects deeper than ``limit``.

    Own code: no library checks depth without parsing (and parsing is what breaks). Strings
    are removed first (brackets inside them do not count); the rest is C-speed except one
    pass over the brackets. Invalid JSON is left to the parser's 400.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the usual case: too few brackets to nest that deep
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS).translate(_STEP)
    # depth after each bracket = running sum of +1 (open) / -1 (close)
    return max(accumulate(b - 1 for b in brackets), default=0) > limit


class EdgeGuard:
    """Pure ASGI middleware enforcing :class:`EdgePolicy` and the JSON depth limit; it
    reads the body (through FastAPI's size limit, below it on the way in) and hands it on
    unchanged, then passes the receive channel through (so the routes still see a client
    hang up)."""

    def __init__(self, app: ASGIApp, policy: EdgePolicy,
                 protocols: tuple[Protocol, ...] = ()) -> None:
        self.app, self.policy, self.protocols = app, policy, protocols

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope["path"]
        error = self._check_headers(headers)
        if error is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body = await _read_body(receive, headers, self.policy.max_body_size)
            if body is None:  # the client left before sending it all: nobody to answer
                return
            if isinstance(body, int):
                error = APIError(413, f"the request body is larger than the server's limit "
                                 f"of {body} bytes (--max-body-size)",
                                 code="request_too_large")
            else:
                if await self._too_deep(body):
                    error = APIError(400, "the request body nests JSON deeper than "
                                     f"{self.policy.max_json_depth} levels",
                                     code="json_too_deep")
                else:
                    receive = _replay(body, receive)
        if error is not None:
            await error.response(path, self.protocols)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_headers(self, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if host is not None and not self.policy.host_allowed(host):
            return APIError(403, f"Host {excerpt(host)!r} is not this server; a web page may "
                            "be trying to reach it (DNS rebinding). Start the server with "
                            "--allow-host NAME to allow a name", type="permission_error",
                            code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin):
            return APIError(403, f"requests from the web origin {excerpt(origin)!r} are not "
                            "allowed; start the server with --allow-origin ORIGIN (or "
                            "MLX_KIT_ORIGINS) to allow one", type="permission_error",
                            code="origin_not_allowed")
        return None

    async def _too_deep(self, body: bytes) -> bool:
        limit = self.policy.max_json_depth
        if len(body) < 1 << 20:
            return json_depth_exceeds(body, limit)
        # up to --max-body-size of brackets takes ~1 s: off the event loop
        return await anyio.to_thread.run_sync(json_depth_exceeds, body, limit)


async def _read_body(receive: Receive, headers: Headers, limit: int) -> bytes | int | None:
    """The whole body; ``limit`` (an int) when it is larger, found before reading more than
    ``limit`` bytes plus one chunk; None when the client disconnected first."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return limit
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return limit
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then http.disconnect when the client hangs up

    return replay
