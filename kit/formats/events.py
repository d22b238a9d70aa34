"""The delta events an output parser yields as a model's text arrives: answer text (with its
tokens' log probabilities), reasoning, complete tool calls.

They live with the parsers (:mod:`kit.formats.output`) so that formats needs nothing from
the engine; :mod:`kit.engine.types` re-exports them as part of the engine's event stream.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReasoningDelta", "TextDelta", "TokenLogprob", "ToolCall"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and the most likely alternatives
    (``top``: (token text, logprob) pairs, most likely first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """The next piece of the answer text (never contains a matched stop string), with the
    log probabilities of the tokens behind it when they were asked for."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    """The next piece of the model's reasoning (text inside its think block)."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call parsed from the output.

    Attributes:
        id: call id (``call_...``), used by the tool result that answers it.
        name: function name.
        arguments: the arguments as a JSON string (OpenAI's shape).
        index: position among this response's calls (0-based).
    """

    id: str
    name: str
    arguments: str
    index: int = 0
