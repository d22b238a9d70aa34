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

This module is the format's entry point (mlx-lm's parser-module contract, the forced-call
grammar, the engine's parser); the markers and block-end scans are in
``_deepseek_markup.py``, reading a block's calls in ``_deepseek_calls.py``.
"""

from __future__ import annotations

import json
from typing import Any

from kit import mlx_lm_api
from kit.formats._deepseek_calls import parse_partial, parse_tool_call
from kit.formats._deepseek_markup import (
    BLOCKS,
    BlockEnd,
    CALLS_BEGIN,
    CALLS_END,
    CALL_BEGIN,
    CALL_END,
    DSML,
    DSML_STARTS,
    SEP,
)
from kit.formats.events import TextDelta, ToolCall
from kit.formats.output import OutputParser, gives_anything

__all__ = ["BLOCKS", "CALL_BEGIN", "CALL_END", "CALLS_BEGIN", "CALLS_END", "DSML",
           "DSML_STARTS", "GRAMMAR_BETWEEN", "GRAMMAR_CLOSE", "SEP", "DeepSeekOutputParser",
           "call_end", "grammar_body", "parse_partial", "parse_tool_call", "tool_call_end",
           "tool_call_start"]

# mlx-lm's parser-module contract; the DSML starts are added by DeepSeekOutputParser
tool_call_start = CALLS_BEGIN
tool_call_end = CALLS_END


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call block that started with ``<｜tool▁calls▁begin｜>`` ends: the text after
    the start marker in, ``(end, end)`` out, ``end`` just past the block's closing marker,
    which stays in the call's text (so a block that does not parse is returned exactly as
    written); None while the block is open. V3/V3.1 blocks end at ``<｜tool▁calls▁end｜>``
    outside JSON strings, DSML blocks at their closing tag outside parameter values.
    Prefix-stable."""
    return BlockEnd()(text)


# ---------------------------------------------------------------------------- forced calls

def grammar_body(name: str, args: str) -> str:
    """The Lark expression (llguidance dialect) of one forced call after
    ``<｜tool▁calls▁begin｜>`` (which the prompt ends with): the V3.1 form,
    ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>``, the simplest of the
    sub-formats to constrain (the arguments are one JSON object) and one
    :func:`parse_tool_call` reads whichever DeepSeek model wrote it; more calls follow
    directly (:data:`GRAMMAR_BETWEEN`), and :data:`GRAMMAR_CLOSE` ends the block. ``args``:
    the Lark expression of the arguments object (e.g. a ``%json`` rule's name). The
    markers are text literals: the grammar gets no vocab to name them as special tokens
    by, and the parser reads text."""
    head = f"{CALL_BEGIN}{name}{SEP}"
    return f"{json.dumps(head)} {args} {json.dumps(CALL_END)}"


#: What a forced turn writes between two calls of its block (V3.1's template: nothing) and
#: after the last (:class:`kit.engine.decode.tool_grammar.CallSequence`).
GRAMMAR_BETWEEN, GRAMMAR_CLOSE = "", CALLS_END


# ---------------------------------------------------------------------------- engine parser

class DeepSeekOutputParser(OutputParser):
    """The engine's :class:`~kit.formats.output.OutputParser` with the DSML block starts
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
                    self._call_end = BlockEnd(None if state == "tool" else "dsml")
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
        self._answered = self._answered or gives_anything(events)
        return events

    def finish(self, reason: str) -> list[Any]:
        """As ``OutputParser.finish``, for generation that ends inside a block: at EOS a
        block that does not parse (a lone start marker too) comes back as its text; of a
        block cut by ``max_tokens`` the complete calls come back, and when there are none
        and nothing else came back (no text, reasoning or call) the block's text does,
        start marker included: never an empty reply."""
        if self._state[0] not in self._starts:
            return super().finish(reason)
        self._state, tail, state = mlx_lm_api.TextStateMachine.flush(self._state)
        events = self._events([(state, tail)])
        text, self._tool_text = self._tool_text, ""
        if reason != "length":
            return events + self._parse_tool(text)
        calls = self._calls(parse_partial(text, self._tools))
        if not calls and not self._answered and not gives_anything(events):
            calls = [TextDelta(self._start + text)]
        return events + calls


OVERRIDES = {"parser_class": DeepSeekOutputParser}
