"""Llama 3.x / 4 tool calls (kit/formats/llama3_json.py) at the parser entry point, the way
the engine builds it (``OutputParser.for_format`` over ``for_tokenizer``), for the cases
canitoolcall's fixtures miss. Model-free.

Each case is replayed whole, one character at a time and at seeded random splits; every
replay must give what a client would receive (content, tool calls with name and arguments).
"""

from __future__ import annotations

import json
import random

import pytest

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
from kit.formats.select import detect, for_tokenizer
from tests.conformance.adapter import FAMILY_FILES, CheckpointFiles

LLAMA3 = for_tokenizer(CheckpointFiles(*FAMILY_FILES["llama"]["llama3-json"]))
LLAMA4 = for_tokenizer(CheckpointFiles(*FAMILY_FILES["llama"]["llama4-pythonic"]))
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "get_time", "write_file")]


def replay(chunks, fmt=LLAMA3, *, tools=TOOLS, reason="stop", in_tool_call=False):
    """(content or None, reasoning or None, [(name, arguments dict)]) a client receives."""
    parser = OutputParser.for_format(fmt, "", tools=tools, in_tool_call=in_tool_call)
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish(reason)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]
    return text or None, reasoning or None, calls


def splits(raw):
    """The raw output whole, per character and at 20 seeded random splits."""
    yield "whole", [raw]
    yield "chars", list(raw)
    for seed in range(20):
        rng, chunks, i = random.Random(seed), [], 0
        while i < len(raw):
            n = rng.randint(1, 8)
            chunks.append(raw[i:i + n])
            i += n
        yield f"rand{seed}", chunks


def assert_every_split(raw, content, calls, fmt=LLAMA3, **kw):
    for label, chunks in splits(raw):
        assert replay(chunks, fmt, **kw) == (content, None, calls), label


CALLS = [
    # (raw output, content, calls)
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
     [("get_weather", {"city": "Paris"})]),
    ('<|python_tag|>{"name": "get_weather", "arguments": {"city": "Oslo"}}', None,
     [("get_weather", {"city": "Oslo"})]),
    ('  \n{"type": "function", "name": "get_time", "parameters": {}}', None,
     [("get_time", {})]),
    ('Let me check. <|python_tag|>{"name": "get_time", "parameters": {}}', "Let me check. ",
     [("get_time", {})]),
    ('{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_time", '
     '"parameters": {}}', None, [("get_weather", {"city": "A"}), ("get_time", {})]),
    ('{"name": "get_weather", "parameters": {"city": "A"}}\n{"name": "get_weather", '
     '"parameters": {"city": "B"}}', None,
     [("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})]),
    ('{"name": "get_time", "parameters": "{\\"tz\\": \\"UTC\\"}"}', None,
     [("get_time", {"tz": "UTC"})]),
    ('[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "arguments": '
     '{"city": "C"}}]', None, [("get_time", {}), ("get_weather", {"city": "C"})]),
    ('[get_weather(city="San Francisco"), get_time()]', None,
     [("get_weather", {"city": "San Francisco"}), ("get_time", {})]),
    ("<|python_start|>[get_weather(city='LA', days=3, hourly=true)]<|python_end|>", None,
     [("get_weather", {"city": "LA", "days": 3, "hourly": True})]),
    ('{"name": "get_time", "parameters": {}}\n\nI asked for the time.',
     "\n\nI asked for the time.", [("get_time", {})]),
    ('{"name": "write_file", "parameters": {"doc": {"tags": ["ü", "東京 🌸", {"k": "}{]["}], '
     '"n": null}}}', None,
     [("write_file", {"doc": {"tags": ["ü", "東京 🌸", {"k": "}{]["}], "n": None}})]),
    ('{"name": "write_file", "parameters": {"c": "<|python_tag|>{\\"name\\": 1}; '
     '<|python_start|>[f()]<|python_end|>"}}', None,
     [("write_file", {"c": '<|python_tag|>{"name": 1}; <|python_start|>[f()]<|python_end|>'})]),
]


@pytest.mark.parametrize("raw,content,calls", CALLS, ids=range(len(CALLS)))
def test_calls_parse_alike_at_every_stream_split(raw, content, calls):
    assert_every_split(raw, content, calls)


def test_llama4_calls_parse_alike_at_every_stream_split():
    assert_every_split('[get_weather(city="Seattle"), get_time(tz="PST")]', None,
                       [("get_weather", {"city": "Seattle"}), ("get_time", {"tz": "PST"})],
                       LLAMA4)
    assert_every_split('{"name": "get_time", "parameters": {}}', None, [("get_time", {})],
                       LLAMA4)


TEXT = [
    "Paris is the capital of France.",
    '{"capital": "Paris", "country": "France"}',
    '{"a": 1} is a dict',
    "{}",
    '{"name": "Alice"}',  # no parameters: an answer, not a call
    '{"name": "f", "parameters": {}, "note": "x"}',  # a key no call has
    "[1, 2, 3]",
    "[Note] read this first",
    "[see the docs](https://example.com) for more",
    "[f(x)]",  # a positional argument: Python, but no call
    "  \n  Hello there",
    "{{ template }} markup",
]


@pytest.mark.parametrize("raw", TEXT, ids=range(len(TEXT)))
def test_answers_that_cannot_be_calls_come_back_unchanged(raw):
    assert_every_split(raw, raw, [])


def test_a_builtin_tool_call_after_python_tag_is_returned_as_text():
    # Llama 3.1's built-in tools (brave_search.call(...)) are no function calls of the API
    assert_every_split('<|python_tag|>brave_search.call(query="x")', 'brave_search.call(query="x")',
                       [])


def test_text_is_released_as_soon_as_it_cannot_be_a_call():
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS)
    assert parser.feed("H") == [TextDelta("H")]
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS)
    out = [e for c in '{"capital"' for e in parser.feed(c)]
    assert "".join(e.text for e in out) == '{"capital"'
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS)
    out = [e for c in "[Note]" for e in parser.feed(c)]
    assert "".join(e.text for e in out) == "[Note]"


