"""Qwen3-Coder / Qwen3.5+ XML calls (kit/formats/qwen3_coder.py) at the engine's parser
entry point, for what canitoolcall's fixtures do not cover; every case is checked whole and
at 1-character and random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import pytest

from kit.formats import qwen3_coder
from kit.formats.base import ScanMarks
from tests.formats.replay import (assert_prefix_stable, assert_resumes_as_pure, call_texts,
                                 family_format, parse)

FMT = family_format("qwen3-xml")


def fn(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


def call(name: str, **params: str) -> str:
    return f"<tool_call>\n{fn(name, **params)}\n</tool_call>"


def test_the_engine_selects_our_module_for_qwen3_coder():
    assert FMT.tool_format == "qwen3_coder" and FMT.parse is qwen3_coder.parse_tool_call
    assert FMT.parser_class is qwen3_coder.QwenCoderParser


def test_closing_tags_inside_a_value_stay_in_the_value():
    content = "end with </parameter> or </function> then </tool_call>;\nuse <parameter=path> text"
    r = parse(FMT, call("write_file", path="a.md", content=content))
    assert r.calls == [("write_file", {"path": "a.md", "content": content})]
    assert r.content is None


def test_a_multiline_value_keeps_its_whitespace():
    code = "def f():\n    return 1\n\n\n  \t"
    r = parse(FMT, call("write_file", path="f.py", content=code))
    assert r.calls == [("write_file", {"path": "f.py", "content": code})]


def test_a_function_block_without_the_tool_call_opener_is_a_call():
    r = parse(FMT, "I'll look.\n\n" + fn("get_weather", city="Paris", days="2") + "\n</tool_call>")
    assert r.content == "I'll look."
    assert r.calls == [("get_weather", {"city": "Paris", "days": 2})]


def test_bare_function_blocks_in_a_row_are_parallel_calls():
    r = parse(FMT, fn("get_weather", city="Paris") + "\n" + fn("get_weather", city="Oslo"))
    assert r.calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert r.content is None


def test_prose_that_mentions_a_function_tag_stays_text():
    text = "Write <function=name> then the parameters."
    r = parse(FMT, text)
    assert (r.content, r.calls) == (text, [])


def test_without_tools_in_the_request_a_function_tag_is_just_text():
    text = fn("get_weather", city="Paris")
    r = parse(FMT, text, tools=None)
    assert (r.content, r.calls) == (text, [])


def test_a_missing_close_parameter_ends_at_the_next_parameter_or_the_function_end():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n<parameter=days>\n3\n"
            "</function>\n</tool_call>")
    r = parse(FMT, text)
    assert r.calls == [("get_weather", {"city": "Lyon", "days": 3})]


def test_compact_markup_without_newlines_parses():
    r = parse(FMT, "x<tool_call><function=get_weather><parameter=city>Nice</parameter>"
                   "</function></tool_call>y")
    assert (r.content, r.calls) == ("xy", [("get_weather", {"city": "Nice"})])


SCHEMA_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {
    "opt_int": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "num_or_bool": {"type": ["number", "boolean"]},
    "str_or_int": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "zip": {"type": "string"},
    "count": {"type": "integer"},
    "opt_obj": {"anyOf": [{"type": "object"}, {"type": "null"}]}}}}}]


def test_values_convert_through_anyof_oneof_and_type_lists():
    r = parse(FMT, call("f", opt_int="5", num_or_bool="true", str_or_int="02139", zip="02139",
                        count="many", opt_obj='{"k": [1, "é"]}'), tools=SCHEMA_TOOLS)
    assert r.calls == [("f", {"opt_int": 5, "num_or_bool": True, "str_or_int": "02139",
                              "zip": "02139", "count": "many", "opt_obj": {"k": [1, "é"]}})]


def test_a_value_that_is_not_its_schema_type_keeps_the_call():
    r = parse(FMT, call("get_weather", city="Rome", days="two"))
    assert r.calls == [("get_weather", {"city": "Rome", "days": "two"})]


def test_nested_json_and_unicode_values():
    r = parse(FMT, call("search", query="東京 ☀️ «café»",
                        filters='{"tags": ["a", {"b": null}], "n": 1.5}'))
    assert r.calls == [("search", {"query": "東京 ☀️ «café»",
                                   "filters": {"tags": ["a", {"b": None}], "n": 1.5}})]


def test_reasoning_then_parallel_calls_without_separators():
    text = ("Two lookups.\n</think>\n\n" + call("get_weather", city="Paris") + "\n"
            + call("get_weather", city="Oslo"))
    r = parse(FMT, text, prompt="<|im_start|>assistant\n<think>\n")
    assert (r.reasoning, r.content) == ("Two lookups.", None)
    assert [a["city"] for _, a in r.calls] == ["Paris", "Oslo"]


def test_a_call_cut_inside_a_value_is_not_returned():
    r = parse(FMT, "Deleting.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/build",
              reason="length")
    assert (r.content, r.calls) == ("Deleting.", [])


def test_a_cut_call_keeps_its_complete_function_blocks():
    text = fn("get_weather", city="Paris") + "\n" + fn("get_weather", city="Os")[:-20]
    r = parse(FMT, text, reason="length")
    assert r.calls == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("body", ["not xml", "<function=>\n</function>",
                                  "<parameter=x>\n1\n</parameter>"])
def test_malformed_call_markup_comes_back_as_text(body):
    r = parse(FMT, f"<tool_call>\n{body}\n</tool_call>")
    assert r.calls == [] and body.strip("<>") in (r.content or "")


@pytest.mark.parametrize("text", [
    "\n" + fn("write_file", content="a </parameter> b </tool_call> c") + "\n</tool_call> tail",
    "\n<function=get_weather>\n<parameter=city>\nLyon\n<parameter=days>\n3\n</function>\n"
    "</tool_call>",
    "<function=a><parameter=x>1</parameter></function>text after",
    "\nnot xml </tool_call> more",
])
def test_the_call_end_answers_the_same_on_every_longer_prefix(text):
    assert_prefix_stable(qwen3_coder.call_end, text)


def test_the_resuming_call_end_answers_as_the_pure_one_on_every_prefix():
    marks = ScanMarks()
    texts = call_texts("qwen3-xml", "<tool_call>") + [
        "\n" + fn("write_file", content="x </parameter> y\n" * 30) + "\n</tool_call>",
        "\n<function=f>\n<parameter=a>\nv\n</parameter> \n</tool_call>"]
    assert_resumes_as_pure(lambda t: qwen3_coder._end(t, False, marks(t)), qwen3_coder.call_end,
                           texts)
