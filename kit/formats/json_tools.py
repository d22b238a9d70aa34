"""Hermes-style JSON tool calls (Qwen2.5/Qwen3, SmolLM3, ...):
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

mlx-lm's ``json_tools`` parser is right about the body (``json.loads`` of it), so it is
reused. Corrected here:

- the call ends at the first ``</tool_call>`` *outside a JSON string* (what
  :func:`kit.formats.base.json_marker_end` finds; :class:`JsonMarkerEnd` finds it in linear
  time on a streamed call); mlx-lm ends it at the first ``</tool_call>`` anywhere,
  so an argument that quotes the marker (code or docs about
  the format) cuts the call short and the rest leaks into the answer (upstream bug);
- the whitespace the template writes around ``<think>``/``</think>`` and before
  ``<tool_call>`` is not part of the reasoning or the answer
  (:class:`~kit.engine.separators.SeparatorParser`; mlx-lm returns it).
"""

from __future__ import annotations

import re
from typing import Any

from mlx_lm.tool_parsers.json_tools import parse_tool_call, tool_call_end, tool_call_start

from kit.engine.separators import SeparatorParser

__all__ = ["JsonMarkerEnd", "call_end", "parse_tool_call", "tool_call_end", "tool_call_start"]

_INSIDE = re.compile(r'["\\]')


class JsonMarkerEnd:
    """:func:`kit.formats.base.json_marker_end` (the call ends at the first ``end`` marker
    outside a JSON string) that resumes: fed the growing text of a call, as the engine does
    token by token, it goes on from where it stopped, so a long call costs linear time, not
    quadratic (a 64,000-character argument: 22 s of scanning with json_marker_end, see
    bench/toolcall_scan.py). A text that does not extend the last one starts over, so one
    instance serves one parser's calls in turn; answers are json_marker_end's (the tests
    compare them on every prefix). Written here: no library scans for a marker outside
    JSON strings, and regex jumps keep the Python loop to quotes and marker candidates."""

    def __init__(self, end: str) -> None:
        self.end = end
        self._outside = re.compile('"|' + re.escape(end[0]))
        self._text, self._i, self._in_str = "", 0, False

    def __call__(self, text: str) -> tuple[int, int] | None:
        if not text.startswith(self._text):
            self._i, self._in_str = 0, False
        self._text = text
        i, in_str, n, end = self._i, self._in_str, len(text), self.end
        while True:
            m = (_INSIDE if in_str else self._outside).search(text, i)
            if m is None:
                i = n
                break
            j = m.start()
            if in_str and text[j] == "\\":
                if j + 1 >= n:  # the escaped character has not arrived
                    i = j
                    break
                i = j + 2
            elif text[j] == '"':
                i, in_str = j + 1, not in_str
            elif text.startswith(end, j):
                self._i, self._in_str = j, False
                return j, j + len(end)
            elif end.startswith(text[j:]):  # maybe the marker, not all here yet
                i = j
                break
            else:
                i = j + 1
        self._i, self._in_str = i, in_str
        return None


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call's body ends: the first ``</tool_call>`` outside a JSON string (see
    :data:`kit.formats.base.CallEnd`)."""
    return JsonMarkerEnd(tool_call_end)(text)


class HermesParser(SeparatorParser):
    """:class:`~kit.engine.separators.SeparatorParser` whose call ends are found by one
    resuming :class:`JsonMarkerEnd` (linear time over a long call)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            self._call_end = JsonMarkerEnd(tool_call_end)


OVERRIDES = {"parser_class": HermesParser}
