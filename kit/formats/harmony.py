"""gpt-oss's Harmony output: messages on channels, reasoning, preambles, answers and tool calls.

After the generation prompt's ``<|start|>assistant`` the model writes one or more messages::

    [<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ TYPE|<|constrain|>TYPE]
    <|message|>BODY  then <|end|> (more messages follow), <|call|> or <|return|> (both EOS)

Routing, by the header (OpenAI's Harmony format spec, docs/format.md of openai/harmony, and
gpt-oss's chat_template.jinja): a message with a recipient ``functions.NAME`` (in the role
part or after the channel, on whatever channel) is a call of NAME with BODY as its JSON
arguments; ``analysis`` is reasoning; ``final`` is the answer; ``commentary`` without a
recipient is a preamble the user sees (content), and so is a channel the spec does not
name. A recipient that is no offered function (the built-in ``python`` / ``browser.*``
tools, which this server never offers) is not a call: its body is dropped, as llama.cpp
does. A header without ``<|message|>`` (malformed: ended by ``<|end|>``, ``<|start|>`` or a
second ``<|channel|>``) comes back as text, never as an error.

Ends: a text body ends at ``<|end|>`` or ``<|return|>`` only, so marker text a model quotes
in its reasoning (``<|call|>``, ``<|channel|>``) stays reasoning; a call's JSON body ends at
the first ``<|call|>`` / ``<|end|>`` / ``<|return|>`` outside a JSON string, so an argument
that quotes a marker stays in the call. ``<|call|>`` and ``<|return|>`` are EOS tokens the
engine never feeds, so a call usually ends where generation does.

Why not ``openai-harmony`` (OpenAI's own library for the format, 0.0.8): its parsers
(``StreamableParser.process(token)``, ``parse_messages_from_completion_tokens``) take o200k
token ids, while the engine's parser is fed detokenized text (so are the conformance replay
and every other family's parser); and loading its encoding downloads
``o200k_base.tiktoken`` (SHA-256 checked) from openaipublic.blob.core.windows.net on first
use, so offline (this machine, CI, many Macs) ``load_harmony_encoding`` fails with "error
downloading or loading vocab file". ``TIKTOKEN_ENCODINGS_BASE`` / ``TIKTOKEN_RS_CACHE_DIR``
can point it at a local copy, but only the exact file passes its hash check; rebuilding it
from a checkpoint's tokenizer.json could not be tried (no gpt-oss tokenizer here) and would
still leave the token-id interface. Its Python API has nothing that works without the
vocab (``Message``/``Conversation`` are pydantic models for rendering). So the text-level
parser is written here; it follows the spec and the library's documented leniencies
(recipient before or after the channel, ``<|constrain|>`` with or without a space).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from kit.engine.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta

log = logging.getLogger("mlx_kit.engine")

START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = (
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
    "<|call|>")
SPECIALS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
#: what ends a message's body (``<|call|>`` only ends a call: see the module docstring)
TEXT_ENDS = (END, RETURN)
CALL_ENDS = (CALL, END, RETURN)

#: mlx-lm's parser-module contract: a forced call's prompt ends with ``<|start|>assistant``
#: and this; the model writes ``NAME<|channel|>commentary json<|message|>{...}`` and EOS
tool_call_start = " to=functions."
tool_call_end = CALL

#: a header longer than this without ``<|message|>`` is not one (real headers are
#: ``<|channel|>commentary to=functions.NAME <|constrain|>json``, well under 200
#: characters): what was buffered comes back as text and the rest streams as text
MAX_HEADER = 256

_RECIPIENT = re.compile(r"\bto=([^\s<\x00]+)")


def _find(buf: str, strings: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest complete occurrence of one of ``strings`` in ``buf`` as ``(index,
    string)`` (ties: the first listed), else ``(-1, None)``."""
    best, hit = -1, None
    for s in strings:
        i = buf.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, hit = i, s
    return best, hit


def _held(buf: str, strings: tuple[str, ...]) -> int:
    """How many characters at the end of ``buf`` may be the start of one of ``strings``
    (held back until the next text decides)."""
    for k in range(min(len(buf), max((len(s) for s in strings), default=1) - 1), 0, -1):
        tail = buf[-k:]
        if any(s.startswith(tail) for s in strings):
            return k
    return 0


def _json_end(body: str, pos: int, in_str: bool, esc: bool
              ) -> tuple[int | None, str | None, int, bool, bool]:
    """Scan a JSON body from ``pos`` for a call end outside a string. Returns ``(index,
    marker, pos, in_str, esc)``: the end marker's index and text when found, else None and
    the state to resume from (``pos`` stops at a possible partial marker)."""
    n = len(body)
    while pos < n:
        c = body[pos]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "<":
            for m in CALL_ENDS:
                if body.startswith(m, pos):
                    return pos, m, pos, in_str, esc
            if any(m.startswith(body[pos:]) for m in CALL_ENDS):
                break  # a marker may be arriving
        pos += 1
    return None, None, pos, in_str, esc


