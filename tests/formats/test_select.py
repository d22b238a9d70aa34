"""Which output format a model gets (:mod:`kit.formats.select`): every parser mlx-lm ships is
reachable from a template (or from ``tool_parser_type``), our selection agrees with mlx-lm's
own (``mlx_lm.tokenizer_utils._infer_tool_parser`` / ``_infer_thinking``) wherever we do not
add a family of our own, and the catalog reports the same names the engine's parser is built
from. Model-free: templates are excerpts of each family's markup, vocabs their special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.formats import select
from kit.formats.select import MLX_LM_PARSERS, detect, for_tokenizer, known, load_format

#: per mlx-lm parser: (an excerpt of a chat template that uses it, its special tokens);
#: the markup each template renders, as in mlx-lm's own selection rules.
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="{{ name }}">', ()),
    "gemma4": ("<|tool_call>call:{{ name }}{...}<tool_call|>", ("<|tool_call>", "<tool_call|>")),
    "function_gemma": ("<start_function_call>call:{{ name }}{...}<end_function_call>", ()),
    "longcat": ("<longcat_tool_call>{{ call | tojson }}</longcat_tool_call>", ()),
    "glm47": ("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>", ()),
    "pythonic": ("<|tool_call_start|>[{{ name }}(...)]<|tool_call_end|>", ()),
    "qwen3_coder": ("<tool_call>\n<function={{ tool_call.name }}>\n<parameter=", ()),
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>", ()),
    "minicpm5": ('<function name="{{ name }}"><param name="{{ k }}">', ()),
    "mistral": ("[TOOL_CALLS]{{ tool.name }}[ARGS]", ("[TOOL_CALLS]", "[ARGS]")),
    "muse_spark": ("<atem:function_calls>{{ calls }}</atem:function_calls>", ()),
    "json_tools": ('<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": ', ()),
    # no template markup mlx-lm matches: the XTML vocab picks it
    "kimi_k3": ("{{ messages }}", ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")),
}


class Files:
    """What both selections read of a tokenizer: the chat template and the vocab."""

    def __init__(self, template: str, vocab: tuple[str, ...]) -> None:
        self.chat_template = template
        self._vocab = {t: i for i, t in enumerate(vocab)}

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0]


def test_the_list_of_mlx_lm_parsers_is_what_mlx_lm_ships():
    import mlx_lm.tool_parsers as pkg

    shipped = {p.stem for p in Path(pkg.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert set(MLX_LM_PARSERS) == shipped


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_mlx_lm_parser_is_picked_from_its_template_as_mlx_lm_picks_it(name):
    from mlx_lm.tokenizer_utils import _infer_tool_parser

    template, vocab = TEMPLATES[name]
    files = Files(template, vocab)
    assert _infer_tool_parser(files) == name
    assert detect(template, files.get_vocab()).tool_format == name
    fmt = for_tokenizer(files)
    assert fmt.tools and fmt.tool_format == name
    assert fmt.tool[0]  # a start marker the parser waits for


def test_every_mlx_lm_parser_is_reachable_and_loads():
    """From a template (above) or, for laguna (converted checkpoints name it), from
    ``tool_parser_type``."""
    assert set(MLX_LM_PARSERS) == set(TEMPLATES) | {"laguna"}
    assert detect("{{ messages }}", set(), configured="laguna").tool_format == "laguna"
    for name in MLX_LM_PARSERS:
        fmt = load_format(detect("", set(), configured=name))
        assert fmt.tools and callable(fmt.parse), name


def test_a_configured_parser_wins_over_the_template_and_an_unknown_one_is_ignored(tmp_path):
    template, vocab = TEMPLATES["json_tools"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tool_parser_type": "glm47"}))
    assert for_tokenizer(Files(template, vocab), tmp_path).tool_format == "glm47"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tool_parser_type": "nope"}))
    assert for_tokenizer(Files(template, vocab), tmp_path).tool_format == "json_tools"
    assert not known("nope") and not known("select") and not known("../base")


def test_a_private_module_of_kit_formats_is_no_tool_format(tmp_path):
    # kit/formats/_*.py hold pieces families share (and __init__.py is the package): a
    # tool_parser_type or a rule naming one must not load it as a parser module
    private = sorted(p.stem for p in Path(select.__file__).parent.glob("_*.py"))
    assert "__init__" in private and len(private) > 1, private
    for name in private:
        assert not known(name), name
    template, vocab = TEMPLATES["json_tools"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tool_parser_type": private[-1]}))
    assert for_tokenizer(Files(template, vocab), tmp_path).tool_format == "json_tools"
    with pytest.raises(ValueError):
        load_format(select.Detected("__init__", None))


@pytest.mark.parametrize("vocab,expected", [
    (("<think>", "</think>"), ("<think>", "</think>")),
    (("<longcat_think>", "</longcat_think>"), ("<longcat_think>", "</longcat_think>")),
    (("<|think:start|>", "<|think:end|>"), ("<|think:start|>", "<|think:end|>")),
    (("<|channel>", "<channel|>"), ("<|channel>thought", "<channel|>")),
    (("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"),
     ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
    (("<|im_start|>", "<|im_end|>"), None),
])
def test_reasoning_markers_are_the_ones_mlx_lm_infers(vocab, expected):
    from mlx_lm.tokenizer_utils import _infer_thinking

    files = Files("", vocab)
    start, end, _, _ = _infer_thinking(files)
    assert ((start, end) if start else None) == expected
    assert for_tokenizer(files).think == expected


def test_mistral_think_markers_are_reasoning_though_mlx_lm_knows_them_not():
    """Magistral / Ministral 3 write ``[THINK]...[/THINK]``; mlx-lm infers no reasoning for
    them, so their reasoning came back inside the answer with its markers."""
    fmt = for_tokenizer(Files(TEMPLATES["mistral"][0], ("[TOOL_CALLS]", "[THINK]", "[/THINK]")))
    assert (fmt.tool_format, fmt.reasoning_format, fmt.think) == (
        "mistral", "mistral", ("[THINK]", "[/THINK]"))


def test_the_catalog_names_the_formats_the_engine_builds_its_parser_from(tmp_path):
    """/v1/models says what the parser will be: both come from :func:`detect`."""
    from kit.models.catalog import capabilities

    template, _ = TEMPLATES["qwen3_coder"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 1, "content": "<think>"}, {"id": 2, "content": "</think>"}],
        "normalizer": None}))
    caps = capabilities(tmp_path, {})
    engine = for_tokenizer(Files(template, ("<think>", "</think>")), tmp_path)
    assert (caps.tools, caps.tool_format, caps.reasoning_format) == (
        True, engine.tool_format, engine.reasoning_format) == (True, "qwen3_coder", "think")


def test_a_template_that_renders_tools_in_no_parsed_format_reports_no_tools(tmp_path):
    """Tools the model is told about but whose calls nothing parses would come back as
    text: /v1/models says tools=false (agents then do not offer it tools)."""
    from kit.models.catalog import capabilities

    template = "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<|unknown_call|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    caps = capabilities(tmp_path, {})
    assert (caps.tools, caps.tool_format) == (False, None)


def test_named_chat_templates_are_all_searched_for_markup():
    """Hermes-3 style checkpoints keep ``default`` and ``tool_use`` templates: transformers
    gives them as a dict; the tool markup is in one of them."""
    template, _ = TEMPLATES["json_tools"]
    named = Files("", ())
    named.chat_template = {"default": "{{ messages }}", "tool_use": template}
    assert for_tokenizer(named).tool_format == "json_tools"


def test_a_parser_mlx_lm_chose_from_its_model_defaults_is_used_when_no_template_names_one():
    """muse_spark checkpoints get their parser from mlx-lm's per-architecture defaults (and a
    Python chat template no rule can read)."""

    class Inner:
        init_kwargs = {"tool_parser_type": "muse_spark"}

    files = Files("", ())
    files._tokenizer = Inner()
    assert for_tokenizer(files).tool_format == "muse_spark"
