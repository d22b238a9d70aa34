"""Qwen3-Coder / Qwen3.5+ XML tool calls::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

The template writes each value between ``<parameter=KEY>\\n`` and ``\\n</parameter>\\n``
(mappings and lists as JSON, everything else as plain text), so only the XML structure
tells a closing tag from the same text inside a value. mlx-lm's ``qwen3_coder`` parser
(regexes) is reused for the schema conversion of a value (``_convert_param_value``) and
the tool lookup; corrected here (upstream bugs):

- the call ends at the ``</tool_call>`` that closes its structure, not at the first one
  (a value that quotes ``</tool_call>`` cut the call short and leaked the rest into the
  answer), and a value ends at a ``</parameter>`` (or ``</function>``) that is followed by
  more structure, not at the first one (a value quoting ``</parameter>`` was cut and its
  rest parsed as another parameter);
- a value whose ``</parameter>`` is missing ends at the next ``<parameter=`` at a line
  start or at ``</function>`` (mlx-lm merged it into the next value, or dropped it: ``{}``);
- a ``<function=...>`` block without the ``<tool_call>`` opener (Qwen3-Coder does this after
  a preamble, and in parallel calls) is a call (mlx-lm returned it as text);
- ``anyOf``/``oneOf`` and list-valued ``type`` schemas convert the value (mlx-lm converted
  only JSON objects/arrays there: ``"5"`` for an optional integer), a value that does not
  convert to its schema type is kept as text (mlx-lm raised, and the whole call came back
  as text), and a string-accepting schema keeps the text as written (``"02139"``);
- the template's separator whitespace is dropped (:class:`~kit.formats.separators.
  SeparatorParser`).

As text, a closing tag that more structure follows inside a value (``</function>\n</tool_call>``
written into a file), or a value line that starts with ``<parameter=``, cannot be told from
the real markup, and is read as markup (vLLM reads the unclosed-value case the same way).

The structure scan is our own: no library parses this almost-XML (values are raw text, not
escaped), and it must answer on every prefix while the call streams in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


from kit import mlx_lm_api
from kit.formats.base import Broken, More, ScanMarks, is_cut, schema_types, skip_ws
from kit.formats.events import TextDelta
from kit.formats.separators import SeparatorParser

# mlx-lm's qwen3_coder parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("qwen3_coder")
_convert_param_value = _upstream._convert_param_value
_get_arguments_config = _upstream._get_arguments_config
_string_types = _upstream._string_types
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start

__all__ = ["call_end", "parse_partial", "parse_tool_call", "tool_call_end", "tool_call_start"]

_FUNC, _PARAM = "<function=", "<parameter="
_END_PARAM, _END_FUNC = "</parameter>", "</function>"
#: what may follow (after whitespace) a closing tag that really closes
_STRUCT = (_PARAM, _END_FUNC, tool_call_end, _FUNC, tool_call_start)
#: where a value may end: a closing tag (if structure follows it) or a new parameter at a
#: line start (the value's own </parameter> is missing)
_VALUE_END = re.compile(r"</parameter>|</function>|</tool_call>|\n<parameter=")
_NAME = re.compile(r"[ \t]*([^\s<>]+)")


@dataclass
class _Function:
    name: str
    params: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False  # its </function> was seen


#: a cut value-end candidate starts at most this far before the end of the text
_LONGEST_END = max(len("\n" + _PARAM), len(_END_PARAM), len(_END_FUNC), len(tool_call_end))


class _Scan:
    """One pass over a call's text (after ``<tool_call>``, or from ``<function=`` for a
    bare block). ``final``: the text is complete (EOS), so its end ends whatever is open;
    else an open structure raises :class:`More`. ``marks``: see :class:`ScanMarks`."""

    def __init__(self, text: str, final: bool, marks: dict[int, int] | None = None) -> None:
        self.text, self.final = text, final
        self.marks = {} if marks is None else marks
        self.functions: list[_Function] = []

    def _end_of_text(self) -> int:
        if not self.final:
            raise More
        return len(self.text)

    def call(self) -> tuple[int, int]:
        """(body end, resume) of the call."""
        t = self.text
        i = skip_ws(t, 0)
        while True:
            if t.startswith(_FUNC, i):
                i = self._function(i + len(_FUNC))
                j = skip_ws(t, i)
                if t.startswith(tool_call_end, j):
                    return j, j + len(tool_call_end)
                if t.startswith(_FUNC, j):
                    i = j
                    continue
                if is_cut(t, j, (tool_call_end, _FUNC)):
                    n = self._end_of_text()
                    return n, n
                return i, i  # no </tool_call>: the call ends with its function
            if t.startswith(tool_call_end, i):
                return i, i + len(tool_call_end)
            if is_cut(t, i, (_FUNC, tool_call_end)):
                n = self._end_of_text()
                return n, n
            raise Broken(i)

    def _name(self, i: int) -> tuple[str, int]:
        t = self.text
        m = _NAME.match(t, i)
        if m is None:
            if not t[i:].strip(" \t"):
                self._end_of_text()  # the name may still come
            raise Broken(i)
        if m.end() == len(t):
            self._end_of_text()  # the name may go on
        i = m.end()
        return m.group(1), i + 1 if t.startswith(">", i) else i

    def _function(self, i: int) -> int:
        t = self.text
        name, i = self._name(i)
        fn = _Function(name)
        self.functions.append(fn)
        while True:
            i = skip_ws(t, i)
            if t.startswith(_PARAM, i):
                i = self._parameter(i + len(_PARAM), fn)
            elif t.startswith(_END_FUNC, i):
                fn.closed = True
                return i + len(_END_FUNC)
            elif any(t.startswith(s, i) for s in (tool_call_end, _FUNC, tool_call_start)):
                return i  # no </function>: what comes next closes it
            elif is_cut(t, i, _STRUCT):
                return self._end_of_text()
            else:
                raise Broken(i)

    def _parameter(self, i: int, fn: _Function) -> int:
        t = self.text
        key, start = self._name(i)
        k = max(start, self.marks.get(start, start))
        while True:
            m = _VALUE_END.search(t, k)
            if m is None:
                self.marks[start] = max(k, len(t) - _LONGEST_END + 1)
                fn.params.append((key, t[start:self._end_of_text()]))
                return len(t)
            if m.group() == "\n" + _PARAM:
                fn.params.append((key, t[start:m.start()]))
                return m.start()
            j = skip_ws(t, m.end())
            if is_cut(t, j, _STRUCT):
                self.marks[start] = m.start()
                self._end_of_text()
            elif not any(t.startswith(s, j) for s in _STRUCT):
                k = m.start() + 1  # the tag's text inside the value
                continue
            fn.params.append((key, t[start:m.start()]))
            return m.end() if m.group() == _END_PARAM else m.start()


def _end(text: str, bare: bool, marks: dict[int, int] | None = None) -> tuple[int, int] | None:
    try:
        return _Scan(text, final=False, marks=marks).call()
    except More:
        return None
    except Broken as e:
        if bare:  # not a call after all: it ends where it stops being one (text)
            return e.pos, e.pos
        i = text.find(tool_call_end, e.pos)
        return None if i < 0 else (i, i + len(tool_call_end))


def call_end(text: str) -> tuple[int, int] | None:
    """Where a ``<tool_call>``'s body ends (see :data:`kit.formats.base.CallEnd`)."""
    return _end(text, bare=False)


