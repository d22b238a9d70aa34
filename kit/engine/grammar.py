"""Constrained decoding: forced tool calls and JSON answers.

A request that must call a tool (``tool_choice`` required or named) or must answer in
JSON (``response_format``) gets a grammar; a logits processor masks, at every step, the
tokens the grammar does not allow. Grammar compilation and the token masks come from
llguidance (the library vLLM and llama.cpp use for the same job); this module only
writes the grammars and adapts the matcher to mlx-lm's logits-processor interface.

Forced tool calls: the prompt gets the chat template's tool-call start marker
(``tokenizer.tool_call_start``, e.g. ``<tool_call>``), so the model is inside a call from
its first token. For tool-call formats whose body we know (:data:`TOOL_CALL_BODIES`,
keyed by mlx-lm's tool-parser name) the body is constrained too: the function name is
one of the allowed tools and the arguments follow that tool's JSON schema. For other
formats only the start marker is forced and the model writes the body.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

def _json_tools_body(name: str, args_rule: str) -> str:
    head = '\n{"name": ' + json.dumps(name) + ', "arguments": '
    return f"{_lark_str(head)} {args_rule} {_lark_str('}' + chr(10))}"


def _deepseek_body(name: str, args_rule: str) -> str:
    from kit.formats.deepseek import grammar_body  # the V3.1 form, see there

    return grammar_body(name, args_rule)


#: Lark grammar of a tool call's body (after the start marker) per mlx-lm tool-parser
#: family, given one tool's name and the name of its arguments' rule. ``json_tools`` is the
#: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format (Hermes, Qwen 2.5/3,
#: SmolLM3...); its parser reads the body up to the end marker or EOS.
TOOL_CALL_BODIES: dict[str, Callable[[str, str], str]] = {"json_tools": _json_tools_body,
                                                          "deepseek": _deepseek_body}

#: JSON layout of constrained output: compact separators, no free whitespace (what models
#: write most often, and the fewest tokens).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_str(text: str) -> str:
    """A Lark string literal matching ``text`` exactly (JSON escaping, which llguidance's
    Lark accepts)."""
    return json.dumps(text)


def _json_rule(schema: Any, *, tool: bool) -> str:
    """A ``%json`` Lark item for ``schema``.

    ``tool`` (a tool's arguments): objects that list ``properties`` and say nothing about
    ``additionalProperties`` get no other keys, and an object schema without properties
    (or none at all) means no arguments — a small model otherwise invents keys (e.g.
    copying ``description``) and never closes the object; keywords llguidance does not
    implement are ignored (``lenient``: agents send large schemas). For answers
    (``response_format``) such keywords are an error, never silently dropped.

    Raises:
        ValueError: ``schema`` is not a JSON object (or its ``x-guidance`` is not).
    """
    if schema is None and tool:
        schema = {}
    if not isinstance(schema, dict) or not isinstance(schema.get("x-guidance", {}), dict):
        raise ValueError("the schema must be a JSON object")
    schema = dict(schema)
    if tool and schema.get("type", "object") == "object" and "additionalProperties" not in \
            schema and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        schema["additionalProperties"] = False
    schema["x-guidance"] = {**_JSON_OPTIONS, "lenient": tool, **schema.get("x-guidance", {})}
    return "%json " + json.dumps(schema)


def tool_call_grammar(family: str | None, tools: list[dict[str, Any]]) -> str | None:
    """The Lark grammar of one tool-call body choosing among ``tools`` (OpenAI function
    schemas ``{"type": "function", "function": {"name", "parameters"}}``), or None when
    the body format of ``family`` (an mlx-lm tool-parser name) is not known.

    Raises:
        ValueError: a tool's parameters are not a JSON schema object.
    """
    body = TOOL_CALL_BODIES.get(family or "")
    if body is None or not tools:
        return None
    rules, alts = [], []
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        rules.append(f"args{i}: {_json_rule(fn.get('parameters'), tool=True)}")
        alts.append(body(str(fn.get("name", "")), f"args{i}"))
    return "start: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"


def json_grammar(schema: dict[str, Any] | None) -> str:
    """The Lark grammar of a JSON answer: any JSON object when ``schema`` is None
    (``response_format`` json_object), else a value following ``schema``.

    Raises:
        ValueError: ``schema`` is not a JSON object.
    """
    return "start: value\nvalue: " + _json_rule(schema or {"type": "object"}, tool=False) + "\n"


def ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of an mlx-lm ``TokenizerWrapper`` (~0.3 s for a 49k vocabulary;
    cache it per loaded model).

    Raises:
        ValueError: the tokenizer is not a fast (Rust) Hugging Face tokenizer.
    """
    import llguidance.hf

    eos = list(getattr(tokenizer, "eos_token_ids", None) or []) or None
    return llguidance.hf.from_tokenizer(tokenizer._tokenizer, eos_token=eos)


class GrammarProcessor:
    """An mlx-lm logits processor (``(tokens, logits) -> logits``) that keeps generation
    inside a grammar: disallowed tokens get -inf; once the grammar is complete only EOS is
    allowed. ``tokens[-1]`` on every call after the first is the token sampled last.

    Args:
        tokenizer: from :func:`ll_tokenizer`.
        grammar: Lark grammar text (llguidance dialect, ``%json`` allowed).

    Raises:
        ValueError: the grammar does not compile (e.g. an unsupported JSON schema).
    """

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        from llguidance import LLMatcher

        self._matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
        if self._matcher.is_error():
            raise ValueError(self._matcher.get_error())
        self._started = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        if self._started and not self._matcher.is_stopped():
            self._matcher.consume_token(int(tokens[-1].item()))
        self._started = True
        vocab = logits.shape[-1]
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:vocab].astype(bool)
        if bits.shape[0] < vocab:  # the model's output layer may be padded past the vocab
            bits = np.pad(bits, (0, vocab - bits.shape[0]))
        return mx.where(mx.array(bits), logits, mx.array(-mx.inf, dtype=logits.dtype))

    @property
    def error(self) -> str:
        """The matcher's error ('' when none)."""
        return self._matcher.get_error() if self._matcher.is_error() else ""
