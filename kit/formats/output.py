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
from collections.abc import Sequence
from typing import Any

from kit import mlx_lm_api
from kit.formats.base import CallEnd, OutputFormat, ToolParser, marker_end
from kit.formats.events import ReasoningDelta, TextDelta, ToolCall

log = logging.getLogger("mlx_kit.engine")


def _openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


#: Call ids per tool format, for calls whose markup carries none: each family's chat
#: template has rules for the ids it renders back (Mistral's raise on any id that is not 9
#: alphanumerics); other formats get OpenAI's ``call_`` + 24 hex. Ids the model wrote
#: (Kimi's ``functions.NAME:IDX``, Mistral's JSON list form) are kept as written.
CALL_IDS = {"mistral": lambda: uuid.uuid4().hex[:9]}


def gives_anything(events: list[Any]) -> bool:
    """Whether ``events`` give the client anything: a call, reasoning, non-blank text."""
    return any(not isinstance(e, TextDelta) or e.text.strip() for e in events)


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
                 extra: dict[str, list[tuple[str, str]]] | None = None,
                 call_end: CallEnd | None = None,
                 parse_partial: ToolParser | None = None) -> None:
        transitions: dict[str, list[tuple[str, Any]]] = {"normal": []}
        if think:
            transitions["normal"].append((think[0], "reasoning"))
            transitions["reasoning"] = [(think[1], "normal")]
        if tool and tool_parser:
            transitions["normal"].append((tool[0], "tool"))
            if think:
                transitions["reasoning"].append((tool[0], "tool"))
            # the call's end is found by call_end over the call's text (see _events), not
            # by the state machine, which would end it at a marker inside an argument string
            transitions["tool"] = []
        for state, edges in (extra or {}).items():
            transitions.setdefault(state, []).extend(edges)
        transitions["normal"].extend((s, None) for s in stops if s)
        self._sm = mlx_lm_api.TextStateMachine(transitions)
        self._state = self._sm.make_state(initial if initial in transitions else "normal")
        self._tool_parser, self._tools = tool_parser, tools
        self._call_end = call_end if call_end is not None else \
            marker_end(tool[1] if tool else "")
        self._parse_partial = parse_partial
        self._tool_text = ""
        self._tool_start = tool[0] if tool else ""
        self._said = False  # text, reasoning or a call came back (see finish)
        self._call_from: str | None = None  # the state the open call was entered from
        self._stops = tuple(s for s in stops if s)
        self._raw = ""  # the last generated text, to tell which stop string matched
        self.tool_calls = 0
        self.reasoning_tokens = 0  # generated tokens inside a think block (see feed)
        self._held = 0  # tokens fed as "" since the last text: counted with the next text
        self.stopped = False  # a stop string matched
        self.stop_string: str | None = None
        self.new_call_id = _openai_call_id  # ids of calls that carry none (see CALL_IDS)
        # one call per turn (``parallel_tool_calls`` false): see for_format
        self.single_call = False

    @classmethod
    def for_format(cls, fmt: OutputFormat, prompt_tail: str, *, stops: Sequence[str] = (),
                   tools: list[dict] | None = None, in_tool_call: bool = False,
                   tokenizer: Any = None, parallel: bool = True) -> OutputParser:
        """The parser for a model's :class:`~kit.formats.OutputFormat`, starting in
        reasoning when ``prompt_tail`` (the prompt's last text, special tokens included)
        opened a think block it did not close, or inside a tool call when
        ``in_tool_call`` (the prompt ends with a forced call's start marker). Tool calls
        are parsed only when the request sent ``tools``. ``tokenizer``: mlx-lm's
        ``TokenizerWrapper``, for the response transitions a checkpoint's config may add.

        ``parallel`` False (``parallel_tool_calls: false``): one call per turn, for the
        turns no grammar holds to one (unforced). Generation ends as soon as the first
        call's markup closes (``stopped``, as at a stop string; nothing after the call
        comes back). A format that writes several calls in one block closes the block
        only after the last (Kimi's section, DeepSeek's block; Mistral's calls run to
        EOS): there the others were generated, and only the first is returned."""
        think = fmt.think
        initial = fmt.initial or "normal"
        if think and prompt_tail.rfind(think[0]) > prompt_tail.rfind(think[1]):
            initial = "reasoning"
        initial = getattr(tokenizer, "response_initial_state", None) or initial
        tool = fmt.tool if tools and fmt.tools else None
        if tool and in_tool_call:
            initial = "tool"
        extra: dict[str, list[tuple[str, str]]] = {}
        for marker in fmt.structural:
            extra.setdefault("normal", []).append((marker, "normal"))
        for state, edges in fmt.transitions.items():
            extra.setdefault(state, []).extend(edges)
        for state, edges in (getattr(tokenizer, "response_transitions", None) or {}).items():
            extra.setdefault(state, []).extend(edges)
        kind = fmt.parser_class or cls
        parser = kind(stops=stops, think=think, tool=tool,
                      tool_parser=fmt.parse if tool else None, tools=tools, initial=initial,
                      extra=extra, call_end=fmt.call_end if tool else None,
                      parse_partial=fmt.parse_partial if tool else None)
        parser.new_call_id = CALL_IDS.get(fmt.tool_format or "", _openai_call_id)
        parser.single_call = not parallel
        return parser

    def _events(self, segments: list[tuple[str | None, str]]) -> list[Any]:
        events: list[Any] = []
        before: str | None = None  # the state of the previous segment
        for state, text in segments:
            if state == "tool":
                if self._call_from is None:  # a call starts: from the answer or reasoning
                    self._call_from = before if before == "reasoning" else "normal"
                self._tool_text += text
                try:
                    end = self._call_end(self._tool_text) if self._call_end else None
                except Exception as e:  # noqa: BLE001 - hostile output (RecursionError...)
                    log.warning("could not scan a tool call (%s); it ends here", e)
                    end = (len(self._tool_text), len(self._tool_text))
                if end is None:
                    continue
                # the call ended: parse it, then read what follows from the state the call
                # was entered from (a call made inside reasoning returns to reasoning)
                body, rest = self._tool_text[:end[0]], self._tool_text[end[1]:]
                self._tool_text = ""
                events += self._parse_tool(body)
                self._state = self._sm.make_state(self._call_from)
                self._call_from = None
                self._state, more = mlx_lm_api.TextStateMachine.split(self._state, rest)
                events += self._events(more)
                continue
            before = state
            if self._tool_text and state != "tool":  # a call without an end marker
                events += self._parse_tool(self._tool_text)
                self._tool_text = ""
            if not text:
                continue
            if state == "reasoning":
                events.append(ReasoningDelta(text))
            elif state is not None:
                events.append(TextDelta(text))
        return events

    def _calls(self, parsed: Any) -> list[ToolCall]:
        parsed = _checked_calls(parsed)  # ValueError: the call's markup comes back as text
        calls = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(call, dict) or "name" not in call:
                continue
            if self.single_call and self.tool_calls:
                break  # one call per turn: the first is the one returned
            args = call.get("arguments", {})
            calls.append(ToolCall(id=call.get("id") or self.new_call_id(),
                                  name=str(call["name"]), index=self.tool_calls,
                                  arguments=args if isinstance(args, str)
                                  else json.dumps(args, ensure_ascii=False)))
            self.tool_calls += 1
        return calls

    def _parse_tool(self, text: str) -> list[Any]:
        try:
            parsed = self._tool_parser(text, self._tools) if self._tool_parser else None
            calls = self._calls(parsed)
        except Exception as e:  # noqa: BLE001 - any parser failure (RecursionError on deep
            # nesting, MemoryError...) is the model's output, not the server's: text
            log.warning("could not parse a tool call (%s); returning it as text", e)
            return [TextDelta(text)]
        if not calls and self.single_call and self.tool_calls:
            return []  # a call after the one a single-call turn returns
        return calls or [TextDelta(text)]

    def feed(self, text: str) -> list[Any]:
        """Consume the next generated text (one call per generated token: the decode loops
        feed each token's text, "" for a token the detokenizer holds back); returns the
        events it completes. After a stop string, ``stopped`` is True and no more text
        should be fed. A token is counted in ``reasoning_tokens`` when its text is in the
        think block or is one of the markers that open and close it (they are not part of
        the answer either); a token whose text the detokenizer held back counts with the
        text that follows, and one that never shows any (the EOS token) counts nowhere."""
        self._state, segments = mlx_lm_api.TextStateMachine.split(self._state, text)
        if not text:
            self._held += 1
        else:
            # segments name every state the text passed, the one before it first
            if any(state == "reasoning" for state, _ in segments):
                self.reasoning_tokens += 1 + self._held
            self._held = 0
        if self._stops:
            self._raw = (self._raw + text)[-4096:]
        events = self._events(segments)
        if self.single_call and any(isinstance(e, ToolCall) for e in events):
            # one call per turn: generation ends with the first call, as at a stop string
            events = events[:next(i for i, e in enumerate(events) if isinstance(e, ToolCall))
                            + 1]
            self.stopped, self._said, self._tool_text = True, True, ""
            return events
        # after _events: the text after a call's end is read there, and may hold the stop
        if self._state[0] is None:
            self.stopped = True
            ends = [(self._raw.rfind(s) + len(s), s) for s in self._stops if s in self._raw]
            self.stop_string = max(ends)[1] if ends else None
        self._said = self._said or gives_anything(events)
        return events

    def finish(self, reason: str) -> list[Any]:
        """End of generation. ``"length"``: held-back text is released, and of a tool call
        cut off mid-way the format's ``parse_partial`` keeps the complete calls; with none
        complete, :meth:`cut_call_text` says what of the cut call comes back (by default
        its text, start marker included, only when nothing else came back, so a reply is
        never empty); after calls, a cut start marker of one more call (``<tool_`` held
        back as a possible marker) is no answer text either. Otherwise (EOS) an
        unterminated tool call is parsed (formats without an end marker)."""
        self._state, tail, state = mlx_lm_api.TextStateMachine.flush(self._state)
        if reason == "length" and self.tool_calls and tail and state != "tool" and \
                self._tool_start.startswith(tail):
            tail = ""  # the start of one more call's marker, cut: no answer text
        events = self._events([(state, tail)]) if not self.stopped else []
        if self._tool_text:
            text, self._tool_text = self._tool_text, ""
            if reason != "length":
                events += self._parse_tool(text)
            else:
                calls: list[Any] = []
                if self._parse_partial is not None:
                    try:
                        calls = self._calls(self._parse_partial(text, self._tools))
                    except Exception as e:  # noqa: BLE001 - as in _parse_tool
                        log.warning("could not parse a cut tool call (%s)", e)
                if not calls:
                    cut = self.cut_call_text(text, said=self._said or gives_anything(events))
                    calls = [TextDelta(cut)] if cut else []
                events += calls
        return events

    def cut_call_text(self, text: str, *, said: bool) -> str:
        """What comes back of a tool call cut by ``max_tokens`` with no complete call in it
        (``text``: the call's text after its start marker; ``said``: text, reasoning or a
        call came back before it): its whole markup when nothing else did, else nothing (a
        cut call cannot be valid). Formats whose "call" may be plain text override it."""
        return "" if said else self._tool_start + text


