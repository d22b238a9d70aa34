"""GLM-4.5/4.6/4.7 tool calls::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

(GLM-4.5 puts a newline after the name and after each tag; the values themselves are
written as they are, strings raw, everything else as JSON). mlx-lm's ``glm47`` parser is
reused for bodies without ``<arg_key>`` (its JSON and plain-text fallbacks) and for value
deserialisation; corrected here (upstream bugs):

- a string value keeps its whitespace: mlx-lm ``strip()``s every value, but the template
  writes ``<arg_value>{{ v }}</arg_value>`` with no padding, so ``"  two  spaces\\n"`` is data;
- a value whose ``</arg_value>`` is missing ends at ``</tool_call>`` (or at the next
  ``<arg_key>...</arg_key><arg_value>``); mlx-lm's regex dropped that argument;
- the call ends at the ``</tool_call>`` that closes its structure: inside a value (which
  ends at its ``</arg_value>``) marker text such as ``</tool_call>`` or ``<arg_key>`` is
  data; mlx-lm ended the call at the first ``</tool_call>`` and lost the rest;
- a string type reached through ``anyOf``/``oneOf`` or a type list keeps the text as
  written (mlx-lm deserialised ``"3"`` to 3 there);
- the template's separator whitespace is dropped (:class:`~kit.formats.separators.
  SeparatorParser`).

The structure scan is our own (no library parses this markup, and it must answer on every
prefix while the call streams in); ``regex``'s partial matching tells a cut lookahead.
"""

from __future__ import annotations

from typing import Any

import regex

from kit import mlx_lm_api
from kit.formats.base import Broken, More, ScanMarks, schema_types, structure_end
from kit.formats.separators import SeparatorParser

# mlx-lm's glm47 parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("glm47")
_deserialize = _upstream._deserialize
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start
_mlx_parse = _upstream.parse_tool_call

__all__ = ["call_end", "parse_tool_call", "tool_call_end", "tool_call_start"]

_KEY, _END_KEY = "<arg_key>", "</arg_key>"
_VALUE, _END_VALUE = "<arg_value>", "</arg_value>"
#: between tags: whitespace, or the two characters ``\n`` that some outputs write
_GAP = regex.compile(r"(?:\s|\\n)*")
#: where a value may end: its closer, or (closer missing) the call's end or the next key
_VALUE_END = regex.compile(r"</arg_value>|</tool_call>|<arg_key>")
#: a next argument, which ends a value whose </arg_value> is missing
_NEXT_ARG = regex.compile(r"<arg_key>[^<]*</arg_key>(?:\s|\\n)*<arg_value>")


