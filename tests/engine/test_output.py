"""Output parsing on recorded model output: answer text, reasoning, tool calls in each
tool-call format mlx-lm ships a parser for, stop strings — fed in small chunks, as tokens
arrive."""

from __future__ import annotations

import importlib
import json

import pytest

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ARGS = {"city": "Paris", "days": 2}

# Recorded outputs, one per parser family: "Let me check." then one get_weather call.
RECORDED = {
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                  '"days": 2}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"
                   "\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>',
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
             "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
    "minimax_m2": '<minimax:tool_call><invoke name="get_weather"><parameter name="city">Paris'
                  '</parameter><parameter name="days">2</parameter></invoke></minimax:tool_call>',
}


def parser_for(family: str, **kw) -> OutputParser:
    m = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
    return OutputParser(tool=(m.tool_call_start, m.tool_call_end), tool_parser=m.parse_tool_call,
                        tools=TOOLS, **kw)


def run(parser: OutputParser, text: str, chunk: int = 3, reason: str = "stop") -> list:
    events = []
    for i in range(0, len(text), chunk):
        events += parser.feed(text[i:i + chunk])
        if parser.stopped:
            break
    return events + parser.finish(reason)


def text_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.parametrize("family", sorted(RECORDED))
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_each_parser_family_yields_the_call_and_the_text(family, chunk):
    p = parser_for(family)
    events = run(p, "Let me check." + RECORDED[family], chunk)
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert text_of(events) == "Let me check."
    assert [(c.name, json.loads(c.arguments), c.index) for c in calls] == [("get_weather", ARGS, 0)]
    assert calls[0].id.startswith("call_")
    assert p.tool_calls == 1


def test_several_calls_in_one_turn_are_all_returned():
    one = RECORDED["json_tools"]
    other = one.replace("Paris", "Oslo")
    events = run(parser_for("json_tools"), one + "\n" + other)
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert [c.index for c in calls] == [0, 1]
    assert len({c.id for c in calls}) == 2


def test_a_call_cut_off_by_max_tokens_is_dropped():
    cut = RECORDED["json_tools"][:30]
    events = run(parser_for("json_tools"), "Let me check." + cut, reason="length")
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert text_of(events) == "Let me check."


def test_an_unparseable_call_comes_back_as_text_not_lost():
    events = run(parser_for("json_tools"), "<tool_call>not json at all</tool_call>")
    assert text_of(events) == "not json at all"
    assert not [e for e in events if isinstance(e, ToolCall)]


def test_reasoning_is_split_from_the_answer():
    p = OutputParser(think=("<think>", "</think>"))
    events = run(p, "<think>The user wants a city.</think>Paris.")
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == \
        "The user wants a city."
    assert text_of(events) == "Paris."


def test_reasoning_opened_by_the_prompt_then_a_tool_call():
    m = importlib.import_module("mlx_lm.tool_parsers.json_tools")
    p = OutputParser(think=("<think>", "</think>"), tool=(m.tool_call_start, m.tool_call_end),
                     tool_parser=m.parse_tool_call, tools=TOOLS, initial="reasoning")
    events = run(p, "I need the weather.</think>" + RECORDED["json_tools"])
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "ReasoningDelta" and kinds[-1] == "ToolCall"
    assert text_of(events) == ""


@pytest.mark.parametrize("chunk", [1, 2, 5, 100])
def test_stop_string_split_across_chunks_ends_and_is_not_returned(chunk):
    p = OutputParser(stops=["\nUser:"])
    events = run(p, "Paris is the capital.\nUser: and Spain?", chunk)
    assert text_of(events) == "Paris is the capital."
    assert p.stopped


def test_partial_stop_match_is_released_when_it_does_not_complete():
    p = OutputParser(stops=["STOP"])
    events = run(p, "It is STOnE.", 1)
    assert text_of(events) == "It is STOnE." and not p.stopped


def test_stop_strings_do_not_apply_inside_reasoning():
    p = OutputParser(think=("<think>", "</think>"), stops=["x"])
    events = run(p, "<think>x marks it</think>ok x then more")
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "x marks it"
    assert text_of(events) == "ok " and p.stopped


def test_reasoning_tokens_count_the_think_block_and_its_markers_not_the_answer():
    # one feed per generated token, as the decode loops do; "" is a token the
    # detokenizer held back (the first half of "é"), the last "" the EOS token
    p = OutputParser(think=("<think>", "</think>"))
    tokens = ["<think>", "Let", " me", "", "é", "</think>", "Hi", " there", ""]
    for t in tokens:
        p.feed(t)
    p.finish("stop")
    assert p.reasoning_tokens == 6  # <think>, Let, me, the held token, é, </think>


def test_no_reasoning_tokens_without_a_think_block():
    p = OutputParser(think=("<think>", "</think>"))
    for t in ["Hi", " there", ""]:
        p.feed(t)
    assert p.reasoning_tokens == 0


# -- hostile or unusual output through each family's real format (kit.formats) -------------

def family_parser(name: str, prompt_tail: str = "", **kw) -> OutputParser:
    from kit.formats.select import for_tokenizer
    from tests.formats.test_select import TEMPLATES, Files

    template, vocab = TEMPLATES[name]
    fmt = for_tokenizer(Files(template, (*vocab, "<think>", "</think>")))
    return OutputParser.for_format(fmt, prompt_tail, tools=TOOLS, **kw)


@pytest.mark.parametrize("chunk", [1, 7, 100_000])
def test_a_call_nested_deeper_than_the_stack_comes_back_as_text_not_an_exception(chunk):
    # Regression: RecursionError escaped the parser (and failed every request of a batch).
    deep = "[" * 1500 + "]" * 1500
    raw = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": ' + deep
           + '}}\n</tool_call>')
    events = run(family_parser("json_tools"), raw, chunk)
    assert not [e for e in events if isinstance(e, ToolCall)]
    assert "get_weather" in text_of(events)


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_reasoning_after_a_call_made_inside_a_think_block_stays_reasoning(chunk):
    # Regression: after the call the parser went back to the answer state, so the rest of
    # the reasoning and its closing marker leaked into the content.
    raw = ('<think>let me call<tool_call>\n{"name": "get_weather", "arguments": '
           '{"city": "Paris"}}\n</tool_call>more thoughts</think>answer')
    events = run(family_parser("json_tools"), raw, chunk)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_weather"]
    assert text_of(events) == "answer"
    assert "more thoughts" in reasoning and "</think>" not in reasoning


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_the_answers_own_indentation_after_reasoning_is_kept(chunk):
    # Regression: the separator dropped after </think> took the answer's indentation too.
    raw = "<think>\nhm\n</think>\n\n    x = 1\n    y = 2\n"
    events = run(family_parser("json_tools"), raw, chunk)
    assert text_of(events).startswith("    x = 1\n    y = 2")