def _checked_calls(parsed: Any) -> list[Any]:
    """A tool parser's result as a list whose calls each have a non-empty string name and
    arguments that are strict JSON object text (what clients ``JSON.parse``).

    Raises:
        ValueError: a call that has not: mlx-lm's parsers hand over what they could not
            decode as the raw string (kimi_k2: ``{"a": 1}<|tool_c``), any JSON value
            (``[1]``, ``"x"``), ``NaN``/``Infinity`` (json.loads accepts them, JSON does
            not) or Python literals json.dumps cannot write (a set: TypeError).
    """
    out = []
    for call in parsed if isinstance(parsed, list) else [parsed]:
        if isinstance(call, dict) and "name" in call:
            if not isinstance(call["name"], str) or not call["name"]:
                raise ValueError("a call's name is not a non-empty string")
            call = {**call, "arguments": _json_object(call.get("arguments", {}))}
        out.append(call)
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_object(args: Any) -> str:
    """A call's arguments as strict JSON object text: a string is kept as it is when it
    parses as one ("" is no arguments), a mapping is written with :func:`json.dumps`.

    Raises:
        ValueError: not a JSON object, ``NaN``/``Infinity`` in it, values JSON cannot
            hold (sets, bytes: json.dumps's TypeError) or nesting deeper than the
            interpreter's stack (RecursionError), all re-raised as ValueError.
    """
    try:
        if isinstance(args, str):
            if not args.strip():
                return "{}"
            if not isinstance(json.loads(args, parse_constant=_reject_constant), dict):
                raise ValueError("a call's arguments are not a JSON object")
            return args
        if not isinstance(args, dict):
            raise ValueError(f"a call's arguments are not a JSON object: "
                             f"{type(args).__name__}")
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (TypeError, RecursionError) as e:  # a set; nesting deeper than Python's stack
        raise ValueError(f"a call's arguments are not JSON: {type(e).__name__}") from None
