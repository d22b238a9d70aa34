"""The description of one family's output format that the engine's parser runs on.

A format says where reasoning is (think markers), where a tool call starts, where it ends
(a scanner over the call's text, so an end marker *inside* an argument string does not cut
the call short) and how the call's text becomes ``{"name", "arguments"}`` records.
"""

from __future__ import annotations

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


def json_marker_end(end: str) -> CallEnd | None:
    """The call ends at the first ``end`` marker outside a JSON string (JSON bodies: an
    argument value that quotes the marker, e.g. code that mentions ``</tool_call>``, stays
    inside the call). Written here: a string-aware scan is all it takes, no library does
    this one job."""
    if not end:
        return None

    def call_end(text: str) -> tuple[int, int] | None:
        i, in_str, n = 0, False, len(text)
        while i < n:
            c = text[i]
            if in_str:
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif text.startswith(end, i):
                return i, i + len(end)
            i += 1
        return None

    return call_end


#: The reasoning efforts a request may ask for, lowest first: OpenAI's (``none`` to
#: ``xhigh``) and ``max`` (Anthropic's ``output_config.effort``, pi's top level).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True)
class OutputFormat:
    """How one model family writes its output, for :class:`kit.engine.output.OutputParser`.

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
        grammar: the key of :data:`kit.engine.grammar.TOOL_CALL_BODIES` whose body grammar a
            forced call uses (None: only the start marker is forced).
        parser_class: an :class:`~kit.engine.output.OutputParser` subclass for formats
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
