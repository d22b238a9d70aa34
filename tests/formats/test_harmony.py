"""gpt-oss Harmony output at the engine's parser entry point (``OutputParser.for_format`` on
the format :func:`kit.formats.select.for_tokenizer` picks from gpt-oss's template and vocab),
for what canitoolcall's fixtures do not cover: every split of the text equal to the whole,
calls cut by max_tokens, malformed markup, forced calls, stop strings, reasoning tokens.
Model-free: the tokenizer is the stand-in the conformance replay uses (template excerpt and
special tokens; no gpt-oss checkpoint can be downloaded here)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.formats.output import OutputParser
from kit.engine.types import ReasoningDelta, TextDelta, ToolCall
from kit.formats import harmony
from kit.formats.select import detect, for_tokenizer
from tests.conformance.adapter import FAMILY_FILES, CheckpointFiles

TEMPLATE, VOCAB = FAMILY_FILES["gpt-oss"]["*"]
FMT = for_tokenizer(CheckpointFiles(TEMPLATE, VOCAB))
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "get_time", "write_file", "python_runner")]
PROMPT_TAIL = "<|start|>user<|message|>hi<|end|><|start|>assistant"

ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|>"
CALL = ('<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json'
        '<|message|>{"city": "Paris"}')


def parse(chunks, *, tools=TOOLS, reason="stop", stops=(), in_tool_call=False):
    """(content, reasoning, calls, parser) of ``chunks`` fed one by one, as the engine
    feeds token texts."""
    p = OutputParser.for_format(FMT, PROMPT_TAIL, stops=stops, tools=tools,
                                in_tool_call=in_tool_call)
    events = []
    for c in chunks:
        events += p.feed(c)
        if p.stopped:
            break
    events += p.finish(reason)
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]
    return content, reasoning, calls, p


def whole(text, **kw):
    return parse([text], **kw)[:3]


def splits(text, seed):
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, 9)
        out.append(text[i:i + k])
        i += k
    return out


OUTPUTS = {
    "call": ANALYSIS + CALL,
    "preamble then call": ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>"
                          "Checking.<|end|>" + CALL,
    "call then final": ANALYSIS + CALL + "<|call|><|start|>assistant<|channel|>final"
                       "<|message|>Sunny.",
    "sequential calls": CALL + '<|call|><|start|>assistant<|channel|>commentary to=functions'
                        '.get_time <|constrain|>json<|message|>{"tz": "UTC"}',
    "final": ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Hello <b>there</b> <|",
    "marker in arguments": '<|channel|>commentary to=functions.write_file<|constrain|>json'
                           '<|message|>{"content": "ends with <|call|> or <|end|>\\" <|return|>"}',
    "markers in reasoning": "<|channel|>analysis<|message|>no <|call|> or <|start|> or "
                            "<|channel|>final here<|end|><|start|>assistant<|channel|>final"
                            "<|message|>ok",
    "malformed": "<|channel|>??<|end|><|start|>assistant<|channel|>analysis<|message|>a<|end|>"
                 "junk<|message|><|start|><|channel|>commentary to=assistant<|channel|>final"
                 "<|message|>b",
    "plain text": "No markup at all, just an answer with a < and a <| in it.",
}


@pytest.mark.parametrize("name", OUTPUTS)
def test_every_split_of_the_text_parses_like_the_whole(name):
    text = OUTPUTS[name]
    want = whole(text)
    assert parse(list(text))[:3] == want  # one character at a time
    for seed in range(8):
        assert parse(splits(text, seed))[:3] == want, seed


def test_a_call_after_reasoning_is_a_call_with_its_arguments():
    assert whole(ANALYSIS + CALL) == ("", "Need the weather.", [("get_weather", {"city": "Paris"})])


def test_preamble_and_final_text_are_content_and_calls_keep_their_order():
    content, reasoning, calls = whole(OUTPUTS["preamble then call"])
    assert (content, reasoning, calls) == ("Checking.", "Need the weather.",
                                           [("get_weather", {"city": "Paris"})])
    assert whole(OUTPUTS["call then final"])[0] == "Sunny."
    _, _, calls, p = parse([OUTPUTS["sequential calls"]])
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]
    assert p.tool_calls == 2


def test_nested_json_and_unicode_arguments_arrive_whole():
    args = {"q": "東京の天気 ☀️ — «prévisions» für Zürich", "f": {"tags": ["a", {"b": [1, 2.5]}],
                                                                 "x": None, "ok": True}}
    text = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            + json.dumps(args, ensure_ascii=False))
    assert whole(text) == ("", "", [("get_weather", args)])
    assert parse(list(text))[:3] == ("", "", [("get_weather", args)])


def test_marker_text_inside_an_argument_string_stays_in_the_argument():
    _, _, calls = whole(OUTPUTS["marker in arguments"] + "<|call|>")
    assert calls == [("write_file", {"content": 'ends with <|call|> or <|end|>" <|return|>'})]


def test_a_call_cut_by_max_tokens_returns_its_text_and_keeps_the_reasoning():
    cut = ANALYSIS + CALL[:-5]  # ends '{"city": "Pa'
    content, reasoning, calls = whole(cut, reason="length")
    assert (content, reasoning, calls) == ('{"city": "Pa', "Need the weather.", [])
    for seed in range(4):
        assert parse(splits(cut, seed), reason="length")[:3] == (content, reasoning, calls)


def test_a_call_cut_right_after_its_json_is_still_a_call():
    assert whole(CALL, reason="length")[2] == [("get_weather", {"city": "Paris"})]


def test_a_header_cut_by_max_tokens_is_dropped_but_one_ended_by_eos_is_text():
    head = ANALYSIS + "<|start|>assistant to=functions.get_weather<|channel|>commentary"
    assert whole(head, reason="length") == ("", "Need the weather.", [])
    assert whole(head, reason="stop")[0] == "assistant to=functions.get_weather<|channel|>commentary"


def test_plain_text_without_markup_is_content_and_streams_at_once():
    assert whole(OUTPUTS["plain text"], reason="length")[0] == OUTPUTS["plain text"]
    p = OutputParser.for_format(FMT, PROMPT_TAIL, tools=TOOLS)
    assert p.feed("Hello") == [TextDelta("Hello")]


def test_a_header_that_never_ends_comes_back_as_text_and_the_rest_streams():
    text = "<|channel|>" + "x" * (harmony.MAX_HEADER + 50) + "<|message|>tail"
    content, reasoning, calls = whole(text)
    assert content == text.replace("<|message|>", "") and not calls and not reasoning
    assert parse(list(text))[:3] == (content, reasoning, calls)


@pytest.mark.parametrize("text", [
    '<|channel|>commentary to=functions.get_weather<|message|>{"city": ',  # EOS in the JSON
    "<|channel|>commentary to=functions.get_weather<|message|>not json",
    '<|channel|>commentary to=functions.get_weather<|message|>["a list"]',
])
def test_a_call_whose_body_is_no_json_object_comes_back_as_text(text):
    content, _, calls = whole(text)
    assert calls == [] and content == text.split("<|message|>")[1]


def test_messages_to_recipients_that_are_no_offered_function_are_dropped():
    python = ANALYSIS + '<|start|>assistant<|channel|>commentary to=python <|constrain|>code' \
                        '<|message|>print("hello")<|call|>'
    assert whole(python) == ("", "Need the weather.", [])
    # a bare recipient naming an offered function is that function (the namespace left out)
    bare = '<|channel|>commentary to=python_runner<|message|>{"code": "1+1"}'
    assert whole(bare)[2] == [("python_runner", {"code": "1+1"})]
    # without tools in the request no message is a call; reasoning is still reasoning
    assert whole(ANALYSIS + CALL, tools=None) == ("", "Need the weather.", [])


def test_a_forced_call_starts_inside_the_header_after_the_prompts_recipient():
    assert FMT.tool[0] == " to=functions."
    out = 'get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    assert parse([out], in_tool_call=True)[2] == [("get_weather", {"city": "Oslo"})]
    assert parse(list(out), in_tool_call=True)[2] == [("get_weather", {"city": "Oslo"})]


def test_stop_strings_end_the_answer_but_not_the_reasoning():
    text = "<|channel|>analysis<|message|>say STOP now<|end|><|start|>assistant<|channel|>final" \
           "<|message|>one STOP two"
    for chunks in ([text], list(text)):
        content, reasoning, _, p = parse(chunks, stops=("STOP",))
        assert (content, reasoning) == ("one ", "say STOP now")
        assert p.stopped and p.stop_string == "STOP"


def test_reasoning_tokens_count_the_analysis_message():
    tokens = ["<|channel|>", "analysis", "<|message|>", "Need", " the", " weather", ".",
              "<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hi"]
    content, reasoning, _, p = parse(tokens)
    assert (content, reasoning) == ("Hi", "Need the weather.")
    assert p.reasoning_tokens == 8


def test_the_module_follows_mlx_lms_parser_contract():
    body = 'get_time<|channel|>commentary <|constrain|>json<|message|>{"tz": "UTC"}'
    assert harmony.parse_tool_call(body) == {"name": "get_time", "arguments": {"tz": "UTC"}}
    assert harmony.call_end(body + "<|call|>") == (len(body), len(body) + len("<|call|>"))
    assert harmony.call_end(body[:-2]) is None
    assert harmony.parse_partial(body[:-2]) == []
    with pytest.raises(ValueError):
        harmony.parse_tool_call("get_time<|channel|>commentary")


def test_gpt_oss_is_selected_from_its_template_or_its_vocab():
    assert (FMT.tool_format, FMT.reasoning_format, FMT.tools) == ("harmony", "harmony", True)
    # the real template writes "to=" and "functions." apart; this is its tool-call line
    real = ('{{- "<|start|>assistant to=" }}\n{{- "functions." + tool_call.name + '
            '"<|channel|>commentary " }}')
    assert detect(real + "<|message|>", ()).tool_format == "harmony"
    assert detect("", {t: 0 for t in VOCAB}).tool_format == "harmony"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list(harmony.SPECIALS) + [
    "assistant", " to=functions.get_weather", " to=python", "analysis", "final", "commentary",
    " json", '{"city": "P', 'aris"}', '"', "\\", "text", " ", "<|", "|>", "STOP"]), max_size=30),
    st.integers(0, 10**6), st.sampled_from(["stop", "length"]))
def test_any_markup_parses_without_error_and_the_same_at_every_split(parts, seed, reason):
    text = "".join(parts)
    want = parse([text], reason=reason, stops=("STOP",))[:3]
    assert parse(splits(text, seed), reason=reason, stops=("STOP",))[:3] == want
    assert parse(list(text), reason=reason, stops=("STOP",))[:3] == want


class _Tokenizer:
    """What :class:`kit.engine.decode.prompt.Prompts` reads of a tokenizer: a chat template with
    gpt-oss's ``Reasoning: <effort>`` line (a stand-in: no gpt-oss checkpoint here)."""

    chat_template = ('{{ "<|start|>system<|message|>Reasoning: " + (reasoning_effort or '
                     '"medium") + "<|end|>" }}{% if add_generation_prompt %}'
                     '<|start|>assistant{% endif %}')

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False,
                            tokenize=False, return_dict=False, **kwargs):
        import jinja2

        return jinja2.Template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)


