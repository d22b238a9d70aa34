"""Compiled decode: a lone request's decode step traced once with ``mx.compile`` and
replayed for every token (``--compile-decode``).

An eager decode step rebuilds the model's graph in Python for every token (a few hundred
operations for an 8B model), which costs host time the accelerator waits through when a
token takes a few milliseconds. A compiled step is traced once and replayed. It cannot run
on mlx-lm 0.32's ``KVCache``: that cache keeps its write position as a Python int, which a
trace freezes into a constant (the compiled step would write every token to the same
place; ml-explore/mlx-swift-lm#406 describes the same failure). So a compiled request
decodes into :class:`StaticKVCache`, whose position is an ``mx.array`` and whose buffer
only grows in whole chunks (each new size is traced once more). mlx-lm has no such cache,
hence this module.

What stays outside the trace: sampling and logits processors (mlx-lm's ``generate_step``
runs them as always: ``stream_generate`` is given :class:`CompiledModel` in place of the
model) and the prompt's prefill (eager, into the same cache). The cache is converted back
to ``KVCache`` before the prompt cache stores it or a batch takes the request over.

Used only where it was checked (:func:`usable`): a model family in :data:`FAMILIES`,
every layer on a plain ``KVCache`` (no quantized KV, no sliding window), one machine, no
draft, no grammar-free restriction beyond those; under greedy sampling it writes the same
tokens as the eager step (tests/engine/test_compiled_decode.py).
"""

from __future__ import annotations

import logging
from typing import Any

from kit import mlx_lm_api

log = logging.getLogger("mlx_kit.engine")

#: model types whose attention reads the cache only through ``offset``,
#: ``update_and_fetch`` and ``create_attention_mask`` (checked against mlx-lm 0.32.2's
#: llama.py, qwen2.py and qwen3.py); every layer must also hold a plain KVCache
FAMILIES = frozenset({"llama", "qwen2", "qwen3"})

#: tokens the cache grows by: each new buffer size is one more trace (~ms per layer),
#: and attention reads at most this many masked-out positions past the last token
CHUNK = 256


def usable(model: Any, caches: list, *, enabled: bool) -> bool:
    """Whether a request may decode compiled.

    Args:
        model: the loaded mlx-lm model (its ``model_type`` attribute or
            ``args.model_type`` names the family).
        caches: the request's prompt cache, one per layer.
        enabled: the engine's ``compile_decode`` setting, resolved for this device.
    """
    if not enabled:
        return False
    kind = getattr(model, "model_type", None) or getattr(getattr(model, "args", None),
                                                         "model_type", None)
    return kind in FAMILIES and bool(caches) and all(type(c) is mlx_lm_api.KVCache
                                                     for c in caches)


