"""Kimi K2 / K2.5 / K2.6 tool calls::

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
    ...
    <|tool_calls_section_end|>

(without the newlines)

The call id is ``functions.NAME:IDX`` (Kimi's templates require it back in the next turn).
mlx-lm's ``kimi_k2`` parser is reused for one call's header and arguments
(``_parse_single_tool``); corrected here (upstream bug): a call's end is its
``<|tool_call_end|>`` *outside the JSON arguments' strings*, and the section's end likewise:
mlx-lm split the calls at the first ``<|tool_call_end|>``, so an argument that quotes the
marker (``"stop at <|tool_call_end|> please"``) was cut into invalid JSON, returned as a
string. The JSON-string-aware scan is :class:`~kit.formats.base.JsonMarkerEnd`. Also:
``parse_partial`` keeps the complete calls of a section cut by ``max_tokens``.
"""

from __future__ import annotations

import logging
from typing import Any


from kit import mlx_lm_api
from kit.formats.base import JsonMarkerEnd
from kit.formats.output import OutputParser

# mlx-lm's kimi_k2 parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("kimi_k2")
_parse_single_tool = _upstream._parse_single_tool
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start
_mlx_parse = _upstream.parse_tool_call

__all__ = ["call_end", "parse_partial", "parse_tool_call", "tool_call_end", "tool_call_start"]

log = logging.getLogger("mlx_kit.engine")

_BEGIN, _END = "<|tool_call_begin|>", "<|tool_call_end|>"


def call_end(text: str) -> tuple[int, int] | None:
    """The section ends at its end marker outside a JSON string (see
    :data:`kit.formats.base.CallEnd`)."""
    return JsonMarkerEnd(tool_call_end)(text)


def _segments(text: str) -> list[tuple[str, bool]]:
    """Each call's text in a section (after ``<|tool_call_begin|>``, up to its
    ``<|tool_call_end|>``) and whether that end was seen."""
    out, pos = [], 0
    while (b := text.find(_BEGIN, pos)) >= 0:
        start = b + len(_BEGIN)
        end = JsonMarkerEnd(_END)(text[start:])
        if end is None:
            out.append((text[start:], False))
            break
        out.append((text[start:start + end[0]], True))
        pos = start + end[1]
    return out


def parse_tool_call(text: str, tools: Any = None) -> list[dict]:
    """The calls of one section: ``[{"id", "name", "arguments"}]``.

    Raises:
        ValueError: a call has no ``NAME:IDX<|tool_call_argument_begin|>`` header.
    """
    done = [seg for seg, closed in _segments(text) if closed]
    if not done:
        return _mlx_parse(text, tools)
    return [_parse_single_tool(seg) for seg in done]


def parse_partial(text: str, tools: Any = None) -> list[dict]:
    """The complete calls of a section cut by ``max_tokens`` (each closed by its
    ``<|tool_call_end|>``)."""
    calls = []
    for seg, closed in _segments(text):
        if closed:
            try:
                calls.append(_parse_single_tool(seg))
            except ValueError as e:
                log.warning("could not parse a call of a cut section (%s); dropped", e)
    return calls


class KimiK2Parser(OutputParser):
    """The engine's parser with one resuming :class:`~kit.formats.base.JsonMarkerEnd`
    for section ends (linear time over a long section)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            self._call_end = JsonMarkerEnd(tool_call_end)


OVERRIDES = {"parser_class": KimiK2Parser}
