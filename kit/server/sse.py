"""Server-sent events, framed once for every protocol: sse-starlette's
``EventSourceResponse`` (a ``: ping`` comment every 15 s keeps proxies and clients from
timing out during a long prefill) fed with ``{"event"?, "data"}`` dicts."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from sse_starlette.sse import EventSourceResponse

PING_S = 15  # seconds between keep-alive comments

#: OpenAI's end of stream (chat and legacy completions).
DONE = {"data": "[DONE]"}


def data(payload: Any) -> dict[str, str]:
    """An unnamed event carrying ``payload`` as JSON (OpenAI's chunks)."""
    return {"data": json.dumps(payload)}


def event(kind: str, payload: Any) -> dict[str, str]:
    """A named event (``event: kind``) carrying ``payload`` as JSON (Anthropic, Responses)."""
    return {"event": kind, "data": json.dumps(payload)}


def response(frames: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """The streaming response for ``frames`` (dicts from :func:`data` / :func:`event`)."""
    return EventSourceResponse(frames, ping=PING_S)
