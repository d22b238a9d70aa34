"""Replays a canitoolcall fixture through mlx-kit's parser entry point
(:meth:`kit.formats.output.OutputParser.for_format`), with the format mlx-kit's own
selection (:func:`kit.formats.select.for_tokenizer`, what the engine's model slot calls on the
loaded tokenizer) picks for the fixture's model.

The fixtures pin real Hugging Face tokenizers (Qwen3, GLM, Kimi, ...), which cannot be
downloaded here, and canitoolcall ships no chat templates. So :class:`CheckpointFiles`
stands in for the loaded tokenizer (a stand-in for what cannot exist here): it exposes
exactly what ``for_tokenizer`` reads, the chat template and the vocab, filled per family and
variant with an excerpt of the published template's tool-call markup and the vocab's
special tokens (``FAMILY_FILES``).

Verdicts come from canitoolcall's own checks (``run_checks`` / ``case_status``), over the
non-streamed parse and text-level stream splits (``canitoolcall.chunking`` strategies applied
to characters, labelled ``text:<strategy>`` so they count toward the status).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from canitoolcall.checks import case_status, run_checks
from canitoolcall.chunking import DEFAULT_STRATEGIES, split
from canitoolcall.fixtures import Family, Fixture, load_fixtures
from canitoolcall.pytest_plugin import family_for
from canitoolcall.results import Observation, ParsedToolCall, ParseResult, Status

from kit.formats import OutputFormat
from kit.formats.select import for_tokenizer

#: family slug -> {variant or "*": (an excerpt of the tool-call markup in the family's
#: published chat template, the special tokens of its vocab that mlx-lm looks for)}.
#: mlx-kit's selection (:mod:`kit.formats.select`) picks from these, so its precedence
#: rules decide, as they would for the real checkpoint.
XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
FAMILY_FILES: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "qwen3-hermes": {"*": ('<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": ',
                           ("<tool_call>", "</tool_call>", "<think>", "</think>"))},
    "qwen3-xml": {"*": ("<tool_call>\n<function={{ tool_call.name }}>\n<parameter=",
                        ("<tool_call>", "</tool_call>", "<think>", "</think>"))},
    "glm": {"*": ("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>",
                  ("<tool_call>", "</tool_call>", "<think>", "</think>"))},
    # [THINK]/[/THINK] are not among the think markers mlx-lm knows
    "mistral": {"*": ("[TOOL_CALLS]{{ tool.name }}[ARGS]", ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")),
                # Magistral Small 2506: v11 vocab (no [THINK]); the template's default system
                # prompt asks for plain-text <think>...</think>
                "v11-think-text": ("Your thinking process must follow the template below:\n<think>\n"
                                   "Your thoughts...\n</think>\n[TOOL_CALLS]{{ tool.name }}[ARGS]",
                                   ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))},
    "gemma4": {"*": ("<|tool_call>call:{{ name }}{...}<tool_call|>",
                     ("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>"))},
    "kimi": {"kimi-k2-thinking": ("<|tool_calls_section_begin|><|tool_call_begin|>",
                                  ("<|tool_calls_section_begin|>", "<think>", "</think>")),
             "kimi-k2-instruct": ("<|tool_calls_section_begin|><|tool_call_begin|>",
                                  ("<|tool_calls_section_begin|>",)),
             # K3's template names no markup mlx-lm matches; its XTML vocab picks kimi_k3
             "kimi-k3-xtml": ("<|open|>tool_call<|sep|>", XTML)},
    # no mlx-lm tool parser matches these templates: calls would come back as text
    # DeepSeek (ours): V3 and V3.1 templates write <｜tool▁calls▁begin｜> blocks (V3 with
    # the call's type and a ```json fence, V3.1 name<｜tool▁sep｜>{json}); V3.2 and V4.x ship no
    # Jinja template (their encoding/*.py renders prompts): only the vocab's ｜DSML｜ token shows
    "deepseek": {
        "deepseek-v3": ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
                        "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' }}",
                        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                         "<think>", "</think>")),
        "deepseek-v31": ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] "
                         "+ '<｜tool▁sep｜>' + tool['function']['arguments'] }}",
                         ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                          "<think>", "</think>")),
        **{v: ("", ("｜DSML｜", "<｜tool▁calls▁begin｜>", "<think>", "</think>"))
           for v in ("deepseek-v32", "deepseek-v4", "deepseek-v41")},
        "*": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>",
              ("<｜tool▁calls▁begin｜>", "<think>", "</think>"))},
    # gpt-oss's chat_template.jinja writes a call in the role header, then <|call|>
    "gpt-oss": {"*": ('{{- "<|start|>assistant to=" }}{{- "functions." + tool_call.name + '
                      '"<|channel|>commentary " }}{{- "json<|message|>" }}'
                      '{{- tool_call.arguments|tojson }}{{- "<|call|>" }}',
                      ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                       "<|return|>", "<|call|>"))},
    # Llama 3.1/3.3 templates name <|python_tag|> (3.2's only ipython + "parameters"); Llama
    # 4's renders a call after <|python_start|>...<|python_end|> as the same JSON
    "llama": {"llama3-json": ('{%- if builtin_tools is defined %}<|python_tag|>{%- endif %}'
                              '{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' }}'
                              '<|start_header_id|>ipython<|end_header_id|>',
                              ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>",
                               "<|start_header_id|>", "<|end_header_id|>")),
              "llama4-pythonic": ("{{- '<|python_start|>' }}{{- '<|python_end|>' }}"
                                  '{{- \'{"name": "\' + tool_call.function.name + \'", \' }}'
                                  '{{- \'"parameters": \' }}<|header_start|>ipython<|header_end|>',
                                  ("<|python_start|>", "<|python_end|>", "<|eot|>", "<|eom|>",
                                   "<|header_start|>", "<|header_end|>"))},
}


class CheckpointFiles:
    """What :func:`~kit.formats.select.for_tokenizer` reads of a loaded tokenizer: the chat
    template and the vocab."""

    def __init__(self, template: str, vocab: tuple[str, ...]) -> None:
        self.chat_template = template
        self._vocab = {t: i for i, t in enumerate(vocab)}

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


def _reference(fixture: Fixture, family: Family | None) -> Any:
    """The family.json reference model of ``fixture`` (its first listed model), or None."""
    by_repo = {m.repo: m for m in (family.reference_models if family else ())}
    return next((by_repo[m] for m in fixture.models if m in by_repo), None)


def _variant(fixture: Fixture, family: Family | None) -> str:
    ref = _reference(fixture, family)
    return ref.variant if ref is not None and ref.variant else "*"


def generation_prompt(fixture: Fixture, family: Family | None) -> str:
    """The prompt's tail the output follows: the fixture's own, else its reference model's
    default (family.json), which is what decides whether output starts inside reasoning."""
    if fixture.generation_prompt is not None:
        return fixture.generation_prompt
    ref = _reference(fixture, family)
    return (ref.default_generation_prompt if ref is not None else None) or ""


@cache
def _format(slug: str, variant: str) -> OutputFormat:
    table = FAMILY_FILES[slug]
    return for_tokenizer(CheckpointFiles(*(table.get(variant) or table["*"])))


def format_for(fixture: Fixture, family: Family | None) -> OutputFormat:
    """The output format mlx-kit's selection picks for ``fixture``'s model."""
    table = FAMILY_FILES[fixture.family]
    variant = _variant(fixture, family)
    return _format(fixture.family, variant if variant in table else "*")


def parse(fixture: Fixture, family: Family | None, chunks: list[str]) -> ParseResult:
    """Feed ``chunks`` (the raw output, split) through mlx-kit's parser for ``fixture``;
    the accumulated result as an OpenAI client would see it."""
    from kit.formats.output import OutputParser
    from kit.engine.types import ReasoningDelta, TextDelta, ToolCall

    parser = OutputParser.for_format(format_for(fixture, family),
                                     generation_prompt(fixture, family),
                                     tools=list(fixture.tools))
    # the engine finishes with "length" when max_tokens cut the output, else EOS ("stop")
    reason = "length" if "truncated" in fixture.tags else "stop"
    events: list[Any] = []
    try:
        for chunk in chunks:
            events += parser.feed(chunk)
            if parser.stopped:
                break
        events += parser.finish(reason)
    except Exception as e:  # a parser crash is a parse outcome (canitoolcall's contract)
        return ParseResult(exception=f"{type(e).__name__}: {e}")
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = tuple(ParsedToolCall(e.name, e.arguments) for e in events if isinstance(e, ToolCall))
    return ParseResult(content=text or None, reasoning_content=reasoning or None, tool_calls=calls)


def streams(fixture: Fixture, family: Family | None) -> dict[str, ParseResult]:
    """The raw output split at text level by each canitoolcall default strategy."""
    chars = list(fixture.raw_output)
    return {f"text:{s.id}": parse(fixture, family, ["".join(g) for g in split(chars, s)])
            for s in DEFAULT_STRATEGIES if s.kind != "special"}


@dataclass(frozen=True)
class Verdict:
    status: str  # pass | soft | fail | unsupported (canitoolcall's error counts as fail)
    nonstream: ParseResult | None
    streams: dict[str, ParseResult]
    detail: str = ""


_RANK = {"pass": 0, "soft": 1, "fail": 2, "unsupported": 3}


def rank(status: str) -> int:
    """Lower is better: pass < soft < fail < unsupported."""
    return _RANK[status]


def verdict(fixture: Fixture) -> Verdict:
    """canitoolcall's verdict for mlx-kit on ``fixture``."""
    family = family_for(fixture)
    if not format_for(fixture, family).tools:
        return Verdict("unsupported", None, {}, "no tool-call parser for this family")
    whole = parse(fixture, family, [fixture.raw_output])
    split_parses = streams(fixture, family)
    obs = Observation(nonstream=whole, streams=split_parses)
    rows = run_checks(fixture, family, obs)
    status = case_status(rows)
    bad = [f"{r.check}[{r.strategy}]: {r.status.value}" + (f" ({r.detail})" if r.detail else "")
           for r in rows if r.status not in (Status.PASS,)]
    name = {Status.PASS: "pass", Status.SOFT_PASS: "soft"}.get(status, "fail")
    return Verdict(name, whole, split_parses, "; ".join(bad[:6]))


@cache
def all_fixtures() -> tuple[Fixture, ...]:
    """The 469 fixtures bundled in canitoolcall's wheel."""
    return tuple(load_fixtures())
