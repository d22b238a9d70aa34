"""Every protocol the server speaks, one record each (:class:`kit.server.protocol.Protocol`):
the routes :mod:`kit.server.app` includes, and what the shared modules ask of a request's
path. Adding a protocol: its module with its ``PROTOCOL``, and one line here.

Order matters where paths overlap: the first record whose ``matches`` takes a path wins.
"""

from __future__ import annotations

from kit.server import (
    anthropic,
    gemini,
    openai_chat,
    openai_completions,
    openai_embeddings,
    openai_responses,
)
from kit.server.protocol import Protocol

PROTOCOLS: tuple[Protocol, ...] = (
    openai_chat.PROTOCOL,
    openai_completions.PROTOCOL,
    anthropic.PROTOCOL,
    openai_responses.PROTOCOL,
    gemini.PROTOCOL,
    openai_embeddings.PROTOCOL,
)
