"""Forced tool-call grammars (kit/engine/decode/grammar.py), model-free: each format's body grammar
compiles, accepts a call written the way the family's template writes one, refuses a call
to another tool or with a wrong argument type, and what it accepts parses (with the format's
own parser, through the engine's parser entry point) to the call it spelled.

The tokenizer is a byte-level BPE with no merges, built in memory with the ``tokenizers``
library (one token per byte): llguidance sees exactly the text, with no model needed.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from kit.engine.decode.grammar import (TOOL_CALL_BODIES, GrammarTokenizer, ll_tokenizer,
                                special_token_refs, tool_call_grammar)
from kit.formats.select import Detected, known, load_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"},
            "options": {"type": "object", "required": ["units"], "properties": {
                "units": {"type": "string"}, "days": {"type": "integer"}}}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ARGS = {"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}

#: a call to get_weather with ARGS as each family's template writes it (after the start
#: marker, which the prompt ends with); the wrong ones: another tool's name, a bad type.
CALLS = {
    "json_tools": ('\n{"name": "get_weather", "arguments": '
                   '{"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}}\n'),
    "qwen3_coder": ('\n<function=get_weather>\n<parameter=city>\nZürich 東京\n</parameter>\n'
                    '<parameter=options>\n{"units": "metric", "days": 3}\n</parameter>\n'
                    '</function>\n</tool_call>'),
    "glm47": ('get_weather<arg_key>city</arg_key><arg_value>Zürich 東京</arg_value>'
              '<arg_key>options</arg_key><arg_value>{"units": "metric", "days": 3}'
              '</arg_value></tool_call>'),
    "mistral": 'get_weather[ARGS]{"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}',
    "kimi_k2": ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}'
                '<|tool_call_end|><|tool_calls_section_end|>'),
    "gemma4": ('call:get_weather{city:<|"|>Zürich 東京<|"|>,options:{units:<|"|>metric<|"|>,'
               'days:3}}<tool_call|>'),
    "deepseek": ('<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
                 '{"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}'
                 '<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "harmony": ('get_weather<|channel|>commentary <|constrain|>json<|message|>'
                '{"city": "Zürich 東京", "options": {"units": "metric", "days": 3}}'),
}
CALLS["llama3_json"] = CALLS["json_tools"]  # after <|python_tag|>: the same body
#: the formats whose parser is on this branch (the others' rows run once theirs lands)
PARSED = sorted(f for f in CALLS if known(f))
BAD_TYPE = {f: text.replace("3", '"3"', 1) if f != "gemma4" else text.replace(
    "days:3", 'days:<|"|>3<|"|>') for f, text in CALLS.items()}


def _bytes_tokenizer(specials: tuple[str, ...] = ()):
    import llguidance.hf
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))},
                               merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>", *specials])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    return hf, llguidance.hf.from_tokenizer(hf, eos_token=hf.eos_token_id)


@pytest.fixture(scope="module")
def tokenizers():
    return _bytes_tokenizer()


def _accepts(tokenizers, grammar: str, text: str) -> bool:
    from llguidance import LLMatcher

    hf, ll = tokenizers
    if isinstance(ll, GrammarTokenizer):
        ll, grammar = ll.ll, special_token_refs(grammar, ll.specials)
    m = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    for t in hf.encode(text, add_special_tokens=False):
        if not m.consume_token(t):
            return False
    return m.is_accepting()


def test_every_format_with_a_body_grammar_has_a_recorded_call_here():
    assert set(TOOL_CALL_BODIES) <= set(CALLS)


def test_every_family_with_a_parser_gets_a_forced_call_body():
    from tests.families.families import FAMILIES

    missing = [f.tool_format for f in FAMILIES if known(f.tool_format) and tool_call_grammar(
        load_format(Detected(f.tool_format, None)).grammar, [TIME]) is None]
    assert not missing, f"no forced-call grammar for {missing}"


@pytest.mark.parametrize("fmt", PARSED)
def test_a_forced_call_grammar_accepts_the_familys_call_and_its_parser_reads_it(
        tokenizers, fmt):
    grammar = tool_call_grammar(fmt, [WEATHER, TIME])
    assert _accepts(tokenizers, grammar, CALLS[fmt])
    from kit.formats.output import OutputParser
    from kit.engine.types import TextDelta, ToolCall

    form = load_format(Detected(fmt, None))
    parser = OutputParser.for_format(form, "", tools=[WEATHER, TIME], in_tool_call=True)
    events = parser.feed(CALLS[fmt]) + parser.finish("stop")
    [call] = [e for e in events if isinstance(e, ToolCall)]
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGS
    assert not "".join(e.text for e in events if isinstance(e, TextDelta)).strip()


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_a_forced_call_grammar_refuses_a_tool_not_offered_and_a_wrong_type(tokenizers, fmt):
    grammar = tool_call_grammar(fmt, [TIME])
    assert not _accepts(tokenizers, grammar, CALLS[fmt])
    assert not _accepts(tokenizers, tool_call_grammar(fmt, [WEATHER]), BAD_TYPE[fmt])


@pytest.mark.parametrize("fmt", sorted(CALLS))
@pytest.mark.parametrize("parameters", [None, {}, {"type": "object"}])
def test_a_tool_without_parameters_is_forced_to_a_call_without_arguments(
        tokenizers, fmt, parameters):
    tool = {"type": "function", "function": {"name": "now", **(
        {"parameters": parameters} if parameters is not None else {})}}
    grammar = tool_call_grammar(fmt, [tool])
    empty = {"json_tools": '\n{"name": "now", "arguments": {}}\n',
             "qwen3_coder": "\n<function=now>\n</function>\n</tool_call>",
             "glm47": "now</tool_call>", "mistral": "now[ARGS]{}",
             "kimi_k2": "<|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}"
                        "<|tool_call_end|><|tool_calls_section_end|>",
             "gemma4": "call:now{}<tool_call|>",
             "deepseek": "<｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                         "<｜tool▁calls▁end｜>",
             "harmony": "now<|channel|>commentary <|constrain|>json<|message|>{}",
             "llama3_json": '\n{"name": "now", "arguments": {}}\n'}[fmt]
    assert _accepts(tokenizers, grammar, empty)


def test_parameters_that_are_no_schema_object_are_refused():
    with pytest.raises(ValueError):
        tool_call_grammar("glm47", [{"type": "function", "function": {"name": "f",
                                                                         "parameters": 5}}])


def test_a_format_without_a_body_grammar_forces_only_its_start_marker():
    assert tool_call_grammar("pythonic", [WEATHER]) is None
    assert tool_call_grammar(None, [WEATHER]) is None



@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm47", "gemma4"])
def test_a_bare_string_with_an_enum_is_one_of_its_values(tokenizers, fmt):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Zürich", "東京"]}}}}}
    grammar = tool_call_grammar(fmt, [tool])
    call = {"qwen3_coder": "\n<function=get_weather>\n<parameter=city>\n{}\n</parameter>\n"
                           "</function>\n</tool_call>",
            "glm47": "get_weather<arg_key>city</arg_key><arg_value>{}</arg_value></tool_call>",
            "gemma4": 'call:get_weather{{city:<|"|>{}<|"|>}}<tool_call|>'}[fmt]
    assert _accepts(tokenizers, grammar, call.format("東京"))
    assert not _accepts(tokenizers, grammar, call.format("Paris"))


#: markers that are single special tokens in the real checkpoints' vocabs
SPECIALS = ("<|channel|>", "<|constrain|>", "<|message|>", "</tool_call>", "<tool_call|>",
            '<|"|>', "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
            "<|tool_call_end|>", "<|tool_calls_section_end|>", "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "[ARGS]")


@pytest.fixture(scope="module")
def special_tokenizers():
    from types import SimpleNamespace

    hf, _ = _bytes_tokenizer(SPECIALS)
    return hf, ll_tokenizer(SimpleNamespace(_tokenizer=hf, eos_token_ids=[hf.eos_token_id]))


@pytest.mark.parametrize("fmt", sorted(set(CALLS) - {"json_tools", "llama3_json"}))  # (no
# marker in their bodies)
def test_a_forced_call_matches_markers_that_are_special_tokens_as_those_tokens(
        special_tokenizers, fmt):
    # Regression: with gpt-oss's <|channel|> a special token, llguidance offered that
    # token for the literal, then refused it once sampled: the call stopped mid-header.
    hf, gt = special_tokenizers
    ids = hf.encode(CALLS[fmt], add_special_tokens=False)
    assert set(ids) & set(gt.specials.values()), "the call holds no special token"
    assert _accepts(special_tokenizers, tool_call_grammar(fmt, [WEATHER, TIME]), CALLS[fmt])


def test_special_token_texts_in_json_schemas_are_left_alone():
    grammar = 'start: "a<|channel|>b" x\nx: %json {"const": "<|channel|>"}\n'
    assert special_token_refs(grammar, {"<|channel|>": 6}) == \
        'start: ("a" <[6]> "b") x\nx: %json {"const": "<|channel|>"}\n'


@pytest.mark.parametrize("fmt", ["json_tools", "qwen3_coder", "kimi_k2"])
def test_nested_objects_of_a_tool_get_no_invented_keys(tokenizers, fmt):
    # Regression: only the arguments object was closed; the 135M model added keys inside
    # a nested object until max_tokens.
    extra = CALLS[fmt].replace('"days": 3}', '"days": 3, "note": "x"}')
    assert extra != CALLS[fmt]
    assert not _accepts(tokenizers, tool_call_grammar(fmt, [WEATHER]), extra)



@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm47", "gemma4"])
def test_a_bare_string_keeps_within_max_length(tokenizers, fmt):
    # a small model otherwise writes a free string until max_tokens
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 6}}}}}
    grammar = tool_call_grammar(fmt, [tool])
    call = {"qwen3_coder": "\n<function=get_weather>\n<parameter=city>\n{}\n</parameter>\n"
                           "</function>\n</tool_call>",
            "glm47": "get_weather<arg_key>city</arg_key><arg_value>{}</arg_value></tool_call>",
            "gemma4": 'call:get_weather{{city:<|"|>{}<|"|>}}<tool_call|>'}[fmt]
    assert _accepts(tokenizers, grammar, call.format("Zürich"))
    assert not _accepts(tokenizers, grammar, call.format("Zürich!"))


@pytest.mark.parametrize("family", ["qwen3_coder", "glm47", "gemma4", "json_tools"])
def test_a_forced_call_to_a_tool_with_thousands_of_properties_is_a_value_error_not_a_crash(family):
    # Regression: the per-property bodies recursed once per property: 993+ properties raised
    # RecursionError, which reached the client as a 500 ("generation failed").
    props = {f"p{i}": {"type": "string"} for i in range(3000)}
    tool = {"type": "function", "function": {"name": "wide", "parameters": {
        "type": "object", "properties": props}}}
    try:
        grammar = tool_call_grammar(family, [tool])
    except ValueError as e:
        assert "too many properties" in str(e) or "schema" in str(e)
    else:
        assert grammar and "p2999" in grammar
