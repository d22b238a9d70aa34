"""Kimi K3 XTML calls (kit/formats/kimi_k3.py) at the engine's parser entry point, for what
canitoolcall's fixtures do not cover; every case is checked whole and at 1-character and
random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import pytest

from kit.formats import kimi_k3
from kit.formats.base import ScanMarks
from tests.formats.replay import (assert_prefix_stable, assert_resumes_as_pure, call_texts,
                                 family_format, parse)

FMT = family_format("kimi", "kimi-k3-xtml")
THINK = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
TOOLS_OPEN, TOOLS_CLOSE = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
AFTER_THINK = "<|close|>think<|sep|><|open|>response<|sep|>"


def arg(key: str, value: str, kind: str = "string") -> str:
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'


def call(name: str, idx: int, *args: str) -> str:
    return f'<|open|>call tool="{name}" index="{idx}"<|sep|>{"".join(args)}<|close|>call<|sep|>'


def test_the_engine_selects_our_module_for_kimi_k3():
    assert FMT.tool_format == "kimi_k3" and FMT.parse is kimi_k3.parse_tool_call


def test_an_answer_that_skips_the_think_channel_is_the_answer():
    r = parse(FMT, "<|open|>response<|sep|>Hello <b>world</b><|close|>response<|sep|>"
                   "<|close|>message<|sep|>", prompt=THINK)
    assert (r.reasoning, r.content, r.calls) == (None, "Hello <b>world</b>", [])


def test_marker_text_inside_a_value_stays_in_the_value():
    value = "<|close|>argument<|sep|> ends args; <|close|>tools<|sep|> ends the section"
    r = parse(FMT, "Write it." + AFTER_THINK + "<|close|>response<|sep|>" + TOOLS_OPEN
              + call("write_file", 1, arg("path", "x.txt"), arg("content", value)) + TOOLS_CLOSE,
              prompt=THINK)
    assert r.reasoning == "Write it."
    assert r.calls == [("write_file", {"path": "x.txt", "content": value})]


def test_parallel_calls_with_typed_values_and_a_json_block():
    r = parse(FMT, TOOLS_OPEN
              + call("get_weather", 1, arg("city", "Zürich 🌧️"), arg("days", "2", "number"))
              + '<|open|>call tool="search" index="2"<|sep|><|open|>json type="object"<|sep|>'
              '{"query": "café", "filters": {"a": [1, null]}}<|close|>json<|sep|>'
              "<|close|>call<|sep|>"
              + TOOLS_CLOSE)
    assert r.calls == [("get_weather", {"city": "Zürich 🌧️", "days": 2}),
                       ("search", {"query": "café", "filters": {"a": [1, None]}})]


def test_a_cut_section_keeps_its_complete_calls():
    r = parse(FMT, TOOLS_OPEN + call("get_weather", 1, arg("city", "Rome"))
              + '<|open|>call tool="get_weather" index="2"<|sep|><|open|>argument key="ci',
              reason="length")
    assert r.calls == [("get_weather", {"city": "Rome"})]


def test_a_section_cut_in_its_first_call_returns_the_text_before_it():
    r = parse(FMT, "Looking." + TOOLS_OPEN + call("get_weather", 1, arg("city", "Rome"))[:-25],
              reason="length")
    assert (r.content, r.calls) == ("Looking.", [])


@pytest.mark.parametrize("body", ["garbage", '<|open|>call index="1"<|sep|><|close|>call<|sep|>'])
def test_malformed_section_comes_back_as_text(body):
    r = parse(FMT, TOOLS_OPEN + body + TOOLS_CLOSE)
    assert r.calls == [] and r.content


@pytest.mark.parametrize("text", [
    call("f", 1, arg("s", "a <|close|>argument<|sep|> b")) + TOOLS_CLOSE + "tail",
    call("f", 1, arg("s", "x")) + "junk" + TOOLS_CLOSE,
    '<|open|>call tool="f"<|sep|><|open|>argument key="s"<|sep|>v<|close|>argument<|sep|>',
])
def test_the_section_end_answers_the_same_on_every_longer_prefix(text):
    assert_prefix_stable(kimi_k3.call_end, text)


def test_the_resuming_call_end_answers_as_the_pure_one_on_every_prefix():
    marks = ScanMarks()
    texts = call_texts("kimi", TOOLS_OPEN) + [
        call("write_file", 1, arg("content", "a <|close|>argument<|sep|> b " * 20)) + TOOLS_CLOSE]
    assert_resumes_as_pure(lambda t: kimi_k3.call_end(t, marks(t)), kimi_k3.call_end, texts)
    assert FMT.parser_class is kimi_k3.KimiK3Parser
