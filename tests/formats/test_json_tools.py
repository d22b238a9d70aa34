"""Qwen3 Hermes-style JSON calls (kit/formats/json_tools.py) at the engine's parser entry
point, for what canitoolcall's fixtures do not cover; every case is checked whole and at
1-character and random stream splits (tests/formats/replay.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.formats import json_tools
from kit.formats.base import JsonMarkerEnd
from tests.formats.replay import (
    assert_prefix_stable,
    family_format,
    parse,
    reference_json_end,
)

FMT = family_format("qwen3-hermes")
THINK_PROMPT = "<|im_start|>assistant\n"


def call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_the_engine_selects_our_module_for_qwen3():
    assert FMT.tool_format == "json_tools" and FMT.parse is json_tools.parse_tool_call
    assert FMT.call_end is json_tools.call_end and FMT.parser_class is json_tools.HermesParser


def test_marker_text_inside_an_argument_string_stays_in_the_argument():
    text = ('Use <tool_call>{"name": ...}</tool_call> and </think> here; "quoted" \\" too')
    r = parse(FMT, call("write_file", '{"path": "a.md", "content": '
                        '"Use <tool_call>{\\"name\\": ...}</tool_call> and </think> here; '
                        '\\"quoted\\" \\\\\\" too"}'))
    assert r.calls == [("write_file", {"path": "a.md", "content": text})]
    assert r.content is None and r.reasoning is None


def test_reasoning_and_the_answer_come_back_without_the_templates_separators():
    r = parse(FMT, "<think>\nCheck the weather.\n</think>\n\n"
              + call("get_weather", '{"city": "Paris"}'), prompt=THINK_PROMPT)
    assert (r.content, r.reasoning) == (None, "Check the weather.")
    assert r.calls == [("get_weather", {"city": "Paris"})]


def test_text_before_a_call_loses_only_the_separator_newline():
    r = parse(FMT, "Let me check:\n" + call("get_weather", '{"city": "Paris", "days": 2}'))
    assert r.content == "Let me check:"
    assert r.calls == [("get_weather", {"city": "Paris", "days": 2})]


def test_text_on_both_sides_of_a_call_is_joined_verbatim():
    r = parse(FMT, "Checking  " + call("get_weather", '{"city": "Oslo"}') + "\n\nDone.\n")
    assert r.content == "Checking  \n\nDone.\n"  # the answer's own whitespace, kept
    assert [c[0] for c in r.calls] == ["get_weather"]


def test_text_after_a_call_drops_the_separator_before_it():
    r = parse(FMT, call("get_weather", '{"city": "Oslo"}') + "\nI asked for the weather.")
    assert r.content == "I asked for the weather."


def test_a_plain_answer_keeps_its_own_whitespace():
    r = parse(FMT, "    indented code\n\n")
    assert r.content == "    indented code\n\n" and r.calls == []


def test_whitespace_inside_reasoning_is_kept():
    r = parse(FMT, "<think>\nstep 1\n\n  step 2\n</think>\n\nAnswer.", prompt=THINK_PROMPT)
    assert (r.reasoning, r.content) == ("step 1\n\n  step 2", "Answer.")


def test_parallel_calls_come_back_in_order_with_nested_json_and_unicode():
    text = (call("get_weather", '{"city": "Zürich 🌧️", "days": 2}') + "\n"
            + call("search", '{"query": "café \\"best\\"", '
                   '"filters": {"tags": ["a", {"b": [1, null]}]}}'))
    r = parse(FMT, text)
    assert r.calls == [("get_weather", {"city": "Zürich 🌧️", "days": 2}),
                       ("search", {"query": 'café "best"',
                                   "filters": {"tags": ["a", {"b": [1, None]}]}})]
    assert r.content is None and len(set(r.ids)) == 2


def test_a_call_cut_by_max_tokens_returns_the_text_before_it():
    r = parse(FMT, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
              reason="length")
    assert (r.content, r.calls) == ("Let me check.", [])


def test_a_cut_second_call_keeps_the_complete_first_one():
    r = parse(FMT, call("get_weather", '{"city": "Rome"}') + '\n<tool_call>\n{"name": "sea',
              reason="length")
    assert r.calls == [("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("body", ['{"name": "get_weather", "arguments": {"city": }}',
                                  'not json at all', '{"arguments": {}}'])
def test_malformed_call_markup_comes_back_as_text(body):
    r = parse(FMT, f"<tool_call>\n{body}\n</tool_call>")
    assert r.calls == [] and body in r.content


def test_an_unterminated_string_in_a_call_at_the_end_of_output_comes_back_as_text():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}}\n</tool_call>\nok'
    r = parse(FMT, text)
    assert r.calls == [] and '"city": "Par' in r.content


@pytest.mark.parametrize("text", [
    call("write_file", '{"content": "a </tool_call> b \\" c"}') + " tail",
    '\n{"name": "x", "arguments": {"s": "\\\\"}}</tool_call>',
    '{"unterminated": "</tool_call>',
])
def test_the_call_end_answers_the_same_on_every_longer_prefix(text):
    body = text[len("<tool_call>"):] if text.startswith("<tool_call>") else text
    assert_prefix_stable(json_tools.call_end, body)


PIECES = st.sampled_from(['"', "\\", "<", "</tool_call>", "</tool_", "a", " ", "{", "}", '\\"'])


@given(st.lists(PIECES, max_size=40))
@settings(max_examples=300, deadline=None)
def test_the_resuming_scan_answers_as_the_plain_scan_on_every_prefix(pieces):
    text = "".join(pieces)
    resuming = JsonMarkerEnd("</tool_call>")
    for i in range(len(text) + 1):  # the growing text of one call, as the engine feeds it
        ref = reference_json_end(text[:i], ("</tool_call>",))
        assert resuming(text[:i]) == ref == json_tools.call_end(text[:i])


def test_one_resuming_scan_serves_calls_in_turn():
    scan = JsonMarkerEnd("</tool_call>")
    for text in ['{"a": "</tool_call>"}</tool_call>', '{"b": 1}</tool_call>', '{"a": "x"']:
        for i in range(len(text) + 1):
            assert scan(text[:i]) == reference_json_end(text[:i], ("</tool_call>",))


def test_a_stop_string_ends_the_answer_and_keeps_the_whitespace_before_it():
    from kit.formats.output import OutputParser

    for chunks in (["Paris is big.\n\nEND more"], list("Paris is big.\n\nEND more")):
        p = OutputParser.for_format(FMT, "", stops=["END"])
        events = []
        for c in chunks:
            events += p.feed(c)
            if p.stopped:
                break
        events += p.finish("stop")
        assert "".join(e.text for e in events) == "Paris is big.\n\n" and p.stop_string == "END"


def test_a_forced_call_starts_inside_the_call():
    from kit.formats.output import OutputParser

    p = OutputParser.for_format(FMT, "<tool_call>", tools=[{"type": "function", "function": {
        "name": "get_weather"}}], in_tool_call=True)
    events = p.feed('\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>')
    events += p.finish("stop")
    assert [(e.name, e.arguments) for e in events] == [("get_weather", '{"city": "Lima"}')]
