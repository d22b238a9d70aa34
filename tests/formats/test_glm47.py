"""GLM-4.5/4.6/4.7 calls (kit/formats/glm47.py) at the engine's parser entry point, for
what canitoolcall's fixtures do not cover; every case is checked whole and at 1-character
and random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import pytest

from kit.formats import glm47
from kit.formats.base import ScanMarks
from tests.formats.replay import (assert_prefix_stable, assert_resumes_as_pure, call_texts,
                                 family_format, parse)

FMT = family_format("glm")


def call(name: str, **args: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in args.items())
    return f"<tool_call>{name}{body}</tool_call>"


def test_the_engine_selects_our_module_for_glm():
    assert FMT.tool_format == "glm47" and FMT.parse is glm47.parse_tool_call


def test_string_values_keep_their_whitespace_and_other_values_are_decoded():
    r = parse(FMT, call("get_weather", city="  New York \n", days=" 3 "))
    assert r.calls == [("get_weather", {"city": "  New York \n", "days": 3})]


def test_marker_text_inside_a_value_stays_in_the_value():
    text = "Wrap in <tool_call> and </tool_call>; keys in <arg_key>k</arg_key> tags."
    r = parse(FMT, call("write_file", path="a.md", content=text) + "Done.")
    assert r.calls == [("write_file", {"path": "a.md", "content": text})]
    assert r.content == "Done."


def test_a_missing_close_arg_value_ends_at_the_call_end():
    r = parse(FMT, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin"
                   "</tool_call>\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome"
                   "</arg_value></tool_call>")
    assert r.calls == [("get_weather", {"city": "Berlin"}), ("get_weather", {"city": "Rome"})]


def test_a_missing_close_arg_value_ends_at_the_next_argument():
    r = parse(FMT, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin"
                   "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>")
    assert r.calls == [("get_weather", {"city": "Berlin", "days": 2})]


def test_glm45_newline_layout_with_reasoning_and_text():
    text = ("\n<think>Need data.</think>\nOne moment.\n<tool_call>get_weather\n<arg_key>city"
            "</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2"
            "</arg_value>\n</tool_call>")
    r = parse(FMT, text, prompt="<|assistant|>")
    assert (r.reasoning, r.content) == ("Need data.", "One moment.")
    assert r.calls == [("get_weather", {"city": "Paris", "days": 2})]


def test_nested_json_and_unicode_values():
    r = parse(FMT, call("search", query="Zürich ☕ 東京", filters='{"tags": ["a", {"b": null}]}'))
    assert r.calls == [("search", {"query": "Zürich ☕ 東京",
                                   "filters": {"tags": ["a", {"b": None}]}})]


def test_a_string_type_reached_through_anyof_keeps_the_text():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                         "n": {"type": ["integer", "null"]}}}}}]
    r = parse(FMT, call("f", label="3", n="3"), tools=tools)
    assert r.calls == [("f", {"label": "3", "n": 3})]


def test_a_call_without_arguments():
    r = parse(FMT, "Checking.<tool_call>get_time</tool_call>")
    assert (r.content, r.calls) == ("Checking.", [("get_time", {})])


def test_a_call_cut_by_max_tokens_returns_the_text_before_it():
    r = parse(FMT, "Let me see." + call("get_weather", city="Paris")[:-20], reason="length")
    assert (r.content, r.calls) == ("Let me see.", [])


@pytest.mark.parametrize("body", ["get_weather<arg_key>city</arg_key>Paris</tool_call>",
                                  "get_weather<arg_key>city"])
def test_malformed_call_markup_is_text_or_no_call_never_an_error(body):
    r = parse(FMT, "<tool_call>" + body)
    assert r.calls == [] and "get_weather" in r.content


@pytest.mark.parametrize("text", [
    "get_weather<arg_key>city</arg_key><arg_value>a </tool_call> b</arg_value></tool_call>x",
    "get_weather<arg_key>city</arg_key><arg_value>Berlin</tool_call>",
    "get_weather<arg_key>city</arg_key><arg_value>Berlin<arg_key>d</arg_key><arg_value>2"
    "</arg_value></tool_call>",
    "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n",
    "broken <arg_key></tool_call>",
])
def test_the_call_end_answers_the_same_on_every_longer_prefix(text):
    assert_prefix_stable(glm47.call_end, text)


def test_the_resuming_call_end_answers_as_the_pure_one_on_every_prefix():
    marks = ScanMarks()
    texts = call_texts("glm", "<tool_call>") + [
        call("write_file", content="a </tool_call> b <arg_key>x</arg_key> c " * 20)[11:]]
    assert_resumes_as_pure(lambda t: glm47.call_end(t, marks(t)), glm47.call_end, texts)
