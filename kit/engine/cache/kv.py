"""The quantized KV cache (``serve --kv-bits 4|8 --kv-group-size 32|64|128``): the checks
of the flags, what they do to batching, and the prompt caches that hold quantized K/V.

mlx-kit quantizes from the first token (``quantized_kv_start`` 0, not mlx-lm's 5000): the
cache a request starts from is already mlx-lm's ``QuantizedKVCache`` in every layer that
can hold one, so the sequential decode (``stream_generate``), the next-turn prefill
(:meth:`kit.engine.decode.pipeline.Pipeline._prefill`), the warm-up at load and the prompt cache
all see one cache type, and the memory ``fit`` and the fit check count holds for every
prompt, short ones included (docs/server.md, "Quantized KV cache").

Why not ``stream_generate(kv_bits=...)``: its ``maybe_quantize_kv_cache`` converts
every layer that has a ``to_quantized`` attribute after a prefill chunk has run, and
``RotatingKVCache.to_quantized`` (sliding-window layers: Gemma 3, gpt-oss) raises
``NotImplementedError``; and the next-turn prefill, which runs the model directly, would
leave the cache unquantized. So this module picks the layers itself (:func:`quantized_cache`):
plain ``KVCache`` layers become ``QuantizedKVCache``; rotating, recurrent (``ArraysCache``),
chunked and nested (``CacheList``) layers keep full precision, and a model none of whose
layers can be quantized is refused at load (:func:`refuse_unquantizable`).

mlx-lm's ``BatchGenerator`` cannot batch a ``QuantizedKVCache`` (it has no ``merge``), so
with ``--kv-bits`` requests decode one at a time (:func:`resolve_max_batch`), as
``mlx_lm.server`` does.

This module imports mlx / mlx-lm only inside the functions that build caches: the CLI and
the HTTP process use the checks without loading either.
"""

from __future__ import annotations

from typing import Any

from kit import mlx_lm_api
from kit.errors import ConfigError, ModelError

#: the bit widths offered: mlx quantizes to 2-8 bits, but below 4 the greedy text leaves
#: the full-precision one within a few tokens (bench/kv_bits.py), and 8 already halves
#: a 16-bit cache
KV_BITS = (4, 8)
#: the group sizes ``mx.quantize`` supports (a head's dimension must be a multiple)
KV_GROUP_SIZES = (32, 64, 128)
#: ``--max-batch`` when none is given: continuous batching up to 8 requests
DEFAULT_MAX_BATCH = 8


def check_kv(kv_bits: int | None, kv_group_size: int = 64) -> None:
    """Refuse KV settings mlx-kit does not offer.

    Raises:
        ConfigError: ``kv_bits`` not None, 4 or 8, or ``kv_group_size`` not 32, 64 or 128.
    """
    if kv_bits is not None and kv_bits not in KV_BITS:
        raise ConfigError(f"--kv-bits {kv_bits} is not supported",
                          hint="--kv-bits 8 (about half the memory of a 16-bit KV cache) or "
                               "4 (about a quarter); leave it out for full precision")
    if kv_group_size not in KV_GROUP_SIZES:
        raise ConfigError(f"--kv-group-size {kv_group_size} is not supported",
                          hint="32, 64 (the default) or 128")


def resolve_max_batch(max_batch: int | None, kv_bits: int | None) -> int:
    """The ``max_batch`` an engine runs with: ``max_batch`` as given, else
    :data:`DEFAULT_MAX_BATCH`, or 1 with ``kv_bits`` (mlx-lm's ``BatchGenerator`` cannot
    merge quantized caches).

    Raises:
        ConfigError: ``kv_bits`` with an explicit ``max_batch`` over 1 (naming both flags).
    """
    if kv_bits is None:
        return DEFAULT_MAX_BATCH if max_batch is None else max_batch
    if max_batch is not None and max_batch > 1:
        raise ConfigError(
            f"--kv-bits {kv_bits} cannot be combined with --max-batch {max_batch}: mlx-lm's "
            f"batched decode (BatchGenerator) cannot merge quantized KV caches",
            hint="leave --max-batch out (or 1) to decode one request at a time with a "
                 "quantized KV cache, or leave --kv-bits out to batch")
    return 1


