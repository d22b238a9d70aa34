"""Memory estimates: will a model fit before we load it?

estimate = weights (exact, from the safetensors headers) + KV cache bytes per token x
context tokens. The budget is the memory the machine has available now (plus what a model
being replaced will free), or an explicit ``--memory-budget``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from kit.errors import ConfigError

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class Estimate:
    """Bytes a model needs: ``weights + kv_per_token * context``."""

    weights: int
    kv_per_token: int
    context: int

    @property
    def kv(self) -> int:
        return self.kv_per_token * self.context

    @property
    def total(self) -> int:
        return self.weights + self.kv


def weights_bytes(folder: Path) -> int:
    """Sum of tensor sizes in every ``*.safetensors`` of ``folder``, read from the headers
    only (the format: an 8-byte little-endian header length, then a JSON header giving each
    tensor's dtype and shape). The safetensors library needs a framework to open a file,
    so this reads the documented header directly."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                total += math.prod(t["shape"]) * _DTYPE_BYTES.get(t["dtype"], 4)
    return total


def kv_bytes_per_token(config: dict, kv_bits: int | None = None, group_size: int = 64) -> int:
    """KV cache bytes one token of context costs, over every layer.

    Full precision: 2 (K and V) x layers x kv_heads x head_dim x activation bytes (4 for
    a float32 model, else 2). With ``kv_bits`` (mlx-lm's ``QuantizedKVCache``, what
    ``serve --kv-bits`` keeps): each head's K and V are ``head_dim`` values of ``kv_bits``
    bits packed in uint32 words, plus a scale and a bias in the activation dtype for every
    ``group_size`` values (``mx.quantize``'s layout). E.g. head_dim 128, float16: 256
    bytes a head at full precision, 136 with 8 bits, 72 with 4 (group 64).

    An estimate for models whose every layer keeps a KV cache of the whole context
    (sliding-window and recurrent layers are counted as full ones: an upper bound).
    """
    cfg = config.get("text_config") or config
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0
    heads = cfg.get("num_attention_heads") or 1
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    act = 4 if "32" in dtype else 2
    if kv_bits is None:
        per_head = head_dim * act
    else:
        words = math.ceil(head_dim * kv_bits / 32)  # packed values, whole uint32 words
        per_head = words * 4 + 2 * math.ceil(head_dim / group_size) * act
    return 2 * layers * kv_heads * per_head


def estimate(folder: Path, context: int, kv_bits: int | None = None,
             kv_group_size: int = 64) -> Estimate:
    """Estimate the bytes the model in ``folder`` needs for ``context`` tokens, its KV
    cache quantized to ``kv_bits`` (None: full precision; see :func:`kv_bytes_per_token`).

    Raises:
        OSError, ValueError: config.json or a safetensors header cannot be read.
    """
    config = json.loads((folder / "config.json").read_text())
    return Estimate(weights_bytes(folder), kv_bytes_per_token(config, kv_bits, kv_group_size),
                    context)


def parse_size(text: str) -> int:
    """``"8GB"``, ``"512MiB"``, ``"1e9"`` -> bytes.

    Raises:
        ConfigError: not a size.
    """
    m = re.fullmatch(r"\s*([0-9.e+]+)\s*([kmgt]?i?b?)?\s*", text.lower())
    if not m:
        raise ConfigError(f"not a size: {text!r}", hint="e.g. 8GB, 512MiB")
    unit = (m.group(2) or "").rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]
    try:
        return int(float(m.group(1)) * scale)
    except ValueError:
        raise ConfigError(f"not a size: {text!r}") from None


def available_bytes() -> int:
    """Memory available to a new allocation now (psutil's ``available``)."""
    return psutil.virtual_memory().available


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"
