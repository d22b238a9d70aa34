"""The embedding model, in the embedding process: loaded with mlx-embeddings (the MLX
library for embedding models: BERT, XLM-RoBERTa, ModernBERT, Qwen3, Gemma 3...), its
inputs tokenized, bounded by its window, batched by length, pooled and L2-normalised.

Pooling follows the sentence-transformers folder when it has one (``1_Pooling/config.json``:
mean, CLS or last token; mlx-embeddings' BERT always mean-pools, which is wrong for CLS
models such as BGE), else the model's own ``text_embeds``.

Imports mlx and mlx-embeddings at load, never at module import.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kit.errors import InvalidRequest, ModelError

log = logging.getLogger("mlx_kit.embed")

#: most tokens (padded) in one forward pass: a batch of 32 inputs of 512 tokens
BATCH_TOKENS = 16_384
#: most inputs in one forward pass
BATCH_INPUTS = 32

_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_lasttoken": "lasttoken"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pooling_of(folder: Path) -> str:
    """How ``folder``'s model pools token vectors into one: ``cls``, ``mean``,
    ``lasttoken`` (its ``1_Pooling/config.json``), or ``model`` (none: the model's own
    ``text_embeds``)."""
    config = _read_json(folder / "1_Pooling" / "config.json")
    return next((mode for key, mode in _POOLING_KEYS.items() if config.get(key) is True),
                "model")


def window_of(folder: Path, context_window: int) -> int:
    """The most tokens an input may take: sentence-transformers' ``max_seq_length``
    (``sentence_bert_config.json``, what it truncates to) when set, else
    ``context_window`` (config.json's positions)."""
    value = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(value, int) and 0 < value <= context_window:
        return value
    return context_window


@dataclass
class Embedder:
    """A loaded embedding model.

    Attributes:
        model, tokenizer: mlx-embeddings' (an ``nn.Module`` and its tokenizer wrapper).
        window: most tokens per input (see :func:`window_of`).
        pooling: see :func:`pooling_of`.
        dims: the vectors' length.
        vocab: the vocabulary's size (token ids are below it).
        pad_id: the token that pads shorter inputs of a batch (masked out).
        weights_bytes: the parameters' size in bytes.
    """

    model: Any
    tokenizer: Any
    window: int
    pooling: str
    dims: int
    vocab: int
    pad_id: int
    weights_bytes: int

    @classmethod
    def load(cls, folder: Path, context_window: int) -> Embedder:
        """Load the model in ``folder`` (a local folder: mlx-embeddings would download a
        name that is not one) and embed one text, so its shape is known.

        Raises:
            ModelError: mlx-embeddings does not take the model, or it does not load.
        """
        import mlx.core as mx
        from mlx.utils import tree_flatten

        try:
            from mlx_embeddings import load
        except ImportError as e:
            raise ModelError(f"embedding models need mlx-embeddings ({e})",
                             hint="pip install 'mlx-kit[embeddings]'") from None
        t0 = time.perf_counter()
        try:
            model, tokenizer = load(str(folder))
        except Exception as e:  # the library's own kinds (ValueError, FileNotFoundError...)
            raise ModelError(f"{folder} does not load as an embedding model: "
                             f"{type(e).__name__}: {e}") from None
        weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        vocab = int(getattr(model.config, "vocab_size", 0) or len(tokenizer.get_vocab()))
        pad = tokenizer.pad_token_id
        me = cls(model, tokenizer, window_of(folder, context_window), pooling_of(folder),
                 0, vocab, int(pad) if isinstance(pad, int) else 0, weights)
        me.dims = int(me.embed([me.tokenize(["warm-up"], truncate=True)[0]]).shape[1])
        mx.clear_cache()
        log.info("embedding model %s loaded in %.2f s: %d dims, window %d, %s pooling",
                 folder, time.perf_counter() - t0, me.dims, me.window, me.pooling)
        return me

    def tokenize(self, texts: list[str], truncate: bool) -> list[list[int]]:
        """Token ids of each text, special tokens included.

        Raises:
            InvalidRequest: ``input[i]`` is past the window and ``truncate`` is off.
        """
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=truncate,
                             max_length=self.window if truncate else None)["input_ids"]
        return self.check_ids([list(map(int, x)) for x in ids], truncate, checked=True)

    def check_ids(self, ids: list[list[int]], truncate: bool, *,
                  checked: bool = False) -> list[list[int]]:
        """``ids`` (one list per input) cut to the window when ``truncate``.

        Raises:
            InvalidRequest: ``input[i]`` is empty, holds an id past the vocabulary, or is
                past the window with ``truncate`` off.
        """
        out = []
        for i, seq in enumerate(ids):
            if not seq:
                raise InvalidRequest(f"input[{i}] has no tokens", field=f"input.{i}")
            if not checked and max(seq) >= self.vocab:
                raise InvalidRequest(f"input[{i}] holds token id {max(seq)}, past the "
                                     f"vocabulary ({self.vocab})", field=f"input.{i}")
            if len(seq) > self.window:
                if not truncate:
                    raise InvalidRequest(
                        f"input[{i}] is {len(seq)} tokens, past the model's window of "
                        f"{self.window}", field=f"input.{i}", code="context_length_exceeded")
                seq = seq[:self.window]
            out.append(seq)
        return out

    def embed(self, ids: list[list[int]]) -> np.ndarray:
        """L2-normalised vectors of ``ids`` (each within the window), float32, shape
        ``(len(ids), dims)``, in the inputs' order. Inputs of like length run together,
        at most :data:`BATCH_INPUTS` and :data:`BATCH_TOKENS` (padded) per pass."""
        import mlx.core as mx

        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[np.ndarray | None] = [None] * len(ids)
        start = 0
        while start < len(order):
            end = start + 1  # sorted by length: the last one sets the padded length
            while (end < len(order) and end - start < BATCH_INPUTS
                   and (end - start + 1) * len(ids[order[end]]) <= BATCH_TOKENS):
                end += 1
            part = order[start:end]
            width = len(ids[part[-1]])
            tokens = np.full((len(part), width), self.pad_id, dtype=np.int32)
            mask = np.zeros((len(part), width), dtype=np.int32)
            for row, i in enumerate(part):
                tokens[row, :len(ids[i])] = ids[i]
                mask[row, :len(ids[i])] = 1
            vectors = self._pool(mx.array(tokens), mx.array(mask))
            for row, i in enumerate(part):
                out[i] = vectors[row]
            start = end
        return np.stack(out) if out else np.zeros((0, self.dims), np.float32)

    def _pool(self, tokens: Any, mask: Any) -> np.ndarray:
        import mlx.core as mx

        result = self.model(tokens, attention_mask=mask)
        if self.pooling == "model":
            pooled = result.text_embeds
        else:
            hidden = result.last_hidden_state.astype(mx.float32)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.pooling == "lasttoken":  # right-padded: the last unmasked position
                last = mask.sum(axis=1) - 1
                pooled = mx.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
            else:
                m = mask[..., None].astype(mx.float32)
                pooled = (hidden * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1e-9)
        pooled = pooled.astype(mx.float32)
        pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return np.array(pooled, dtype=np.float32)
