"""``/metrics``: the server's Prometheus metrics (prometheus_client), one registry per app.

Two kinds of numbers:

* **Counted here** as requests pass (:class:`Metrics`): HTTP requests by route and status
  (:class:`RequestCounter`, an ASGI middleware), tokens, time to first token and time per
  output token as the client sees them, and the queue depth and batch size the server
  sees (requests waiting for the engine's ``Started`` / generating now).
* **Read at scrape time** from the engine (:class:`EngineCollector`): memory, swaps,
  restarts, reloads, unloads, the loaded model, and when the engine reports them the prompt
  cache's hits (the ``prompt_cache`` key of ``/health``: ``memory_hits``, ``disk_hits``,
  ``misses``, ``memory_bytes``, ``disk_bytes``) and memory admission's counters and ceiling
  (``admission``); absent keys are left out.

A registry of its own per app, never prometheus_client's global one: tests start several
apps in one process, and a global registry refuses a second metric of the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from kit.server.state import ServerState

# No ``*_created`` series (the time each counter was made): a second series per counter
# that Prometheus' text format does not need; process-wide, and this process serves one app.
disable_created_metrics()

PREFIX = "mlx_kit_"
#: Time to first token, seconds: 10 ms (a cached prompt on a GPU) to 2 min (a long prompt
#: prefilled on a CPU).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: Time per output token, seconds: 1000 tok/s down to 1 tok/s.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.0)
#: A route label for every path no route matched (scanners, typos): the label's values stay
#: bounded by the app's routes.
OTHER_ROUTE = "other"
#: The method label's values: the methods HTTP defines that clients send (RFC 9110);
#: anything else a client writes (h11 accepts any token) counts as :data:`OTHER_METHOD`, so
#: a client cannot grow the label set.
KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})
OTHER_METHOD = "other"
#: The prompt cache keys read from the engine (``/health``'s ``prompt_cache``).
_CACHE_HITS = {"memory_hits": "memory", "disk_hits": "disk"}
_CACHE_BYTES = {"memory_bytes": "memory", "disk_bytes": "disk"}
_MEMORY = {"active_bytes": "active", "peak_bytes": "peak", "weights_bytes": "weights"}
#: metric name (``_total`` added) -> (the engine's attribute, help)
_ENGINE_COUNTERS = {
    "model_swaps": ("swaps", "model swaps done"),
    "model_reloads": ("reloads", "model reloads after an idle unload"),
    "model_unloads": ("unloads", "model unloads after the idle TTL"),
    "engine_restarts": ("restarts", "engine processes replaced after one died"),
    "requests_served": ("requests_served", "generations the engine finished")}


class Metrics:
    """The metric objects of one app and the updates the request path makes.

    Attributes:
        registry: what ``/metrics`` renders (its own, see the module docstring).
    """

    def __init__(self, state: ServerState | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            PREFIX + "http_requests", "HTTP requests answered, by route template, method "
            "and status", ["route", "method", "status"], registry=r)
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "prompt tokens of started generations", registry=r)
        self.cached_tokens = Counter(
            PREFIX + "cached_prompt_tokens", "prompt tokens served from the prompt cache "
            "(part of mlx_kit_prompt_tokens_total)", registry=r)
        self.generated_tokens = Counter(
            PREFIX + "generated_tokens", "tokens generated (reasoning included)", registry=r)
        self.generations = Counter(
            PREFIX + "generations", "generations ended, by protocol and how they ended "
            "(stop, length, tool_calls, cancelled, error)", ["protocol", "outcome"],
            registry=r)
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "from the request reaching the engine "
            "queue to its first output (queue wait and prefill)", buckets=TTFT_BUCKETS,
            registry=r)
        self.tpot = Histogram(
            PREFIX + "time_per_output_token_seconds", "mean time between output tokens "
            "after the first, per generation", buckets=TPOT_BUCKETS, registry=r)
        self.queue_depth = Gauge(
            PREFIX + "queue_depth", "generations waiting for the engine (queued, not "
            "started)", registry=r)
        self.batch_size = Gauge(
            PREFIX + "batch_size", "generations the engine is decoding now", registry=r)
        if state is not None:
            r.register(EngineCollector(state))

    def started(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A generation started (the engine sent ``Started``): count its prompt."""
        self.prompt_tokens.inc(max(prompt_tokens, 0))
        self.cached_tokens.inc(max(cached_tokens, 0))

    def ended(self, protocol: str, outcome: str, *, generated: int, ttft_s: float | None,
              tpot_s: float | None) -> None:
        """A generation ended; ``generated`` tokens, its time to first output and mean time
        per output token in seconds (None: it produced no output / one token)."""
        self.generations.labels(protocol, outcome).inc()
        self.generated_tokens.inc(max(generated, 0))
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)


