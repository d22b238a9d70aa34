"""An independent numpy forward of a BERT sentence-embedding model, used only as a test reference.

The embedding server computes its vectors with MLX (through mlx-embeddings).  To check those
vectors without trusting the library they come from, this module recomputes them from the same
folder (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``1_Pooling/config.json``)
with plain numpy: embeddings, the encoder layers, pooling and L2 normalisation, as
sentence-transformers does for models such as all-MiniLM-L6-v2.  It is slow and simple on purpose:
each text runs on its own (no padding, no batching) in float64.

It imports neither mlx, mlx_embeddings, torch, transformers nor sentence_transformers; only numpy,
scipy (the exact erf GELU), ``tokenizers`` and ``safetensors.numpy``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer

_WORDS = "embeddings.word_embeddings.weight"


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _weights(folder: Path) -> dict[str, np.ndarray]:
    """The tensors of ``folder/model.safetensors`` as float64, named without any common prefix
    (``bert.``, ``0.``...) so that e.g. ``embeddings.word_embeddings.weight`` is found."""
    raw = load_file(str(folder / "model.safetensors"))
    prefix = next(k[: -len(_WORDS)] for k in raw if k.endswith(_WORDS))
    return {k[len(prefix):]: v.astype(np.float64) for k, v in raw.items() if k.startswith(prefix)}


def _window(folder: Path, config: dict, max_tokens: int | None) -> int:
    """The most tokens (special ones included) a text keeps: ``max_tokens`` when given, else
    sentence-transformers' ``max_seq_length`` (``sentence_bert_config.json``), else
    ``tokenizer_config.json``'s ``model_max_length``, each only if within
    ``max_position_embeddings``, which is the last resort."""
    if max_tokens is not None:
        return int(max_tokens)
    positions = int(config["max_position_embeddings"])
    for value in (_read_json(folder / "sentence_bert_config.json").get("max_seq_length"),
                  _read_json(folder / "tokenizer_config.json").get("model_max_length")):
        if isinstance(value, int) and 0 < value <= positions:
            return value
    return positions


def _pooling(folder: Path) -> str:
    """``"mean"`` or ``"cls"``, from ``1_Pooling/config.json`` (mean when the file is absent)."""
    config = _read_json(folder / "1_Pooling" / "config.json")
    if not config or config.get("pooling_mode_mean_tokens"):
        return "mean"
    if config.get("pooling_mode_cls_token"):
        return "cls"
    raise NotImplementedError(f"pooling not supported by the reference: {config}")


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _linear(x: np.ndarray, W: dict[str, np.ndarray], name: str) -> np.ndarray:
    """``nn.Linear``: weight is (out, in), so y = x @ W.T + b."""
    return x @ W[name + ".weight"].T + W[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, BERT's ``hidden_act: gelu``."""
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _encode(ids: list[int], W: dict[str, np.ndarray], config: dict) -> np.ndarray:
    """Last hidden states, shape (tokens, hidden), of one unpadded text given its token ids."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps, d = float(config.get("layer_norm_eps", 1e-12)), hidden // heads
    n = len(ids)
    x = (W["embeddings.word_embeddings.weight"][ids]
         + W["embeddings.position_embeddings.weight"][:n]
         + W["embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        q, k, v = (_linear(x, W, p + "attention.self." + m).reshape(n, heads, d).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)            # (heads, n, n)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
        x = _layer_norm(_linear(ctx, W, p + "attention.output.dense") + x,
                        W[p + "attention.output.LayerNorm.weight"],
                        W[p + "attention.output.LayerNorm.bias"], eps)
        h = _gelu(_linear(x, W, p + "intermediate.dense"))
        x = _layer_norm(_linear(h, W, p + "output.dense") + x,
                        W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], eps)
    return x


def embed(folder: Path | str, texts: list[str], max_tokens: int | None = None) -> np.ndarray:
    """Sentence embeddings of ``texts`` by the BERT model in ``folder``.

    Args:
        folder: a sentence-transformers model folder (``config.json``, ``model.safetensors``,
            ``tokenizer.json``, optionally ``1_Pooling/config.json`` and
            ``sentence_bert_config.json``).
        texts: the inputs; each is tokenized with [CLS]/[SEP] and cut to the window.
        max_tokens: the window in tokens, special tokens included; by default the model's
            (see :func:`_window`: 256 for all-MiniLM-L6-v2).

    Returns:
        float32 array of shape (len(texts), hidden_size), each row pooled per
        ``1_Pooling/config.json`` (mean over tokens, or [CLS]) and L2-normalised (unit length).
    """
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    if config.get("hidden_act", "gelu") != "gelu":
        raise NotImplementedError(f"hidden_act {config['hidden_act']!r}")
    W, pooling = _weights(folder), _pooling(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=_window(folder, config, max_tokens))
    rows = []
    for text in texts:
        states = _encode(tokenizer.encode(text).ids, W, config)
        vector = states.mean(0) if pooling == "mean" else states[0]
        rows.append(vector / np.linalg.norm(vector))
    return np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)
