"""A call cut by max_tokens at the parser entry point (model-free), for every family with a
parser: the complete calls come back, or — when nothing else would — the cut call's text;
never an empty reply. The end-to-end row is in test_families.py."""

from __future__ import annotations

import pytest

from kit.formats.output import OutputParser
from kit.engine.types import TextDelta, ToolCall
from kit.formats.select import Detected, known, load_format
from tests.families.families import FAMILIES

WITH_PARSER = sorted({f.tool_format for f in FAMILIES if known(f.tool_format)})
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def _run(fmt: str, text: str, *, forced: bool) -> list:
    form = load_format(Detected(fmt, None))
    parser = OutputParser.for_format(form, "", tools=[TOOL], in_tool_call=forced)
    events = []
    for ch in text:  # one character at a time, as the worst stream split
        events += parser.feed(ch)
    return events + parser.finish("length")


@pytest.mark.parametrize("fmt", WITH_PARSER)
def test_a_forced_call_cut_by_max_tokens_comes_back_as_text_not_an_empty_reply(fmt):
    # Regression: the cut call was dropped and the client got content "" and no call.
    events = _run(fmt, "get_weath", forced=True)
    assert not [e for e in events if isinstance(e, ToolCall)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.endswith("get_weath") and text.count("get_weath") == 1


@pytest.mark.parametrize("fmt", [f for f in WITH_PARSER
                                 if load_format(Detected(f, None)).parse_partial is None])
def test_a_call_cut_after_text_leaves_the_text_alone(fmt):
    # the base rule (formats without parse_partial, mlx-lm's); ours decide in their parser
    start = load_format(Detected(fmt, None)).tool[0]
    events = _run(fmt, "Let me check." + start + "get_weath", forced=False)
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check."
