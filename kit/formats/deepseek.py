"""DeepSeek tool calls, every generation: V3/R1, V3.1, and the DSML markup of V3.2, V4 and
V4.1, with ``<think>``/``</think>`` reasoning.

Written here because no maintained library parses these formats: mlx-lm ships no DeepSeek
parser, and DeepSeek's own decoder (``parse_message_from_completion_text`` in the
``encoding/encoding_dsv32.py`` / ``encoding_dsv4.py`` files of its checkpoints) is a script
inside the model repository, not a package, and parses only a complete, well-formed output
of one sub-format.

The sub-formats (from the published chat templates of V3-0324 and V3.1, and DeepSeek's
encoders for V3.2 and V4, which ship no Jinja template):

- V3 / R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n
  {ARGS}\\n```<｜tool▁call▁end｜>`` (more calls, separated by ``\\n``) ``<｜tool▁calls▁end｜>``.
- V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>
  ...<｜tool▁calls▁end｜>``.
- V3.2 / V4 / V4.1 (DSML; ``｜DSML｜`` is one special token): ``\\n\\n<｜DSML｜B>\\n<｜DSML｜invoke
  name="NAME">\\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\\n...
  </｜DSML｜invoke>\\n</｜DSML｜B>`` with block name B ``function_calls`` (V3.2),
  ``tool_calls`` (V4) or ``calls`` (V4.1, which also puts a space after the DSML token
  of every tag: ``<｜DSML｜ invoke``). ``string="true"`` values are raw text (quotes,
  newlines, ``<`` unescaped, surrounding whitespace kept); ``string="false"`` values are
  JSON. The ``\\n\\n`` before the block belongs to the block's start (DeepSeek's decoder
  reads it as part of the start token), so it is not part of the answer text.

A call block's end is found structurally (:func:`call_end`): in V3/V3.1 the end marker
outside JSON strings, in DSML the block's closing tag outside parameter values, so marker
text quoted in an argument stays in the argument. :class:`DeepSeekOutputParser` adds the
DSML block starts to the engine's parser and returns a block that does not parse as the
text the model wrote; of a block cut by ``max_tokens`` it keeps the complete calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kit.engine.output import OutputParser
from kit.engine.types import TextDelta, ToolCall

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
DSML = "｜DSML｜"
#: DSML block names: V3.2, V4, V4.1
BLOCKS = ("function_calls", "tool_calls", "calls")

# mlx-lm's parser-module contract; the DSML starts are added by DeepSeekOutputParser
tool_call_start = CALLS_BEGIN
tool_call_end = CALLS_END

#: every DSML block start, with and without the "\n\n" DeepSeek's encoder writes before it
DSML_STARTS = tuple(nl + f"<{DSML}{sp}{name}>" for name in BLOCKS for sp in ("", " ")
                    for nl in ("\n\n", ""))

_TAG = re.compile(f"<(/?){DSML} ?([A-Za-z_]+)")
_INVOKE = re.compile(f"<{DSML} ?invoke(?![A-Za-z_])")
_INVOKE_CLOSE = re.compile(f"</{DSML} ?invoke>")
_PARAM = re.compile(f"<{DSML} ?parameter(?![A-Za-z_])")
_PARAM_CLOSE = re.compile(f"</{DSML} ?parameter>")
_BLOCK_CLOSE = re.compile(f"</{DSML} ?(?:{'|'.join(BLOCKS)})>\\s*$")
_ATTR = re.compile(r'\s*([A-Za-z_][\w-]*)="([^"]*)"')
_WS = " \t\r\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)


# ---------------------------------------------------------------------------- call ends

_OUTSIDE = re.compile('["<]')
_INSIDE = re.compile(r'["\\]')


class _V3Scan:
    """Where a V3/V3.1 block's ``<｜tool▁calls▁end｜>`` ends, outside JSON strings (what
    :func:`kit.formats.base.json_marker_end` finds, with regex jumps). Fed the growing text
    of one block, as the engine does token by token, it resumes where it stopped, so a long
    call costs linear, not quadratic, time; a text that does not extend the last starts
    over."""

    def __init__(self) -> None:
        self._text, self._i, self._in_str = "", 0, False

    def __call__(self, text: str) -> int | None:
        if not text.startswith(self._text):
            self._i, self._in_str = 0, False
        self._text = text
        i, in_str, n = self._i, self._in_str, len(text)
        while True:
            m = (_INSIDE if in_str else _OUTSIDE).search(text, i)
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
            elif text.startswith(CALLS_END, j):
                self._i, self._in_str = j, False
                return j + len(CALLS_END)
            elif CALLS_END.startswith(text[j:]):  # maybe the marker, not all here yet
                i = j
                break
            else:
                i = j + 1
        self._i, self._in_str = i, in_str
        return None


def _open_tag_end(text: str, i: int) -> int | None:
    """Index just past the ``>`` closing the tag whose attributes start at ``i`` (quoted
    attribute values may hold ``>``); None while the tag is not complete."""
    in_quote = False
    for j in range(i, len(text)):
        c = text[j]
        if c == '"':
            in_quote = not in_quote
        elif c == ">" and not in_quote:
            return j + 1
    return None


_LONGEST_PARAM_CLOSE = len(f"</{DSML} parameter>")


class _DsmlScan:
    """Where a DSML block's closing tag ends, skipping parameter values (whose text may
    quote any tag); None while the block is open. Like :class:`_V3Scan`, it resumes on the
    growing text of one block."""

    def __init__(self) -> None:
        self._text, self._pos = "", 0
        self._value: int | None = None  # where the open parameter's value starts
        self._seen = 0  # how far its closing tag has been looked for

    def __call__(self, text: str) -> int | None:
        if not text.startswith(self._text):
            self._pos, self._value, self._seen = 0, None, 0
        self._text, pos = text, self._pos
        while True:
            if self._value is not None:  # the value ends at the first closing tag
                start = max(self._value, self._seen - _LONGEST_PARAM_CLOSE)
                close = _PARAM_CLOSE.search(text, start)
                if close is None:
                    self._pos, self._seen = pos, len(text)
                    return None
                pos, self._value = close.end(), None
                continue
            m = _TAG.search(text, pos)
            if m is None or m.end() >= len(text):  # no tag yet, or its name may go on
                self._pos = pos
                return None
            closing, name = m.group(1) == "/", m.group(2)
            if closing and name in BLOCKS and text[m.end()] == ">":
                self._pos = pos
                return m.end() + 1
            if not closing and name == "parameter":
                gt = _open_tag_end(text, m.end())
                if gt is None:
                    self._pos = pos
                    return None
                if text[gt - 2] != "/":
                    self._value = self._seen = gt
                pos = gt
            else:
                pos = m.end()


def _sub_format(text: str) -> str | None:
    """``"dsml"`` or ``"v3"`` for a block's text after ``<｜tool▁calls▁begin｜>`` (None:
    too little text to tell)."""
    head = text.lstrip(_WS)
    if not head or any(t.startswith(head) and t != head for t in (f"<{DSML}", f"</{DSML}")):
        return None
    return "dsml" if head.startswith((f"<{DSML}", f"</{DSML}")) else "v3"


class _BlockEnd:
    """:func:`call_end` for the growing text of one block (see :class:`_V3Scan`);
    ``kind`` ``"dsml"`` for a block that started with a DSML block start."""

    def __init__(self, kind: str | None = None) -> None:
        self._kind = kind
        self._v3, self._dsml = _V3Scan(), _DsmlScan()

    def __call__(self, text: str) -> tuple[int, int] | None:
        self._kind = self._kind or _sub_format(text)
        if self._kind is None:
            return None
        end = (self._dsml if self._kind == "dsml" else self._v3)(text)
        return None if end is None else (end, end)


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call block that started with ``<｜tool▁calls▁begin｜>`` ends: the text after
    the start marker in, ``(end, end)`` out, ``end`` just past the block's closing marker,
    which stays in the call's text (so a block that does not parse is returned exactly as
    written); None while the block is open. V3/V3.1 blocks end at ``<｜tool▁calls▁end｜>``
    outside JSON strings, DSML blocks at their closing tag outside parameter values.
    Prefix-stable."""
    return _BlockEnd()(text)


