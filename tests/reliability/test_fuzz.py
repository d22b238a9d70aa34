"""Fuzzing every POST route of a real server on loopback with bodies schemathesis generates
from the app's own OpenAPI schema: bodies that fit the schema (positive) and bodies that
break it (negative). The server must answer every one without a 5xx and stay alive.

Bounded: ``MLX_KIT_FUZZ_EXAMPLES`` examples per route and mode (default 8: about 100 cases); generated
token limits are capped at 4 (and set where absent) so that valid bodies cost a few decode
steps, not a context window; on /v1 routes a generated model name becomes ``local`` so
bodies reach the engine. The totals are printed (``-s``) and kept in ``FUZZ_TOTALS`` for the report.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core import NotSet
from schemathesis.generation import GenerationMode

from kit.server.app import create_app
from kit.server.state import ServerState

EXAMPLES = int(os.environ.get("MLX_KIT_FUZZ_EXAMPLES", "8"))
_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
FUZZ_TOTALS: Counter = Counter()


def _schema() -> dict:
    # built in-process: no engine is needed to describe the routes
    return create_app(ServerState(engine=None)).openapi()


SCHEMA = schemathesis.openapi.from_dict(_schema())
# /admin/shutdown is left out: its valid body stops the server the other cases need (its
# auth and shutdown are tested in tests/reliability/test_process_stop.py).
POST_ROUTES = sorted(path for path, ops in _schema()["paths"].items()
                     if "post" in ops and path != "/admin/shutdown")


def _capped(body, path: str):
    """``body`` with token limits capped at 4 (set where absent or null) and, on /v1
    routes, a generated string ``model`` replaced by ``local``, so that the rest of the
    body reaches the engine instead of stopping at a 404 for a random model name."""
    if isinstance(body, dict):
        body = dict(body)
        if path.startswith("/v1/") and isinstance(body.get("model"), str):
            body["model"] = "local"
        for key in _CAPS:  # absent or null means "up to the context window": minutes
            if _unbounded(body.get(key)):
                body[key] = 4
        if "/models/" in path:  # Gemini: the cap sits in generationConfig
            config = body.get("generationConfig")
            config = dict(config) if isinstance(config, dict) else {}
            if _unbounded(config.get("maxOutputTokens")):
                config["maxOutputTokens"] = 4
            body["generationConfig"] = config
    return body


def _unbounded(value) -> bool:
    """Whether a token limit lets a request decode past 4 tokens: absent or null (up to
    the context window: a streamed one decoded for 5-6 minutes in CI, the server's pings
    keeping httpx's read timeout from firing), or a number over 4 (floats too: a whole
    float such as 8192.0 is a valid limit)."""
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 4


def test_the_schema_lists_every_post_route():
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
            "/v1/messages/count_tokens", "/admin/swap"} <= set(POST_ROUTES)


def test_a_null_token_limit_is_capped_as_an_absent_one_is():
    """Regression: a generated ``"max_completion_tokens": null`` went to the server as is
    (up to the context window) and one fuzz case took 322-392 s of every CI run."""
    body = _capped({"model": "x", "max_tokens": None, "max_completion_tokens": 2.0,
                    "max_output_tokens": 8192.0}, "/v1/completions")
    assert body == {"model": "local", "max_tokens": 4, "max_completion_tokens": 2.0,
                    "max_output_tokens": 4}
    gemini = _capped({"generationConfig": {"maxOutputTokens": None}},
                     "/v1beta/models/{model}:generateContent")
    assert gemini["generationConfig"] == {"maxOutputTokens": 4}


# The Gemini catch-all routes (`models/{rest}`: a method we do not serve -> 404) take no
# body, so there is nothing to break in negative mode.
CASES = [(path, mode) for path in POST_ROUTES
         for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         if not (mode is GenerationMode.NEGATIVE and "{rest}" in path)]


@pytest.mark.parametrize("path,mode", CASES, ids=[f"{p}-{m.value}" for p, m in CASES])
def test_no_generated_body_gets_a_5xx(server, path, mode):
    headers = {"Content-Type": "application/json"}
    if path.startswith("/admin/"):  # reach the validation behind the admin token
        headers["Authorization"] = f"Bearer {server.admin_token()}"
    failures: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=SCHEMA[path]["POST"].as_strategy(generation_mode=mode))
    def run(case):
        body = case.body
        if isinstance(body, NotSet):
            content = b""
        elif isinstance(body, (bytes, str)):  # negative mode: not JSON at all
            content = body.encode(errors="surrogatepass") if isinstance(body, str) else body
        else:
            content = json.dumps(_capped(body, path)).encode()
        target = case.formatted_path  # path parameters (a Gemini model name) filled in
        if "{model}" in path and mode is GenerationMode.POSITIVE:
            target = path.replace("{model}", "local")  # reach the engine, as on /v1
        r = httpx.post(server.root + target, content=content, headers=headers, timeout=120)
        FUZZ_TOTALS["cases"] += 1
        FUZZ_TOTALS[f"{r.status_code // 100}xx"] += 1
        if r.status_code >= 500:
            failures.append(f"{r.status_code} {target} {content[:300]!r} -> {r.text[:300]}")

    run()
    print(f"\nfuzz {path} {mode.value}: totals so far {dict(FUZZ_TOTALS)}")
    assert not failures, "\n".join(failures[:5])
    assert server.health()["status"] == "ok"