class EngineCollector(Collector):
    """The engine's state as metrics, read when ``/metrics`` is scraped (the engine's own
    counters: no copy that could drift). Never blocks: the engine's last known values."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []  # unknown until the engine reports (the prompt cache's keys may be absent)

    def collect(self) -> Iterator[Metric]:
        engine = self.state.engine
        if engine is None:
            return
        status = engine.status()
        for name, (key, doc) in _ENGINE_COUNTERS.items():
            yield _counter(name, doc, getattr(status, key))
        memory = status.memory.model_dump()
        g = GaugeMetricFamily(PREFIX + "engine_memory_bytes", "mlx allocator in the "
                              "engine process (its last report)", labels=["kind"])
        for key, kind in _MEMORY.items():
            if isinstance(memory.get(key), (int, float)):
                g.add_metric([kind], memory[key])
        yield g
        info = GaugeMetricFamily(PREFIX + "model_info", "the model behind `local` (1) and "
                                 "its state", labels=["model", "state"])
        info.add_metric([str(self.state.model_id), status.state], 1)
        yield info
        yield from prompt_cache_metrics(status.prompt_cache)
        yield from admission_metrics(status.admission)
        yield from draft_metrics(status.draft)


def draft_metrics(draft: Any) -> Iterator[Metric]:
    """Speculative decoding's counters (``/health``'s ``draft``): proposals drafted and
    accepted, and the acceptance; nothing without ``--draft-model``."""
    if draft is None:
        return
    yield _counter("draft_tokens", "tokens the draft model proposed and the model checked",
                   draft.drafted)
    yield _counter("draft_accepted_tokens", "draft proposals the model kept", draft.accepted)
    if draft.acceptance is not None:
        yield GaugeMetricFamily(PREFIX + "draft_acceptance", "accepted / drafted since "
                                "start", value=draft.acceptance)


def admission_metrics(snapshot: Any) -> Iterator[Metric]:
    """Memory admission's numbers from the engine's ``admission`` snapshot (``/health``:
    ``clamped``, ``rejected``, ``deferred``, ``reserved_bytes``, ``ceiling_bytes``); nothing
    for None or keys it lacks."""
    snap = _dict(snapshot)
    outcomes = CounterMetricFamily(PREFIX + "admission", "requests memory admission "
                                   "clamped (max_tokens lowered), deferred (waited for room) "
                                   "or rejected", labels=["outcome"])
    found = False
    for key in ("clamped", "deferred", "rejected"):
        if _number(snap.get(key)):
            outcomes.add_metric([key], snap[key])
            found = True
    if found:
        yield outcomes
    if _number(snap.get("ceiling_bytes")):
        yield GaugeMetricFamily(PREFIX + "memory_ceiling_bytes", "the most memory the "
                                "engine lets weights, KV caches and prompt caches use",
                                value=snap["ceiling_bytes"])
    if _number(snap.get("reserved_bytes")):
        yield GaugeMetricFamily(PREFIX + "memory_reserved_bytes", "bytes running requests "
                                "reserved for their KV caches", value=snap["reserved_bytes"])


def prompt_cache_metrics(snapshot: Any) -> Iterator[Metric]:
    """The prompt cache's counters from the engine's ``prompt_cache`` snapshot (a dict with
    any of ``memory_hits``, ``disk_hits``, ``misses``, ``memory_bytes``, ``disk_bytes``);
    nothing for None or keys it lacks."""
    snap = _dict(snapshot)
    hits = CounterMetricFamily(PREFIX + "prompt_cache_hits", "requests whose prompt "
                               "reused a cached prefix, by where it was found",
                               labels=["tier"])
    if _by_tier(hits, _CACHE_HITS, snap):
        yield hits
    if _number(snap.get("misses")):
        yield _counter("prompt_cache_misses", "requests with no cached prefix",
                       snap["misses"])
    size = GaugeMetricFamily(PREFIX + "prompt_cache_bytes", "bytes the prompt cache holds",
                             labels=["tier"])
    if _by_tier(size, _CACHE_BYTES, snap):
        yield size


def _counter(name: str, doc: str, value: Any) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value if _number(value) else 0)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def method_label(scope: Scope) -> str:
    """The request's method as a label value: one of :data:`KNOWN_METHODS`, or
    :data:`OTHER_METHOD` for whatever else the client sent."""
    method = scope.get("method")
    return method if method in KNOWN_METHODS else OTHER_METHOD


class RequestCounter:
    """Pure ASGI middleware: counts every HTTP response in ``mlx_kit_http_requests_total``
    by the matched route's path template (``/v1/chat/completions``; :data:`OTHER_ROUTE` for
    none, so a scanner's random paths cannot grow the label set), method (one of
    :data:`KNOWN_METHODS` or :data:`OTHER_METHOD`) and status (the server's own codes).
    Outside the Host/Origin guard and the key check, so their refusals count too. Own code:
    prometheus_client has no ASGI request counter, and starlette-exporter /
    prometheus-fastapi-instrumentator would add a dependency and their own metric names for
    these few lines.

    Args:
        routes: returns the app's routes (a flat list of Starlette routes with a ``path``;
            others are skipped), for requests refused before the router chose one.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Callable[[], Iterable]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]  # what an exception with no response becomes (UnexpectedErrors)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.http_requests.labels(self._route(scope), method_label(scope),
                                              str(status[0])).inc()

    def _route(self, scope: Scope) -> str:
        chosen = getattr(scope.get("route"), "path", None)  # set by the router when it ran
        if isinstance(chosen, str):
            return chosen
        from starlette.routing import Match

        for route in self.routes():
            path = getattr(route, "path", None)
            if isinstance(path, str) and route.matches(scope)[0] != Match.NONE:
                return path  # PARTIAL: the path matched, the method did not (a 405)
        return OTHER_ROUTE


def _by_tier(family: Any, keys: dict[str, str], snap: dict) -> bool:
    """Add to ``family`` one sample per ``tier`` whose snapshot ``key`` holds a number
    (``keys``: snapshot key -> tier label); whether any was added."""
    found = False
    for key, tier in keys.items():
        if _number(snap.get(key)):
            family.add_metric([tier], snap[key])
            found = True
    return found
