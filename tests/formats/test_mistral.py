"""Mistral-family tool calls and reasoning (kit/formats/mistral.py, mlx-lm's parser with its
bugs corrected) at the parser entry point, for the cases canitoolcall's fixtures miss.
Model-free. Every case is replayed whole, per character and at seeded random splits."""

from __future__ import annotations

import json
import random

import pytest

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
from kit.formats.select import detect, for_tokenizer
from tests.conformance.adapter import FAMILY_FILES, CheckpointFiles

V13 = for_tokenizer(CheckpointFiles(*FAMILY_FILES["mistral"]["*"]))
MAGISTRAL_2506 = for_tokenizer(CheckpointFiles(*FAMILY_FILES["mistral"]["v11-think-text"]))
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "get_time", "write_file")]


def replay(chunks, fmt=V13, *, tools=TOOLS, reason="stop", ids=False):
    """(content or None, reasoning or None, calls) a client receives; a call is
    (name, arguments dict), with its id first when ``ids``."""
    parser = OutputParser.for_format(fmt, "[/INST]", tools=tools)
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish(reason)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [((e.id,) if ids else ()) + (e.name, json.loads(e.arguments))
             for e in events if isinstance(e, ToolCall)]
    return text or None, reasoning or None, calls


def splits(raw):
    yield "whole", [raw]
    yield "chars", list(raw)
    for seed in range(20):
        rng, chunks, i = random.Random(seed), [], 0
        while i < len(raw):
            n = rng.randint(1, 8)
            chunks.append(raw[i:i + n])
            i += n
        yield f"rand{seed}", chunks


def assert_every_split(raw, expected, fmt=V13, **kw):
    for label, chunks in splits(raw):
        assert replay(chunks, fmt, **kw) == expected, label


def test_a_v11_call_id_is_the_calls_id_not_its_name():
    # mlx-lm's header regex took the text before [ARGS], the id, for the tool's name
    assert_every_split('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}',
                       (None, None, [("a1B2c3D4e", "get_weather", {"city": "Paris"})]),
                       ids=True)


def test_parallel_v11_calls_with_ids():
    raw = ('[TOOL_CALLS]get_time[CALL_ID]000000001[ARGS]{}[TOOL_CALLS]get_weather'
           '[CALL_ID]000000002[ARGS]{"city": "Zürich 🌧️", "opts": {"days": [1, 2]}}')
    assert_every_split(raw, (None, None, [
        ("000000001", "get_time", {}),
        ("000000002", "get_weather", {"city": "Zürich 🌧️", "opts": {"days": [1, 2]}})]),
        ids=True)


def test_a_call_drafted_inside_reasoning_stays_reasoning():
    raw = ('[THINK]I could write [TOOL_CALLS]get_time[ARGS]{} but first [ARGS] more'
           '[/THINK]Sure.[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}')
    assert_every_split(raw, ("Sure.", "I could write [TOOL_CALLS]get_time[ARGS]{} but first "
                                      "[ARGS] more", [("get_time", {"tz": "UTC"})]))


def test_markers_inside_arguments_stay_in_the_arguments():
    raw = ('[TOOL_CALLS]write_file[ARGS]{"content": "[TOOL_CALLS]x[ARGS]{} [THINK]y[/THINK] '
           '}{"}[TOOL_CALLS]get_time[ARGS]{}')
    assert_every_split(raw, (None, None, [
        ("write_file", {"content": "[TOOL_CALLS]x[ARGS]{} [THINK]y[/THINK] }{"}),
        ("get_time", {})]))


def test_text_before_a_call_and_a_v3_json_array():
    assert_every_split('Checking.[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]',
                       ("Checking.", None, [("get_time", {})]))


def test_a_call_cut_by_max_tokens_keeps_its_complete_calls():
    raw = '[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Par'
    assert_every_split(raw, (None, None, [("get_time", {})]), reason="length")


def test_a_call_cut_by_max_tokens_without_a_complete_call_is_returned_as_text():
    raw = '[THINK]Write it.[/THINK][TOOL_CALLS]write_file[ARGS]{"path": "/tmp/a.sh", "con'
    assert_every_split(raw, ('write_file[ARGS]{"path": "/tmp/a.sh", "con', "Write it.", []),
                       reason="length")
    # a v3 array counts only once it closed
    assert_every_split('[TOOL_CALLS] [{"name": "get_time", "arguments": {}}, {"na',
                       (' [{"name": "get_time", "arguments": {}}, {"na', None, []),
                       reason="length")


@pytest.mark.parametrize("raw,content", [
    ("[TOOL_CALLS] not json at all", " not json at all"),
    ('[TOOL_CALLS]get_time[ARGS]{"tz": ', 'get_time[ARGS]{"tz": '),
    ("[TOOL_CALLS]get_time", "get_time"),
])
def test_malformed_markup_is_returned_as_text(raw, content):
    assert_every_split(raw, (content, None, []))


def test_magistral_2506_plain_text_think_is_reasoning():
    assert MAGISTRAL_2506.think == ("<think>", "</think>")
    assert_every_split('<think>\nPlan it.\n</think>\n\nDone.[TOOL_CALLS]get_time[ARGS]{}',
                       ("\n\nDone.", "\nPlan it.\n", [("get_time", {})]), MAGISTRAL_2506)


def test_reasoning_is_parsed_without_tools_in_the_request():
    assert_every_split("[THINK]a [TOOL_CALLS] b[/THINK]Hi", ("Hi", "a [TOOL_CALLS] b", []),
                       tools=None)


@pytest.mark.parametrize("template,vocab,reasoning", [
    (*FAMILY_FILES["mistral"]["*"], "mistral"),
    (*FAMILY_FILES["mistral"]["v11-think-text"], "think"),
    ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", ("[TOOL_CALLS]",), None),
])
def test_mistral_templates_select_mistral_and_their_reasoning(template, vocab, reasoning):
    got = detect(template, set(vocab))
    assert (got.tool_format, got.reasoning_format) == ("mistral", reasoning)


@pytest.mark.parametrize("raw", ['[TOOL_CALLS]get_time[ARGS]"parameters"', "[TOOL_CALLS]f[ARGS]1"])
def test_arguments_that_are_no_json_object_are_no_call(raw):
    # mlx-lm took any JSON value as the arguments, and the client got non-object arguments
    assert_every_split(raw, (raw[len("[TOOL_CALLS]"):], None, []))


def test_arguments_rendered_as_a_json_string_are_read():
    assert_every_split('[TOOL_CALLS]get_time[ARGS]"{\\"tz\\": \\"UTC\\"}"',
                       (None, None, [("get_time", {"tz": "UTC"})]))
