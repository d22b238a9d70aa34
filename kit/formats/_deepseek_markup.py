"""DeepSeek's call markup (see :mod:`kit.formats.deepseek`, the format's entry point): its
markers and where a block ends, read structurally so that marker text quoted in an
argument stays in the argument: a V3/V3.1 block at ``<｜tool▁calls▁end｜>`` outside JSON
strings (:class:`~kit.formats.base.JsonMarkerEnd`), a DSML block at its closing tag
outside parameter values (:class:`_DsmlScan`, our own: no library reads DSML, and it must
answer on every prefix while the block streams in).
"""

from __future__ import annotations

import re

from kit.formats.base import JsonMarkerEnd

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
DSML = "｜DSML｜"
#: DSML block names: V3.2, V4, V4.1
BLOCKS = ("function_calls", "tool_calls", "calls")

#: every DSML block start, with and without the "\n\n" DeepSeek's encoder writes before it
DSML_STARTS = tuple(nl + f"<{DSML}{sp}{name}>" for name in BLOCKS for sp in ("", " ")
                    for nl in ("\n\n", ""))

_TAG = re.compile(f"<(/?){DSML} ?([A-Za-z_]+)")
PARAM_CLOSE = re.compile(f"</{DSML} ?parameter>")
WS = " \t\r\n"


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
    quote any tag); None while the block is open. Like :class:`BlockEnd`, it resumes on the
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
                close = PARAM_CLOSE.search(text, start)
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
    head = text.lstrip(WS)
    if not head or any(t.startswith(head) and t != head for t in (f"<{DSML}", f"</{DSML}")):
        return None
    return "dsml" if head.startswith((f"<{DSML}", f"</{DSML}")) else "v3"


class BlockEnd:
    """:func:`kit.formats.deepseek.call_end` for the growing text of one block: fed each
    longer text in turn it resumes where it stopped (linear time over a long call); a text
    that does not extend the last starts over. ``kind`` ``"dsml"`` for a block that started
    with a DSML block start (None: its first characters tell)."""

    def __init__(self, kind: str | None = None) -> None:
        self._kind = kind
        self._v3, self._dsml = JsonMarkerEnd(CALLS_END), _DsmlScan()

    def __call__(self, text: str) -> tuple[int, int] | None:
        self._kind = self._kind or _sub_format(text)
        if self._kind is None:
            return None
        if self._kind == "dsml":
            end = self._dsml(text)
        else:  # past the marker: it stays in the block's text (see deepseek.call_end)
            end = None if (v3 := self._v3(text)) is None else v3[1]
        return None if end is None else (end, end)

