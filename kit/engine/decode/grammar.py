"""Constrained decoding: forced tool calls and JSON answers.

A request that must call a tool (``tool_choice`` required or named) or must answer in
JSON (``response_format``) gets a grammar; a logits processor masks, at every step, the
tokens the grammar does not allow. Grammar compilation and the token masks come from
llguidance (the library vLLM and llama.cpp use for the same job); this module only
writes the grammars and adapts the matcher to mlx-lm's logits-processor interface.

Forced tool calls' grammars are written by :mod:`kit.engine.decode.tool_grammar`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kit import mlx_lm_api
from kit.engine.decode.tool_grammar import TOOL_CALL_BODIES, json_rule, tool_call_grammar

__all__ = ["TOOL_CALL_BODIES", "GrammarProcessor", "GrammarTokenizer", "json_grammar",
           "ll_tokenizer", "special_token_refs", "tool_call_grammar"]


def json_grammar(schema: dict[str, Any] | None) -> str:
    """The Lark grammar of a JSON answer: any JSON object when ``schema`` is None
    (``response_format`` json_object), else a value following ``schema``.

    Raises:
        ValueError: ``schema`` is not a JSON object.
    """
    return "start: value\nvalue: " + json_rule(schema or {"type": "object"}, tool=False) + "\n"


@dataclass(frozen=True)
class GrammarTokenizer:
    """What a grammar is compiled against: llguidance's tokenizer and the vocab's special
    tokens by text (``{"<|channel|>": 6}``)."""

    ll: Any
    specials: dict[str, int] = field(default_factory=dict)


def ll_tokenizer(tokenizer: Any) -> GrammarTokenizer:
    """llguidance's view of an mlx-lm ``TokenizerWrapper`` (~0.3 s for a 49k vocabulary;
    cache it per loaded model), with its special tokens.

    Raises:
        ValueError: the tokenizer is not a fast (Rust) Hugging Face tokenizer.
    """
    import llguidance.hf

    hf = mlx_lm_api.hf_tokenizer(tokenizer)
    eos = list(getattr(tokenizer, "eos_token_ids", None) or []) or None
    added = getattr(hf, "added_tokens_decoder", None) or {}
    specials = {t.content: i for i, t in added.items() if getattr(t, "special", False)
                and len(getattr(t, "content", "")) > 1}
    return GrammarTokenizer(llguidance.hf.from_tokenizer(hf, eos_token=eos), specials)


_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')


def special_token_refs(grammar: str, specials: dict[str, int]) -> str:
    """``grammar`` with the special tokens' texts inside its string literals written as
    llguidance token references (``<[ID]>``), ``%json`` lines left alone.

    A literal must not spell a special token: the chat template renders that text as the
    one special token, and llguidance (0.7) masks the literal's forced bytes by
    tokenizing them, which yields the special token, and then refuses that token when it
    is sampled (special tokens match no text), so the grammar fails mid-call (gpt-oss's
    ``<|channel|>``, Qwen's ``</tool_call>``, GLM's ``<arg_key>`` on real checkpoints)."""
    if not specials:
        return grammar
    names = re.compile("|".join(re.escape(n) for n in sorted(specials, key=len, reverse=True)))

    def literal(m: re.Match) -> str:
        try:
            text = json.loads(m.group(0))
        except ValueError:
            return m.group(0)
        parts, pos = [], 0
        for hit in names.finditer(text):
            parts += [json.dumps(text[pos:hit.start()])] if hit.start() > pos else []
            parts.append(f"<[{specials[hit.group(0)]}]>")
            pos = hit.end()
        if not parts:
            return m.group(0)
        parts += [json.dumps(text[pos:])] if pos < len(text) else []
        return "(" + " ".join(parts) + ")"

    return "\n".join(line if "%json" in line else _LITERAL.sub(literal, line)
                     for line in grammar.split("\n"))


class GrammarProcessor:
    """An mlx-lm logits processor (``(tokens, logits) -> logits``) that keeps generation
    inside a grammar: disallowed tokens get -inf; once the grammar is complete only EOS is
    allowed. ``tokens[-1]`` on every call after the first is the token sampled last.

    Args:
        tokenizer: from :func:`ll_tokenizer` (or a bare llguidance tokenizer).
        grammar: Lark grammar text (llguidance dialect, ``%json`` allowed); special
            tokens spelled in its literals are matched as the tokens
            (:func:`special_token_refs`).

    Raises:
        ValueError: the grammar does not compile (e.g. an unsupported JSON schema).
    """

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        from llguidance import LLMatcher

        if isinstance(tokenizer, GrammarTokenizer):
            tokenizer, grammar = tokenizer.ll, special_token_refs(grammar, tokenizer.specials)
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
