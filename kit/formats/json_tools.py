"""Hermes-style JSON tool calls (Qwen2.5/Qwen3, SmolLM3, ...):
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

mlx-lm's ``json_tools`` parser is right about the body (``json.loads`` of it), so it is
reused. Corrected here:

- the call ends at the first ``</tool_call>`` *outside a JSON string* (what
  :class:`kit.formats.base.JsonMarkerEnd` finds, in linear time on a streamed call);
  mlx-lm ends it at the first ``</tool_call>`` anywhere, so an argument that quotes the
  marker (code or docs about the format) cuts the call short and the rest leaks into the
  answer (upstream bug);
- the whitespace the template writes around ``<think>``/``</think>`` and before
  ``<tool_call>`` is not part of the reasoning or the answer
  (:class:`~kit.formats.separators.SeparatorParser`; mlx-lm returns it).
"""

from __future__ import annotations

from typing import Any


from kit import mlx_lm_api
from kit.formats.base import JsonMarkerEnd
from kit.formats.separators import SeparatorParser

# mlx-lm's json_tools parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("json_tools")
parse_tool_call = _upstream.parse_tool_call
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start

__all__ = ["call_end", "parse_tool_call", "tool_call_end", "tool_call_start"]


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call's body ends: the first ``</tool_call>`` outside a JSON string (see
    :data:`kit.formats.base.CallEnd`)."""
    return JsonMarkerEnd(tool_call_end)(text)


class HermesParser(SeparatorParser):
    """:class:`~kit.formats.separators.SeparatorParser` whose call ends are found by one
    resuming :class:`~kit.formats.base.JsonMarkerEnd` (linear time over a long call)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            self._call_end = JsonMarkerEnd(tool_call_end)


OVERRIDES = {"parser_class": HermesParser}
