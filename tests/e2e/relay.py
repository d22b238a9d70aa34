"""A recording relay for agent tests: it stands between an agent and the real server on
loopback, forwards every request byte for byte and keeps each request's method, path and
JSON body, so a test can assert what the agent sent (e.g. that no billing-header block
reached the server), and the start of each answer, where our server's request id is (so a
benchmark can pair a request body with the server's log line for it). Our own code because
nothing off the shelf records bodies while streaming SSE back unchanged in a few dozen lines;
stdlib http.server plus httpx, one thread per connection."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

#: Headers the relay does not pass on: hop-by-hop ones, and the length/encoding that
#: httpx has already undone (the relay answers HTTP/1.0 and closes after each response).
_SKIP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
         "host", "accept-encoding"}
#: How much of each answer's body the relay keeps (`Exchange.head`): the request id is in
#: the first object of every protocol's answer, streamed or not.
HEAD_BYTES = 4096
#: Our server's request id in an answer: ``"id"`` (``"responseId"`` on the Gemini API) set
#: to a prefix (``chatcmpl-``, ``msg_``, ``resp_``, ... or none) and 24 hex digits, as
#: ``kit.server.translate.new_id`` makes them; the first such field is the request's.
_ID = re.compile(rb'"(?:id|responseId)"\s*:\s*"([A-Za-z]*[-_]?[0-9a-f]{24})"')


@dataclass
class Exchange:
    """One request through the relay and the start of its answer.

    Attributes:
        method, path, body: as in `Relay.requests`.
        status: the server's HTTP status (None until it answered).
        head: the answer body's first `HEAD_BYTES` bytes, as they were streamed.
    """

    method: str
    path: str
    body: Any
    status: int | None = None
    head: bytearray = field(default_factory=bytearray)

    @property
    def response_id(self) -> str | None:
        """Our server's id for this request (the one its log lines start with), read from
        the answer's first ``"id"``; None when the answer has none (an error, a GET)."""
        m = _ID.search(self.head)
        return m.group(1).decode() if m else None


class Relay:
    """Forwards ``http://127.0.0.1:<port>`` to ``upstream`` (a server root).

    Attributes:
        url: the relay's root, to give the agent instead of the server's.
        requests: ``(method, path, body)`` per request received, body parsed as JSON
            (None when it is empty or not JSON), in arrival order.
        exchanges: the same requests as `Exchange` records, each with the start of its
            answer (and so the server's request id: `Exchange.response_id`).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
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
                exchange = Exchange(self.command, self.path, parsed)
                relay.exchanges.append(exchange)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _SKIP}
                with httpx.Client(timeout=None) as client, client.stream(
                        self.command, relay.upstream + self.path, content=body,
                        headers=headers) as r:
                    exchange.status = r.status_code
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() not in _SKIP:
                            self.send_header(k, v)
                    self.end_headers()
                    try:
                        for chunk in r.iter_bytes():
                            if len(exchange.head) < HEAD_BYTES:
                                exchange.head += chunk[:HEAD_BYTES - len(exchange.head)]
                            self.wfile.write(chunk)
                            self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the agent hung up: closing the upstream stream tells the server

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def requests(self) -> list[tuple[str, str, Any]]:
        """``(method, path, body)`` of each exchange, in arrival order."""
        return [(ex.method, ex.path, ex.body) for ex in self.exchanges]

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