# ---------------------------------------------------------------------------- parsing

def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _schema_type(tools: Any, name: str, key: str) -> Any:
    """The JSON-schema ``type`` of argument ``key`` of tool ``name`` in the request's
    ``tools`` (OpenAI function schemas), or None when the schema does not say."""
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            prop = props.get(key) if isinstance(props, dict) else None
            return prop.get("type") if isinstance(prop, dict) else None
    return None


def _v3_calls(text: str, calls: list[dict]) -> None:
    """Appends the V3/V3.1 calls of ``text`` (a block's body) to ``calls``, in order.

    Raises:
        ValueError: the body is not a sequence of well-formed calls (or is cut).
    """
    i, n = 0, len(text)
    while (i := _skip_ws(text, i)) < n:
        if not text.startswith(CALL_BEGIN, i):
            raise ValueError(f"expected {CALL_BEGIN} at {i}")
        sep = text.find(SEP, i)
        if sep < 0:
            raise ValueError(f"no {SEP}")
        head, j = text[i + len(CALL_BEGIN):sep], sep + len(SEP)
        k = _skip_ws(text, j)
        fenced = k >= n or text[k] != "{"
        if not fenced:  # V3.1: NAME<sep>{ARGS}
            name = head
        else:  # V3: TYPE<sep>NAME\n```json\n{ARGS}\n```
            nl = text.find("\n", j)
            if nl < 0:
                raise ValueError("no newline after the name")
            name, k = text[j:nl], _skip_ws(text, nl)
            for fence in ("```json", "```"):
                if text.startswith(fence, k):
                    k = _skip_ws(text, k + len(fence))
                    break
        args, k = _JSON.raw_decode(text, k)
        if not isinstance(args, dict):
            raise ValueError("the arguments are not a JSON object")
        k = _skip_ws(text, k)
        if fenced and text.startswith("```", k):
            k = _skip_ws(text, k + 3)
        if not text.startswith(CALL_END, k) or not name.strip():
            raise ValueError(f"expected {CALL_END} at {k}")
        calls.append({"name": name.strip(), "arguments": args})
        i = k + len(CALL_END)


