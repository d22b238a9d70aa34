"""Browsers kept out (issue 11 item 3: DNS rebinding): a foreign Host or Origin is refused
on every route of a real server, loopback names and the server's own pages still work, and
origins allowed with --allow-origin / MLX_KIT_ORIGINS get proper CORS answers."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import (anthropic_for, clean_env, free_port, openai_for, run_kit,
                           spawn_server, start_server, stop, wait_health)

CHAT = {"model": "local", "max_tokens": 2,
        "messages": [{"role": "user", "content": "Say hi"}]}
MESSAGES = {"model": "local", "max_tokens": 2,
            "messages": [{"role": "user", "content": "Say hi"}]}


def test_foreign_host_is_refused_on_every_route(server):
    evil = {"Host": "evil.example"}
    for method, path, body in [("GET", "/", None), ("HEAD", "/", None),
                               ("GET", "/health", None), ("GET", "/v1/models", None),
                               ("POST", "/v1/chat/completions", CHAT),
                               ("POST", "/v1/responses", {"model": "local", "input": "hi"}),
                               ("GET", "/openapi.json", None)]:
        r = httpx.request(method, server.root + path, json=body, headers=evil, timeout=30)
        assert r.status_code == 403, (path, r.status_code)
        if method != "HEAD":
            assert r.json()["error"]["code"] == "host_not_allowed", path
    r = httpx.post(server.v1 + "/messages", json=MESSAGES, headers=evil, timeout=30)
    assert r.status_code == 403
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "permission_error"
    # a rebinding domain with our port, and a look-alike of localhost, too
    for host in (f"evil.example:{server.port}", "localhost.evil.example", "127.0.0.1.nip.io"):
        r = httpx.get(server.root + "/health", headers={"Host": host}, timeout=10)
        assert r.status_code == 403, host


def test_loopback_names_are_accepted(server):
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}",
                 "127.0.0.2", f"[::1]:{server.port}", "LocalHost.", "app.localhost"):
        r = httpx.get(server.root + "/health", headers={"Host": host}, timeout=10)
        assert r.status_code == 200, host
        assert r.json()["service"] == "mlx-kit"


def test_foreign_origin_is_refused(server):
    for origin in ("http://evil.example", f"http://evil.example:{server.port}",
                   "http://localhost:3000", "null", "https://127.0.0.1"):
        r = httpx.post(server.v1 + "/chat/completions", json=CHAT, timeout=30,
                       headers={"Origin": origin})
        assert r.status_code == 403, origin
        assert r.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        r = httpx.get(server.root + "/health", headers={"Origin": origin}, timeout=10)
        assert r.status_code == 403, origin
    # no permissive CORS: a preflight from a foreign page is refused too
    r = httpx.options(server.v1 + "/chat/completions", timeout=10,
                      headers={"Origin": "http://evil.example",
                               "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_the_servers_own_pages_may_call_it(server):
    """/docs' "try it out" sends Origin: <this server>: allowed, like same-origin."""
    for origin in (server.root, f"http://localhost:{server.port}"):
        r = httpx.post(server.v1 + "/chat/completions", json=CHAT, timeout=60,
                       headers={"Origin": origin})
        assert r.status_code == 200, origin
        assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_official_sdks_send_no_origin_and_pass(server):
    c = openai_for(server, timeout=60)
    assert c.chat.completions.create(**CHAT).choices[0].message.role == "assistant"
    a = anthropic_for(server, timeout=60)
    assert a.messages.create(**MESSAGES).role == "assistant"


@pytest.fixture(scope="module")
def open_server(hf_home, tmp_path_factory):
    """A server with an allowed origin by flag, one by MLX_KIT_ORIGINS, an extra Host name
    by flag and one by MLX_KIT_HOSTS."""
    s = start_server(tmp_path_factory.mktemp("home-open"), hf_home, "--temperature", "0",
                     "--allow-origin", "http://localhost:5173", "--allow-host", ".mine.test",
                     log_level=None, MLX_KIT_ORIGINS="https://app.example, http://x.test:8000",
                     MLX_KIT_HOSTS="env-host.test")
    yield s
    stop(s)


def test_allowed_origin_gets_cors_answers(open_server):
    s = open_server
    for origin in ("http://localhost:5173", "https://app.example", "http://x.test:8000"):
        pre = httpx.options(s.v1 + "/chat/completions", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200, origin
        assert pre.headers["access-control-allow-origin"] == origin
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        r = httpx.post(s.v1 + "/chat/completions", json=CHAT, timeout=60,
                       headers={"Origin": origin})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == origin
    # everything else stays out, and nothing says "*"
    r = httpx.post(s.v1 + "/chat/completions", json=CHAT, timeout=30,
                   headers={"Origin": "https://app.example.evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(s.v1 + "/chat/completions", timeout=10, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 403


def test_allowed_host_names_are_accepted(open_server):
    s = open_server
    for host in ("mine.test", "api.mine.test:443", "env-host.test"):
        r = httpx.get(s.root + "/health", headers={"Host": host}, timeout=10)
        assert r.status_code == 200, host
    assert httpx.get(s.root + "/health", headers={"Host": "mine.test.evil"},
                     timeout=10).status_code == 403


def test_a_bad_allowed_origin_is_a_clear_startup_error(tmp_path):
    r = run_kit(clean_env(tmp_path), "serve", "--port", str(free_port()),
                "--allow-origin", "localhost:5173/path", timeout=60)
    assert r.returncode != 0
    assert "--allow-origin" in r.stderr and "Traceback" not in r.stderr


def test_wildcard_bind_accepts_this_machines_names_only(hf_home, tmp_path):
    """0.0.0.0 (with its required key): Host may be a loopback name or one of this
    machine's names and addresses; others are refused. /docs is off off-loopback."""
    import socket

    import psutil

    s = spawn_server(tmp_path, hf_home, "--host", "0.0.0.0", "--api-key", "k", log_level=None)
    port = s.port
    try:
        wait_health(s.root, s.proc)
        addresses = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                     if a.family == socket.AF_INET]
        for host in ["localhost", socket.gethostname(), *addresses]:
            r = httpx.get(s.root + "/health", headers={"Host": f"{host}:{port}"}, timeout=10)
            assert r.status_code == 200, host
        assert httpx.get(s.root + "/health", headers={"Host": "evil.example"},
                         timeout=10).status_code == 403
        assert httpx.get(s.root + "/openapi.json", timeout=10).status_code == 404
    finally:
        stop(s)
