"""Forced turns with parallel calls (kit/engine/decode/tool_grammar.py ``CALL_SEQUENCES``),
model-free, for every family of the families table: with parallel calls allowed the grammar
accepts two calls written the way the family's template renders a turn with two
``tool_calls``, and the family's own parser reads them back as two calls; with
``parallel_tool_calls`` false the grammar refuses a second call. A parser told one call
per turn (``parallel=False``, the unforced path) returns the first call only and stops.

Tokenizers and the acceptance check are tests/engine/test_grammar.py's (one token per byte,
or the family's markers as special tokens, as in the real checkpoints).
"""

from __future__ import annotations

import json

import pytest

from kit.engine.decode.grammar import ll_tokenizer, tool_call_grammar
from kit.engine.decode.tool_grammar import CALL_SEQUENCES, MAX_NUMBERED_CALLS
from kit.engine.types import TextDelta, ToolCall
from kit.formats.output import OutputParser
from kit.formats.select import Detected, load_format
from tests.engine.test_grammar import (ARGS, CALLS, SPECIALS, TIME, WEATHER, _accepts,
                                       _bytes_tokenizer)
from tests.families.families import FAMILIES

#: the second call, get_time(zone="UTC"), in each format's markup
SECOND = {
    "json_tools": '\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n',
    "qwen3_coder": ("\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
                    "</function>\n</tool_call>"),
    "glm47": "get_time<arg_key>zone</arg_key><arg_value>UTC</arg_value></tool_call>",
    "mistral": 'get_time[ARGS]{"zone": "UTC"}',
    "kimi_k2": ('<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>'
                '{"zone": "UTC"}<|tool_call_end|><|tool_calls_section_end|>'),
    "gemma4": 'call:get_time{zone:<|"|>UTC<|"|>}<tool_call|>',
    "deepseek": ('<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "UTC"}<｜tool▁call▁end｜>'
                 '<｜tool▁calls▁end｜>'),
}


def two_calls(fmt: str) -> str:
    """get_weather(ARGS) then get_time(zone="UTC"), after the start marker the prompt ends
    with, as the family's template renders a turn with both calls."""
    first = CALLS[fmt]
    if fmt == "json_tools":
        return first + "</tool_call>\n<tool_call>" + SECOND[fmt] + "</tool_call>"
    if fmt == "qwen3_coder":
        return first + "\n<tool_call>" + SECOND[fmt]
    if fmt == "glm47":
        return first + "<tool_call>" + SECOND[fmt]
    if fmt == "mistral":
        return first + "[TOOL_CALLS]" + SECOND[fmt]
    if fmt == "gemma4":
        return first + "<|tool_call>" + SECOND[fmt]
    # one section (Kimi) or block (DeepSeek): the second call replaces the first's close
    close = CALL_SEQUENCES[fmt].close if fmt in CALL_SEQUENCES else "<｜tool▁calls▁end｜>"
    return first.removesuffix(close) + SECOND[fmt]


#: the grammar key of every family of the families table that has a forced-call body
GRAMMARS = {f.name: load_format(Detected(f.tool_format, None)).grammar for f in FAMILIES}
#: the families whose format writes several calls in one turn (all but gpt-oss and Llama)
PARALLEL = sorted(name for name, g in GRAMMARS.items() if g in SECOND)
ONE_PER_TURN = sorted(name for name, g in GRAMMARS.items() if g not in SECOND)


@pytest.fixture(scope="module")
def tokenizers():
    return _bytes_tokenizer()


@pytest.fixture(scope="module")
def special_tokenizers():
    from types import SimpleNamespace

    hf, _ = _bytes_tokenizer(SPECIALS + ("<tool_call>", "<|tool_call>", "[TOOL_CALLS]"))
    return hf, ll_tokenizer(SimpleNamespace(_tokenizer=hf, eos_token_ids=[hf.eos_token_id]))


def parsed(fmt: str, text: str, *, parallel: bool = True) -> tuple[list[ToolCall], str, bool]:
    """The calls, the answer text and ``stopped`` of the format's parser fed ``text`` as
    a forced turn (the prompt ended with the start marker)."""
    parser = OutputParser.for_format(load_format(Detected(fmt, None)), "",
                                     tools=[WEATHER, TIME], in_tool_call=True,
                                     parallel=parallel)
    events = parser.feed(text)
    stopped = parser.stopped
    events += parser.finish("stop")
    return ([e for e in events if isinstance(e, ToolCall)],
            "".join(e.text for e in events if isinstance(e, TextDelta)), stopped)


def test_every_family_is_in_one_list_and_every_format_with_several_calls_is_tested():
    assert set(PARALLEL) | set(ONE_PER_TURN) == set(GRAMMARS)
    assert {k for k, s in CALL_SEQUENCES.items() if s.between is not None} | {"deepseek"} \
        == set(SECOND)
    assert all(GRAMMARS[name] for name in GRAMMARS), "a family without a forced-call body"


@pytest.mark.parametrize("family", PARALLEL)
def test_a_forced_turn_with_parallel_calls_accepts_two_calls_that_parse_as_two(
        tokenizers, special_tokenizers, family):
    fmt = GRAMMARS[family]
    grammar = tool_call_grammar(fmt, [WEATHER, TIME], parallel=True)
    assert _accepts(tokenizers, grammar, two_calls(fmt))
    assert _accepts(special_tokenizers, grammar, two_calls(fmt))
    calls, text, _ = parsed(fmt, two_calls(fmt))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGS), ("get_time", {"zone": "UTC"})]
    assert [c.index for c in calls] == [0, 1] and len({c.id for c in calls}) == 2
    assert not text.strip()