def describe(kv_bits: int | None, kv_group_size: int = 64) -> dict[str, Any]:
    """The KV settings as /health shows them: ``{"bits": 4|8|None, "group_size": int,
    "quantized_start": 0|None}`` (None: full precision)."""
    return {"bits": kv_bits, "group_size": kv_group_size if kv_bits else None,
            "quantized_start": 0 if kv_bits else None}


def kv_tag(kv_bits: int | None, kv_group_size: int = 64) -> str:
    """A short name of the KV settings for keys of stored caches (``"kv-full"``,
    ``"kv8-g64"``): a cache saved with one setting must not be loaded under another (a
    quantized cache in a batching server would reach ``BatchGenerator``, which cannot
    merge it)."""
    return "kv-full" if kv_bits is None else f"kv{kv_bits}-g{kv_group_size}"


def kv_snapshot(slot: Any, max_batch: int) -> dict[str, Any]:
    """/health's ``kv_cache`` for a :class:`kit.engine.decode.slot.ModelSlot`: :func:`describe`
    plus ``quantized_layers`` / ``layers`` of the loaded model (None before a load or
    without ``kv_bits``) and the engine's ``max_batch`` (1 with ``bits``, and for a vision
    model, which mlx-vlm decodes one request at a time: :mod:`kit.engine.decode.vision`)."""
    q = slot.kv_layers
    return {**describe(slot.kv_bits, slot.kv_group_size),
            "quantized_layers": q[0] if q else None, "layers": q[1] if q else None,
            "max_batch": 1 if getattr(slot, "vision", False) else max_batch}


def quantizable(layer: Any) -> bool:
    """Whether mlx-lm can quantize this layer's cache: a plain ``KVCache`` (a subclass may
    keep state a quantized cache would drop; ``RotatingKVCache.to_quantized`` raises)."""
    return type(layer) is mlx_lm_api.KVCache


def quantized_cache(cache: list[Any], kv_bits: int, kv_group_size: int) -> list[Any]:
    """``cache`` (a new, empty prompt cache from ``make_prompt_cache``) with every
    :func:`quantizable` layer replaced by an empty ``QuantizedKVCache(kv_group_size,
    kv_bits)``; the other layers as they are. The list is changed in place and returned."""
    for i, layer in enumerate(cache):
        if quantizable(layer):
            cache[i] = mlx_lm_api.QuantizedKVCache(group_size=kv_group_size, bits=kv_bits)
    return cache


def layer_kinds(cache: list[Any]) -> tuple[int, list[str]]:
    """How many of ``cache``'s layers :func:`quantizable` allows, and the class names of
    the others (sorted, once each) for the log and the errors."""
    kept = sorted({type(c).__name__ for c in cache if not quantizable(c)})
    return sum(1 for c in cache if quantizable(c)), kept


def refuse_unquantizable(model_id: str, cache: list[Any], kv_bits: int) -> tuple[int, int]:
    """Check that ``--kv-bits`` can do something for this model's ``cache`` (a fresh
    ``make_prompt_cache``); returns ``(quantized layers, all layers)``.

    Raises:
        ModelError: no layer's cache can be quantized (all rotating or recurrent).
    """
    n, kept = layer_kinds(cache)
    if n == 0:
        raise ModelError(
            f"--kv-bits {kv_bits}: {model_id}'s KV cache cannot be quantized: mlx-lm has no "
            f"quantized form of its layers' caches ({', '.join(kept)}: sliding-window or "
            f"recurrent layers)", hint="serve this model without --kv-bits")
    return n, len(cache)
