"""The description of one family's output format that the engine's parser runs on.

A format says where reasoning is (think markers), where a tool call starts, where it ends
(a scanner over the call's text, so an end marker *inside* an argument string does not cut
the call short) and how the call's text becomes ``{"name", "arguments"}`` records. Here
too: the call-end scanners more than one family uses (:func:`marker_end`,
:class:`JsonMarkerEnd`, and the pieces of the structure scans).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: ``parse(call_text, tools) -> {"name", "arguments"[, "id"]} | [those]``; raises ValueError
#: (or KeyError/TypeError/IndexError, as mlx-lm's parsers do) for text that is no call.
ToolParser = Callable[[str, Any], Any]

#: ``call_end(call_text) -> (body_end, resume) | None``: where the call's body ends and where
#: the text after its end marker resumes, both indexes into ``call_text`` (the text after
#: the start marker); None while the call has not ended. It must be prefix-stable: once it
#: answers for a text, it answers the same for every longer text (streaming relies on it).
CallEnd = Callable[[str], "tuple[int, int] | None"]


def marker_end(end: str) -> CallEnd | None:
    """The call ends at the first ``end`` marker (None: the call runs to the end of the
    output, formats without an end marker)."""
    if not end:
        return None

    def call_end(text: str) -> tuple[int, int] | None:
        i = text.find(end)
        return None if i < 0 else (i, i + len(end))

    return call_end


#: what matters inside a JSON string: its end, an escape
_INSIDE = re.compile(r'["\\]')


class JsonMarkerEnd:
    """A :data:`CallEnd`: the call ends at the first of the end markers outside a JSON
    string (JSON bodies: an argument value that quotes the marker, e.g. code that mentions
    ``</tool_call>``, stays inside the call); ``(marker index, index past it)``.

    It resumes: fed the growing text of a call, as the engine does token by token, it goes
    on from where it stopped, so a long call costs linear time, not quadratic (a
    64,000-character argument: 22 s of scanning when each text is scanned from its start,
    see bench/toolcall_scan.py). A text that does not extend the last one starts over, so
    one instance serves one parser's calls in turn, and a fresh instance per text is the
    plain scan (the tests compare both on every prefix). Written here: no library scans for
    a marker outside JSON strings, and regex jumps keep the Python loop to quotes and
    marker candidates.

    Args:
        end, more: the end markers (non-empty strings); where two could start at one
            index, the first listed wins.
    """

    def __init__(self, end: str, *more: str) -> None:
        ends = self.ends = (end, *more)
        firsts = "".join(sorted({e[0] for e in ends}))
        self._outside = re.compile('"|[' + re.escape(firsts) + "]")
        self._text, self._i, self._in_str = "", 0, False

    def __call__(self, text: str) -> tuple[int, int] | None:
        if not text.startswith(self._text):
            self._i, self._in_str = 0, False
        self._text = text
        i, in_str, n, ends = self._i, self._in_str, len(text), self.ends
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
            elif (hit := next((e for e in ends if text.startswith(e, j)), None)) is not None:
                self._i, self._in_str = j, False
                return j, j + len(hit)
            elif any(e.startswith(text[j:]) for e in ends):  # maybe a marker, not all here
                i = j
                break
            else:
                i = j + 1
        self._i, self._in_str = i, in_str
        return None


# -- pieces of the structure scans (qwen3_coder, glm47, kimi_k3) -----------------------------
# Written here: those markups (raw-text values between tags) are no XML or JSON a library
# reads, and a scan must answer on every prefix while the call streams in.

class More(Exception):
    """A structure scan: the text ends before the structure decides (streaming: ask again
    when more text has come)."""


class Broken(Exception):
    """A structure scan: the text is not the format's structure from ``pos`` on (an index
    into the scanned text)."""

    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character (``str.isspace``) of ``text`` at or
    after ``i``; ``len(text)`` when there is none."""
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


def is_cut(text: str, i: int, tokens: tuple[str, ...]) -> bool:
    """``text`` ends at ``i``, or inside one of ``tokens`` starting at ``i`` (a proper
    prefix of it): the next text decides."""
    rest = text[i:]
    return not rest or any(len(rest) < len(t) and t.startswith(rest) for t in tokens)


def structure_end(scan: Callable[[], tuple[int, int]], text: str, end: str
                  ) -> tuple[int, int] | None:
    """A structure scan's answer as a :data:`CallEnd` answer for ``text``: what ``scan()``
    returns, (body end, resume); None while it raises :class:`More`; where it raises
    :class:`Broken` (the text stopped being the structure), the first ``end`` marker from
    that position on, as a plain marker scan would find it (None while there is none)."""
    try:
        return scan()
    except More:
        return None
    except Broken as e:
        i = text.find(end, e.pos)
        return None if i < 0 else (i, i + len(end))


