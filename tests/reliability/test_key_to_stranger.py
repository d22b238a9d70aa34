"""Issue 25 (review finding): `launch` and `harness install` sent MLX_KIT_API_KEY to
whatever answered at the server's loopback port. A free port is any local user's to bind,
and /health is easy to fake, so the key went to a stranger. Now the key goes only where
the pid /health names is a process of the user's own that listens on that port
(kit/key_guard.py). A real HTTP server on loopback plays the stranger; the CLI runs as a
real `python -m kit` in a throwaway HOME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kit.key_guard import why_not_send_key
from kit.urls import parse_url
from tests.helpers import clean_env, flat, require_binary, run_kit

KEY = "sekret-for-strangers"


@pytest.fixture
def stranger():
    """A server that answers /health as mlx-kit would, claiming ``state["pid"]``, and
    records the Authorization headers it was sent. Yields (url, state)."""
    state: dict = {"pid": os.getpid(), "seen": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["seen"].append(self.headers.get("authorization"))
            if self.path == "/health":
                body = {"service": "mlx-kit", "status": "ok", "model_state": "ready",
                        "model": "mlx-kit/SmolLM2-135M-Instruct", "pid": state["pid"]}
            else:
                body = {"object": "list", "data": [{
                    "id": "local", "object": "model", "name": "local",
                    "model": "mlx-kit/SmolLM2-135M-Instruct", "context_window": 8192,
                    "max_tokens": 2048, "capabilities": {"tools": False, "reasoning": False,
                                                       "vision": False}}]}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield parse_url(f"http://127.0.0.1:{httpd.server_address[1]}"), state
    httpd.shutdown()
    httpd.server_close()


def test_the_key_may_go_to_a_process_of_ours_that_listens_on_the_port(stranger):
    url, _ = stranger  # this test's own process listens there
    assert why_not_send_key(url, os.getpid()) is None


def test_a_health_that_names_a_process_not_listening_there_gets_no_key(stranger):
    url, _ = stranger
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as other:
        try:
            why = why_not_send_key(url, other.pid)  # ours, but it holds no such port
        finally:
            other.kill()
    assert why and f"does not listen on port {url.port}" in why
    assert "names no process" in why_not_send_key(url, None)
    assert "not a process of yours" in why_not_send_key(url, 2**22 + 12345)  # no such pid


def test_a_remote_url_is_the_users_choice():
    assert why_not_send_key(parse_url("http://192.0.2.7:8090"), None) is None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run a process as nobody")
def test_a_process_of_another_user_gets_no_key():
    code = ("import http.server, socketserver, sys;"
            "s = http.server.HTTPServer(('127.0.0.1', 0), http.server.BaseHTTPRequestHandler);"
            "print(s.server_address[1], flush=True); s.serve_forever()")
    other = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                              sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        why = why_not_send_key(parse_url(f"http://127.0.0.1:{port}"), other.pid)
    finally:
        other.kill()
        other.wait()
    assert why and "runs as another user" in why


@pytest.mark.agent
def test_launch_refuses_to_send_the_key_to_a_stranger_at_the_port(stranger, tmp_path):
    """Before: launch's key check (GET /v1/models with the key) and then the agent sent
    it to the stranger. The stranger claims a pid of ours that does not listen there."""
    require_binary("pi")  # launch finds the agent before it looks at the server
    url, state = stranger
    state["pid"] = os.getppid()  # pytest's parent: ours, not listening on that port
    r = run_kit(clean_env(tmp_path, MLX_KIT_API_KEY=KEY, PATH=os.environ["PATH"]), "launch",
                "pi", "--url", url.v1, "--", "-p", "hi", timeout=60,
                stdin=subprocess.DEVNULL)
    said = flat(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"not sending your API key to {url.root}" in said, said
    assert "Traceback" not in r.stderr
    assert f"Bearer {KEY}" not in state["seen"]


def test_harness_install_bakes_the_model_list_without_sending_the_key_to_a_stranger(
        stranger, tmp_path):
    url, state = stranger
    state["pid"] = os.getppid()
    r = run_kit(clean_env(tmp_path, MLX_KIT_API_KEY=KEY), "harness", "install", "opencode",
                "--url", url.v1, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert state["seen"], "the stranger was never asked anything"
    assert f"Bearer {KEY}" not in state["seen"]
