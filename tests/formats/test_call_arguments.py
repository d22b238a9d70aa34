"""A call reaches the client only with a string name and arguments that are a strict JSON
object (what agents ``JSON.parse``); anything else is the markup returned as text, never an
exception (model-free, at the engine's parser entry point, whole and at stream splits).

Found by fuzzing the fixtures' raw outputs (issue 14, tried as an attacker): mlx-lm's
kimi_k2 parser hands over arguments it could not decode as the raw string
(``{"city": "Tokyo"}<|tool_c`` became a call's arguments), Python literals that
json.dumps cannot write (a set raised TypeError out of the parser), and every family passed
``NaN``/``Infinity`` (json.loads accepts them), a JSON list or string as arguments through.
"""

from __future__ import annotations

import pytest

from tests.formats.replay import TOOLS, family_format, parse

KIMI = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")
HERMES = '<tool_call>\n{{"name": "get_weather", "arguments": {}}}\n</tool_call>'
CASES = [
    ("kimi", "kimi-k2-instruct", KIMI, '{"city": "Tokyo"}<|tool_c'),
    ("kimi", "kimi-k2-instruct", KIMI, "{'city': {1, 2}}"),
    ("kimi", "kimi-k2-instruct", KIMI, "{'city': b'x'}"),
    ("kimi", "kimi-k2-instruct", KIMI, '{"days": 1e999}'),
    ("kimi", "kimi-k2-instruct", KIMI, '[1, 2]'),
    ("kimi", "kimi-k2-instruct", KIMI, '"Paris"'),
    ("qwen3-hermes", "*", HERMES, '{"days": NaN}'),
    ("qwen3-hermes", "*", HERMES, '[1]'),
    ("qwen3-hermes", "*", HERMES, '"x"'),
    ("llama", "llama3-json", '{{"name": "get_weather", "parameters": {}}}', '{"days": Infinity}'),
    ("mistral", "*", "[TOOL_CALLS]get_weather[ARGS]{}", '{"days": NaN}'),
    ("gpt-oss", "*", "<|channel|>commentary to=functions.get_weather <|constrain|>json"
     "<|message|>{}<|call|>", '{"days": -Infinity}'),
]


@pytest.mark.parametrize("slug, variant, markup, args", CASES,
                         ids=[f"{c[0]}-{c[3][:14]}" for c in CASES])
def test_a_call_whose_arguments_are_not_a_json_object_comes_back_as_text(slug, variant,
                                                                         markup, args):
    r = parse(family_format(slug, variant), markup.format(args), tools=TOOLS)
    assert r.calls == [] and args in (r.content or "")


def test_a_call_whose_name_is_not_a_string_comes_back_as_text():
    text = '<tool_call>\n{"name": {"a": 1}, "arguments": {}}\n</tool_call>'
    r = parse(family_format("qwen3-hermes"), text)
    assert r.calls == [] and '{"name": {"a": 1}' in r.content


def test_python_literal_arguments_that_are_a_mapping_still_make_a_call():
    r = parse(family_format("kimi", "kimi-k2-instruct"), KIMI.format("{'city': 'Oslo'}"))
    assert r.calls == [("get_weather", {"city": "Oslo"})]


def test_valid_calls_after_a_bad_one_in_the_same_reply_are_kept():
    fmt = family_format("qwen3-hermes")
    r = parse(fmt, HERMES.format('{"days": NaN}') + HERMES.format('{"city": "Rome"}'))
    assert r.calls == [("get_weather", {"city": "Rome"})] and "NaN" in r.content


def test_arguments_nested_deeper_than_the_stack_come_back_as_text_not_an_exception():
    deep = "[" * 5_000 + "]" * 5_000  # mlx-lm's kimi_k2 passes it on as the raw string
    r = parse(family_format("kimi", "kimi-k2-instruct"), KIMI.format(deep))
    assert r.calls == [] and deep in r.content