class StaticKVCache:
    """One layer's KV cache with its write position as an array, for a compiled step.

    ``s`` is ``[keys, values, offset]``: keys and values ``(batch, kv_heads, capacity,
    head_dim)``, offset an int32 scalar array (tokens written). The list is what
    ``mx.compile`` reads before and writes after each replay. ``n`` mirrors offset as a
    Python int (read without a device sync) to grow the buffer before a step needs room;
    its owner (:class:`CompiledModel`) advances it, since a replay runs no Python.
    """

    def __init__(self, keys: Any, values: Any, n: int) -> None:
        import mlx.core as mx

        self.s = [keys, values, mx.array(n, dtype=mx.int32)]
        self.n = n

    @classmethod
    def of(cls, cache: Any, room: int) -> StaticKVCache:
        """Copy a filled ``KVCache`` (``offset`` > 0) into a buffer with ``room`` free slots
        (rounded up to :data:`CHUNK`)."""
        import mlx.core as mx

        n = cache.offset
        keys, values = cache.keys[..., :n, :], cache.values[..., :n, :]
        cap = _round(n + room)
        b, h, _, dk = keys.shape
        k = mx.zeros((b, h, cap, dk), keys.dtype)
        v = mx.zeros((b, h, cap, values.shape[3]), values.dtype)
        k[..., :n, :] = keys
        v[..., :n, :] = values
        return cls(k, v, n)

    @property
    def offset(self) -> Any:
        """Tokens written, as an array (what RoPE reads)."""
        return self.s[2]

    @property
    def keys(self) -> Any:
        return self.s[0]

    @keys.setter
    def keys(self, value: Any) -> None:  # qwen2's pipeline split sets it (mx.depends)
        self.s[0] = value

    @property
    def values(self) -> Any:
        return self.s[1]

    @property
    def state(self) -> tuple[Any, Any]:
        return self.s[0], self.s[1]

    @property
    def capacity(self) -> int:
        return self.s[0].shape[2]

    def reserve(self, tokens: int) -> None:
        """Grow the buffer (by whole chunks) so that ``tokens`` more fit."""
        import mlx.core as mx

        if self.n + tokens <= self.capacity:
            return
        grow = _round(self.n + tokens) - self.capacity
        b, h, _, dk = self.s[0].shape
        self.s[0] = mx.concatenate([self.s[0], mx.zeros((b, h, grow, dk), self.s[0].dtype)],
                                   axis=2)
        self.s[1] = mx.concatenate([self.s[1], mx.zeros((b, h, grow, self.s[1].shape[3]),
                                                        self.s[1].dtype)], axis=2)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        """Write ``keys``/``values`` ``(batch, kv_heads, tokens, head_dim)`` at the offset;
        return the whole buffers (positions past the offset are masked by
        :meth:`make_mask`). Call :meth:`reserve` first."""
        import mlx.core as mx

        at = self.s[2][None]
        self.s[0] = mx.slice_update(self.s[0], keys, at, axes=(2,))
        self.s[1] = mx.slice_update(self.s[1], values, at, axes=(2,))
        self.s[2] = self.s[2] + keys.shape[2]
        return self.s[0], self.s[1]

    def make_mask(self, tokens: int, return_array: bool = False,
                  window_size: int | None = None) -> Any:
        """Boolean ``(tokens, capacity)``: query i (at offset + i) sees positions up to its
        own; mlx-lm's ``create_attention_mask`` asks the cache for it."""
        import mlx.core as mx

        at = self.s[2] + mx.arange(tokens)[:, None]
        return mx.arange(self.capacity)[None] <= at

    def to_kv_cache(self) -> Any:
        """The tokens written, as mlx-lm's ``KVCache`` (what the prompt cache stores): a
        copy, so that a stored cache does not keep the whole buffer alive beyond what its
        ``nbytes`` (which the prompt cache's byte bound counts) says."""
        import mlx.core as mx

        cache = mlx_lm_api.KVCache()
        cache.state = (mx.contiguous(self.s[0][..., :self.n, :]),
                       mx.contiguous(self.s[1][..., :self.n, :]), self.n)
        return cache


class CompiledModel:
    """Stands in for the model in ``mlx_lm.stream_generate``: a one-token call on
    :attr:`caches` replays the compiled step; anything else (the prefill) runs the model
    eagerly into the same caches.

    Args:
        model: the loaded mlx-lm model (its weights are constants of the trace: one
            instance serves one request, so a swap or an adapter change never meets a
            stale trace).
        caches: the request's ``KVCache`` list (filled or empty).

    Attributes:
        caches: what to pass as ``prompt_cache``: the same list object throughout; its
            items turn into :class:`StaticKVCache` at the first one-token call on a filled
            cache (the prefill before it runs on the plain ones).
    """

    def __init__(self, model: Any, caches: list) -> None:
        self.model = model
        self.caches = list(caches)
        self._step: Any = None

    def __call__(self, tokens: Any, cache: Any = None, **kwargs: Any) -> Any:
        """``tokens`` ``(1, n)`` -> logits ``(1, n, vocab)``."""
        if cache is not self.caches or kwargs:
            return self.model(tokens, cache=cache, **kwargs)
        n = tokens.shape[1]
        if self._step is None and n == 1 and all(c.offset > 0 for c in self.caches):
            self._compile()
        if self._step is None:
            return self.model(tokens, cache=cache)
        for c in self.caches:
            c.reserve(n)
        out = self._step(tokens) if n == 1 else self.model(tokens, cache=cache)
        for c in self.caches:
            c.n += n
        return out

    def _compile(self) -> None:
        import mlx.core as mx

        self.caches[:] = [StaticKVCache.of(c, CHUNK) for c in self.caches]
        state = [c.s for c in self.caches]
        model, caches = self.model, self.caches
        self._step = mx.compile(lambda tokens: model(tokens, cache=caches),
                                inputs=state, outputs=state)

    def kv_caches(self) -> list:
        """The request's cache as ``KVCache`` objects (for the prompt cache or a batch)."""
        return [c.to_kv_cache() if isinstance(c, StaticKVCache) else c for c in self.caches]


def _round(n: int) -> int:
    return -(-n // CHUNK) * CHUNK