@pytest.mark.parametrize("asked, rendered", [
    ("none", "low"), ("minimal", "low"), ("low", "low"), ("medium", "medium"),
    ("high", "high"), ("xhigh", "high"), ("max", "high")])
def test_gpt_oss_gets_the_reasoning_levels_its_template_was_trained_on(asked, rendered):
    from types import SimpleNamespace

    from kit.engine.decode.prompt import Prompts
    from kit.engine.types import ChatRequest

    prompts = Prompts(SimpleNamespace(tokenizer=_Tokenizer(), output_format=FMT))
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}],
                      template_kwargs={"reasoning_effort": asked})
    text = prompts.render_text(req, req.messages, generation_prompt=True)
    assert text == f"<|start|>system<|message|>Reasoning: {rendered}<|end|><|start|>assistant"
    # other families' templates get the effort as asked (Kimi K3 knows "none" and "max")
    assert for_tokenizer(CheckpointFiles("", ())).template_effort(asked) == asked


#: gpt-oss's template's handling of an assistant tool-call turn (its checks on content,
#: arguments|tojson), in our own words: what the next-turn render must get through
GPT_OSS_TURNS = """
{%- for m in messages -%}
{%- if m.role == "assistant" -%}
{%- if "content" in m and "<|channel|>final<|message|>" in m.content -%}
{{ raise_exception("channel markup in content") }}{%- endif -%}
{%- if m.tool_calls -%}
{%- if m.content and m.thinking -%}{{ raise_exception("content and thinking") }}{%- endif -%}
{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>
{%- endif -%}
<|start|>assistant to=functions.{{ m.tool_calls[0].function.name }}<|channel|>commentary json
<|message|>{{ m.tool_calls[0].function.arguments|tojson }}<|call|>
{%- else %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- endfor -%}"""


def test_the_engines_next_turn_render_is_the_clients_resend_of_a_gpt_oss_call():
    """Regression: the next-turn cache render sent content None (the template fails on
    ``"..." in None``) and arguments as a JSON string (``tojson`` quoted it), so a gpt-oss
    tool-call turn never got its next-turn cache."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from kit.engine.decode.pipeline import resent_turn
    from tests.server.test_reasoning_effort import chat

    parser = OutputParser.for_format(FMT, PROMPT_TAIL, tools=TOOLS)
    calls = [e for e in parser.feed(ANALYSIS + CALL) + parser.finish("stop")
             if isinstance(e, ToolCall)]
    engine = [{"role": "user", "content": "hi"}, resent_turn("", calls)]
    client = chat(messages=[{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}]).messages

    def render(messages):
        return render_jinja_template(conversations=[messages], chat_template=GPT_OSS_TURNS)[0][0]

    assert render(engine) == render(client)
    assert '<|message|>{"city": "Paris"}<|call|>' in render(engine)


def test_arguments_nested_deeper_than_the_stack_come_back_as_text():
    deep = "[" * 100_000 + "]" * 100_000
    text = "<|channel|>commentary to=functions.get_weather<|message|>" + deep
    assert whole(text) == (deep, "", [])
