"""``/metrics`` (Prometheus text format) and the request path that feeds it.

Most tests run in-process with :class:`StandInEngine`, a scripted engine (a stand-in for
what takes seconds to start: the counting, the labels and the access rule are the server's,
not the engine's); one test reads the metrics of a real server on the starter model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kit.engine.types import Finished, Started, TextDelta, Usage
from kit.models.catalog import CatalogCache
from kit.models.resolve import ModelInfo
from kit.server.app import create_app
from kit.server.guard import EdgePolicy
from kit.server.live import MAX_LIVE_LISTED, Activity, agent_name
from kit.server.protocols import PROTOCOLS
from kit.server.metrics import Metrics
from kit.server.state import ServerState

LOOPBACK = ("127.0.0.1", 50123)
LAN = ("192.168.1.20", 50123)
#: every metric family the docs list (docs/server.md "Metrics"), without ``_total``
DOCUMENTED = {
    "mlx_kit_http_requests", "mlx_kit_prompt_tokens", "mlx_kit_cached_prompt_tokens",
    "mlx_kit_generated_tokens", "mlx_kit_generations", "mlx_kit_time_to_first_token_seconds",
    "mlx_kit_time_per_output_token_seconds", "mlx_kit_queue_depth", "mlx_kit_batch_size",
    "mlx_kit_model_swaps", "mlx_kit_model_reloads", "mlx_kit_model_unloads",
    "mlx_kit_engine_restarts", "mlx_kit_requests_served", "mlx_kit_engine_memory_bytes",
    "mlx_kit_model_info"}
CACHE_FAMILIES = {"mlx_kit_prompt_cache_hits", "mlx_kit_prompt_cache_misses",
                  "mlx_kit_prompt_cache_bytes"}
ADMISSION_FAMILIES = {"mlx_kit_admission", "mlx_kit_memory_ceiling_bytes",
                      "mlx_kit_memory_reserved_bytes"}
#: the engine's admission snapshot as issue 16's memory admission reports it (/health)
ADMISSION = {"clamped": 2, "rejected": 1, "deferred": 0, "reserved_bytes": 4096,
             "ceiling_bytes": 8_000_000_000, "ceiling_source": "--memory-budget"}


class StandInEngine:
    """Scripted EngineLike: every request gets ``Started`` (7 prompt tokens, 3 cached),
    then ``words`` text deltas, then ``Finished``; ``gate`` (an ``asyncio.Event`` or a
    ``threading.Event``, when set) holds each request before its ``Started`` until it is
    set, as a busy engine queue would."""

    def __init__(self, words: int = 4, prompt_cache: dict | None = None,
                 admission: dict | None = None) -> None:
        self.model_info = ModelInfo("stand-in/model", Path("/nonexistent"), 2048)
        self.state, self.error, self.ttl, self.load_seconds = "ready", None, None, 0.1
        self.error_type = self.phase = None
        self.requests_served = self.swaps = self.reloads = self.unloads = self.restarts = 0
        self.words, self.gate = words, None
        if prompt_cache is not None:
            self.prompt_cache = prompt_cache
        if admission is not None:
            self.admission = admission

    pid = 1

    def capabilities(self) -> dict:
        return {"tools": False, "reasoning": False}

    def memory(self) -> dict:
        return {"active_bytes": 3_000_000, "peak_bytes": 4_000_000, "weights_bytes": 2_000_000}

    async def current_memory(self) -> dict:
        return self.memory()

    def status(self):
        from kit.engine.status import status_of

        return status_of(self, prompt_cache=getattr(self, "prompt_cache", None),
                         admission=getattr(self, "admission", None))

    async def generate(self, request):
        if isinstance(self.gate, asyncio.Event):
            await self.gate.wait()
        while self.gate is not None and not self.gate.is_set():  # a threading.Event
            await asyncio.sleep(0.01)
        yield Started(self.model_info.id, 7, 3)
        for i in range(self.words):
            await asyncio.sleep(0)
            yield TextDelta(f"w{i} ")
        self.requests_served += 1
        yield Finished("stop", Usage(7, self.words, cached_tokens=3), self.model_info.id)


def make_app(engine=None, port: int = 8090, **state):
    """An app on ``engine`` (default a :class:`StandInEngine`) that lists no other model
    (no scan of any model cache), for Host ``testserver`` or loopback on ``port``."""
    engine = engine or StandInEngine()
    st = ServerState(engine, catalog_cache=CatalogCache(scanner=lambda: []), **state)
    return create_app(st, edge=EdgePolicy.build("127.0.0.1", port, ["testserver"]))


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


CHAT = {"model": "local", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_metric_names_are_prefixed_with_units_and_documented():
    client = TestClient(make_app(StandInEngine(prompt_cache={
        "memory_hits": 2, "disk_hits": 1, "misses": 5, "memory_bytes": 10, "disk_bytes": 20},
        admission=ADMISSION)), client=LOOPBACK)
    client.post("/v1/chat/completions", json=CHAT)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = families(r.text)
    assert set(got) == DOCUMENTED | CACHE_FAMILIES | ADMISSION_FAMILIES
    for name, family in got.items():
        assert name.startswith("mlx_kit_")
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if "bytes" in name or "seconds" in name:
            assert family.type in ("gauge", "histogram")


def test_a_chat_counts_its_route_tokens_and_timings():
    client = TestClient(make_app(StandInEngine(words=5)), client=LOOPBACK)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    client.post("/v1/chat/completions", json={**CHAT, "messages": "not a list"})
    text = client.get("/metrics").text
    assert value(text, "mlx_kit_http_requests_total", route="/v1/chat/completions",
                 method="POST", status="200") == 1
    assert value(text, "mlx_kit_http_requests_total", route="/v1/chat/completions",
                 method="POST", status="400") == 1
    assert value(text, "mlx_kit_prompt_tokens_total") == 7
    assert value(text, "mlx_kit_cached_prompt_tokens_total") == 3
    assert value(text, "mlx_kit_generated_tokens_total") == 5
    assert value(text, "mlx_kit_generations_total", protocol="openai-chat", outcome="stop") == 1
    assert value(text, "mlx_kit_time_to_first_token_seconds_count") == 1
    assert value(text, "mlx_kit_time_per_output_token_seconds_count") == 1
    assert value(text, "mlx_kit_queue_depth") == 0 and value(text, "mlx_kit_batch_size") == 0
    assert value(text, "mlx_kit_requests_served_total") == 1
    assert value(text, "mlx_kit_engine_memory_bytes", kind="weights") == 2_000_000
    assert value(text, "mlx_kit_model_info", model="stand-in/model", state="ready") == 1


def test_unmatched_paths_share_one_route_label():
    client = TestClient(make_app(), client=LOOPBACK)
    for i in range(20):
        assert client.get(f"/scan-{i}.php").status_code == 404
    text = client.get("/metrics").text
    assert value(text, "mlx_kit_http_requests_total", route="other", method="GET",
                 status="404") == 20
    routes = {s.labels["route"] for f in text_string_to_metric_families(text)
              if f.name == "mlx_kit_http_requests" for s in f.samples}
    assert not any(r.startswith("/scan") for r in routes)


def test_invented_methods_share_one_method_label():
    client = TestClient(make_app(), client=LOOPBACK)
    for i in range(20):
        client.request(f"X-SCAN{i}", "/health")
    client.request("PATCH", "/health")
    text = client.get("/metrics").text
    methods = {s.labels["method"] for f in text_string_to_metric_families(text)
               if f.name == "mlx_kit_http_requests" for s in f.samples}
    assert methods == {"other", "PATCH"}  # this GET is counted after its own answer
    assert value(text, "mlx_kit_http_requests_total", route="/health", method="other") == 20


def test_refused_requests_are_counted_with_their_status():
    client = TestClient(make_app(api_key="sekret"), client=LOOPBACK)
    assert client.get("/v1/models").status_code == 401
    assert client.get("/health", headers={"host": "evil.example"}).status_code == 403
    text = client.get("/metrics", headers={"Authorization": "Bearer sekret"}).text
    assert value(text, "mlx_kit_http_requests_total", route="/v1/models", status="401") == 1
    assert value(text, "mlx_kit_http_requests_total", route="/health", status="403") == 1


def test_prompt_cache_metrics_absent_until_the_engine_reports_them():
    client = TestClient(make_app(), client=LOOPBACK)
    assert not CACHE_FAMILIES & set(families(client.get("/metrics").text))
    engine = StandInEngine(prompt_cache={"memory_hits": 4, "disk_hits": 2, "misses": 1,
                                         "memory_bytes": 1024})
    text = TestClient(make_app(engine), client=LOOPBACK).get("/metrics").text
    assert value(text, "mlx_kit_prompt_cache_hits_total", tier="memory") == 4
    assert value(text, "mlx_kit_prompt_cache_hits_total", tier="disk") == 2
    assert value(text, "mlx_kit_prompt_cache_misses_total") == 1
    assert value(text, "mlx_kit_prompt_cache_bytes", tier="memory") == 1024
    assert value(text, "mlx_kit_prompt_cache_bytes", tier="disk") is None


def test_admission_metrics_absent_until_the_engine_reports_them():
    plain = families(TestClient(make_app(), client=LOOPBACK).get("/metrics").text)
    assert not ADMISSION_FAMILIES & set(plain)
    client = TestClient(make_app(StandInEngine(admission=ADMISSION)), client=LOOPBACK)
    text = client.get("/metrics").text
    assert value(text, "mlx_kit_admission_total", outcome="clamped") == 2
    assert value(text, "mlx_kit_admission_total", outcome="rejected") == 1
    assert value(text, "mlx_kit_memory_ceiling_bytes") == 8_000_000_000
    assert value(text, "mlx_kit_memory_reserved_bytes") == 4096


def test_two_apps_in_one_process_count_separately():
    a, b = (TestClient(make_app(), client=LOOPBACK) for _ in range(2))
    a.post("/v1/chat/completions", json=CHAT)
    assert value(a.get("/metrics").text, "mlx_kit_generated_tokens_total") == 4
    assert value(b.get("/metrics").text, "mlx_kit_generated_tokens_total") == 0


@pytest.mark.parametrize("path", ["/metrics", "/ui/data", "/ui", "/ui/static/ui.js"])
def test_without_a_key_only_clients_on_this_machine_get_in(path):
    app = make_app()
    assert TestClient(app, client=LOOPBACK).get(path).status_code == 200
    r = TestClient(app, client=LAN).get(path)
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_loopback"
    assert "--api-key" in r.json()["error"]["message"]


def test_with_a_key_data_needs_it_and_the_page_files_do_not():
    app = make_app(api_key="sekret")
    lan = TestClient(app, client=LAN)
    for path in ("/metrics", "/ui/data"):
        r = lan.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert lan.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert lan.get(path, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert lan.get(path, headers={"x-api-key": "sekret"}).status_code == 200
    page = lan.get("/ui")
    assert page.status_code == 200 and "sekret" not in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_a_foreign_origin_cannot_read_the_data():
    client = TestClient(make_app(), client=LOOPBACK)
    r = client.get("/ui/data", headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = client.get("/metrics", headers={"host": "rebound.example:8090"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"


def test_browser_root_goes_to_the_page_and_api_clients_keep_the_json():
    client = TestClient(make_app(), client=LOOPBACK)
    r = client.get("/", headers={"accept": "text/html,application/xhtml+xml"},
                   follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    assert client.get("/").json()["service"] == "mlx-kit"
    assert client.head("/", headers={"accept": "text/html"}).status_code == 200


def test_unknown_static_file_is_404_not_a_path_walk():
    client = TestClient(make_app(), client=LOOPBACK)
    for name in ("ui.html", "..%2Fui.py", "nope.js"):
        assert client.get(f"/ui/static/{name}").status_code == 404


def test_live_list_and_samples_are_bounded_and_a_queued_request_shows():
    """Many requests held in the engine queue: the page lists at most MAX_LIVE_LISTED,
    counts them all, and the queue-depth gauge sees them; once released they leave."""
    engine = StandInEngine(words=2)
    app = make_app(engine)
    activity: Activity = app.state.activity
    n = MAX_LIVE_LISTED + 10

    async def run() -> None:
        engine.gate = asyncio.Event()
        transport = httpx.ASGITransport(app=app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            tasks = [asyncio.create_task(c.post("/v1/chat/completions", json=CHAT,
                                                headers={"user-agent": "opencode/1.18"}))
                     for _ in range(n)]
            while len(activity.live) < n:
                await asyncio.sleep(0.01)
            snap = activity.snapshot()
            assert snap["live_total"] == n and len(snap["live"]) == MAX_LIVE_LISTED
            assert {e["state"] for e in snap["live"]} == {"queued"}
            assert {e["agent"] for e in snap["live"]} == {"opencode"}
            assert {e["protocol"] for e in snap["live"]} == {"openai-chat"}
            metrics = (await c.get("/metrics")).text
            assert value(metrics, "mlx_kit_queue_depth") == n
            engine.gate.set()
            assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))
            assert activity.snapshot()["live_total"] == 0
            data = (await c.get("/ui/data")).json()
            assert len(data["samples"]) == n and data["totals"]["generated_tokens"] == 2 * n

    asyncio.run(run())


class NoScan(dict):
    """The live table, refusing to be scanned: arrivals and ends must keep counts."""

    scans_allowed = False

    def values(self):
        assert self.scans_allowed, "the live table was rescanned"
        return super().values()

    def __iter__(self):
        assert self.scans_allowed, "the live table was rescanned"
        return super().__iter__()


def test_queue_gauges_keep_counts_without_rescanning_the_live_requests():
    """Regression: each arrival and end recounted every live entry (O(n^2) with thousands
    queued). Counts are kept instead, and they match a recount at every step."""
    engine = StandInEngine(words=1)
    app = make_app(engine)
    activity: Activity = app.state.activity
    activity.live = NoScan()
    n = 300

    async def run() -> None:
        engine.gate = asyncio.Event()
        transport = httpx.ASGITransport(app=app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            tasks = [asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
                     for _ in range(n)]
            while len(activity.live) < n:
                await asyncio.sleep(0.01)
            assert activity.metrics.queue_depth._value.get() == n == activity.queued
            tasks[0].cancel()  # one leaves while queued
            await asyncio.sleep(0.05)
            assert activity.queued == n - 1 and len(activity.live) == n - 1
            engine.gate.set()
            await asyncio.gather(*tasks[1:])
            assert activity.queued == 0 and len(activity.live) == 0
            activity.live.scans_allowed = True
            metrics = (await c.get("/metrics")).text
            assert value(metrics, "mlx_kit_queue_depth") == 0
            assert value(metrics, "mlx_kit_batch_size") == 0
            assert value(metrics, "mlx_kit_generations_total", protocol="openai-chat",
                         outcome="stop") == n - 1

    asyncio.run(run())


def test_a_gemini_stream_is_listed_as_streamed():
    """Gemini chooses streaming by route (:streamGenerateContent), not by a body field."""
    engine = StandInEngine(words=2)
    app = make_app(engine)
    activity: Activity = app.state.activity
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

    async def run() -> None:
        engine.gate = asyncio.Event()
        transport = httpx.ASGITransport(app=app, client=LOOPBACK)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            streamed = asyncio.create_task(c.post(
                "/v1beta/models/local:streamGenerateContent?alt=sse", json=body))
            plain = asyncio.create_task(c.post("/v1beta/models/local:generateContent",
                                               json=body))
            while len(activity.live) < 2:
                await asyncio.sleep(0.01)
            listed = {e["stream"] for e in activity.snapshot()["live"]}
            engine.gate.set()
            assert (await streamed).status_code == 200 and (await plain).status_code == 200
            assert listed == {True, False}
            assert {e["protocol"] for e in activity.snapshot()["live"]} == set()

    asyncio.run(run())


def test_a_stream_closed_early_is_counted_cancelled_and_closes_the_engine_side():
    """What a route does when its client leaves mid-stream: it closes the events iterator
    (httpx's in-process transport cannot hang up, so the close is made here)."""
    activity = Activity(Metrics(), PROTOCOLS)
    closed = []

    async def engine_events():
        try:
            for i in range(50):
                yield TextDelta(f"w{i}")
        finally:
            closed.append(True)  # the engine's side sees the cancel

    async def starting():
        return Started("m", 5, 0), engine_events()

    async def run() -> None:
        _, events = await activity.watch({}, "/v1/messages", "msg_1", "m", True, starting())
        assert activity.snapshot()["live"][0]["state"] == "running"
        assert isinstance(await anext(events), TextDelta)
        await events.aclose()

    asyncio.run(run())
    assert closed == [True] and activity.snapshot()["live_total"] == 0
    text = generate_latest(activity.metrics.registry).decode()
    assert value(text, "mlx_kit_generations_total", protocol="anthropic",
                 outcome="cancelled") == 1
    assert activity.snapshot()["samples"][0]["outcome"] == "cancelled"


@pytest.mark.parametrize("ua, name", [
    ("claude-cli/2.1.332 (external, cli)", "Claude Code"),
    ("opencode/1.18.33 ai-sdk/provider-utils/3.0", "opencode"),
    ("codex_cli_rs/0.171.0 (Debian 12; x86_64)", "Codex"),
    ("Mozilla/5.0 (X11; Linux x86_64) Chrome/140", "browser"),
    ("OpenAI/Python 1.99.0", "OpenAI/Python"),
    ("", "unknown"),
    ("x" * 500, "x" * 40)])
def test_agent_name_from_user_agent(ua, name):
    assert agent_name(ua) == name


def test_a_real_server_reports_tokens_memory_and_model(server):
    """The starter model on a real server: the numbers a user checks after one chat."""
    before = value(httpx.get(server.root + "/metrics", timeout=10).text,
                   "mlx_kit_generated_tokens_total")
    r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                   json={"model": "local", "max_tokens": 6,
                         "messages": [{"role": "user", "content": "Say hi"}]})
    assert r.status_code == 200
    generated = r.json()["usage"]["completion_tokens"]
    text = httpx.get(server.root + "/metrics", timeout=10).text
    assert value(text, "mlx_kit_generated_tokens_total") == before + generated
    assert value(text, "mlx_kit_engine_memory_bytes", kind="weights") > 10_000_000
    health = server.health()
    assert value(text, "mlx_kit_model_info", model=health["model"], state="ready") == 1
    assert value(text, "mlx_kit_time_to_first_token_seconds_count") >= 1
    assert value(text, "mlx_kit_requests_served_total") == health["requests_served"]
    cache = health.get("prompt_cache")  # once the engine reports it (issue 16)
    if isinstance(cache, dict):
        for key, tier in (("memory_hits", "memory"), ("disk_hits", "disk")):
            if key in cache:
                assert value(text, "mlx_kit_prompt_cache_hits_total", tier=tier) == cache[key]
        if "misses" in cache:
            assert value(text, "mlx_kit_prompt_cache_misses_total") == cache["misses"]


def test_docs_list_exactly_the_metrics_served():
    import re

    from tests.helpers import REPO

    text = (REPO / "docs" / "server.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    listed = {re.sub(r"_total$", "", n) for n in re.findall(r"`(mlx_kit_\w+)", section)}
    assert listed == DOCUMENTED | CACHE_FAMILIES | ADMISSION_FAMILIES


def test_a_request_that_leaves_while_queued_is_counted_cancelled_not_plotted():
    activity = Activity(Metrics(), PROTOCOLS)

    async def run() -> None:
        never = asyncio.Event()

        async def starting():
            await never.wait()  # the engine never gets to it

        task = asyncio.create_task(activity.watch({}, "/v1/chat/completions", "c1", "m",
                                                  False, starting()))
        while not activity.live:
            await asyncio.sleep(0)
        assert activity.snapshot()["live"][0]["state"] == "queued"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    snap = activity.snapshot()
    assert snap["live_total"] == 0 and snap["samples"] == []
    text = generate_latest(activity.metrics.registry).decode()
    assert value(text, "mlx_kit_generations_total", outcome="cancelled") == 1
    assert value(text, "mlx_kit_queue_depth") == 0
