"""gpt-oss Harmony's markup (see :mod:`kit.formats.harmony`, the format's entry point, for
the format and why the parser is our own): its special tokens, a message's header, whom a
message calls and a call's arguments, and the text scans the parser shares.
"""

from __future__ import annotations

import json
import re
from typing import Any

START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = (
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
    "<|call|>")
SPECIALS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
#: what ends a message's body (``<|call|>`` only ends a call: see kit/formats/harmony.py)
TEXT_ENDS = (END, RETURN)
CALL_ENDS = (CALL, END, RETURN)

#: a header longer than this without ``<|message|>`` is not one (real headers are
#: ``<|channel|>commentary to=functions.NAME <|constrain|>json``, well under 200
#: characters): what was buffered comes back as text and the rest streams as text
MAX_HEADER = 256

_RECIPIENT = re.compile(r"\bto=([^\s<\x00]+)")


def find_first(buf: str, strings: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest complete occurrence of one of ``strings`` in ``buf`` as ``(index,
    string)`` (ties: the first listed), else ``(-1, None)``."""
    best, hit = -1, None
    for s in strings:
        i = buf.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, hit = i, s
    return best, hit


def held(buf: str, strings: tuple[str, ...]) -> int:
    """How many characters at the end of ``buf`` may be the start of one of ``strings``
    (held back until the next text decides)."""
    for k in range(min(len(buf), max((len(s) for s in strings), default=1) - 1), 0, -1):
        tail = buf[-k:]
        if any(s.startswith(tail) for s in strings):
            return k
    return 0


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
