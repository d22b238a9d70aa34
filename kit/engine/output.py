"""Split a model's generated text into answer text, reasoning and tool calls, and end it
at stop strings — incrementally, as tokens arrive.

Built on mlx-lm's ``TextStateMachine`` (text-level matching of control sequences, with
partial matches held back) and the tool parsers mlx-lm picks for each chat template
(``tokenizer.tool_parser``). The transitions follow ``mlx_lm.generate.make_text_state_machine``
with one difference: a stop string *ends* generation (destination state ``None``) instead
of being stripped, and stop strings apply to the answer text, not to reasoning.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kit.engine.types import ReasoningDelta, TextDelta, ToolCall

log = logging.getLogger("mlx_kit.engine")

ToolParser = Callable[[str, Any], Any]


class OutputParser:
    """Turns text chunks into ``TextDelta`` / ``ReasoningDelta`` / ``ToolCall`` events.

    Args:
        stops: strings that end generation (not returned).
        think: (start, end) markers of reasoning, or None.
        tool: (start, end) markers of a tool call (end may be "" when a call runs to the
            end of the output), or None.
        tool_parser: ``parser(tool_text, tools) -> {"name", "arguments"} | [...]``.
        tools: the request's tool schemas, handed to the parser.
        initial: the state generation starts in (``"reasoning"`` when the prompt opened a
            think block).
        extra: more transitions ``{state: [(text, new_state)]}`` (model-specific formats).
    """

    def __init__(self, *, stops: Sequence[str] = (), think: tuple[str, str] | None = None,
                 tool: tuple[str, str] | None = None, tool_parser: ToolParser | None = None,
                 tools: list[dict] | None = None, initial: str = "normal",
                 extra: dict[str, list[tuple[str, str]]] | None = None) -> None:
        from mlx_lm.generate import TextStateMachine

        transitions: dict[str, list[tuple[str, Any]]] = {"normal": []}
        if think:
            transitions["normal"].append((think[0], "reasoning"))
            transitions["reasoning"] = [(think[1], "normal")]
        if tool and tool_parser:
            transitions["normal"].append((tool[0], "tool"))
            if think:
                transitions["reasoning"].append((tool[0], "tool"))
            transitions["tool"] = [(tool[1], "normal")] if tool[1] else []
        for state, edges in (extra or {}).items():
            transitions.setdefault(state, []).extend(edges)
        transitions["normal"].extend((s, None) for s in stops if s)
        self._sm = TextStateMachine(transitions)
        self._state = self._sm.make_state(initial if initial in transitions else "normal")
        self._tool_parser, self._tools = tool_parser, tools
        self._tool_text = ""
        self._stops = tuple(s for s in stops if s)
        self._raw = ""  # the last generated text, to tell which stop string matched
        self.tool_calls = 0
        self.reasoning_tokens = 0  # generated tokens inside a think block (see feed)
        self._held = 0  # tokens fed as "" since the last text: counted with the next text
        self.stopped = False  # a stop string matched
        self.stop_string: str | None = None

    @classmethod
    def for_model(cls, tokenizer: Any, prompt: list[int], *, stops: Sequence[str] = (),
                  tools: list[dict] | None = None, in_tool_call: bool = False) -> OutputParser:
        """The parser for an mlx-lm ``TokenizerWrapper``'s chat template, starting in
        reasoning when the prompt ends inside an open think block, or inside a tool call
        when ``in_tool_call`` (the prompt ends with a forced call's start marker)."""
        think = None
        initial = "normal"
        if getattr(tokenizer, "has_thinking", False):
            think = (tokenizer.think_start, tokenizer.think_end)
            if tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt):
                initial = "reasoning"
        initial = getattr(tokenizer, "response_initial_state", None) or initial
        tool = None
        if tools and getattr(tokenizer, "has_tool_calling", False):
            tool = (tokenizer.tool_call_start, tokenizer.tool_call_end or "")
            if in_tool_call:
                initial = "tool"
        extra: dict[str, list[tuple[str, str]]] = {}
        for marker in getattr(tokenizer, "structural_markers", None) or ():
            extra.setdefault("normal", []).append((marker, "normal"))
        for state, edges in (getattr(tokenizer, "response_transitions", None) or {}).items():
            extra.setdefault(state, []).extend(edges)
        return cls(stops=stops, think=think, tool=tool,
                   tool_parser=getattr(tokenizer, "tool_parser", None) if tool else None,
                   tools=tools, initial=initial, extra=extra)

    def _events(self, segments: list[tuple[str | None, str]]) -> list[Any]:
        events: list[Any] = []
        for state, text in segments:
            if state == "tool":
                self._tool_text += text
                continue
            if self._tool_text and state != "tool":  # a call just closed
                events += self._parse_tool(self._tool_text)
                self._tool_text = ""
            if not text:
                continue
            if state == "reasoning":
                events.append(ReasoningDelta(text))
            elif state is not None:
                events.append(TextDelta(text))
        return events

    def _parse_tool(self, text: str) -> list[Any]:
        try:
            parsed = self._tool_parser(text, self._tools) if self._tool_parser else None
        except (ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("could not parse a tool call (%s); returning it as text", e)
            return [TextDelta(text)]
        calls = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(call, dict) or "name" not in call:
                continue
            args = call.get("arguments", {})
            calls.append(ToolCall(id=call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                                  name=str(call["name"]), index=self.tool_calls,
                                  arguments=args if isinstance(args, str)
                                  else json.dumps(args, ensure_ascii=False)))
            self.tool_calls += 1
        return calls or [TextDelta(text)]

    def feed(self, text: str) -> list[Any]:
        """Consume the next generated text (one call per generated token: the decode loops
        feed each token's text, "" for a token the detokenizer holds back); returns the
        events it completes. After a stop string, ``stopped`` is True and no more text
        should be fed. A token is counted in ``reasoning_tokens`` when its text is in the
        think block or is one of the markers that open and close it (they are not part of
        the answer either); a token whose text the detokenizer held back counts with the
        text that follows, and one that never shows any (the EOS token) counts nowhere."""
        from mlx_lm.generate import TextStateMachine

        self._state, segments = TextStateMachine.split(self._state, text)
        if not text:
            self._held += 1
        else:
            # segments name every state the text passed, the one before it first
            if any(state == "reasoning" for state, _ in segments):
                self.reasoning_tokens += 1 + self._held
            self._held = 0
        if self._stops:
            self._raw = (self._raw + text)[-4096:]
        if self._state[0] is None:
            self.stopped = True
            ends = [(self._raw.rfind(s) + len(s), s) for s in self._stops if s in self._raw]
            self.stop_string = max(ends)[1] if ends else None
        return self._events(segments)

    def finish(self, reason: str) -> list[Any]:
        """End of generation. ``"length"``: held-back text is released, and a tool call cut
        off mid-way is dropped (it cannot be valid); otherwise (EOS) an unterminated tool
        call is parsed (formats without an end marker)."""
        from mlx_lm.generate import TextStateMachine

        self._state, tail, state = TextStateMachine.flush(self._state)
        events = self._events([(state, tail)]) if not self.stopped else []
        if self._tool_text:
            if reason != "length":
                events += self._parse_tool(self._tool_text)
            self._tool_text = ""
        return events