class _Scan:
    """One pass over a call's text (after ``<tool_call>``). ``final``: the text is
    complete, so its end closes what is open; else an open structure raises More."""

    def __init__(self, text: str, final: bool, marks: dict[int, int] | None = None) -> None:
        self.text, self.final = text, final
        self.marks = {} if marks is None else marks  # see base.ScanMarks
        self.name: str | None = None
        self.args: list[tuple[str, str]] = []
        self.structured = False  # the body has <arg_key> markup

    def _more(self) -> int:
        if not self.final:
            raise More
        return len(self.text)

    def _gap(self, i: int) -> int:
        m = _GAP.match(self.text, i)
        j = m.end() if m else i
        if j == len(self.text) or (self.text[j] == "\\" and j + 1 == len(self.text)):
            self._more()
        return j

    def call(self) -> tuple[int, int]:
        """(body end, resume) of the call."""
        t = self.text
        k = t.find(_KEY)
        e = t.find(tool_call_end, 0, k if k >= 0 else len(t))
        if k < 0 or e >= 0:  # no arguments in markup: the first </tool_call> ends it
            if e < 0:
                n = self._more()
                return n, n
            return e, e + len(tool_call_end)
        self.name, self.structured = t[:k].strip(), True
        i = k
        while True:
            i = self._gap(i)
            if t.startswith(_KEY, i):
                i, closes_call = self._argument(i + len(_KEY))
                if closes_call:
                    return i, i + len(tool_call_end)
            elif t.startswith(tool_call_end, i):
                return i, i + len(tool_call_end)
            elif any(len(t) - i < len(s) and s.startswith(t[i:]) for s in (_KEY, tool_call_end)):
                n = self._more()
                return n, n
            else:
                raise Broken(i)

    def _argument(self, i: int) -> tuple[int, bool]:
        """Reads ``KEY</arg_key><arg_value>VALUE[</arg_value>]`` from ``i``; (where the
        scan goes on, whether the value's end is the call's ``</tool_call>``)."""
        t = self.text
        e = t.find(_END_KEY, i)
        if e < 0:
            self._more()
            raise Broken(i)  # the output ended inside a key
        key = t[i:e].strip()
        j = self._gap(e + len(_END_KEY))
        if not t.startswith(_VALUE, j):
            if len(t) - j < len(_VALUE) and _VALUE.startswith(t[j:]):
                self._more()
            raise Broken(j)
        start = j + len(_VALUE)
        k = max(start, self.marks.get(start, start))
        while True:
            m = _VALUE_END.search(t, k)
            if m is None:
                self.marks[start] = max(k, len(t) - len(_END_VALUE) + 1)
                self.args.append((key, t[start:self._more()]))
                return len(t), False
            tag = m.group()
            if tag == _END_VALUE:
                self.args.append((key, t[start:m.start()]))
                return m.end(), False
            if tag == tool_call_end:  # inside an unclosed value: ends it if the call ends
                j = _GAP.match(t, m.end()).end()
                if j == len(t) or (len(t) - j < len(tool_call_start)
                                   and tool_call_start.startswith(t[j:])):
                    self.marks[start] = m.start()
                    self._more()  # undecided until more text (final: the end decides)
                elif not t.startswith(tool_call_start, j):
                    k = m.start() + 1  # the marker's text inside the value
                    continue
            else:  # <arg_key>: a next argument, if a whole one follows
                after = _NEXT_ARG.match(t, m.start(), partial=True)
                if after is not None and after.partial:
                    self.marks[start] = m.start()
                    self._more()
                if after is None or after.partial:
                    k = m.start() + 1
                    continue
            self.args.append((key, t[start:m.start()]))
            return m.start(), tag == tool_call_end


def call_end(text: str, marks: dict[int, int] | None = None) -> tuple[int, int] | None:
    """Where a ``<tool_call>``'s body ends (see :data:`kit.formats.base.CallEnd`);
    ``marks``: see :class:`~kit.formats.base.ScanMarks`."""
    return structure_end(_Scan(text, final=False, marks=marks).call, text, tool_call_end)


def _string_keys(name: str, tools: Any) -> set[str]:
    """The arguments of tool ``name`` whose schema allows a string."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k for k, s in props.items()
                    if isinstance(s, dict) and "string" in schema_types(s)}
    return set()


def parse_tool_call(text: str, tools: Any = None) -> dict:
    """``{"name", "arguments"}`` of one call's text (``NAME<arg_key>...``); a body without
    ``<arg_key>`` goes to mlx-lm's fallbacks (JSON, ``name a=1``).

    Raises:
        ValueError: the markup is broken (an argument without its key's close or its
            ``<arg_value>``, text between arguments).
    """
    scan = _Scan(text, final=True)
    try:
        scan.call()
    except Broken as e:
        raise ValueError(f"malformed GLM tool call at {e.pos}") from None
    if not scan.structured:
        return _mlx_parse(text, tools)
    strings = _string_keys(scan.name or "", tools)
    args: dict[str, Any] = {}
    for key, raw in scan.args:
        if key in strings:
            args[key] = raw
        else:
            value = _deserialize(raw.strip())
            args[key] = raw if isinstance(value, str) and value == raw.strip() else value
    return dict(name=scan.name, arguments=args)


class GlmParser(SeparatorParser):
    """:class:`~kit.formats.separators.SeparatorParser` whose call-end scans resume inside
    an open value (:class:`~kit.formats.base.ScanMarks`: linear time over a long
    value)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            marks = ScanMarks()
            self._call_end = lambda text: call_end(text, marks(text))


OVERRIDES = {"parser_class": GlmParser}
