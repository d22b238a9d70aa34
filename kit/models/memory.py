"""Memory estimates: will a model fit before we load it?

estimate = weights (exact, from the safetensors headers) + KV cache bytes per token x
context tokens. The ceiling it is checked against (:func:`memory_ceiling`): an explicit
``--memory-budget``; else on a Mac, Metal's GPU working set; else the memory the machine
has available now (plus what a model being replaced will free).
"""

from __future__ import annotations

import json
import math
import sys
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
    """A size as flags take it -> bytes. Units mean what they say: ``GB``/``MB``/``KB``
    (and ``G``/``M``/``K``) are powers of 1000, ``GiB``/``MiB``/``KiB`` powers of 1024
    (pydantic's ``ByteSize``, case-insensitive); a plain number (``1e9``) is bytes.
    ``"8GB"`` -> 8_000_000_000, ``"8GiB"`` -> 8_589_934_592, ``"512MiB"`` -> 536_870_912.

    Raises:
        ConfigError: not a size.
    """
    from pydantic import ByteSize, TypeAdapter, ValidationError

    hint = "e.g. 8GiB or 512MiB (binary), 8GB (10^9 bytes)"
    try:
        number = float(text)
    except ValueError:
        try:
            size = int(TypeAdapter(ByteSize).validate_python(text.strip()))
        except ValidationError:
            raise ConfigError(f"not a size: {text!r}", hint=hint) from None
    else:
        if not math.isfinite(number):
            raise ConfigError(f"not a size: {text!r}", hint=hint)
        size = int(number)
    if size < 0:
        raise ConfigError(f"not a size: {text!r}", hint="a size is at least 0 bytes")
    return size


def available_bytes() -> int:
    """Memory available to a new allocation now (psutil's ``available``)."""
    return psutil.virtual_memory().available


def human(n: float) -> str:
    """Bytes as people read memory sizes, in binary units: ``"512 B"``, ``"7.45 GiB"``,
    ``"243.00 MiB"`` (2 decimals; pydantic's ``ByteSize.human_readable`` keeps only 1)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


#: Context (tokens) a model's KV cache must have room for, besides its weights, for it to
#: load at all when its whole window does not fit (capped at the window). Past it, memory
#: admission (kit/engine/cache/admission.py) caps each request to the room left instead of the
#: load refusing the model: a 128k window need not fit for 30k-token sessions to work.
FIT_MIN_CONTEXT = 2048


def fit_context(window: int) -> int:
    """The context a model with this ``window`` (tokens) must fit to load:
    ``min(window, FIT_MIN_CONTEXT)``."""
    return min(window, FIT_MIN_CONTEXT) if window > 0 else window


def context_that_fits(ceiling: int, weights: int, kv_per_token: int) -> int | None:
    """Tokens of KV cache the ``ceiling`` holds beside ``weights`` (bytes; never below 0);
    None when ``kv_per_token`` is unknown (0)."""
    if kv_per_token <= 0:
        return None
    return max(0, ceiling - weights) // kv_per_token


@dataclass(frozen=True)
class Ceiling:
    """The most memory a model (weights + KV caches) may use, and where that number came
    from: ``source`` is ``"budget"`` (``--memory-budget``), ``"metal"`` (Metal's
    recommended GPU working set) or ``"available"`` (psutil's available memory, plus what
    a model being replaced frees)."""

    bytes: int
    source: str

    @property
    def label(self) -> str:
        """How ``fit`` and errors name it, e.g. ``"Metal working set 11.84 GiB"``."""
        name = {"budget": "budget", "metal": "Metal working set",
                "available": "available memory"}[self.source]
        return f"{name} {human(self.bytes)}"


def _metal_device_info() -> dict | None:
    """mlx's Metal device description (``memory_size``, ``max_recommended_working_set_size``,
    ... in bytes), or None off a Mac or where mlx has no Metal device. mlx is imported only
    on macOS: ``fit`` on Linux never loads it."""
    if sys.platform != "darwin":
        return None
    try:
        import mlx.core as mx

        if not mx.metal.is_available():
            return None
        query = getattr(mx, "device_info", None) or mx.metal.device_info
        return dict(query())
    except Exception:  # no mlx, or an mlx without the query: no Metal ceiling
        return None


def metal_working_set() -> int | None:
    """Metal's ``max_recommended_working_set_size`` in bytes (about three quarters of RAM
    by default): past it a GPU allocation pages weights every token or aborts the
    process. None off a Mac."""
    info = _metal_device_info()
    size = (info or {}).get("max_recommended_working_set_size")
    return int(size) if size else None


def memory_ceiling(budget: int | None = None, replacing: int = 0) -> Ceiling:
    """The ceiling a model's weights and KV caches must stay under: ``budget`` (bytes,
    ``--memory-budget``) when given; else on Metal the GPU working set (the whole of it:
    a replaced model's weights leave it); else psutil's available memory now plus
    ``replacing`` (bytes a model being replaced will free)."""
    if budget:
        return Ceiling(int(budget), "budget")
    working_set = metal_working_set()
    if working_set:
        return Ceiling(working_set, "metal")
    return Ceiling(available_bytes() + replacing, "available")