class Header:
    """One message's header, read from its text (markers included) before ``<|message|>``.

    Attributes:
        role: the author (``assistant``), "" when the prompt wrote it.
        channel: ``analysis`` / ``commentary`` / ``final`` / another word, or None.
        recipient: ``functions.NAME``, ``python``... or None.
        content_type: ``json``, ``code``... or None.
    """

    _MARK = "\x00"  # <|constrain|> among the words

    def __init__(self, text: str) -> None:
        role_part, has_channel, channel_part = text.partition(CHANNEL)
        m = _RECIPIENT.search(text.replace(CONSTRAIN, " "))
        self.recipient = m.group(1) if m else None
        rw, cw = self._words(role_part), self._words(channel_part)
        self.role = rw[0] if rw and rw[0] != self._MARK else ""
        self.channel = cw[0] if has_channel and cw and cw[0] != self._MARK else None
        rest = cw[1:] if self.channel is not None else cw
        if self._MARK in rest:  # <|constrain|>TYPE
            after = rest[rest.index(self._MARK) + 1:]
            self.content_type = after[0] if after else None
        else:  # " TYPE" (the HF template's spelling) or none
            self.content_type = rest[0] if rest else None

    @classmethod
    def _words(cls, part: str) -> list[str]:
        return _RECIPIENT.sub(" ", part.replace(CONSTRAIN, f" {cls._MARK} ")).split()

    @property
    def json(self) -> bool:
        """The body is JSON (the type says so, or says nothing: the template's default)."""
        return self.content_type is None or "json" in self.content_type.lower()


def callee(header: Header, tools: list[dict] | None) -> str | None:
    """The function a message calls: ``functions.NAME`` -> NAME; a bare recipient that
    names an offered function (models sometimes drop the namespace) -> itself; None for
    no recipient or one that is no offered function (built-in ``python``/``browser.*``)."""
    r = header.recipient
    if r is None or not tools:
        return None
    if r.startswith("functions.") and len(r) > len("functions."):
        return r[len("functions."):]
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
    return r if r in names else None


def arguments(body: str) -> dict[str, Any]:
    """A call's JSON body as its arguments (an empty body: no arguments).

    Raises:
        ValueError: the body is not a JSON object.
    """
    text = body.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except RecursionError:  # nesting deeper than Python's stack: no call, text
        raise ValueError("the arguments nest too deep") from None
    if not isinstance(value, dict):
        raise ValueError(f"the arguments are a JSON {type(value).__name__}, not an object")
    return value


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any]:
    """mlx-lm's contract: the text after :data:`tool_call_start` (``NAME<|channel|>...
    <|message|>{...}``, up to the end marker) as ``{"name", "arguments"}``.

    Raises:
        ValueError: no ``<|message|>``, no function name, or the body is not a JSON object.
    """
    head, sep, body = text.partition(MESSAGE)
    if not sep:
        raise ValueError("no <|message|> after the call's header")
    header = Header(tool_call_start + head)
    name = (header.recipient or "").removeprefix("functions.")
    if not name:
        raise ValueError("the call names no function")
    i = _json_end(body, 0, False, False)[0] if header.json else _find(body, CALL_ENDS)[0]
    return {"name": name, "arguments": arguments(body if i is None or i < 0 else body[:i])}


def parse_partial(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """The complete calls of a call cut by ``max_tokens``: the call itself when its JSON
    body happens to be complete, else none."""
    try:
        return [parse_tool_call(text, tools)]
    except ValueError:
        return []


def call_end(text: str) -> tuple[int, int] | None:
    """Where a call's text (after :data:`tool_call_start`) ends: the first end marker after
    ``<|message|>`` outside a JSON string (prefix-stable)."""
    i = text.find(MESSAGE)
    if i < 0:
        return None
    j, m, *_ = _json_end(text, i + len(MESSAGE), False, False)
    return None if j is None else (j, j + len(m))


class HarmonyParser(OutputParser):
    """:class:`~kit.engine.output.OutputParser` for Harmony: a header state whose
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
        self._body, self._pos, self._in_str, self._esc = "", 0, False, False

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
        if self._hit:
            self.reasoning_tokens += n
        elif was_head or self._mode == "head":
            self._head_tokens += n
        return events

    def finish(self, reason: str) -> list[Any]:
        """End of generation (see :meth:`OutputParser.finish`): held-back text is released;
        a header cut by ``max_tokens`` is dropped (its message never began), one ended by
        EOS comes back as text; a call ended by EOS (``<|call|>`` is one) is parsed; one cut
        by ``max_tokens`` is kept when its JSON is complete, else its text comes back."""
        if self.stopped or self._mode == "done":
            return []
        events: list[Any] = []
        buf, self._buf = self._buf, ""
        if self._mode == "head":
            head = self._header + buf
            if head and (reason != "length" or not self._looks_like_header(head)):
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
        i, m = _find(self._buf, SPECIALS)
        if m is None:
            cut = len(self._buf) - _held(self._buf, SPECIALS)
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
            self._body, self._pos, self._in_str, self._esc = "", 0, False, False
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
        i, m = _find(self._buf, ends)
        if m is None:
            cut = len(self._buf) - _held(self._buf, ends)
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
        i, m = _find(self._buf, ends)
        if m is None:
            cut = len(self._buf) - _held(self._buf, ends)
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
        j, m, self._pos, self._in_str, self._esc = _json_end(self._body, self._pos,
                                                             self._in_str, self._esc)
        if j is None:
            return False
        body, rest = self._body[:j], self._body[j + len(m):]
        self._body = ""
        events += self._call(body)
        self._mode, self._buf = "stray", rest
        return True

    def _step_drop(self, events: list[Any]) -> bool:
        """A body that ends at the first end marker: a dropped message's, or a call's whose
        content type is no JSON."""
        i, m = _find(self._buf, CALL_ENDS)
        if m is None:
            cut = len(self._buf) - _held(self._buf, CALL_ENDS)
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


#: the parser, and the reasoning efforts gpt-oss's template was trained on (its system
#: message says ``Reasoning: low|medium|high``; openai-harmony's ReasoningEffort has those)
OVERRIDES = {"parser_class": HarmonyParser, "efforts": ("low", "medium", "high")}
