"""Which output format a model uses, from its chat template and vocab.

:func:`detect` is pure Python and imports nothing heavy: the catalog names a model's formats
from its files without loading it, and the engine builds the parser with the same rules
(:func:`load_format`). They read the same template, but not quite the same vocab: the
catalog sees only the special tokens at the head of tokenizer.json, the engine the whole
vocab, so a marker that is an ordinary token (rare) is found by the engine only; for the
loaded model ``/v1/models`` reports what the engine found.

The tool-format table follows mlx-lm's own selection (``mlx_lm.tokenizer_utils.
_infer_tool_parser``: template markup first, then the vocab, in its order) with our
families put first: mlx-lm would otherwise pick none for them (DeepSeek, gpt-oss Harmony,
Llama 3/4 JSON). tests/formats/test_select.py checks that both agree on every family they
share. A ``tool_parser_type`` in the model's tokenizer_config.json wins, as in mlx-lm.
"""

from __future__ import annotations

import importlib
from collections.abc import Container
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from types import ModuleType

from kit import mlx_lm_api
from kit.formats.base import OutputFormat, marker_end

_HERE = Path(__file__).parent


def ours(name: str) -> bool:
    """Whether the tool format ``name`` has our own module, ``kit/formats/<name>.py`` (a
    family mlx-lm has no parser for, or one whose mlx-lm parser ours corrects); it follows
    the contract of an ``mlx_lm.tool_parsers`` module (see :func:`load_format`). A module
    whose name starts with ``_`` is private (pieces families share, or a family's parts
    behind its entry module), never a format; nor are ``base`` and ``select``."""
    return name.isidentifier() and not name.startswith("_") and \
        name not in ("base", "select") and (_HERE / f"{name}.py").is_file()


def known(name: str | None) -> bool:
    """Whether ``name`` is a tool format we can load (ours or mlx-lm's)."""
    return bool(name) and (ours(name) or name in MLX_LM_PARSERS)

#: every parser module mlx-lm ships (the versions :data:`kit.mlx_lm_api.CHECKED`); each is
#: reachable from a template (the table below) or from ``tool_parser_type`` in
#: tokenizer_config.json.
MLX_LM_PARSERS = mlx_lm_api.TOOL_PARSERS

_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def _template_tool_format(t: str) -> str | None:
    """mlx-lm's template rules, in its order, after ours."""
    rules: list[tuple[bool, str]] = [
        # ours first: mlx-lm has no rule for these families
        # gpt-oss: its template writes "<|start|>assistant to=" and "functions." + name
        # as separate strings, so the pair of Harmony markers decides, not "to=functions"
        ("<|channel|>" in t and "<|message|>" in t, "harmony"),
        ("<｜tool▁calls▁begin｜>" in t or "｜DSML｜" in t, "deepseek"),
        ("<|python_tag|>" in t or ("ipython" in t and '"parameters"' in t), "llama3_json"),
        # mlx-lm's (mlx_lm.tokenizer_utils._infer_tool_parser)
        ("<minimax:tool_call>" in t, "minimax_m2"),
        ("<|tool_call>" in t and "<tool_call|>" in t, "gemma4"),
        ("<start_function_call>" in t, "function_gemma"),
        ("<longcat_tool_call>" in t, "longcat"),
        ("<arg_key>" in t, "glm47"),
        ("<|tool_list_start|>" in t or "<|tool_call_start|>" in t, "pythonic"),
        ("<tool_call>\\n<function=" in t or "<tool_call>\n<function=" in t, "qwen3_coder"),
        ("<|tool_calls_section_begin|>" in t, "kimi_k2"),
        ('<function name="' in t and '<param name="' in t, "minicpm5"),
        ("[TOOL_CALLS]" in t, "mistral"),
        ("<atem:function_calls>" in t, "muse_spark"),
        ("<tool_call>" in t and "tool_call.name" in t, "json_tools"),
    ]
    return next((name for hit, name in rules if hit and known(name)), None)


