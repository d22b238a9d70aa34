"""DeepSeek tool calls (V3, V3.1, V3.2/V4/V4.1 DSML) at the engine's parser entry point
(``OutputParser.for_format`` with the format ``for_tokenizer`` picks), for the cases the
canitoolcall fixtures miss: every stream split equal to the whole, cut calls, malformed
markup, marker text in arguments, text around calls. Model-free: the tokenizer is a
stand-in exposing the template and vocab ``for_tokenizer`` reads (no checkpoint here)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
from kit.formats import deepseek
from kit.formats._deepseek_markup import BlockEnd
from kit.formats.select import detect, for_tokenizer
from tests.conformance.adapter import CheckpointFiles

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
D = "｜DSML｜"
THINK = ("<think>", "</think>")
V31_TEMPLATE = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] }}"
DSML_VOCAB = ("｜DSML｜", B, "<think>", "</think>")

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "count": {"type": "integer"},
                                     "text": {"type": "string"}, "q": {"type": "object"}}}}}
    for n in ("get_weather", "search", "echo")]


def fmt(dsml: bool = True):
    if dsml:  # V3.2/V4: no Jinja template, the vocab's DSML token
        return for_tokenizer(CheckpointFiles("", DSML_VOCAB))
    return for_tokenizer(CheckpointFiles(V31_TEMPLATE, (B, "<think>", "</think>")))


def run(raw: str | list[str], *, dsml: bool = True, tail: str = "<｜Assistant｜></think>",
        tools=TOOLS, reason: str = "stop"):
    """Feed ``raw`` (a string, or its chunks) through the parser; (content, reasoning,
    [(name, arguments dict)]) as a client accumulates them."""
    parser = OutputParser.for_format(fmt(dsml), tail, tools=tools)
    events = []
    for chunk in [raw] if isinstance(raw, str) else raw:
        events += parser.feed(chunk)
    events += parser.finish(reason)
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]
    return content, reasoning, calls


def dsml_block(invokes: str, name: str = "tool_calls", sp: str = "") -> str:
    return f"\n\n<{D}{sp}{name}>\n{invokes}</{D}{sp}{name}>"


def invoke(name: str, params: list[tuple[str, str, str]], sp: str = "") -> str:
    body = "".join(f'<{D}{sp}parameter name="{k}" string="{s}">{v}</{D}{sp}parameter>\n'
                   for k, s, v in params)
    return f'<{D}{sp}invoke name="{name}">\n{body}</{D}{sp}invoke>\n'


PARALLEL_V31 = (f'Checking.{B}{CB}get_weather{SEP}{{"city": "Zürich 🌸"}}{CE}'
                f'{CB}search{SEP}{{"q": {{"tags": ["a", {{"b": [1, 2.5]}}]}}}}{CE}{E}')
PARALLEL_V3 = (f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "東京"}}\n```{CE}\n'
               f'{CB}function{SEP}search\n```json\n{{"q": {{"a": {{"b": null}}}}}}\n```{CE}{E}')
PARALLEL_DSML = "Plan." + dsml_block(
    invoke("get_weather", [("city", "true", "  杭州\n"), ("count", "false", "42")])
    + invoke("search", [("q", "false", '{"tags": ["a", "b"], "max": 3}')]))
SAMPLES = [  # (raw, dsml, prompt tail, expected (content, reasoning, calls))
    (PARALLEL_V31, False, "", ("Checking.", "", [
        ("get_weather", {"city": "Zürich 🌸"}),
        ("search", {"q": {"tags": ["a", {"b": [1, 2.5]}]}})])),
    (PARALLEL_V3 + "Done.", False, "", ("Done.", "", [
        ("get_weather", {"city": "東京"}), ("search", {"q": {"a": {"b": None}}})])),
    (PARALLEL_DSML, True, "", ("Plan.", "", [
        ("get_weather", {"city": "  杭州\n", "count": 42}),
        ("search", {"q": {"tags": ["a", "b"], "max": 3}})])),
    ("Two lookups.</think>Plan." + dsml_block(invoke("echo", [("text", "true", "x")], " "),
                                               "calls", " "),
     True, "<｜Assistant｜><think>", ("Plan.", "Two lookups.", [("echo", {"text": "x"})])),
    (f'<{D}tool_calls>\n<{D}invoke name="echo"/>\n</{D}tool_calls>', True, "",
     ("", "", [("echo", {})])),
]


@pytest.mark.parametrize("raw,dsml,tail,want", SAMPLES)
def test_each_sub_format_parses_to_its_calls_content_and_reasoning(raw, dsml, tail, want):
    assert run(raw, dsml=dsml, tail=tail) == want


@pytest.mark.parametrize("raw,dsml,tail,want", SAMPLES)
def test_streaming_one_character_at_a_time_equals_the_whole(raw, dsml, tail, want):
    assert run(list(raw), dsml=dsml, tail=tail) == want


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(SAMPLES), st.randoms(use_true_random=False))
def test_streaming_at_random_splits_equals_the_whole(sample, rnd: random.Random):
    raw, dsml, tail, want = sample
    cuts = sorted(rnd.sample(range(1, len(raw)), k=min(len(raw) - 1, rnd.randint(1, 12))))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    assert "".join(chunks) == raw
    assert run(chunks, dsml=dsml, tail=tail) == want


def test_marker_text_inside_argument_values_stays_in_the_argument():
    v3 = f'{B}{CB}echo{SEP}{{"text": "ends with {E} and {CE}"}}{CE}{E}'
    assert run(v3, dsml=False) == ("", "", [("echo", {"text": f"ends with {E} and {CE}"})])
    quoted = f'<{D}tool_calls> and </{D}tool_calls> and </{D}invoke>'
    dsml = dsml_block(invoke("echo", [("text", "true", quoted)]))
    assert run(dsml) == ("", "", [("echo", {"text": quoted})])
    assert run(list(dsml)) == ("", "", [("echo", {"text": quoted})])


def test_a_call_cut_by_max_tokens_returns_its_complete_calls():
    raw = dsml_block(invoke("get_weather", [("city", "true", "Paris")])
                     + invoke("search", [("q", "false", '{"a": 1}')]))
    cut = raw[:raw.index('{"a"') + 3]
    assert run(cut, reason="length") == ("", "", [("get_weather", {"city": "Paris"})])
    v31 = PARALLEL_V31[:PARALLEL_V31.index('{"q"') + 4]
    assert run(v31, dsml=False, reason="length") == (
        "Checking.", "", [("get_weather", {"city": "Zürich 🌸"})])


@pytest.mark.parametrize("dsml,raw", [
    (False, f'{B}{CB}get_weather{SEP}{{"city": "Pa'),
    (True, f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}par'),
])
def test_a_call_cut_before_any_call_is_complete_comes_back_as_its_text(dsml, raw):
    assert run(raw, dsml=dsml, reason="length") == (raw, "", [])
    assert run(list(raw), dsml=dsml, reason="length") == (raw, "", [])


def test_a_cut_call_after_an_answer_is_dropped_and_the_answer_stays():
    raw = f'Let me look.\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}par'
    assert run(raw, reason="length") == ("Let me look.", "", [])
    thought = "Weather first.</think>" + raw[len("Let me look."):]
    assert run(thought, tail="<｜Assistant｜><think>", reason="length") == (
        "", "Weather first.", [])


@pytest.mark.parametrize("dsml,raw", [
    (False, f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Tokyo"\n```{CE}{E}'),
    (False, f'{B}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{E}'),
    (False, f'{B}{CB}get_weather{SEP}[1, 2]{CE}{E}'),  # arguments not an object
    (False, f'{B}{CB}get_weather{SEP}{{"x": NaN}}{CE}{E}'),  # not JSON
    (True, dsml_block(f'<{D}invoke>\n</{D}invoke>\n')),  # no name
    (True, dsml_block(invoke("echo", [("text", "true", "a"), ("text", "true", "b")]))),
    (True, dsml_block(invoke("search", [("q", "false", "{not json")]))),
    (True, dsml_block("just words\n")),
    (True, dsml_block("")),
    (True, f'\n\n<{D}tool_calls>\n<{D}invoke name="echo">\n<{D}parameter name="text" '
           f'string="true">never closed'),  # EOS inside a value
    (False, B), (True, f"\n\n<{D} calls>"),  # EOS right after a start marker
])
def test_malformed_markup_comes_back_as_the_text_the_model_wrote(dsml, raw):
    assert run(raw, dsml=dsml) == (raw, "", [])
    assert run(list(raw), dsml=dsml) == (raw, "", [])


def test_without_tools_in_the_request_the_markup_is_plain_text():
    assert run(PARALLEL_DSML, tools=None) == (PARALLEL_DSML, "", [])
    assert run(PARALLEL_V31, dsml=False, tools=None) == (PARALLEL_V31, "", [])


def test_dsml_values_follow_the_string_attribute_and_the_schema_only_where_it_is_missing():
    raw = dsml_block(f'<{D}invoke name="get_weather">\n'
                     f'<{D}parameter name="city" string="false">Paris</{D}parameter>\n'
                     f'<{D}parameter name="count">7</{D}parameter>\n'
                     f'<{D}parameter name="text">007</{D}parameter>\n'
                     f'<{D}parameter name="other" string="true">true</{D}parameter>\n'
                     f'</{D}invoke>\n')
    # city: declared a string, so invalid JSON stays text; count: no attribute, the schema
    # says integer; text: no attribute, declared a string; other: string="true" is raw text
    assert run(raw)[2] == [("get_weather", {"city": "Paris", "count": 7, "text": "007",
                                            "other": "true"})]


def test_call_end_is_prefix_stable_and_its_resuming_scan_agrees_on_every_prefix():
    quoted = dsml_block(invoke("echo", [("text", "true", f"</{D}tool_calls> <{D}parameter")]))
    for raw in [s[0] for s in SAMPLES] + [quoted, PARALLEL_V31.replace("Zürich", 'a\\"b\\\\')]:
        opener = next(o for o in (B, *deepseek.DSML_STARTS) if o in raw)
        body = raw[raw.index(opener) + len(opener):]
        final = deepseek.call_end(body)
        assert final is not None
        resuming = BlockEnd()  # what the parser feeds token by token
        for n in range(len(body) + 1):
            got = deepseek.call_end(body[:n])
            assert got is None or got == final, (raw, n)
            assert resuming(body[:n]) == got, (raw, n)


def test_selection_picks_deepseek_from_the_template_or_the_dsml_token():
    assert detect(V31_TEMPLATE, {B, "<think>", "</think>"}).tool_format == "deepseek"
    assert detect(None, set(DSML_VOCAB)) == detect("", set(DSML_VOCAB))
    assert detect(None, set(DSML_VOCAB)).tool_format == "deepseek"
    assert detect(None, set(DSML_VOCAB)).reasoning_format == "think"
    f = fmt()
    assert (f.tool_format, f.think, f.tools) == ("deepseek", THINK, True)
    assert f.parser_class is deepseek.DeepSeekOutputParser


def test_a_malformed_dsml_block_ends_at_its_closing_tag_and_what_follows_still_parses():
    bad = dsml_block("just words\n")
    good = dsml_block(invoke("echo", [("text", "true", "hi")]))
    for chunks in (bad + " then" + good, list(bad + " then" + good)):
        assert run(chunks) == (bad + " then", "", [("echo", {"text": "hi"})])


def _bytes_tokenizer():
    """A one-token-per-byte tokenizer (no merges), built in memory: llguidance then sees
    exactly the text, no model needed."""
    import llguidance.hf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    return hf, llguidance.hf.from_tokenizer(hf, eos_token=hf.eos_token_id)


def test_a_forced_call_grammar_allows_one_v31_call_of_an_offered_tool_which_parses_back():
    from llguidance import LLMatcher

    from kit.engine.decode.grammar import tool_call_grammar

    hf, ll = _bytes_tokenizer()
    grammar = tool_call_grammar("deepseek", TOOLS[:2])

    def accepts(text: str) -> bool:
        m = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0)
        assert not m.is_error(), m.get_error()
        return all(m.consume_token(t) for t in hf.encode(text, add_special_tokens=False)) \
            and m.is_accepting()

    good = f'{CB}get_weather{SEP}{{"city": "Zürich 東京", "count": 3}}{CE}{E}'
    assert accepts(good)
    assert not accepts(good.replace("get_weather", "echo"))  # not offered
    assert not accepts(good.replace("3", '"3"'))  # count is an integer
    parser = OutputParser.for_format(fmt(), "<｜Assistant｜></think>", tools=TOOLS,
                                     in_tool_call=True)
    events = [e for ch in good for e in parser.feed(ch)] + parser.finish("stop")
    assert [(e.name, json.loads(e.arguments)) for e in events] == [
        ("get_weather", {"city": "Zürich 東京", "count": 3})]


def test_the_catalog_reports_deepseek_tool_calls_for_a_checkpoint_without_a_template(tmp_path):
    """What /v1/models says of a V3.2/V4 checkpoint folder (no chat template; ｜DSML｜
    among tokenizer.json's added tokens) and of a V3.1 one (its template)."""
    from kit.models.catalog import capabilities

    def tokenizer_json(*tokens: str) -> str:
        added = [{"id": 128793 + i, "content": t, "special": True} for i, t in enumerate(tokens)]
        return json.dumps({"version": "1.0", "added_tokens": added, "normalizer": None,
                           "model": {"vocab": {}}}, ensure_ascii=False)

    v32, v31 = tmp_path / "v32", tmp_path / "v31"
    for folder in (v32, v31):
        folder.mkdir()
        (folder / "tokenizer.json").write_text(tokenizer_json(*DSML_VOCAB[1:]), "utf-8")
    (v32 / "tokenizer.json").write_text(tokenizer_json(*DSML_VOCAB), "utf-8")
    (v31 / "tokenizer_config.json").write_text(json.dumps({"chat_template": V31_TEMPLATE}))
    for folder in (v32, v31):
        caps = capabilities(folder, {})
        assert (caps.tools, caps.tool_format, caps.reasoning_format) == (True, "deepseek", "think")


FRAGMENTS = [B, E, CB, CE, SEP, "function", "get_weather", "\n", "\n\n", "```json", "```",
             '{"city": "Paris"}', "{", "}", '"', "\\", "x", "é", "</think>", "<think>",
             f"<{D}tool_calls>", f"</{D}tool_calls>", f"<{D} calls>", f"</{D} calls>",
             f'<{D}invoke name="echo">', f"</{D}invoke>", f'<{D}invoke name="echo"/>',
             f'<{D}parameter name="text" string="true">', f'<{D}parameter name="q" string="false">',
             f"</{D}parameter>", f"<{D}", ">", "/>"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=14), st.sampled_from(["stop", "length"]),
       st.sampled_from(["<｜Assistant｜></think>", "<｜Assistant｜><think>"]),
       st.randoms(use_true_random=False))
def test_any_jumble_of_markup_parses_without_an_exception_and_streams_as_it_parses_whole(
        parts, reason, tail, rnd: random.Random):
    raw = "".join(parts)
    whole = run(raw, tail=tail, reason=reason)
    cuts = sorted(rnd.sample(range(1, len(raw)), k=min(len(raw) - 1, 5))) if len(raw) > 1 else []
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    assert run(chunks, tail=tail, reason=reason) == whole
    assert run(list(raw), tail=tail, reason=reason) == whole
    content, reasoning, calls = whole
    # something always comes back (unless the model wrote nothing but think markers)
    assert content.strip() or reasoning or calls or \
        not raw.replace("<think>", "").replace("</think>", "").strip()
