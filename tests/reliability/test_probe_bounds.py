"""Issue 25 item 4: what answers at a server's port may be another local user's program
(a free loopback port is anyone's to bind). `status`, `launch` and `harness install` read
its /health and /v1/models: a body that never ends, or that drips a byte at a time, must
not fill memory or hang them. A real HTTP server on loopback plays the stranger."""

from __future__ import annotations

import functools
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kit.probe import MAX_BODY_BYTES, fetch_models, fetch_status, probe
from kit.urls import parse_url


@functools.cache
def bomb() -> bytes:
    """64 MiB of JSON-looking text gzipped to ~64 KiB: a client that inflates it holds 16
    times the probe's bound (the test's memory limit is 4 times it). Built on first use,
    not at import: collecting this file must not cost every lane the compression."""
    return gzip.compress(b'{"service": "mlx-kit", "data": ["' + b"x" * 2**26, 9)


@pytest.fixture
def stranger():
    """Answers every GET 200 with a JSON-looking body: ``mode`` "endless" (1 MiB chunks,
    forever) or "drip" (a byte every 0.2 s). Yields (url, sent bytes counter, set_mode)."""
    state = {"mode": "endless", "sent": 0}
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            if state["mode"] == "gzip":
                self.send_header("content-encoding", "gzip")
                self.send_header("content-length", str(len(bomb())))
                self.end_headers()
                self.wfile.write(bomb())
                state["sent"] += len(bomb())
                return
            self.end_headers()
            try:
                self.wfile.write(b'{"service": "mlx-kit", "data": ["')
                while not stop.is_set():
                    if state["mode"] == "endless":
                        self.wfile.write(b"x" * 2**20)
                        state["sent"] += 2**20
                    else:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.2)
            except OSError:  # the client gave up: what the test wants
                pass

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield parse_url(f"http://127.0.0.1:{httpd.server_address[1]}"), state
    stop.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("mode", ["endless", "drip", "gzip"])
def test_a_stranger_at_the_port_cannot_fill_memory_or_hang_a_probe(stranger, mode):
    """Before: httpx read the whole body (endless: memory grew until killed), and its
    timeout is per read (drip: never ended); the bound was checked after inflating each
    chunk (gzip: a ~64 KiB reply inflates to 64 MiB), and fetch_status read any body whole."""
    import tracemalloc

    url, state = stranger
    state["mode"] = mode
    if mode == "gzip":
        bomb()  # built before memory is traced: its 64 MiB input is not the probe's
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        assert fetch_models(url, timeout=2.0) is None
        found = probe(url, timeout=2.0)
        assert fetch_status(url, timeout=2.0) == 200  # the status only: no body read
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.kind == "other"
    assert time.monotonic() - t0 < 30
    assert peak < 4 * MAX_BODY_BYTES