def _attrs(text: str, i: int) -> tuple[dict[str, str], int, bool]:
    """A tag's ``key="value"`` attributes from ``i``; returns them, the index past the tag
    and whether it closed itself (``/>``).

    Raises:
        ValueError: malformed or cut attributes.
    """
    attrs: dict[str, str] = {}
    while True:
        i = _skip_ws(text, i)
        if text.startswith("/>", i):
            return attrs, i + 2, True
        if text.startswith(">", i):
            return attrs, i + 1, False
        m = _ATTR.match(text, i)
        if m is None:
            raise ValueError(f"malformed tag attributes at {i}")
        attrs[m.group(1)] = m.group(2)
        i = m.end()


def _value(raw: str, string: str | None, declared: Any) -> Any:
    """A DSML parameter's value: ``string="true"`` raw text, ``string="false"`` JSON. Where
    the model broke that rule, the tool's schema decides, and only as far as it says: a
    value the schema declares a string stays raw text; without the attribute, a value the
    schema declares another type is read as JSON.

    Raises:
        ValueError: a value that must be JSON is not.
    """
    is_str = declared == "string"
    if string == "true" or (string is None and (is_str or declared is None)):
        return raw
    try:
        return _JSON.decode(raw)
    except ValueError:
        if is_str or string is None:
            return raw
        raise


def _dsml_calls(text: str, tools: Any, calls: list[dict]) -> None:
    """Appends the invokes of a DSML block body to ``calls``, in order.

    Raises:
        ValueError: not a sequence of well-formed invokes (or cut).
    """
    i, n = 0, len(text)
    while (i := _skip_ws(text, i)) < n:
        m = _INVOKE.match(text, i)
        if m is None:
            raise ValueError(f"expected an invoke at {i}")
        attrs, i, closed = _attrs(text, m.end())
        name = attrs.get("name", "").strip()
        if not name:
            raise ValueError("an invoke without a name")
        args: dict[str, Any] = {}
        while not closed:
            i = _skip_ws(text, i)
            if (end := _INVOKE_CLOSE.match(text, i)) is not None:
                i, closed = end.end(), True
                continue
            if (p := _PARAM.match(text, i)) is None:
                raise ValueError(f"expected a parameter or the invoke's end at {i}")
            pattrs, i, empty = _attrs(text, p.end())
            key = pattrs.get("name")
            if key is None or key in args:
                raise ValueError(f"a parameter without a name, or twice: {key!r}")
            raw = ""
            if not empty:
                if (close := _PARAM_CLOSE.search(text, i)) is None:
                    raise ValueError(f"parameter {key!r} is not closed")
                raw, i = text[i:close.start()], close.end()
            args[key] = _value(raw, pattrs.get("string"), _schema_type(tools, name, key))
        calls.append({"name": name, "arguments": args})


def _body(text: str) -> tuple[str, bool]:
    """A block's text without its closing marker, and whether it is DSML."""
    head = text.lstrip(_WS)
    if head.startswith(f"<{DSML}") or head.startswith(f"</{DSML}"):
        m = _BLOCK_CLOSE.search(text)
        return (text[:m.start()] if m else text), True
    stripped = text.rstrip(_WS)
    if stripped.endswith(CALLS_END):
        stripped = stripped[:-len(CALLS_END)]
    return stripped, False


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls of one block (its text after the start marker, closing marker included
    or not): ``[{"name": str, "arguments": dict}, ...]`` in the order written.

    Raises:
        ValueError: the block is not well-formed or holds no call (the engine then
            returns it as text).
    """
    body, dsml = _body(text)
    calls: list[dict[str, Any]] = []
    (_dsml_calls(body, tools, calls) if dsml else _v3_calls(body, calls))
    if not calls:
        raise ValueError("no tool call in the block")
    return calls


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a block cut off by ``max_tokens`` (each up to its own end
    marker), in order; [] when none is complete."""
    body, dsml = _body(text)
    calls: list[dict[str, Any]] = []
    try:
        (_dsml_calls(body, tools, calls) if dsml else _v3_calls(body, calls))
    except ValueError:
        pass  # the cut call: only those before it are complete
    return calls