@pytest.mark.parametrize("family", PARALLEL)
def test_a_forced_turn_with_parallel_calls_still_accepts_one_call(tokenizers, family):
    fmt = GRAMMARS[family]
    assert _accepts(tokenizers, tool_call_grammar(fmt, [WEATHER, TIME], parallel=True),
                    CALLS[fmt])


@pytest.mark.parametrize("family", PARALLEL)
def test_parallel_tool_calls_false_refuses_a_second_call(tokenizers, special_tokenizers,
                                                         family):
    fmt = GRAMMARS[family]
    grammar = tool_call_grammar(fmt, [WEATHER, TIME], parallel=False)
    assert not _accepts(tokenizers, grammar, two_calls(fmt))
    assert not _accepts(special_tokenizers, grammar, two_calls(fmt))
    # nor the start of a second call, up to its name: the grammar ends after one call
    text = two_calls(fmt)
    upto = text.index(SECOND[fmt]) + SECOND[fmt].index("get_time") + 1
    assert _prefix_ok(tokenizers, grammar, CALLS[fmt])
    assert not _prefix_ok(tokenizers, grammar, text[:upto])


@pytest.mark.parametrize("family", ONE_PER_TURN)
def test_a_format_with_one_call_per_turn_gets_one_call_with_parallel_allowed(family):
    fmt = GRAMMARS[family]
    assert tool_call_grammar(fmt, [WEATHER, TIME], parallel=True) == \
        tool_call_grammar(fmt, [WEATHER, TIME], parallel=False)


def _prefix_ok(tokenizers, grammar: str, text: str) -> bool:
    """Whether the grammar accepts ``text`` as the start of an output (not necessarily a
    complete one)."""
    from llguidance import LLMatcher

    hf, ll = tokenizers
    m = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0)
    return all(m.consume_token(t) for t in hf.encode(text, add_special_tokens=False))


def test_json_tools_lets_the_last_call_end_at_eos_or_at_its_end_marker(tokenizers):
    grammar = tool_call_grammar("json_tools", [WEATHER, TIME], parallel=True)
    text = two_calls("json_tools")
    assert _accepts(tokenizers, grammar, text)
    assert _accepts(tokenizers, grammar, text.removesuffix("</tool_call>"))
    # an end marker that is not followed by a call or EOS: refused
    assert not _accepts(tokenizers, grammar, text + "\n")


def test_kimi_numbers_the_calls_of_a_turn_and_holds_at_most_max_numbered_calls(tokenizers):
    grammar = tool_call_grammar("kimi_k2", [TIME], parallel=True)

    def call(i: int) -> str:
        return (f'<|tool_call_begin|>functions.get_time:{i}<|tool_call_argument_begin|>'
                '{"zone": "UTC"}<|tool_call_end|>')

    end = "<|tool_calls_section_end|>"
    assert _accepts(tokenizers, grammar, call(0) + call(1) + end)
    assert not _accepts(tokenizers, grammar, call(0) + call(0) + end)  # ids must differ
    most = "".join(call(i) for i in range(MAX_NUMBERED_CALLS))
    assert _accepts(tokenizers, grammar, most + end)
    assert not _accepts(tokenizers, grammar, most + call(MAX_NUMBERED_CALLS) + end)
    calls, _, _ = parsed("kimi_k2", most + end)
    assert [c.id for c in calls] == [f"functions.get_time:{i}" for i in
                                     range(MAX_NUMBERED_CALLS)]


@pytest.mark.parametrize("family", PARALLEL)
def test_a_parser_told_one_call_per_turn_returns_the_first_call_only(family):
    fmt = GRAMMARS[family]
    calls, text, stopped = parsed(fmt, two_calls(fmt), parallel=False)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
    assert not text.strip()
    # generation stops once the text holding the first call closes: every format but
    # Mistral's, whose calls run to EOS (Kimi's section and DeepSeek's block close here)
    assert stopped is (fmt != "mistral")


def test_a_parser_told_one_call_per_turn_stops_streamed_calls_at_the_first():
    # the unforced path: the answer, then two calls; streamed a character at a time
    fmt = load_format(Detected("json_tools", None))
    parser = OutputParser.for_format(fmt, "", tools=[WEATHER, TIME], parallel=False)
    text = "Sure.\n<tool_call>" + two_calls("json_tools") + "\nDone."
    events, fed = [], 0
    for ch in text:
        events += parser.feed(ch)
        fed += 1
        if parser.stopped:
            break
    events += parser.finish("stop")
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_weather"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sure."
    assert fed == text.index("</tool_call>") + len("</tool_call>")


def test_a_parallel_turn_cut_inside_the_next_calls_start_marker_returns_no_markup_as_text():
    # Regression: a forced turn that repeats calls until max_tokens (the 135M model with a
    # named tool) was cut inside "<tool_call>" (several tokens in its vocab); the held-back
    # "<tool_" came back as the answer's content beside the calls
    fmt = load_format(Detected("json_tools", None))
    parser = OutputParser.for_format(fmt, "", tools=[WEATHER, TIME], in_tool_call=True)
    events = parser.feed(two_calls("json_tools") + "\n<tool_") + parser.finish("length")
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_weather", "get_time"]
    assert not "".join(e.text for e in events if isinstance(e, TextDelta)).strip()
