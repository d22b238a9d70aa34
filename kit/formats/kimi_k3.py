"""Kimi K3 XTML tool calls::

    <|open|>tools<|sep|>
    <|open|>call tool="NAME" index="1"<|sep|>
    <|open|>argument key="KEY" type="string"<|sep|>VALUE<|close|>argument<|sep|>
    <|close|>call<|sep|>
    <|close|>tools<|sep|>

(or one ``<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>`` block per call).
Kimi's encoder writes an argument's text with ``allow_special=False``, so a value may hold
the *text* of the markers as ordinary tokens; as text, only the structure tells them apart.
mlx-lm's ``kimi_k3`` parser is reused for attributes and typed values (``_parse_attrs``,
``_decode_value``); corrected here (upstream bugs):

- a value ends at a ``<|close|>argument<|sep|>`` that more structure follows (another
  argument, the call's close, the section's close), not at the first one: mlx-lm's regex cut
  ``"<|close|>argument<|sep|> is how args end"`` to ``""``;
- the section ends at the ``<|close|>tools<|sep|>`` that closes its structure;
- a response that skips the think channel (``<|open|>response<|sep|>`` straight after the
  prompt's ``<|open|>think<|sep|>``) is the answer, not reasoning: mlx-lm had no way out of
  the think state but ``<|close|>think<|sep|>`` and returned the whole answer, markup and all,
  as reasoning;
- ``parse_partial`` keeps the complete calls of a section cut by ``max_tokens``.

The structure scan is our own (no library reads XTML, and it must answer on every prefix
while the section streams in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


from kit import mlx_lm_api
from kit.formats.base import Broken, More, ScanMarks, is_cut, skip_ws, structure_end
from kit.formats.output import OutputParser

# mlx-lm's kimi_k3 parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("kimi_k3")
_decode_value = _upstream._decode_value
_parse_attrs = _upstream._parse_attrs
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start

__all__ = ["call_end", "parse_partial", "parse_tool_call", "tool_call_end", "tool_call_start"]

_SEP = "<|sep|>"
_OPEN_CALL, _CLOSE_CALL = "<|open|>call", "<|close|>call<|sep|>"
_OPEN_ARG, _CLOSE_ARG = "<|open|>argument", "<|close|>argument<|sep|>"
_OPEN_JSON, _CLOSE_JSON = "<|open|>json", "<|close|>json<|sep|>"
#: what may follow (after whitespace) a closing tag that really closes
_STRUCT = (_OPEN_ARG, _OPEN_JSON, _CLOSE_CALL, _OPEN_CALL, tool_call_end)


@dataclass
class _Call:
    attrs: str
    args: list[tuple[str, str]] = field(default_factory=list)  # (attrs, raw value)
    json: str | None = None
    closed: bool = False


class _Scan:
    """One pass over a tools section's text. ``final``: the text is complete, so its end
    closes what is open; else an open structure raises :class:`More`."""

    def __init__(self, text: str, final: bool, marks: dict[int, int] | None = None) -> None:
        self.text, self.final = text, final
        self.marks = {} if marks is None else marks  # see base.ScanMarks
        self.calls: list[_Call] = []

    def _more(self) -> int:
        if not self.final:
            raise More
        return len(self.text)

    def section(self) -> tuple[int, int]:
        t = self.text
        i = skip_ws(t, 0)
        while True:
            if t.startswith(_OPEN_CALL, i):
                i = self._call(i + len(_OPEN_CALL))
                i = skip_ws(t, i)
            elif t.startswith(tool_call_end, i):
                return i, i + len(tool_call_end)
            elif is_cut(t, i, (_OPEN_CALL, tool_call_end)):
                n = self._more()
                return n, n
            else:
                raise Broken(i)

    def _attrs(self, i: int) -> tuple[str, int]:
        j = self.text.find(_SEP, i)
        if j < 0:
            n = self._more()
            return self.text[i:], n
        return self.text[i:j], j + len(_SEP)

    def _call(self, i: int) -> int:
        t = self.text
        attrs, i = self._attrs(i)
        call = _Call(attrs)
        self.calls.append(call)
        while True:
            i = skip_ws(t, i)
            if t.startswith(_OPEN_ARG, i):
                a, i = self._attrs(i + len(_OPEN_ARG))
                value, i = self._value(i, _CLOSE_ARG)
                call.args.append((a, value))
            elif t.startswith(_OPEN_JSON, i):
                _, i = self._attrs(i + len(_OPEN_JSON))
                call.json, i = self._value(i, _CLOSE_JSON)
            elif t.startswith(_CLOSE_CALL, i):
                call.closed = True
                return i + len(_CLOSE_CALL)
            elif t.startswith(_OPEN_CALL, i) or t.startswith(tool_call_end, i):
                return i  # no close: what comes next closes it
            elif is_cut(t, i, _STRUCT):
                return self._more()
            else:
                raise Broken(i)

    def _value(self, start: int, close: str) -> tuple[str, int]:
        t = self.text
        k = max(start, self.marks.get(start, start))
        while True:
            e = t.find(close, k)
            if e < 0:
                self.marks[start] = max(k, len(t) - len(close) + 1)
                return t[start:self._more()], len(t)
            j = skip_ws(t, e + len(close))
            if is_cut(t, j, _STRUCT):
                self.marks[start] = e
                self._more()
            elif not any(t.startswith(s, j) for s in _STRUCT):
                k = e + 1  # the marker's text inside the value
                continue
            return t[start:e], e + len(close)


def call_end(text: str, marks: dict[int, int] | None = None) -> tuple[int, int] | None:
    """Where a tools section's body ends (see :data:`kit.formats.base.CallEnd`);
    ``marks``: see :class:`~kit.formats.base.ScanMarks`."""
    return structure_end(_Scan(text, final=False, marks=marks).section, text, tool_call_end)


def _record(call: _Call) -> dict:
    name = _parse_attrs(call.attrs).get("tool")
    if not name:
        raise ValueError("Kimi K3 tool call is missing the tool name attribute.")
    if call.json is not None:
        arguments = json.loads(call.json)
        if not isinstance(arguments, dict):
            raise ValueError("Kimi K3 tool call JSON block must be an object.")
    else:
        arguments = {}
        for attrs, raw in call.args:
            a = _parse_attrs(attrs)
            if a.get("key") is None:
                raise ValueError("Kimi K3 tool argument is missing its key.")
            arguments[a["key"]] = _decode_value(raw, a.get("type", "string"))
    return dict(name=name, arguments=arguments)


def _records(calls: list[_Call]) -> list[dict]:
    out = []
    for call in calls:
        try:
            out.append(_record(call))
        except ValueError:  # as mlx-lm: a bad call is skipped, the others kept
            continue
    return out


def parse_tool_call(text: str, tools: Any = None) -> list[dict]:
    """The calls of one tools section: ``[{"name", "arguments"}]``.

    Raises:
        ValueError: no well-formed call.
    """
    scan = _Scan(text, final=True)
    try:
        scan.section()
        calls = scan.calls
    except Broken:
        calls = [c for c in scan.calls if c.closed]
    out = _records(calls)
    if not out:
        raise ValueError("No tool call found.")
    return out


def parse_partial(text: str, tools: Any = None) -> list[dict]:
    """The complete calls (closed by ``<|close|>call<|sep|>``) of a section cut by
    ``max_tokens``."""
    scan = _Scan(text, final=False)
    try:
        scan.section()
    except (More, Broken):
        pass
    return _records([c for c in scan.calls if c.closed])


class KimiK3Parser(OutputParser):
    """The engine's parser whose section-end scans resume inside an open value
    (:class:`~kit.formats.base.ScanMarks`: linear time over a long value)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            marks = ScanMarks()
            self._call_end = lambda text: call_end(text, marks(text))


#: the answer channel may open straight from the think channel the prompt opened
OVERRIDES = {"transitions": {"reasoning": [("<|open|>response<|sep|>", "normal")]},
             "parser_class": KimiK3Parser}
