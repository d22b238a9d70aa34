"""Replays a model's output through the parser exactly as the engine builds it
(:meth:`OutputParser.for_format` on the format :func:`kit.formats.select.for_tokenizer`
picks from a family's template and vocab, tests/conformance/adapter.py's ``FAMILY_FILES``),
whole and at many stream splits, for the per-family tests in this folder (model-free)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
from kit.formats import OutputFormat
from kit.formats.select import for_tokenizer
from tests.conformance.adapter import FAMILY_FILES, CheckpointFiles

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"},
                                         "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"},
                                         "filters": {"type": "object"}}}}},
]


def family_format(slug: str, variant: str = "*") -> OutputFormat:
    """The format the engine's selection picks for canitoolcall family ``slug``."""
    table = FAMILY_FILES[slug]
    return for_tokenizer(CheckpointFiles(*(table.get(variant) or table["*"])))


@dataclass(frozen=True)
class Reply:
    """What a client receives: the answer (None when empty), the reasoning (None when
    empty) and the calls as (name, decoded arguments)."""

    content: str | None
    reasoning: str | None
    calls: list[tuple[str, dict]]
    ids: list[str]


def replay(fmt: OutputFormat, chunks: list[str], *, prompt: str = "", tools=TOOLS,
           reason: str = "stop") -> Reply:
    """Feed ``chunks`` to the engine's parser for ``fmt`` and finish with ``reason``
    ("length": cut by max_tokens)."""
    parser = OutputParser.for_format(fmt, prompt, tools=tools)
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish(reason)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [e for e in events if isinstance(e, ToolCall)]
    return Reply(text or None, reasoning or None,
                 [(c.name, json.loads(c.arguments)) for c in calls], [c.id for c in calls])


def splits(text: str, seeds: int = 12) -> list[list[str]]:
    """The output whole, one character at a time, and at ``seeds`` seeded random splits
    (pieces of 1-8 characters, as a detokenizer hands them over)."""
    out = [[text], list(text)]
    for seed in range(seeds):
        rng, pieces, i = random.Random(seed), [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            pieces.append(text[i:i + n])
            i += n
        out.append(pieces)
    return out


def parse(fmt: OutputFormat, text: str, **kw) -> Reply:
    """The reply for ``text``, after checking that every stream split of it gives the
    same reply as the whole (ids aside: they are made per call)."""
    whole = replay(fmt, [text], **kw)
    for chunks in splits(text)[1:]:
        got = replay(fmt, chunks, **kw)
        assert (got.content, got.reasoning, got.calls) == \
            (whole.content, whole.reasoning, whole.calls), (chunks, got, whole)
    return whole


def assert_prefix_stable(call_end, text: str) -> None:
    """``call_end``'s contract (kit.formats.base.CallEnd): once it answers for a prefix of
    ``text``, it answers the same for every longer prefix."""
    first = None
    for i in range(len(text) + 1):
        got = call_end(text[:i])
        if first is not None:
            assert got == first, (text[:i], got, first)
        elif got is not None:
            first = got


def call_texts(slug: str, start: str) -> list[str]:
    """The text after each ``start`` marker in the raw outputs of canitoolcall family
    ``slug`` (a corpus of real call markup, malformed and cut ones included)."""
    from tests.conformance.adapter import all_fixtures

    out = []
    for f in all_fixtures():
        if f.family == slug:
            parts = f.raw_output.split(start)
            out += [start.join(parts[i:]) for i in range(1, len(parts))]
    return out


def assert_resumes_as_pure(resuming, pure, texts: list[str]) -> None:
    """A resuming call-end scan (one object fed each text's growing prefixes in turn, as
    one parser is) answers as the pure ``call_end`` on every prefix of every text."""
    for text in texts:
        for i in range(len(text) + 1):
            assert resuming(text[:i]) == pure(text[:i]), (text[:i],)


def reference_json_end(text: str, ends: tuple[str, ...]) -> tuple[int, int] | None:
    """The test oracle for :class:`kit.formats.base.JsonMarkerEnd`: a plain character loop
    (no regex, no resuming) for the first of ``ends`` outside a JSON string, as
    ``(index, index past it)``; None when there is none yet."""
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
        else:
            for end in ends:
                if text.startswith(end, i):
                    return i, i + len(end)
        i += 1
    return None
