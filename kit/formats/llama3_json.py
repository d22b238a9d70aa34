"""Llama 3.1 / 3.2 / 3.3 and Llama 4 tool calls.

What the models write (Meta's prompt-format docs and the published chat templates):

- Llama 3.x: the answer *is* the call, a JSON object ``{"name": ..., "parameters": {...}}``
  (models also write ``"arguments"``, and Meta's own example adds ``"type": "function"``),
  with or without a leading ``<|python_tag|>`` (3.1/3.3, ``Environment: ipython``);
  several calls are separated by ``;`` or whitespace. The HF templates render a past call
  back as ``{"name": "...", "parameters": ...}``.
- Llama 4: the same JSON (its HF template renders calls so), or Meta's documented pythonic
  list ``[get_weather(city="Paris"), f()]``, either maybe wrapped in
  ``<|python_start|>...<|python_end|>``. Llama 3.2's docs describe the same pythonic list.

There is no start marker to wait for, so the decision is made at the start of the answer:
the parser starts inside a would-be call (``initial="tool"``) and :func:`call_end` holds the
text back only while it can still be a call (leading whitespace, an opener, an open ``{``
whose keys so far are a call's keys, ``[name(`` ...); as soon as it cannot be one, the
whole text is released as answer text, and the answer continues in the normal state.
A ``<|python_tag|>`` or ``<|python_start|>`` later in the answer (text before a call)
starts a call there. JSON is scanned string-aware, so braces, brackets or markers inside an
argument string neither end nor start a call.

No maintained library parses this format (mlx-lm has no Llama parser; its ``pythonic``
parser expects ``<|tool_call_start|>`` and falls back to a lenient regex that would take
``[f(x)]`` prose for a call), so the scanner is written here; values are read by the
standard library (``json``, ``ast.literal_eval``).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kit.formats.base import skip_ws
from kit.formats.events import TextDelta
from kit.formats.output import OutputParser

tool_call_start = "<|python_tag|>"  # Llama 3.1/3.3's marker (forced calls start with it)
tool_call_end = ""  # no end marker: a call ends where its JSON (or list) does

_OPENERS = ("<|python_tag|>", "<|python_start|>")
_CLOSER = "<|python_end|>"
_KEYS = frozenset({"name", "parameters", "arguments", "type"})  # what a call object holds


def _undecided_prefix(text: str, i: int, marker: str) -> bool:
    """``text[i:]`` (non-empty) is a proper prefix of ``marker``: it may still become it."""
    return i < len(text) and len(text) - i < len(marker) and marker.startswith(text[i:])


def _opener(text: str, i: int) -> int | None:
    """Index after an optional opener marker at ``i`` (and the whitespace after it); None
    while the text there may still become one."""
    for m in _OPENERS:
        if text.startswith(m, i):
            return skip_ws(text, i + len(m))
        if _undecided_prefix(text, i, m):
            return None
    return i


def _record(obj: Any) -> dict[str, Any] | None:
    """``{"name", "arguments"}`` when ``obj`` is a call object, else None."""
    if not isinstance(obj, dict) or not set(obj) <= _KEYS or obj.get("type", "function") != \
            "function":
        return None
    name, keys = obj.get("name"), [k for k in ("parameters", "arguments") if k in obj]
    if not isinstance(name, str) or not name or len(keys) != 1:
        return None
    args = obj[keys[0]]
    if isinstance(args, str):  # some models quote the arguments object
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return {"name": name, "arguments": args} if isinstance(args, dict) else None


_OPEN, _BAD = -1, -2


def _object_scan(text: str, i: int, memo: dict) -> int:
    """Scan the JSON object opening at ``text[i] == "{"``: the index after its closing
    brace, ``_OPEN`` while it has not closed, ``_BAD`` as soon as a top-level key is not one
    a call has (or the text there is no JSON key), so non-call JSON is released early.
    ``memo`` keeps where an open scan stopped, so a longer text resumes there (streaming
    feeds the growing text again and again: without it each token costs O(length))."""
    k, depth, in_str, key_at, expect_key = memo.get(("o", i), (i, 0, False, -1, False))
    n = len(text)
    while k < n:
        c = text[k]
        if in_str:
            if c == "\\":
                k += 2
                continue
            if c == '"':
                in_str = False
                if key_at >= 0:
                    try:
                        if json.loads(text[key_at:k + 1]) not in _KEYS:
                            return _BAD
                    except ValueError:
                        return _BAD
                    key_at = -1
        elif c == '"':
            in_str = True
            if depth == 1 and expect_key:
                key_at, expect_key = k, False
        elif depth == 1 and expect_key and c != "}" and not c.isspace():
            return _BAD
        elif c in "{[":
            depth += 1
            expect_key = c == "{" and depth == 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
        elif c == "," and depth == 1:
            expect_key = True
        k += 1
    memo[("o", i)] = (k, depth, in_str, key_at, expect_key)
    return _OPEN


def _bracket_scan(text: str, i: int, quotes: str, memo: dict) -> int:
    """The index after the bracket opening at ``text[i]`` closes (strings in ``quotes``
    skipped, backslash escapes honoured), or ``_OPEN`` (``memo``: see :func:`_object_end`)."""
    k, depth, quote = memo.get(("b", i), (i, 0, ""))
    n = len(text)
    while k < n:
        c = text[k]
        if quote:
            if c == "\\":
                k += 2
                continue
            if c == quote:
                quote = ""
        elif c in quotes:
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    memo[("b", i)] = (k, depth, quote)
    return _OPEN


def _object_end(text: str, i: int, memo: dict) -> int:
    """:func:`_object_scan`, its final answer kept in ``memo``."""
    if ("od", i) not in memo:
        k = _object_scan(text, i, memo)
        if k == _OPEN:
            return k
        memo[("od", i)] = k
    return memo[("od", i)]


def _bracket_end(text: str, i: int, quotes: str, memo: dict) -> int:
    """:func:`_bracket_scan`, its final answer kept in ``memo``."""
    if ("bd", i) not in memo:
        k = _bracket_scan(text, i, quotes, memo)
        if k == _OPEN:
            return k
        memo[("bd", i)] = k
    return memo[("bd", i)]


def _pythonic(text: str) -> list[dict[str, Any]] | None:
    """``[f(a=1), g()]`` as call records (literal keyword arguments only; JSON's
    true/false/null accepted as Python's), else None."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        parts, f = [], node.func
        while isinstance(f, ast.Attribute):
            parts.append(f.attr)
            f = f.value
        if not isinstance(f, ast.Name):
            return None
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            v = kw.value
            if isinstance(v, ast.Name) and v.id in ("true", "false", "null"):
                args[kw.arg] = {"true": True, "false": False, "null": None}[v.id]
                continue
            try:
                args[kw.arg] = ast.literal_eval(v)
            except (ValueError, SyntaxError, TypeError):
                return None
        calls.append({"name": ".".join([f.id, *reversed(parts)]), "arguments": args})
    return calls


def _json_list(text: str) -> list[dict[str, Any]] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = [_record(v) for v in value] if isinstance(value, list) and value else [None]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _after_list(text: str, k: int) -> tuple[int, int] | None:
    """A call list ended at ``k``: where the calls end, consuming a ``<|python_end|>``."""
    j = skip_ws(text, k)
    if j == len(text) or _undecided_prefix(text, j, _CLOSER):
        return None
    return (k, j + len(_CLOSER)) if text.startswith(_CLOSER, j) else (k, k)


class CallEnd:
    """:func:`call_end` for one growing call text: scans resume where the last call
    stopped while the text only grew (one per parser: :class:`LlamaOutputParser`)."""

    def __init__(self) -> None:
        self._text = ""
        self._memo: dict = {}

    def __call__(self, text: str) -> tuple[int, int] | None:
        if not text.startswith(self._text):
            self._memo = {}
        self._text = text
        return _call_end(text, self._memo)


def call_end(text: str) -> tuple[int, int] | None:
    """Where the calls at the start of ``text`` end: ``(body_end, resume)``, ``(0, 0)``
    when the text is not a call (it is then read as answer text), None while undecided.
    Prefix-stable: each answer depends only on the text up to the point it was decided."""
    return _call_end(text, {})


def _valid_once(memo: dict, key: tuple, check: Any) -> bool:
    if key not in memo:
        memo[key] = bool(check())
    return memo[key]


def _call_end(text: str, memo: dict) -> tuple[int, int] | None:
    i = _opener(text, skip_ws(text, 0))
    if i is None or i == len(text):
        return None
    if text[i] == "{":
        last, j = 0, i
        while True:
            k = _object_end(text, j, memo)
            if k == _OPEN:
                return None
            if k == _BAD or not _valid_once(memo, ("v", j), lambda: _record_of(text[j:k])):
                return (last, last)
            last, j = k, skip_ws(text, k)
            if j < len(text) and text[j] == ";":
                j = skip_ws(text, j + 1)
            if j == len(text) or _undecided_prefix(text, j, _CLOSER):
                return None
            if text.startswith(_CLOSER, j):
                return (last, j + len(_CLOSER))
            if text[j] != "{":
                return (last, last)
    if text[i] == "[":
        j = skip_ws(text, i + 1)
        if j == len(text):
            return None
        if text[j] == "{":
            k = _bracket_end(text, i, '"', memo)
            if k == _OPEN:
                return None
            ok = _valid_once(memo, ("l", i), lambda: _json_list(text[i:k]))
            return _after_list(text, k) if ok else (0, 0)
        if text[j].isalpha() or text[j] == "_":
            while j < len(text) and (text[j].isalnum() or text[j] in "_."):
                j += 1
            j = skip_ws(text, j)
            if j == len(text):
                return None
            if text[j] != "(":
                return (0, 0)
            k = _bracket_end(text, i, "'\"", memo)
            if k == _OPEN:
                return None
            ok = _valid_once(memo, ("p", i), lambda: _pythonic(text[i:k]))
            return _after_list(text, k) if ok else (0, 0)
    return (0, 0)


def _record_of(text: str) -> dict[str, Any] | None:
    try:
        return _record(json.loads(text))
    except ValueError:
        return None


def _calls(text: str, *, partial: bool) -> list[dict[str, Any]]:
    """The call records in a call's text (what :func:`call_end` delimited, or all the text
    at the end of the output). ``partial``: the text was cut, keep the complete calls."""
    body = text.strip()
    if body.endswith(_CLOSER):
        body = body[:-len(_CLOSER)]
    i = _opener(body, 0)
    body = body[i or 0:].rstrip()
    if body.startswith("["):
        calls = None if partial else (_json_list(body) or _pythonic(body))
        if calls is None and not partial:
            raise ValueError("not a list of calls")
        return calls or []
    decoder, calls, i = json.JSONDecoder(), [], 0
    while i < len(body):
        try:
            obj, i = decoder.raw_decode(body, i)
        except ValueError:
            if partial:
                return calls
            raise
        record = _record(obj)
        if record is None:
            if partial:
                return calls
            raise ValueError("a JSON object that is no call")
        calls.append(record)
        i = skip_ws(body, i)
        if body.startswith(";", i):
            i = skip_ws(body, i + 1)
    if not calls and not partial:
        raise ValueError("no call")
    return calls


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls in ``text`` (mlx-lm's parser contract).

    Raises:
        ValueError: the text is not one or more complete calls.
    """
    return _calls(text, partial=False)


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a call text cut by ``max_tokens`` (maybe none). A pythonic
    list counts only once it closed: its calls are one expression."""
    return _calls(text, partial=True)


class LlamaOutputParser(OutputParser):
    """:class:`OutputParser` for markerless calls: ``<|python_start|>`` also opens a call,
    an empty call text (the answer was no call) emits nothing, and a call cut by
    ``max_tokens`` with no complete call in it comes back as answer text (never an empty
    reply for what the model did write)."""

    def __init__(self, *, tool: tuple[str, str] | None = None,
                 extra: dict[str, list[tuple[str, str]]] | None = None,
                 parse_partial: Any = None, call_end: Any = None, **kw: Any) -> None:
        extra = dict(extra or {})
        if tool:
            extra["normal"] = [*extra.get("normal", []), ("<|python_start|>", "tool")]
        super().__init__(tool=tool, extra=extra, call_end=CallEnd() if call_end else None,
                         parse_partial=parse_partial, **kw)


    def _parse_tool(self, text: str) -> list[Any]:
        return super()._parse_tool(text) if text else []

    def cut_call_text(self, text: str, *, said: bool) -> str:
        """A cut call without a complete call comes back as answer text, whatever came
        before it (see :meth:`OutputParser.cut_call_text`)."""
        return text


#: start inside a would-be call: the answer's first characters decide (see call_end). A
#: forced call's body is json_tools', ``{"name": ..., "arguments": {...}}`` (whitespace
#: around it): one of the two keys Llama models write, both parsed here; its own grammar key
#: (llama3_json) because a forced turn holds one call, as Llama 3's templates take.
OVERRIDES = {"parser_class": LlamaOutputParser, "initial": "tool", "grammar": "llama3_json"}
