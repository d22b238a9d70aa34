"""What the status page shows of the requests themselves: the generations running now and
samples of the recent ones (time to first token, tokens/s), both bounded; and the hook that
feeds them and :class:`~kit.server.metrics.Metrics` from every generating route
(:meth:`Activity.watch`, called by :func:`kit.server.adapter.begin`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from itertools import count, islice
from typing import Any

from kit.engine.types import Finished, ReasoningDelta, Started, TextDelta, ToolCall
from kit.server.metrics import Metrics
from kit.server.protocol import Protocol, protocol_for

#: Live generations listed at most (the rest are counted): the page stays small even with
#: thousands of queued requests.
MAX_LIVE_LISTED = 50
#: Recent generations kept as samples for the charts (about the last minutes of a busy
#: server; one sample is ~120 bytes of JSON).
MAX_SAMPLES = 600
#: Samples older than this many seconds are dropped from the page's answer.
SAMPLE_WINDOW_S = 15 * 60
#: User-Agent products of the agents we wire (first match wins), for the page's "agent"
#: column; anything else shows its first product token. Substrings, lowercase.
KNOWN_AGENTS = (("claude-cli", "Claude Code"), ("claude-code", "Claude Code"),
                ("qwen-code", "Qwen Code"), ("qwencode", "Qwen Code"),
                ("opencode", "opencode"), ("codex", "Codex"), ("gemini-cli", "Gemini CLI"),
                ("goose", "Goose"), ("zed", "Zed"), ("crush", "Crush"),
                ("continue", "Continue"), ("aider", "aider"), ("litellm", "aider"),
                ("llm/", "llm"), ("pi-coding-agent", "pi"), ("mozilla/", "browser"))
_OUTPUT = (TextDelta, ReasoningDelta, ToolCall)


def agent_name(user_agent: str) -> str:
    """A short agent name from a User-Agent header: a known agent's name, else the first
    product token (at most 40 characters), else ``unknown``."""
    lowered = user_agent.lower()
    for needle, name in KNOWN_AGENTS:
        if needle in lowered:
            return name
    first = user_agent.split(" ", 1)[0].strip()
    return first[:40] if first else "unknown"


def protocol_of(path: str, protocols: Iterable[Protocol]) -> str:
    """The label of the protocol of ``path`` among ``protocols``, or ``other``."""
    protocol = protocol_for(path, protocols)
    return protocol.label if protocol else "other"


@dataclass
class LiveRequest:
    """One generation as the page lists it (times: ``time.monotonic()`` seconds)."""

    id: str
    protocol: str
    agent: str
    model: str
    stream: bool
    arrived: float = field(default_factory=time.monotonic)
    state: str = "queued"   # queued -> running
    prompt_tokens: int = 0
    cached_tokens: int = 0
    outputs: int = 0        # output events so far (about one per token)
    first_output: float | None = None

    def public(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "protocol": self.protocol, "agent": self.agent,
                "model": self.model, "stream": self.stream, "state": self.state,
                "age_s": round(now - self.arrived, 2), "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "outputs": self.outputs,
                "ttft_s": None if self.first_output is None
                else round(self.first_output - self.arrived, 3)}


class Activity:
    """The live generations and recent samples of one app, and the metric updates.

    Lives on the event loop thread (only the request path touches it): no lock.
    """

    def __init__(self, metrics: Metrics, protocols: Iterable[Protocol] = ()) -> None:
        self.metrics = metrics
        #: the protocols a request's label comes from (:func:`protocol_of`)
        self.protocols = tuple(protocols)
        self.live: dict[int, LiveRequest] = {}
        #: how many of ``live`` are queued: kept as they change, so each arrival and end
        #: costs O(1) even with thousands queued (not a rescan of ``live``)
        self.queued = 0
        self.samples: deque[dict[str, Any]] = deque(maxlen=MAX_SAMPLES)
        self._keys = count()

    async def watch(self, scope_headers: Any, path: str, request_id: str, model: str,
                    stream: bool, starting: Awaitable[tuple[Started, AsyncIterator]]
                    ) -> tuple[Started, AsyncIterator]:
        """Await ``starting`` (:func:`kit.server.adapter.start`) with the request listed as
        queued, then return its ``Started`` and its events wrapped so that the page and the
        metrics see each output and the end. Errors pass through unchanged (counted as
        ``error``)."""
        entry = LiveRequest(request_id, protocol_of(path, self.protocols),
                            agent_name(scope_headers.get("user-agent", "")), model or "local",
                            stream)
        key = next(self._keys)
        self.live[key] = entry
        self.queued += 1
        self._gauges()
        try:
            started, events = await starting
        except asyncio.CancelledError:  # the client left while it was queued
            self._end(key, entry, "cancelled", None)
            raise
        except BaseException:
            self._end(key, entry, "error", None)
            raise
        entry.state, entry.model = "running", started.model
        self.queued -= 1
        entry.prompt_tokens, entry.cached_tokens = started.prompt_tokens, started.cached_tokens
        self.metrics.started(started.prompt_tokens, started.cached_tokens)
        self._gauges()
        return started, self._follow(key, entry, events)

    async def _follow(self, key: int, entry: LiveRequest,
                      events: AsyncIterator) -> AsyncIterator:
        fin: Finished | None = None
        outcome = "cancelled"  # the client left (the iterator was closed early)
        try:
            async with aclosing(events):
                async for ev in events:
                    if isinstance(ev, _OUTPUT):
                        entry.outputs += 1
                        if entry.first_output is None:
                            entry.first_output = time.monotonic()
                    elif isinstance(ev, Finished):
                        fin, outcome = ev, ev.finish_reason
                    yield ev
        except Exception:
            outcome = "error"
            raise
        finally:
            self._end(key, entry, outcome, fin)

    def _end(self, key: int, entry: LiveRequest, outcome: str, fin: Finished | None) -> None:
        if self.live.pop(key, None) is None:
            return
        if entry.state == "queued":
            self.queued -= 1
        self._gauges()
        now = time.monotonic()
        generated = fin.usage.completion_tokens if fin is not None else entry.outputs
        ttft = None if entry.first_output is None else entry.first_output - entry.arrived
        tpot = None
        if entry.first_output is not None and generated > 1:
            tpot = (now - entry.first_output) / (generated - 1)
        self.metrics.ended(entry.protocol, outcome, generated=generated, ttft_s=ttft,
                           tpot_s=tpot)
        if entry.state == "queued":
            return  # refused or left before it ran: no timing to plot
        self.samples.append({  # what the charts need (the page polls them every second)
            "t": round(time.time(), 2), "protocol": entry.protocol, "outcome": outcome,
            "generated_tokens": generated, "ttft_s": None if ttft is None else round(ttft, 4),
            "tokens_per_s": round(1 / tpot, 2) if tpot else None})

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(self.queued)
        self.metrics.batch_size.set(len(self.live) - self.queued)

    def snapshot(self) -> dict[str, Any]:
        """The page's view, bounded: at most :data:`MAX_LIVE_LISTED` live generations
        (oldest first) and the samples of the last :data:`SAMPLE_WINDOW_S` seconds (at
        most :data:`MAX_SAMPLES`)."""
        now, wall = time.monotonic(), time.time()
        live = islice(self.live.values(), MAX_LIVE_LISTED)  # not a copy of all
        return {"live": [e.public(now) for e in live],
                "live_total": len(self.live),
                "samples": [s for s in self.samples if wall - s["t"] <= SAMPLE_WINDOW_S]}
