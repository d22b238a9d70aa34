"""A proven lower bound on how many tokens a text encodes to, computed without tokenizing.

Why: a prompt far over the context window must be rejected before it is tokenized (a
20 MB body took 29-85 s of the engine's worker and GBs of memory to tokenize in full,
while every other request waited). The bound is sound: ``at_least(text) <= len(tokens)``
for every text, so a prompt that would fit is never rejected on it; a prompt the bound
does not decide is tokenized exactly (its size is then bounded by the window).

How (own code: no library computes such a bound). Every token covers a run of the
text's UTF-8 bytes no longer than its own text. Give each byte value ``b`` the weight
``1 / m[b]``, ``m[b]`` the longest token (in bytes) containing ``b``: a token of length
``k`` covers at most ``k`` bytes, each weighing at most ``1/k``, so it accounts for at
most 1 of the text's total weight, and ``ceil(sum of weights) <= number of tokens``.
Per byte instead of one global "longest token" keeps the bound useful: SmolLM2's
longest token is 81 spaces, but no token with a letter is longer than 25 bytes and digits
are split one by one.

It holds only when the tokenizer drops no byte of its input and covers each byte with a
token whose text contains it. :meth:`TokenBound.from_tokenizer` checks the tokenizer's
pipeline (``tokenizer.json``) for that and returns None otherwise (the prompt is then
tokenized in full, as before): a BPE model on bytes (ByteLevel) or with byte fallback;
normalizers NFC/NFD/NFKC/NFKD (applied before counting) or Llama's Prepend/Replace of
spaces by the Metaspace marker; pre-tokenizers that only split (ByteLevel, Metaspace,
Digits, Split and Punctuation without "removed"); no added token that strips the
whitespace around it.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from kit import mlx_lm_api

_NF_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
_SPLITTERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation"}
_CHUNK = 1 << 20  # characters counted at a time


@dataclass(frozen=True)
class TokenBound:
    """Per byte value, the length in bytes of the longest token that contains it.

    Attributes:
        longest: 256 ints; 0 for a byte no token contains (it then weighs nothing).
        forms: Unicode normal forms the tokenizer applies first, in order.
    """

    longest: tuple[int, ...]
    forms: tuple[str, ...] = ()

    def at_least(self, text: str, above: int | None = None) -> int:
        """A lower bound on the number of tokens ``text`` encodes to (special tokens the
        tokenizer adds around it only add to the real count). The weights add up over
        the text, so a prefix's bound bounds the whole: with ``above``, counting stops at
        the first 1 MiB chunk that takes the bound past it (the result is then still a
        lower bound, just not the tightest). ~12 ms per MiB."""
        import numpy as np

        for form in self.forms:
            text = unicodedata.normalize(form, text)
        # integer arithmetic: a float sum could round up past the true bound
        denom = math.lcm(*(m for m in self.longest if m))
        scale = np.array([denom // m if m else 0 for m in self.longest], dtype=object)
        total = 0
        for i in range(0, len(text), _CHUNK):  # chunks: bincount makes 8 bytes per byte
            data = text[i:i + _CHUNK].encode("utf-8", "surrogatepass")
            counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
            total += int((counts.astype(object) * scale).sum())
            if above is not None and total > above * denom:
                break
        return -(-total // denom)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenBound | None:
        """The bound for a Hugging Face tokenizer (mlx-lm's wrapper, a transformers
        tokenizer or a ``tokenizers.Tokenizer``), or None when its pipeline may drop
        or merge input without a token of matching length (see the module docstring)."""
        backend = tokenizer
        for attr in (mlx_lm_api.HF_TOKENIZER_ATTR, "backend_tokenizer"):  # mlx-lm -> HF -> Rust
            backend = getattr(backend, attr, backend)
        if not hasattr(backend, "to_str"):
            return None
        try:
            spec = json.loads(backend.to_str())
        except (ValueError, TypeError):
            return None
        return cls.from_spec(spec)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TokenBound | None:
        """The bound for a parsed ``tokenizer.json``, or None (see :meth:`from_tokenizer`)."""
        model = spec.get("model") or {}
        if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
            return None
        pre = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
        norm = _flatten(spec.get("normalizer"), "normalizers")
        if pre is None or norm is None:
            return None
        for p in pre:
            if p.get("type") not in _SPLITTERS or str(p.get("behavior", "")).lower() == \
                    "removed" or p.get("invert"):
                return None
        byte_level = any(p.get("type") == "ByteLevel" for p in pre)
        if not byte_level and not model.get("byte_fallback"):
            return None  # an unknown character could vanish or fuse into one <unk>
        forms, marker = [], None
        for n in norm:
            kind = n.get("type")
            if kind in _NF_FORMS:
                forms.append(kind)
            elif kind in ("Prepend", "Replace") and _is_space_marker(n):
                marker = "\u2581"
            else:
                return None  # Lowercase, Strip, Precompiled...: may shrink the text
        for p in pre:
            if p.get("type") == "Metaspace":
                marker = p.get("replacement", "\u2581")
        added = spec.get("added_tokens") or []
        if any(a.get("lstrip") or a.get("rstrip") for a in added):
            return None  # such a token swallows any run of whitespace beside it
        decode = _byte_level_decoder() if byte_level else None
        longest = [0] * 256
        texts = [data for t in model["vocab"] for data in _token_bytes(t, decode, marker)]
        texts += [a["content"].encode("utf-8", "surrogatepass") for a in added
                  if isinstance(a.get("content"), str)]
        for data in texts:
            for b in set(data):
                longest[b] = max(longest[b], len(data))
        return cls(tuple(longest), tuple(forms))


def _flatten(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]] | None:
    """A pipeline step as a flat list of its parts ([] for none); None if malformed."""
    if node is None:
        return []
    if not isinstance(node, dict):
        return None
    if node.get("type") != "Sequence":
        return [node]
    out: list[dict[str, Any]] = []
    for part in node.get(key) or []:
        flat = _flatten(part, key)
        if flat is None:
            return None
        out += flat
    return out


def _is_space_marker(step: dict[str, Any]) -> bool:
    """Llama's normalizer: prepend the Metaspace marker, or replace spaces by it."""
    if step.get("type") == "Prepend":
        return step.get("prepend") == "\u2581"
    return (step.get("pattern") or {}).get("String") == " " and step.get("content") == "\u2581"


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: character -> the byte it stands for."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def _token_bytes(token: str, decode: dict[str, int] | None,
                 marker: str | None) -> list[bytes]:
    """The input bytes a vocabulary entry may stand for. Byte-level: the bytes its
    characters encode. Otherwise its UTF-8 text, and also with each Metaspace marker read
    as the space it replaced (a marker in the input itself stays three bytes), and a
    byte-fallback entry ``<0xNN>`` as that one byte."""
    if decode is not None and all(c in decode for c in token):
        return [bytes(decode[c] for c in token)]
    out = [token.encode("utf-8", "surrogatepass")]
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            out.append(bytes([int(token[3:5], 16)]))
        except ValueError:
            pass
    if marker and marker in token:
        out.append(token.replace(marker, " ").encode("utf-8", "surrogatepass"))
    return out