def _convert(value: str, key: str, config: dict) -> Any:
    schema = config.get(key)
    if value.lower() == "null" or not isinstance(schema, dict):
        return _convert_param_value(value, key, config)
    types = [x for x in schema_types(schema) if x != "null"]
    if not types:
        return _convert_param_value(value, key, config)
    if any(x in _string_types for x in types):
        return value
    for x in types:
        try:
            out = _convert_param_value(value, key, {key: {"type": x}})
        except ValueError:  # not this type
            continue
        if not isinstance(out, str):
            return out
    return value


def _strip_newline(value: str) -> str:
    # the template's own newlines around a value (exactly one each side)
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


def _calls(functions: list[_Function], tools: Any) -> Any:
    if not functions:
        raise ValueError("No function provided.")
    out = []
    for fn in functions:
        config = _get_arguments_config(fn.name, tools)
        out.append(dict(name=fn.name, arguments={
            key: _convert(_strip_newline(v), key, config) for key, v in fn.params}))
    return out[0] if len(out) == 1 else out


def _parse(text: str, tools: Any, closed_only: bool) -> Any:
    scan = _Scan(text, final=True)
    try:
        scan.call()
        functions = scan.functions
        if closed_only:
            functions = [f for f in functions if f.closed]
    except Broken:
        functions = [f for f in scan.functions if f.closed]
    return _calls(functions, tools)


def parse_tool_call(text: str, tools: Any = None) -> Any:
    """``{"name", "arguments"}`` (a list for several ``<function=`` blocks) of one call's
    text; a block whose ``</function>`` or ``</parameter>`` is missing still counts.

    Raises:
        ValueError: the text holds no function block.
    """
    return _parse(text, tools, closed_only=False)


def parse_partial(text: str, tools: Any = None) -> list:
    """The complete calls of a call cut by ``max_tokens``: the ``<function=`` blocks closed
    by ``</function>`` that another block follows (the last one never reached its
    ``</tool_call>``)."""
    scan = _Scan(text, final=False)
    try:
        scan.call()
    except (More, Broken):
        pass
    done = [f for f in scan.functions if f.closed]
    if done and scan.functions[-1] is done[-1]:
        done.pop()
    if not done:
        return []
    calls = _calls(done, tools)
    return calls if isinstance(calls, list) else [calls]


class QwenCoderParser(SeparatorParser):
    """:class:`~kit.formats.separators.SeparatorParser` that also takes a ``<function=``
    block without its ``<tool_call>`` opener as a call (only when the request has tools).
    Such a block counts only when its ``</function>`` closes it: prose that mentions
    ``<function=name>`` stays text."""

    def __init__(self, **kwargs: Any) -> None:
        self._bare = False
        if kwargs.get("tool") and kwargs.get("tool_parser"):
            extra = {k: list(v) for k, v in (kwargs.get("extra") or {}).items()}
            extra.setdefault("normal", []).append((_FUNC, "bare"))
            extra.setdefault("bare", [])
            kwargs["extra"] = extra
        super().__init__(**kwargs)
        self._raw_prev = self._state[0]
        if self._tool_parser is not None:
            marks = ScanMarks()
            self._call_end = lambda text: _end(text, self._bare, marks(text))

    def _events(self, segments: list[tuple[str | None, str]]) -> list[Any]:
        mapped = []
        for state, text in segments:
            raw = state
            if state == "bare":  # the state machine ate the opener: the call's text has it
                if self._raw_prev != "bare":
                    text, self._bare = _FUNC + text, True
                state = "tool"
            elif state == "tool" and self._raw_prev != "tool":
                self._bare = False
            self._raw_prev = raw
            mapped.append((state, text))
        return super()._events(mapped)

    def _parse_tool(self, text: str) -> list[Any]:
        if not self._bare:
            return super()._parse_tool(text)
        try:
            parsed = _parse(text, self._tools, closed_only=True)
        except ValueError:
            return [TextDelta(text)]
        return self._calls(parsed) or [TextDelta(text)]


OVERRIDES = {"parser_class": QwenCoderParser}
