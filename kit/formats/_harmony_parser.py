"""The engine's parser for gpt-oss Harmony output (see :mod:`kit.formats.harmony`, the
format's entry point): messages routed by their headers, as they stream in.
"""

from __future__ import annotations

import logging
from typing import Any

from kit.formats._harmony_markup import (
    CALL_ENDS,
    CHANNEL,
    CONSTRAIN,
    Header,
    MAX_HEADER,
    MESSAGE,
    SPECIALS,
    START,
    TEXT_ENDS,
    arguments,
    callee,
    find_first,
    held,
)
from kit.formats.base import JsonMarkerEnd
from kit.formats.events import ReasoningDelta, TextDelta
from kit.formats.output import OutputParser, gives_anything

log = logging.getLogger("mlx_kit.engine")


class HarmonyParser(OutputParser):
    """:class:`~kit.formats.output.OutputParser` for Harmony: a header state whose
    ``<|message|>`` routes the body by the header (reasoning, content, a call, or dropped).

    Reasoning and answer text stream as they arrive (a possible partial marker or stop
    string at the end is held back); a header and a call's body are buffered until they
    end. The result depends only on the text, never on how it was split into chunks: every
    decision is taken at a position in the text (a marker, :data:`MAX_HEADER`), never at a
    chunk boundary. Arguments as the base class takes them (``think``, ``call_end`` and
    ``extra`` are unused: Harmony's markers are fixed); ``tool`` None means the request
    sent no tools, so no message is a call. Stop strings end the answer text (content),
    never reasoning or a call.
    """

    def __init__(self, *, stops=(), think=None, tool=None, tool_parser=None, tools=None,
                 initial="normal", extra=None, call_end=None, parse_partial=None) -> None:
        # not the base's __init__: its TextStateMachine decides states by markers alone,
        # and Harmony's states are decided by what the header says
        self._tools = tools if tool is not None else None
        self._stops = tuple(s for s in stops if s)
        self.tool_calls = 0
        self._said = False  # text, reasoning or a call came back (see finish)
        self.reasoning_tokens = 0
        self.stopped = False
        self.stop_string: str | None = None
        self._held_tokens = 0  # tokens fed as "" since the last text
        self._head_tokens = 0  # tokens that went into the current header
        self._hit = False  # the token being fed touched a reasoning message
        self._buf = ""  # text not consumed yet
        self._mode = "head"  # head | text | call | drop | stray | done
        # a forced call: the prompt ends with <|start|>assistant and the call's start
        self._header = tool[0] if initial == "tool" and tool else ""
        self._after_start = False  # the header follows a <|start|> the model wrote
        self._route = "content"  # text mode: reasoning | content
        self._name, self._json = "", True  # call mode
        self._body, self._scan = "", JsonMarkerEnd(*CALL_ENDS)

    # -- the OutputParser interface -----------------------------------------------------

    def feed(self, text: str) -> list[Any]:
        """See :meth:`OutputParser.feed`. A token counts in ``reasoning_tokens`` when its
        text is in an ``analysis`` message (its header and end marker included)."""
        if self.stopped:
            return []
        if not text:
            self._held_tokens += 1
            return []
        n, self._held_tokens = 1 + self._held_tokens, 0
        self._hit = self._mode == "text" and self._route == "reasoning"
        was_head = self._mode == "head"
        self._buf += text
        events = self._run()
        self._said = self._said or gives_anything(events)
        if self._hit:
            self.reasoning_tokens += n
        elif was_head or self._mode == "head":
            self._head_tokens += n
        return events

    def finish(self, reason: str) -> list[Any]:
        """End of generation (see :meth:`OutputParser.finish`): held-back text is released;
        a header cut by ``max_tokens`` is dropped (its message never began) unless nothing
        else came back (a forced call cut in its name: its text, never an empty reply), one
        ended by EOS comes back as text; a call ended by EOS (``<|call|>`` is one) is parsed; one cut
        by ``max_tokens`` is kept when its JSON is complete, else its text comes back."""
        if self.stopped or self._mode == "done":
            return []
        events: list[Any] = []
        buf, self._buf = self._buf, ""
        if self._mode == "head":
            head = self._header + buf
            if head and (reason != "length" or not self._looks_like_header(head)
                         or not self._said):
                events.append(TextDelta(head))
        elif self._mode == "text":
            events += self._text(buf)
        elif self._mode == "call":
            body = self._body + buf
            if reason != "length":
                events += self._call(body)
            else:
                try:
                    events += self._calls({"name": self._name, "arguments": arguments(body)})
                except ValueError:
                    log.warning("a tool call was cut by max_tokens; returning its text")
                    events += [TextDelta(body)] if body else []
        elif self._mode == "stray" and buf:
            events.append(TextDelta(buf))
        self._mode = "done"
        return events

    # -- states -------------------------------------------------------------------------

    def _run(self) -> list[Any]:
        events: list[Any] = []
        while self._buf and not self.stopped and self._mode != "done":
            if not getattr(self, "_step_" + self._mode)(events):
                break  # waiting for more text
        return events

    def _text(self, text: str) -> list[Any]:
        if not text:
            return []
        if self._route == "reasoning":
            self._hit = True
            return [ReasoningDelta(text)]
        return [TextDelta(text)]

    def _looks_like_header(self, head: str) -> bool:
        """Harmony header markup (dropped when cut), not text a model wrote without any
        markup (returned)."""
        return self._after_start or CHANNEL in head or \
            head.lstrip().startswith((CONSTRAIN, MESSAGE, "to="))

    def _new_header(self, text: str, after_start: bool) -> None:
        self._mode, self._header, self._after_start = "head", text, after_start
        self._head_tokens = 0

    def _grow(self, text: str, events: list[Any]) -> bool:
        """Add ``text`` to the header; False when that shows it is no header (it is then
        text again, put back in front of the buffer, read in the stray state)."""
        self._header += text
        h = self._header
        if not self._after_start and not h.startswith((CHANNEL, " to=", "to=", CONSTRAIN)) \
                and not any(p.startswith(h) for p in (CHANNEL, " to=", "to=", CONSTRAIN)):
            # the first message's header follows the prompt's <|start|>assistant: text
            # that cannot begin one is a model writing without Harmony markup
            self._header, self._buf, self._mode = "", h + self._buf, "stray"
            return False
        if len(h) > MAX_HEADER:
            log.warning("a Harmony header ran past %d characters; returned as text",
                        MAX_HEADER)
            events.append(TextDelta(h[:MAX_HEADER]))
            self._header, self._buf, self._mode = "", h[MAX_HEADER:] + self._buf, "stray"
            return False
        return True

    def _malformed(self, events: list[Any]) -> None:
        if self._header:
            log.warning("a Harmony header without <|message|>; returned as text")
            events.append(TextDelta(self._header))
        self._header = ""

    def _step_head(self, events: list[Any]) -> bool:
        i, m = find_first(self._buf, SPECIALS)
        if m is None:
            cut = len(self._buf) - held(self._buf, SPECIALS)
            text, self._buf = self._buf[:cut], self._buf[cut:]
            return not self._grow(text, events)  # stray: go on; else wait for more
        text, self._buf = self._buf[:i], self._buf[i:]
        if not self._grow(text, events):
            return True
        self._buf = self._buf[len(m):]
        if m == MESSAGE:
            self._open()
        elif m in (CHANNEL, CONSTRAIN) and not (m == CHANNEL and CHANNEL in self._header):
            if not self._grow(m, events):
                return True
        elif m == CHANNEL:  # a second channel: the first header was never finished
            self._malformed(events)
            self._new_header(CHANNEL, False)
        elif m == START:
            self._malformed(events)
            self._new_header("", True)
        else:  # <|end|> <|call|> <|return|>: the header never got its <|message|>
            self._malformed(events)
            self._mode = "stray"
        return True

    def _open(self) -> None:
        """``<|message|>``: route the body by the header."""
        header = Header(self._header)
        self._header = ""
        name = callee(header, self._tools)
        if name:
            self._mode, self._name, self._json = "call", name, header.json
            self._body, self._scan = "", JsonMarkerEnd(*CALL_ENDS)
        elif header.recipient is not None:
            log.warning("a message to %r, which is no offered function: dropped",
                        header.recipient[:64])
            self._mode, self._body = "drop", ""
        else:
            self._mode = "text"
            self._route = "reasoning" if header.channel == "analysis" else "content"
            if self._route == "reasoning":
                self._hit = True
                self.reasoning_tokens += self._head_tokens
        self._head_tokens = 0

    def _step_text(self, events: list[Any]) -> bool:
        ends = TEXT_ENDS + (self._stops if self._route == "content" else ())
        i, m = find_first(self._buf, ends)
        if m is None:
            cut = len(self._buf) - held(self._buf, ends)
            events += self._text(self._buf[:cut])
            self._buf = self._buf[cut:]
            return False
        events += self._text(self._buf[:i])
        rest, self._buf = self._buf[i + len(m):], ""
        if m in TEXT_ENDS:
            self._hit = self._hit or self._route == "reasoning"
            self._mode, self._buf = "stray", rest
            return True
        self.stopped, self.stop_string = True, m
        return False

    def _step_stray(self, events: list[Any]) -> bool:
        """Between messages: text here is content (a model that writes without markup,
        or after a malformed header); ``<|start|>`` or ``<|channel|>`` begins a header."""
        ends = SPECIALS + self._stops
        i, m = find_first(self._buf, ends)
        if m is None:
            cut = len(self._buf) - held(self._buf, ends)
            if cut:
                events.append(TextDelta(self._buf[:cut]))
            self._buf = self._buf[cut:]
            return False
        if i:
            events.append(TextDelta(self._buf[:i]))
        self._buf = self._buf[i + len(m):]
        if m in self._stops and m not in SPECIALS:
            self.stopped, self.stop_string, self._buf = True, m, ""
            return False
        if m == START:
            self._new_header("", True)
        elif m == CHANNEL:  # a header whose <|start|>ROLE was left out
            self._new_header(CHANNEL, False)
        # any other marker out of place is markup, not text: dropped
        return True

    def _step_call(self, events: list[Any]) -> bool:
        if not self._json:
            return self._step_drop(events)
        self._body += self._buf
        self._buf = ""
        end = self._scan(self._body)  # resumes where the last text's scan stopped
        if end is None:
            return False
        body, rest = self._body[:end[0]], self._body[end[1]:]
        self._body = ""
        events += self._call(body)
        self._mode, self._buf = "stray", rest
        return True

    def _step_drop(self, events: list[Any]) -> bool:
        """A body that ends at the first end marker: a dropped message's, or a call's whose
        content type is no JSON."""
        i, m = find_first(self._buf, CALL_ENDS)
        if m is None:
            cut = len(self._buf) - held(self._buf, CALL_ENDS)
            self._body += self._buf[:cut]
            self._buf = self._buf[cut:]
            return False
        body, self._buf = self._body + self._buf[:i], self._buf[i + len(m):]
        self._body = ""
        if self._mode == "call":
            events += self._call(body)
        self._mode = "stray"
        return True

    def _call(self, body: str) -> list[Any]:
        """A call's events: the call, or its body as text when that is no JSON object."""
        try:
            return self._calls({"name": self._name, "arguments": arguments(body)})
        except ValueError as e:
            log.warning("could not parse a tool call (%s); returning it as text", e)
            return [TextDelta(body)] if body else []