class ScanMarks:
    """Where a structure scan of a call's growing text may resume inside each open value:
    value start -> how far its end has been looked for (both indexes into the call's text).
    Valid while each text extends the last (the structure before a value is then the same);
    a text that does not starts over. One per parser, so a long value costs linear time,
    not quadratic (bench/toolcall_scan.py)."""

    def __init__(self) -> None:
        self._text, self._marks = "", {}

    def __call__(self, text: str) -> dict[int, int]:
        """The marks valid for ``text`` (the scan reads and updates them)."""
        if not text.startswith(self._text):
            self._marks = {}
        self._text = text
        return self._marks


def schema_types(schema: dict) -> list[str]:
    """The JSON types a tool argument's schema allows (``type`` as a string or a list, and
    the members of ``anyOf``/``oneOf``), lower-cased, e.g. ``["integer", "null"]``; [] when
    it names none. For the families whose values are raw text (qwen3_coder, glm47): the
    schema decides whether the text is a string or JSON."""
    t = schema.get("type")
    if isinstance(t, str):
        return [t.strip().lower()]
    if isinstance(t, list):
        return [str(x).strip().lower() for x in t]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for member in schema.get(key) or ():
            if isinstance(member, dict):
                out += [x for x in schema_types(member) if x not in out]
    return out


#: The reasoning efforts a request may ask for, lowest first: OpenAI's (``none`` to
#: ``xhigh``) and ``max`` (Anthropic's ``output_config.effort``, pi's top level).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True)
class OutputFormat:
    """How one model family writes its output, for :class:`kit.formats.output.OutputParser`.

    Attributes:
        tool_format: the tool-call format's name as ``/v1/models`` reports it (an mlx-lm
            parser module name such as ``json_tools``, or one of ours such as
            ``deepseek``), None when the model's calls cannot be parsed.
        reasoning_format: the reasoning markup's name (``think``, ``harmony``, ...) or None.
        think: (start, end) markers of a reasoning block, or None.
        tool: (start, end) markers of a tool call; end "" when a call has no end marker.
        parse: turns one call's text (between the markers) into call records.
        call_end: finds the end of a call in its text (default: the first end marker).
        parse_partial: for a call cut off by ``max_tokens``: the complete calls in its text
            (a list, maybe empty); None drops a cut call.
        structural: markers removed from the answer text (mlx-lm's structural markers).
        transitions: more ``{state: [(text, new_state)]}`` for mlx-lm's ``TextStateMachine``.
        initial: the state generation starts in when the prompt says nothing else.
        grammar: the key of :data:`kit.engine.decode.grammar.TOOL_CALL_BODIES` whose body grammar a
            forced call uses (None: only the start marker is forced).
        parser_class: an :class:`~kit.formats.output.OutputParser` subclass for formats
            that need more than markers (None: the base class).
        efforts: the ``reasoning_effort`` values the family's template was made for,
            lowest first (empty: any value goes to the template as asked); see
            :meth:`template_effort`.
    """

    tool_format: str | None = None
    reasoning_format: str | None = None
    think: tuple[str, str] | None = None
    tool: tuple[str, str] | None = None
    parse: ToolParser | None = None
    call_end: CallEnd | None = None
    parse_partial: ToolParser | None = None
    structural: tuple[str, ...] = ()
    transitions: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    initial: str | None = None
    grammar: str | None = None
    parser_class: type | None = None
    efforts: tuple[str, ...] = ()

    def template_effort(self, effort: str) -> str:
        """``effort`` as this family's template knows it: itself when :attr:`efforts` is
        empty or lists it, else the listed one nearest in :data:`EFFORTS` order (the lower
        on a tie: gpt-oss's low/medium/high take ``none``/``minimal`` as ``low`` and
        ``xhigh``/``max`` as ``high``); a value outside :data:`EFFORTS` (a template
        variable the request set itself) unchanged."""
        if not self.efforts or effort in self.efforts or effort not in EFFORTS:
            return effort
        rank = EFFORTS.index
        known = [e for e in self.efforts if e in EFFORTS]
        return min(known, key=lambda e: (abs(rank(e) - rank(effort)), rank(e))) if known \
            else effort

    @property
    def tools(self) -> bool:
        """Tool calls in this format are parsed."""
        return self.tool is not None and self.parse is not None
