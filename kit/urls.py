"""The server address every command talks to: ``--url``, else ``$MLX_KIT_URL``, else the default."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from kit.errors import ConfigError
from kit.knobs import env

DEFAULT_URL = "http://127.0.0.1:8090"
URL_ENV = "MLX_KIT_URL"


@dataclass(frozen=True)
class ServerURL:
    """A normalised server address.

    Attributes:
        root: ``scheme://host:port`` with no path and no trailing slash.
        host: host name or IP.
        port: TCP port.
    """

    root: str
    host: str
    port: int

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL, ``<root>/v1``."""
        return self.root + "/v1"


def parse_url(url: str | None = None) -> ServerURL:
    """Normalise a server URL given with or without a trailing ``/v1`` (or ``/v1/``).

    ``None`` means ``$MLX_KIT_URL`` or :data:`DEFAULT_URL`.

    Raises:
        ConfigError: the URL is not ``http(s)://host[:port][/v1]``.
    """
    raw = (url or env(URL_ENV) or DEFAULT_URL).strip()
    hint = "use http://HOST:PORT, with or without /v1, e.g. " + DEFAULT_URL
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname
    except ValueError:  # an unclosed IPv6 bracket ("http://[::1"), a bad address in one
        raise ConfigError(f"not a server URL: {raw!r}", hint=hint) from None
    path = parts.path.rstrip("/")
    if parts.scheme not in ("http", "https") or not hostname or path not in ("", "/v1"):
        raise ConfigError(f"not a server URL: {raw!r}", hint=hint)
    if parts.query or parts.fragment:
        raise ConfigError(f"server URL must not have a query or fragment: {raw!r}")
    try:
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"bad port in server URL {raw!r}: {e}") from None
    if port == 0:
        raise ConfigError(f"bad port in server URL {raw!r}: 0")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    host = hostname
    netloc_host = f"[{host}]" if ":" in host else host
    return ServerURL(root=f"{parts.scheme}://{netloc_host}:{port}", host=host, port=port)
