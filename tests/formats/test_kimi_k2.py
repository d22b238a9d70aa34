"""Kimi K2.x calls (kit/formats/kimi_k2.py) at the engine's parser entry point, for what
canitoolcall's fixtures do not cover; every case is checked whole and at 1-character and
random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import json

import pytest

from kit.formats import kimi_k2
from tests.formats.replay import (assert_prefix_stable, assert_resumes_as_pure, call_texts,
                                 family_format, parse)

FMT = family_format("kimi", "kimi-k2-thinking")
BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def one(name: str, idx: int, args: str) -> str:
    return (f"<|tool_call_begin|>functions.{name}:{idx}<|tool_call_argument_begin|>{args}"
            "<|tool_call_end|>")


def test_the_engine_selects_our_module_for_kimi_k2():
    assert FMT.tool_format == "kimi_k2" and FMT.parse is kimi_k2.parse_tool_call


def test_section_and_call_end_markers_inside_a_json_string_stay_in_it():
    text = f"stop at <|tool_call_end|> or {END} please"
    r = parse(FMT, BEGIN + one("write_file", 0, f'{{"path": "e.txt", "content": "{text}"}}') + END)
    assert r.calls == [("write_file", {"path": "e.txt", "content": text})]
    assert r.ids == ["functions.write_file:0"]


def test_parallel_calls_keep_kimis_ids_and_order():
    r = parse(FMT, "Both.</think>Checking. " + BEGIN + one("get_weather", 0, '{"city": "Zürich"}')
              + one("search", 1, '{"query": "café \\"x\\"", "filters": {"a": [1, {"b": null}]}}')
              + END + " Done.", prompt="<|im_assistant|>assistant<|im_middle|><think>")
    assert r.reasoning == "Both."
    assert r.content == "Checking.  Done."
    assert r.calls == [("get_weather", {"city": "Zürich"}),
                       ("search", {"query": 'café "x"', "filters": {"a": [1, {"b": None}]}})]
    assert r.ids == ["functions.get_weather:0", "functions.search:1"]


def test_a_cut_section_keeps_its_complete_calls():
    r = parse(FMT, BEGIN + one("get_weather", 0, '{"city": "Rome"}')
              + '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"ci',
              reason="length")
    assert r.calls == [("get_weather", {"city": "Rome"})]


def test_a_section_cut_in_its_first_call_returns_the_text_before_it():
    r = parse(FMT, "Looking." + BEGIN + one("get_weather", 0, '{"city": "Rome"}')[:-30],
              reason="length")
    assert (r.content, r.calls) == ("Looking.", [])


@pytest.mark.parametrize("body", ["<|tool_call_begin|>no header<|tool_call_end|>", "garbage"])
def test_malformed_section_comes_back_as_text(body):
    r = parse(FMT, BEGIN + body + END)
    assert r.calls == [] and body in r.content


@pytest.mark.parametrize("text", [
    one("f", 0, '{"s": "a <|tool_calls_section_end|> b"}') + END + "tail",
    one("f", 0, '{"s": "unterminated ') + END,
])
def test_the_section_end_answers_the_same_on_every_longer_prefix(text):
    assert_prefix_stable(kimi_k2.call_end, text)


def test_long_arguments_stream_through_the_resuming_section_scan():
    body = 'line "quoted" <|tool_call_end|> \\\\ é\n' * 300
    r = parse(FMT, BEGIN + one("write_file", 0, json.dumps({"path": "x", "content": body})) + END)
    assert r.calls == [("write_file", {"path": "x", "content": body})]
    assert FMT.parser_class is kimi_k2.KimiK2Parser


def test_the_resuming_call_end_answers_as_the_pure_one_on_every_prefix():
    from kit.formats.base import JsonMarkerEnd

    assert_resumes_as_pure(JsonMarkerEnd(END), kimi_k2.call_end, call_texts("kimi", BEGIN))
