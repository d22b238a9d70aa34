"""Bounded input at the edge (issue 11 item 4, part of 6): a body over --max-body-size is a
413 before the server reads it all, JSON nested too deep is a 400 naming the limit (it was a
RecursionError while pickling the request to the engine), errors quote only an excerpt of
the input, and /openapi.json documents the 400 error shape. All against a real server."""

from __future__ import annotations

import json
import socket
import time

import httpx

LIMIT = 32 * 1024 * 1024  # the default --max-body-size


def _raw(server, head: str, *chunks: bytes, timeout: float = 30) -> tuple[int, dict, float]:
    """Send ``head`` and ``chunks`` on a raw socket, then read the response: (status, JSON
    body, seconds from the last byte sent to the response). The body is never finished,
    so an answer proves the server did not wait for it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(head.encode())
        for c in chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed early: fine
        sent = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
    took = time.monotonic() - sent
    head_bytes, body = data.split(b"\r\n\r\n", 1)
    return int(head_bytes.split()[1]), json.loads(body[:_length(data)]), took


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_declared_40mb_body_is_refused_before_it_is_sent(server):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {40_000_000}\r\n\r\n")
    status, body, took = _raw(server, head, b'{"model": "local", "messages": [')
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert str(LIMIT) in body["error"]["message"]
    assert took < 5


def test_chunked_body_over_the_limit_is_refused_while_streaming(server):
    """No Content-Length (chunked): refused once the bytes received pass the limit, with
    the rest of the body (and its final chunk) never sent."""
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    mib = b"x" * (1 << 20)
    chunk = f"{len(mib):x}\r\n".encode() + mib + b"\r\n"
    status, body, took = _raw(server, head, *[chunk] * 33)  # 33 MiB of a 40 MB body
    assert status == 413
    assert body["type"] == "error" and "--max-body-size" in body["error"]["message"]
    assert took < 5
    assert server.health()["status"] == "ok"


def test_deep_json_nesting_is_400_naming_the_limit(server):
    deep = '{"model": "local", "max_tokens": 2, "messages": [{"role": "user", ' \
           '"content": "hi"}], "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for path in ("/chat/completions", "/responses", "/messages"):
        r = httpx.post(server.v1 + path, content=deep, timeout=30,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400, path
        assert "deeper than 128 levels" in r.text
    # brackets inside strings are text, not nesting
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "max_tokens": 2,
        "messages": [{"role": "user", "content": "[" * 100 + "{" * 100}]})
    assert r.status_code == 200
    assert server.health()["status"] == "ok"


def test_nesting_under_the_limit_reaches_the_engine(server):
    """60 levels (in chat_template_kwargs, which travels to the engine) is served: under the
    body's limit (128) and the one for free JSON inside a field (64, kit.server.content)."""
    nested: object = "leaf"
    for _ in range(60):
        nested = [nested]
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": "local", "max_tokens": 2, "chat_template_kwargs": {"deep": nested},
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text[:300]


def test_error_messages_quote_only_an_excerpt(server):
    huge = "m" * 1_000_000
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": huge, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert 400 <= r.status_code < 500
    assert len(r.content) < 4000
    r = httpx.get(server.root + "/health", headers={"Host": "h" * 5000}, timeout=10)
    assert r.status_code == 403 and len(r.content) < 1000


def test_openapi_documents_the_400_error_shape(server):
    schema = httpx.get(server.root + "/openapi.json", timeout=10).json()
    posts = {p: ops["post"] for p, ops in schema["paths"].items() if "post" in ops}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
            "/v1/messages/count_tokens"} <= set(posts)
    for path, op in posts.items():
        assert "422" not in op["responses"], path
        ref = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorBody"), path
        assert "413" in op["responses"] and "403" in op["responses"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert {"message", "type", "param", "code"} <= set(detail["properties"])
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert list(schema["paths"]["/"]) == ["get"]  # HEAD / is served but not an operation
    assert httpx.head(server.root + "/", timeout=10).status_code == 200
    docs = httpx.get(server.root + "/docs", timeout=10)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