def test_a_possible_call_is_held_back_while_undecided():
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS)
    assert [e for c in '\n{"name": "get_time", "parameters": {"tz": "U' for e in parser.feed(c)] \
        == []
    parser = OutputParser.for_format(LLAMA4, "", tools=TOOLS)
    assert [e for c in "<|python_start|>[get_weather(city='L" for e in parser.feed(c)] == []


def test_a_call_cut_by_max_tokens_keeps_its_complete_calls():
    raw = '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"ci'
    for label, chunks in splits(raw):
        assert replay(chunks, reason="length") == (None, None, [("get_time", {})]), label


@pytest.mark.parametrize("raw", [
    '{"name": "write_file", "parameters": {"path": "a.txt", "content": "li',
    '[get_weather(city="San Francisco"), get_weather(city="Seattle',
    "\n{",
])
def test_a_call_cut_by_max_tokens_without_a_complete_call_is_returned_as_text(raw):
    assert_every_split(raw, raw, [], reason="length")


def test_text_before_a_cut_call_and_the_cut_call_come_back_as_text():
    raw = 'Checking. <|python_tag|>{"name": "get_weather", "parameters": {"ci'
    assert_every_split(raw, 'Checking. {"name": "get_weather", "parameters": {"ci', [],
                       reason="length")


@pytest.mark.parametrize("raw", [
    '{"name": "get_time", "parameters": {"tz": "UTC"}',  # never closed
    '{"name": 3, "parameters": {}}',  # a name that is no string
    '[get_weather(city="Oslo")',
    "[get_weather(**kwargs)]",
])
def test_malformed_markup_is_returned_as_text(raw):
    assert_every_split(raw, raw, [])


def test_without_tools_in_the_request_a_call_is_answer_text():
    raw = '<|python_start|>[get_time()]<|python_end|>{"name": "get_time", "parameters": {}}'
    assert_every_split(raw, raw, [], tools=None)


def test_a_forced_call_is_parsed_from_its_first_token():
    # the prompt ends with the start marker; the output is the call's body, constrained by
    # the json_tools body (kit/engine/decode/tool_grammar.py), one call per turn, whose text
    # is this
    assert LLAMA3.grammar == LLAMA4.grammar == "llama3_json"
    body = '\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
    for label, chunks in splits(body):
        assert replay(chunks, in_tool_call=True) == (None, None, [("get_time", {"tz": "UTC"})])


@pytest.mark.parametrize("template,vocab", [
    FAMILY_FILES["llama"]["llama3-json"],
    FAMILY_FILES["llama"]["llama4-pythonic"],
    # Llama 3.2: no <|python_tag|> in the template, only ipython and "parameters"
    ('{{- \'{"name": "\' + tool_call.name + \'", \' }}{{- \'"parameters": \' }}'
     '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}', ("<|eot_id|>",)),
])
def test_every_llama_template_selects_llama3_json(template, vocab):
    got = detect(template, set(vocab))
    assert (got.tool_format, got.reasoning_format) == ("llama3_json", None)


def test_a_stop_string_in_the_answers_first_text_ends_generation():
    # the first text is read in the tool state, then re-read as answer text: a stop string
    # matched on that second reading must stop generation too (it went unnoticed before)
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS, stops=["Hi"])
    assert parser.feed("Hi") == [] and parser.stopped and parser.stop_string == "Hi"
    parser = OutputParser.for_format(LLAMA3, "", tools=TOOLS, stops=["END"])
    events = parser.feed('{"name": "get_time", "parameters": {}}\nEND')
    assert parser.stopped and parser.stop_string == "END"
    assert [type(e) for e in events] == [ToolCall, TextDelta] and events[1].text == "\n"


_PIECES = ['{', '}', '[', ']', '"', '\\', ';', ':', ',', '(', ')', ' ', '\n', '"name"',
           '"parameters"', '"arguments"', '"type"', '"function"', 'f', '=', '1', "'", 'x',
           '<|python_tag|>', '<|python_start|>', '<|python_end|>', '<|python', '.', 'true',
           '{"name": "f", "parameters": {}}', '[f(a=1)]', '{"name": "g", "arguments": {"x": "}"}}']


def _without_markers(text):
    for marker in ("<|python_tag|>", "<|python_start|>", "<|python_end|>"):
        text = text.replace(marker, "")
    return text


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_random_markup_streams_like_the_whole_and_loses_no_text(reason):
    # 300 seeded random outputs of call-like pieces: no exception, every split gives what
    # the whole output gives, and an output read as no call comes back whole as text
    for n in range(300):
        rng = random.Random(n)
        raw = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14)))
        whole = replay([raw], reason=reason)
        for label, chunks in list(splits(raw))[1:5]:
            assert replay(chunks, reason=reason) == whole, (raw, label)
        if not whole[2]:
            assert _without_markers(whole[0] or "") == _without_markers(raw), raw
