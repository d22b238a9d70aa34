"""An :class:`~kit.formats.output.OutputParser` that drops the whitespace a chat template
writes around its markup, so the answer and the reasoning come back as the message fields
the template was given.

Templates put separators around the markup they render: Qwen3 writes
``<think>\\n{reasoning}\\n</think>\\n\\n{content}\\n<tool_call>...``, GLM
``\\n<think>{reasoning}</think>\\n{content}\\n<tool_call>...``, Gemma 4
``<|channel>thought\\n{reasoning}<channel|>``, and the templates strip the fields they
render (Qwen3's ``reasoning_content.strip('\\n')`` and ``content.lstrip('\\n')``, GLM's
``content.strip()``). A model writes the same separators, and they are not part of what it
says. The rules (what canitoolcall's fixtures expect, and what the templates render back):

- reasoning: whitespace at the start and at the end of each reasoning block is dropped;
- answer text: whitespace before its first visible character is dropped when markup (a
  reasoning block or a tool call) comes before it, and whitespace after its last visible
  character is dropped when markup comes after it; whitespace *between* pieces of text
  (``"before <call> after"``) is kept verbatim, and so is whitespace of a plain answer that
  no markup touches (an answer's own leading indentation or trailing newline).

Markup is known from the parser's events: reasoning stands for its think block, a call (or
the end of generation inside one) for the call's markup; an empty ``<think></think>`` gives
no event, and the whitespace around it stays. Streaming: whitespace is held back until the
next visible character or markup decides it, so every split of the output gives the same
result as the whole.
"""

from __future__ import annotations

from typing import Any

from kit.formats.events import ReasoningDelta, TextDelta
from kit.formats.output import OutputParser


class SeparatorParser(OutputParser):
    """:class:`~kit.formats.output.OutputParser` plus the separator rules of this module
    (same arguments, same events; only the whitespace around markup differs).

    Attributes:
        text_separators: the answer-text rules apply (False for a family whose template
            writes no whitespace between its markup and the answer: there, all of the
            answer's whitespace is the model's own).
    """

    text_separators = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._c_pending = ""      # trailing whitespace of the answer text, not yet sent
        self._c_started = False   # a visible answer character was sent
        self._c_marked = False    # markup since the last visible answer character
        self._r_pending = ""      # trailing whitespace of the reasoning block, not yet sent
        self._r_started = False   # the current reasoning block has a visible character

    def feed(self, text: str) -> list[Any]:
        return self._shape(super().feed(text))

    def finish(self, reason: str) -> list[Any]:
        if self._state[0] not in ("normal", "reasoning", None):
            self._c_marked = True  # generation ended inside a call: its markup was there
        events = self._shape(super().finish(reason))
        self._r_pending = ""  # a reasoning block's last whitespace says nothing
        if self._c_pending and not self._c_marked:
            events.append(TextDelta(self._c_pending))  # a plain answer's own whitespace
        self._c_pending = ""
        return events

    def _shape(self, events: list[Any]) -> list[Any]:
        # the events alone tell where markup was: reasoning deltas stand for a think block
        # (its markers), a call for the call's markup; the sequence of event kinds is the
        # same at every split of the output, so the result is too
        out: list[Any] = []
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                self._c_marked = True
                self._reasoning(ev.text, out)
                continue
            # anything else ends a reasoning block: its last whitespace goes
            self._r_pending, self._r_started = "", False
            if isinstance(ev, TextDelta):
                if self.text_separators:
                    self._text(ev.text, out)
                else:
                    out.append(ev)
            else:  # a tool call is markup too
                self._c_marked = True
                out.append(ev)
        return out

    def _reasoning(self, text: str, out: list[Any]) -> None:
        if not self._r_started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._r_pending += text
            return
        out.append(ReasoningDelta(self._r_pending + body))
        self._r_pending, self._r_started = text[len(body):], True

    def _text(self, text: str, out: list[Any]) -> None:
        body = text.strip()
        if not body:
            self._c_pending += text
            return
        lead = text[:len(text) - len(text.lstrip())]
        pending = self._c_pending + lead
        if not self._c_started and self._c_marked:
            # the separator between markup and the answer's first character: the newlines
            # the template writes; what follows the last of them is the answer's indentation
            pending = pending[pending.rfind("\n") + 1:] if "\n" in pending else ""
        stripped = text.rstrip()
        out.append(TextDelta(pending + stripped[len(lead):]))
        self._c_pending = text[len(stripped):]
        self._c_started, self._c_marked = True, False


class ReasoningSeparatorParser(SeparatorParser):
    """:class:`SeparatorParser` for the reasoning block only: the answer text is kept as
    the model wrote it."""

    text_separators = False