# ---------------------------------------------------------------------------- forced calls

def grammar_body(name: str, args: str) -> str:
    """The Lark expression (llguidance dialect) of a forced call's body after
    ``<｜tool▁calls▁begin｜>`` (which the prompt ends with): one call in the V3.1 form,
    ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>``, the
    simplest of the sub-formats to constrain (the arguments are one JSON object) and one
    :func:`parse_tool_call` reads whichever DeepSeek model wrote it. ``args``: the Lark
    expression of the arguments object (e.g. a ``%json`` rule's name). The markers are
    text literals: the grammar gets no vocab to name them as special tokens by, and the
    parser reads text."""
    head, tail = f"{CALL_BEGIN}{name}{SEP}", CALL_END + CALLS_END
    return f"{json.dumps(head)} {args} {json.dumps(tail)}"


# ---------------------------------------------------------------------------- engine parser

class DeepSeekOutputParser(OutputParser):
    """The engine's :class:`~kit.engine.output.OutputParser` with the DSML block starts
    (:data:`DSML_STARTS`) as call starts besides ``<｜tool▁calls▁begin｜>``. Each start gets
    its own state, so a block that does not parse comes back as text exactly as the model
    wrote it (start marker included), and so does a block ``max_tokens`` cut with no
    complete call in it when nothing else came back (see :meth:`finish`). Keyword
    arguments as for ``OutputParser``."""

    def __init__(self, *, think: tuple[str, str] | None = None,
                 tool: tuple[str, str] | None = None, tool_parser: Any = None,
                 extra: dict[str, list[tuple[str, str]]] | None = None, **kw: Any) -> None:
        extra = {state: list(edges) for state, edges in (extra or {}).items()}
        self._starts: dict[str, str] = {}
        if tool and tool_parser:
            self._starts["tool"] = tool[0]
            for k, start in enumerate(DSML_STARTS):
                state = f"tool:{k}"
                self._starts[state] = start
                extra.setdefault(state, [])
                for src in ("normal", "reasoning") if think else ("normal",):
                    extra.setdefault(src, []).append((start, state))
        self._start = tool[0] if tool else ""
        self._answered = False  # text, reasoning or a call came back (see finish)
        super().__init__(think=think, tool=tool, tool_parser=tool_parser, extra=extra, **kw)

    def _events(self, segments: list[tuple[str | None, str]]) -> list[Any]:
        named = []
        for state, text in segments:
            if state in self._starts:
                if not self._tool_text:  # a new block: remember how it started
                    # _tool_start: the base class's name for it, where it has one
                    self._start = self._tool_start = self._starts[state]
                    self._call_end = _BlockEnd(None if state == "tool" else "dsml")
                state = "tool"
            named.append((state, text))
        return super()._events(named)

    def _parse_tool(self, text: str) -> list[Any]:
        events = super()._parse_tool(text)
        if any(isinstance(e, ToolCall) for e in events):
            return events
        return [TextDelta(self._start + text)]

    def feed(self, text: str) -> list[Any]:
        events = super().feed(text)
        self._answered = self._answered or _says(events)
        return events

    def finish(self, reason: str) -> list[Any]:
        """As ``OutputParser.finish``, for generation that ends inside a block: at EOS a
        block that does not parse (a lone start marker too) comes back as its text; of a
        block cut by ``max_tokens`` the complete calls come back, and when there are none
        and nothing else came back (no text, reasoning or call) the block's text does,
        start marker included: never an empty reply."""
        from mlx_lm.generate import TextStateMachine

        if self._state[0] not in self._starts:
            return super().finish(reason)
        self._state, tail, state = TextStateMachine.flush(self._state)
        events = self._events([(state, tail)])
        text, self._tool_text = self._tool_text, ""
        if reason != "length":
            return events + self._parse_tool(text)
        calls = self._calls(parse_partial(text, self._tools))
        if not calls and not self._answered and not _says(events):
            calls = [TextDelta(self._start + text)]
        return events + calls


def _says(events: list[Any]) -> bool:
    """Whether ``events`` give the client anything: a call, reasoning, non-blank text."""
    return any(not isinstance(e, TextDelta) or e.text.strip() for e in events)


OVERRIDES = {"parser_class": DeepSeekOutputParser}
