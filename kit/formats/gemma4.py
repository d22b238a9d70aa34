"""Gemma 4 tool calls::

    <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1.5,flag:true,obj:{a:[1,<|"|>t<|"|>]}}<tool_call|>

Keys are bare (they may hold spaces), strings are delimited by ``<|"|>`` (no escapes: a
string ends at the next ``<|"|>``), everything else is written as JSON. mlx-lm's ``gemma4``
parser turns the arguments into JSON with regexes; replaced here (upstream bugs):

- a tool name with a dot (``weather.get``: MCP-style names) did not match ``[\\w-]+`` and the
  whole call came back as text;
- only keys made of ``\\w`` characters right after ``{`` or ``,`` were quoted, so a key with
  a space (``key with space``) or after ``", "`` left invalid JSON and the call came back as
  text, with the ``<|"|>`` markup in it;
- the call ended at the first ``<tool_call|>`` even inside a ``<|"|>`` string (an argument
  that quotes the markers cut the call short);
- the newline the template writes after ``<|channel>thought`` (and before ``<channel|>``)
  is not part of the reasoning (:class:`~kit.formats.separators.ReasoningSeparatorParser`);
  the answer keeps its whitespace: the template writes none between calls and text.

The argument reader is our own, a small recursive descent: no library reads this syntax.
"""

from __future__ import annotations

import json
import re
from typing import Any


from kit import mlx_lm_api
from kit.formats.separators import ReasoningSeparatorParser

# mlx-lm's gemma4 parser (imports mlx: a format module loads with a model only)
_upstream = mlx_lm_api.tool_parser("gemma4")
tool_call_end = _upstream.tool_call_end
tool_call_start = _upstream.tool_call_start

__all__ = ["Gemma4End", "call_end", "parse_tool_call", "tool_call_end", "tool_call_start"]

_Q = '<|"|>'
_CALL = re.compile(r"call:([^\s{}<>,]+)\s*\{")
_MAX_DEPTH = 64  # nesting bound: deeper input is no call


class Gemma4End:
    """Where a call ends: the first ``<tool_call|>`` outside a ``<|"|>`` string. Fed the
    growing text of a call, as the engine does token by token, it resumes where it stopped
    (linear time over a long call, not quadratic); a text that does not extend the last
    starts over, so one instance serves one parser's calls in turn."""

    _HOLD = max(len(_Q), len(tool_call_end)) - 1  # a cut marker starts at most this far back

    def __init__(self) -> None:
        self._text, self._i, self._in_str = "", 0, False

    def __call__(self, text: str) -> tuple[int, int] | None:
        if not text.startswith(self._text):
            self._i, self._in_str = 0, False
        self._text = text
        i, in_str = self._i, self._in_str
        while True:
            q = text.find(_Q, i)
            if in_str:
                if q < 0:
                    break
                in_str, i = False, q + len(_Q)
                continue
            e = text.find(tool_call_end, i)
            if e >= 0 and (q < 0 or e < q):
                self._i, self._in_str = i, False
                return e, e + len(tool_call_end)
            if q < 0:
                break
            in_str, i = True, q + len(_Q)
        self._i, self._in_str = max(i, len(text) - self._HOLD), in_str
        return None


def call_end(text: str) -> tuple[int, int] | None:
    """The call ends at the first ``<tool_call|>`` outside a ``<|"|>`` string (see
    :data:`kit.formats.base.CallEnd`)."""
    return Gemma4End()(text)


class Gemma4Parser(ReasoningSeparatorParser):
    """:class:`~kit.formats.separators.ReasoningSeparatorParser` with one resuming
    :class:`Gemma4End` for call ends."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._tool_parser is not None:
            self._call_end = Gemma4End()


class _Reader:
    """Reads one ``{...}`` argument object from ``text`` (ValueError when it is not one)."""

    def __init__(self, text: str) -> None:
        self.t = text

    def _ws(self, i: int) -> int:
        while i < len(self.t) and self.t[i].isspace():
            i += 1
        if i >= len(self.t):
            raise ValueError("the arguments end early")
        return i

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        t = self.t
        i = self._ws(i)
        if t.startswith(_Q, i):
            j = t.find(_Q, i + len(_Q))
            if j < 0:
                raise ValueError("unterminated string")
            return t[i + len(_Q):j], j + len(_Q)
        if t[i] in "{[":
            if depth >= _MAX_DEPTH:
                raise ValueError("arguments nested too deep")
            return (self.obj if t[i] == "{" else self.array)(i + 1, depth + 1)
        j = i
        while j < len(t) and t[j] not in ",}]" and not t.startswith(_Q, j):
            j += 1
        token = t[i:j].strip()
        if not token or any(c in token for c in "{[:"):
            raise ValueError(f"a value expected at {i}")
        try:
            value = json.loads(token)
        except ValueError:
            value = token  # a bare word: the text the model wrote
        return value, j

    def obj(self, i: int, depth: int) -> tuple[dict, int]:
        t, out = self.t, {}
        i = self._ws(i)
        if t[i] == "}":
            return out, i + 1
        while True:
            i = self._ws(i)
            if t.startswith(_Q, i):
                key, i = self.value(i, depth)
                i = self._ws(i)
                if t[i] != ":":
                    raise ValueError(f"':' expected at {i}")
            else:
                j = i
                while j < len(t) and t[j] not in ":{}[],":
                    j += 1
                if j >= len(t) or t[j] != ":" or not t[i:j].strip():
                    raise ValueError(f"a key expected at {i}")
                key, i = t[i:j].strip(), j
            out[key], i = self.value(i + 1, depth)
            i = self._ws(i)
            if t[i] == "}":
                return out, i + 1
            if t[i] != ",":
                raise ValueError(f"',' or '}}' expected at {i}")
            i += 1

    def array(self, i: int, depth: int) -> tuple[list, int]:
        t, out = self.t, []
        i = self._ws(i)
        if t[i] == "]":
            return out, i + 1
        while True:
            item, i = self.value(i, depth)
            out.append(item)
            i = self._ws(i)
            if t[i] == "]":
                return out, i + 1
            if t[i] != ",":
                raise ValueError(f"',' or ']' expected at {i}")
            i += 1


def parse_tool_call(text: str, tools: Any = None) -> dict | list:
    """``{"name", "arguments"}`` of each ``call:NAME{...}`` in one call's text (a list
    for several).

    Raises:
        ValueError: no well-formed ``call:NAME{...}``.
    """
    calls, pos = [], 0
    reader = _Reader(text)
    while (m := _CALL.search(text, pos)) is not None:
        args, pos = reader.obj(m.end(), 1)
        calls.append(dict(name=m.group(1), arguments=args))
    if not calls:
        raise ValueError("No function provided.")
    return calls[0] if len(calls) == 1 else calls


OVERRIDES = {"parser_class": Gemma4Parser}