def _vocab_tool_format(vocab: Container[str]) -> str | None:
    rules = [("｜DSML｜" in vocab, "deepseek"),  # V3.2/V4: no Jinja template, DSML token
             (all(t in vocab for t in _XTML), "kimi_k3"),
             ("<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab, "pythonic"),
             (all(t in vocab for t in ("<|channel|>", "<|message|>", "<|call|>")), "harmony")]
    return next((name for hit, name in rules if hit and known(name)), None)


#: reasoning formats: name -> (start, end) markers, in mlx-lm's order of preference
#: (``_infer_thinking``), then ours; each needs both of its vocab tokens.
REASONING: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    # name: ((vocab tokens that show it), (start, end) markers in the output)
    "think": (("<think>", "</think>"), ("<think>", "</think>")),
    "longcat": (("<longcat_think>", "</longcat_think>"), ("<longcat_think>", "</longcat_think>")),
    "think_colon": (("<|think:start|>", "<|think:end|>"), ("<|think:start|>", "<|think:end|>")),
    "gemma": (("<|channel>", "<channel|>"), ("<|channel>thought", "<channel|>")),
    "xtml": (("<|open|>", "<|close|>"), ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
    "mistral": (("[THINK]", "[/THINK]"), ("[THINK]", "[/THINK]")),
}


@dataclass(frozen=True)
class Detected:
    """A model's formats by name (see :class:`~kit.formats.base.OutputFormat`)."""

    tool_format: str | None
    reasoning_format: str | None


def detect(template: str | None, vocab: Container[str], configured: str | None = None
           ) -> Detected:
    """The tool-call and reasoning formats of a model.

    Args:
        template: its chat template text (None or "" when it has none).
        vocab: its tokens (a set or dict; any container answering ``in`` for a token).
        configured: ``tool_parser_type`` from its tokenizer_config.json, which wins.
    """
    t = template or ""
    tool = (configured if known(configured) else None) or _template_tool_format(t) or \
        _vocab_tool_format(vocab)
    reasoning = "harmony" if tool == "harmony" else None
    if reasoning is None:
        for name, (tokens, _) in REASONING.items():
            if name == "xtml":
                if all(x in vocab for x in _XTML):
                    reasoning = name
                    break
            elif all(x in vocab for x in tokens):
                reasoning = name
                break
    if reasoning is None and tool == "mistral" and "<think>" in t and "</think>" in t:
        # Magistral Small 2506 (v11 tokenizer): its default system prompt asks for plain-text
        # <think>...</think>, which no token of its vocab marks
        reasoning = "think"
    return Detected(tool, reasoning)


@cache
def _module(name: str) -> ModuleType:
    """Our module for a tool format, else mlx-lm's (imports mlx: engine process only).

    Raises:
        ValueError: no such tool format.
    """
    if ours(name):
        return importlib.import_module(f"kit.formats.{name}")
    if name in MLX_LM_PARSERS:
        return mlx_lm_api.tool_parser(name)
    raise ValueError(f"unknown tool format {name!r}")


def load_format(detected: Detected) -> OutputFormat:
    """The :class:`OutputFormat` for ``detected``: the tool format's module (ours, else
    mlx-lm's) and the reasoning markers.

    A module follows mlx-lm's parser contract (``tool_call_start``, ``tool_call_end``,
    ``parse_tool_call(text, tools)``) and may add ``call_end(text)``,
    ``parse_partial(text, tools)`` and ``OVERRIDES`` (a dict of :class:`OutputFormat`
    fields, e.g. its own ``think`` markers or ``parser_class``).

    Raises:
        ValueError: ``detected.tool_format`` names no known format.
    """
    think = REASONING[detected.reasoning_format][1] if detected.reasoning_format in REASONING \
        else None
    fmt = OutputFormat(reasoning_format=detected.reasoning_format, think=think,
                       structural=("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                                   "<|close|>message<|sep|>")
                       if detected.reasoning_format == "xtml" else ())
    if detected.tool_format is None:
        return fmt
    mod = _module(detected.tool_format)
    end = getattr(mod, "tool_call_end", "") or ""
    fmt = replace(fmt, tool_format=detected.tool_format,
                  tool=(mod.tool_call_start, end), parse=mod.parse_tool_call,
                  call_end=getattr(mod, "call_end", None) or marker_end(end),
                  parse_partial=getattr(mod, "parse_partial", None),
                  grammar=detected.tool_format)
    return replace(fmt, **getattr(mod, "OVERRIDES", {}))


def for_tokenizer(tokenizer: object, folder: object = None) -> OutputFormat:
    """The :class:`OutputFormat` of a loaded model: :func:`detect` on its tokenizer's chat
    template and vocab (``tokenizer``: mlx-lm's ``TokenizerWrapper`` or anything with
    ``chat_template`` and ``get_vocab()``), honouring ``tool_parser_type`` from
    ``folder``/tokenizer_config.json. A configured name we do not know is ignored (mlx-lm
    would have refused to load it)."""
    import json

    configured = None
    if folder is not None:
        try:
            cfg = json.loads((Path(str(folder)) / "tokenizer_config.json").read_text("utf-8"))
            name = cfg.get("tool_parser_type") if isinstance(cfg, dict) else None
            configured = name if isinstance(name, str) and known(name) else None
        except (OSError, ValueError):
            pass
    template = template_text(getattr(tokenizer, "chat_template", None))
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    found = detect(template, vocab, configured)
    if found.tool_format is None:
        # what mlx-lm chose from its per-architecture defaults (e.g. muse_spark's
        # TOKENIZER_DEFAULTS, with a Python chat template we cannot read)
        inner = getattr(tokenizer, "_tokenizer", None)
        name = (getattr(inner, "init_kwargs", None) or {}).get("tool_parser_type")
        if isinstance(name, str) and known(name):
            found = Detected(name, found.reasoning_format)
    return load_format(found)


def template_text(template: object) -> str | None:
    """A chat template as text: named templates (a dict or a list of ``{"name",
    "template"}``, as transformers and tokenizer_config.json hold them) joined, so every
    one of them is searched for markup (the catalog reads them the same way)."""
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return " ".join(str(t) for t in template.values())
    if isinstance(template, list):
        return " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return None
