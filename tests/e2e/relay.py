"""A recording relay for agent tests: it stands between an agent and the real server on
loopback, forwards every request byte for byte and keeps each request's method, path and
JSON body, so a test can assert what the agent sent (e.g. that no billing-header block
reached the server). Our own code because nothing off the shelf records bodies while
streaming SSE back unchanged in ~40 lines; stdlib http.server plus httpx, one thread per
connection."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

#: Headers the relay does not pass on: hop-by-hop ones, and the length/encoding that
#: httpx has already undone (the relay answers HTTP/1.0 and closes after each response).
_SKIP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
         "host", "accept-encoding"}


class Relay:
    """Forwards ``http://127.0.0.1:<port>`` to ``upstream`` (a server root).

    Attributes:
        url: the relay's root, to give the agent instead of the server's.
        requests: ``(method, path, body)`` per request received, body parsed as JSON
            (None when it is empty or not JSON), in arrival order.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, str, Any]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: the server logs requests
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                relay.requests.append((self.command, self.path, parsed))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _SKIP}
                with httpx.Client(timeout=None) as client, client.stream(
                        self.command, relay.upstream + self.path, content=body,
                        headers=headers) as r:
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() not in _SKIP:
                            self.send_header(k, v)
                    self.end_headers()
                    for chunk in r.iter_bytes():
                        self.wfile.write(chunk)
                        self.wfile.flush()

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def bodies(self, path_prefix: str) -> list[Any]:
        """The JSON bodies of the requests whose path starts with ``path_prefix``."""
        return [b for _, p, b in self.requests if p.startswith(path_prefix)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
