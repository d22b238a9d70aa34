"""Gemma 4 calls (kit/formats/gemma4.py) at the engine's parser entry point, for what
canitoolcall's fixtures do not cover; every case is checked whole and at 1-character and
random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import pytest

from kit.formats import gemma4
from tests.formats.replay import (assert_prefix_stable, assert_resumes_as_pure, call_texts,
                                 family_format, parse)

FMT = family_format("gemma4")
Q = '<|"|>'


def test_the_engine_selects_our_module_for_gemma4():
    assert FMT.tool_format == "gemma4" and FMT.parse is gemma4.parse_tool_call


def test_dotted_names_and_keys_with_spaces_and_spaced_separators():
    r = parse(FMT, f"<|tool_call>call:wf.create{{name:{Q}Demo{Q}, links:{{Basic LLM Chain:"
                   f"{{main:[[{{node:{Q}X{Q}, index:0}}]]}}}}}}<tool_call|>")
    assert r.calls == [("wf.create", {"name": "Demo", "links": {"Basic LLM Chain": {
        "main": [[{"node": "X", "index": 0}]]}}})]


def test_values_of_every_type_with_unicode_and_braces_in_strings():
    r = parse(FMT, f"<|tool_call>call:search{{query:{Q}café {{x}}, [y] 東京 🌸{Q},filters:"
                   f"{{n:-1.5e-05,ok:true,none:null,tags:[{Q}a,b{Q},2]}}}}<tool_call|>")
    assert r.calls == [("search", {"query": "café {x}, [y] 東京 🌸",
                                   "filters": {"n": -1.5e-05, "ok": True, "none": None,
                                               "tags": ["a,b", 2]}})]


def test_marker_text_inside_a_string_stays_in_the_string():
    text = "Wrap as <|tool_call>call:f{}<tool_call|> and end thoughts with <channel|>."
    r = parse(FMT, f"<|tool_call>call:write_file{{content:{Q}{text}{Q}}}<tool_call|>")
    assert r.calls == [("write_file", {"content": text})] and r.content is None


def test_parallel_calls_and_text_around_them_keep_the_models_whitespace():
    r = parse(FMT, f"Checking both: <|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
                   f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|> done")
    assert r.content == "Checking both:  done"
    assert r.calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]


def test_reasoning_drops_the_templates_newlines_only():
    r = parse(FMT, "<|channel>thought\nStep 1.\n\nStep 2.\n<channel|>Answer.")
    assert (r.reasoning, r.content) == ("Step 1.\n\nStep 2.", "Answer.")


def test_a_call_cut_by_max_tokens_returns_the_text_before_it():
    r = parse(FMT, f"One moment.<|tool_call>call:get_weather{{city:{Q}Par", reason="length")
    assert (r.content, r.calls) == ("One moment.", [])


def test_a_cut_second_call_keeps_the_first():
    r = parse(FMT, f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}}}<tool_call|>"
                   "<|tool_call>call:get", reason="length")
    assert r.calls == [("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("body", ["call:bad no brace", f"call:f{{a:{Q}open}}", "call:f{a:1,,}",
                                  "call:f{:1}", "call:f{a:1[}",
                                  "call:f{a:" + "[" * 100 + "]" * 100 + "}"])
def test_malformed_call_markup_comes_back_as_text(body):
    r = parse(FMT, f"<|tool_call>{body}<tool_call|>")
    assert r.calls == [] and body in r.content


@pytest.mark.parametrize("text", [
    f"call:f{{s:{Q}a <tool_call|> b{Q}}}<tool_call|>tail",
    f"call:f{{s:{Q}unterminated <tool_call|>",
    "call:f{}<tool_call|>",
])
def test_the_call_end_answers_the_same_on_every_longer_prefix(text):
    assert_prefix_stable(gemma4.call_end, text)


def test_the_resuming_call_end_answers_as_the_pure_one_on_every_prefix():
    texts = call_texts("gemma4", "<|tool_call>") + [
        f"call:f{{s:{Q}" + "a <tool_call|> <|\" b " * 30 + f"{Q}}}<tool_call|>"]
    assert_resumes_as_pure(gemma4.Gemma4End(), gemma4.call_end, texts)
