"""The prompt cache's policy: which KV cache a prompt starts from (mlx-lm's
``LRUPromptCache`` plus our rules, and the disk tier), and which one is kept after it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kit import mlx_lm_api


def reusable_prefix(resend: list[int], tokens: list[int], n_prompt: int) -> int | None:
    """How many of ``tokens`` (what a KV cache holds: prompt + generated) the next turn,
    which resends the conversation as ``resend``, can keep: the common prefix, or None
    when trimming would not help (``tokens`` already starts with all of ``resend``, or
    the template rewrote the prompt itself: less than half of its ``n_prompt`` tokens
    in common)."""
    common = 0
    for a, b in zip(resend, tokens):
        if a != b:
            break
        common += 1
    if common == len(resend) or common < n_prompt // 2:
        return None
    return common


class PromptCachePolicy:
    """Which KV cache a prompt starts from and which one is kept after it: mlx-lm's
    ``LRUPromptCache`` (longest cached prefix, ``size`` entries) plus two rules of ours:
    an exact hit re-feeds the last prompt token (its logits are not cached), and a
    finished turn's cache is fitted to what the next turn resends (:meth:`next_turn`).

    With a disk tier (:meth:`attach_disk`, :mod:`kit.engine.cache.disk_tier`), a prompt that
    memory serves less of than a file on disk starts from that file, and every kept cache
    of 256 tokens or more is queued for the disk, written when the worker is idle
    (:meth:`write_pending`).

    Args:
        size: how many caches to keep.
        max_bytes: most bytes the kept caches may hold together (least recently used
            evicted first); None: ``default_bytes()`` when the store is made (after each
            load: the owner sets it to a share of the memory left after the weights).
    """

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.default_bytes: Callable[[], int | None] = lambda: None  # None: no byte bound
        self._lru: Any = None  # made on first use: importing mlx-lm imports mlx
        self._disk: Any = None  # kit.engine.cache.disk_tier.DiskTier, see attach_disk
        self.hits = {"memory_hits": 0, "disk_hits": 0, "misses": 0}

    def fetch(self, key: str, prompt: list[int], new_cache: Callable[[], Any],
              disk: bool = True) -> tuple[Any, list[int]]:
        """The KV cache to generate ``prompt`` with (a copy; ``new_cache()`` when nothing
        under ``key`` shares a prefix) and the tokens still to prefill (never empty).
        ``disk``: the disk tier may serve it (not for a LoRA adapter's KV: the disk
        tier knows a file by its model's identity alone)."""
        cache, rest = self._store().fetch_nearest_cache(key, prompt)
        source = "memory_hits" if cache is not None else "misses"
        if disk and self._disk is not None and (got := self._disk.lookup(
                key, prompt, cache, rest, new_cache, self._store())) is not None:
            (cache, rest), source = got, "disk_hits"
        self.hits[source] += 1
        if cache is None:
            return new_cache(), prompt
        if not rest:  # exact hit: re-feed the last prompt token to get fresh logits
            mlx_lm_api.trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        return cache, rest

    def insert(self, key: str, tokens: list[int], cache: Any, disk: bool = True) -> None:
        """Keep ``cache``, which holds ``tokens``, for later prompts under ``key`` (and,
        with ``disk``, queue it for the disk tier)."""
        self._store().insert_cache(key, tokens, cache)
        if disk and self._disk is not None:
            self._disk.queue(tokens, cache)

    def _store(self) -> Any:
        """mlx-lm's ``LRUPromptCache``, made on first use."""
        if self._lru is None:
            bound = self.max_bytes if self.max_bytes is not None else self.default_bytes()
            self._lru = mlx_lm_api.LRUPromptCache(max_size=self.size,
                                       **({} if bound is None else {"max_bytes": bound}))
        return self._lru

    # -- the byte bound (memory admission evicts through these) -------------------------------

    def byte_bound(self) -> int | None:
        """The bound of the store now in use (None: none made yet, or no byte bound)."""
        if self._lru is None or self._lru.max_bytes >= 1 << 62:
            return None
        return self._lru.max_bytes

    def nbytes(self) -> int:
        """Bytes the in-memory caches hold now (mlx-lm's count of their buffers)."""
        return self._lru.nbytes if self._lru is not None else 0

    def entries(self) -> int:
        """How many caches are kept in memory now."""
        return len(self._lru) if self._lru is not None else 0

    def evict(self, n_bytes: int) -> None:
        """Drop least recently used caches until the rest hold at most ``n_bytes``."""
        if self._lru is not None and self._lru.nbytes > n_bytes:
            self._lru.trim_to(n_bytes=n_bytes)

    def next_turn(self, tokens: list[int], resend: list[int], n_prompt: int, cache: Any,
                  prefill: Callable[[Any, list[int]], None] | None) -> list[int]:
        """Make ``cache`` (holding ``tokens``) hold ``resend``, what the client's next turn
        starts with, and return the tokens it then holds.

        The next request resends this turn as an assistant message rendered by the chat
        template, which is often not the generated text: thinking templates drop the
        reasoning of earlier turns, tool calls are re-serialized, the end-of-turn marker
        differs from the EOS token the model stopped on. The KV of the generated tokens
        after the first difference is useless to the next turn; so the cache is trimmed
        to the common prefix and ``prefill(cache, rest)`` runs the rest of the rendered
        message now (a few tokens, after the client has its answer). ``prefill`` None
        (other requests would wait for it) trims only: the cache holds the common prefix,
        a prefix of the next turn's prompt, which that turn prefills on from and whose own
        cache then replaces it (mlx-lm's store drops an entry a newer one extends).
        Non-trimmable caches (recurrent / rotated-out layers) keep ``tokens``, as does a
        cache for which :func:`reusable_prefix` finds nothing to gain.
        """
        common = reusable_prefix(resend, tokens, n_prompt)
        if common is None or not mlx_lm_api.can_trim_prompt_cache(cache):
            return tokens
        mlx_lm_api.trim_prompt_cache(cache, len(tokens) - common)
        if prefill is None:
            return resend[:common]
        prefill(cache, resend[common:])
        return resend

    def clear(self) -> None:
        """Drop every cache in memory (the model they belong to is going away); the disk
        tier and the writes queued for it stay (each knows its model's identity)."""
        self._lru = None

    # -- the disk tier (kit/engine/cache/disk_tier.py) ------------------------------------------

    def attach_disk(self, tier: Any) -> None:
        """Back this cache with ``tier`` (a :class:`kit.engine.cache.disk_tier.DiskTier`)."""
        self._disk = tier

    def model_installed(self) -> None:
        """A model was just loaded: the disk tier takes its identity now."""
        if self._disk is not None:
            self._disk.model_installed()

    def pending(self) -> bool:
        """Whether caches wait to be written to disk."""
        return self._disk is not None and self._disk.pending()

    def write_pending(self) -> None:
        """Write the newest cache queued for the disk (the worker calls it once idle for
        the ``idle_write_s`` knob, :data:`kit.knobs.KNOBS`)."""
        self._disk.write_one()

    def flush(self, seconds: float) -> None:
        """Write what is queued for the disk for at most about ``seconds`` (a stop)."""
        if self._disk is not None:
            self._disk.flush(seconds)

    def stats(self) -> dict[str, int]:
        """Counters for ``/health``: memory_hits, disk_hits, misses (prompts since start),
        memory_bytes / memory_entries (the in-memory LRU), and the disk tier's
        disk_bytes / disk_entries (its files) and disk_writes (since start), 0 without one."""
        lru = self._lru
        disk = self._disk.stats() if self._disk is not None else {
            "disk_bytes": 0, "disk_entries": 0, "disk_writes": 0}
        return {**self.hits, "memory_bytes": lru.nbytes if lru is not None else 0,
                "memory_entries": len(lru) if lru is not None else 0, **disk}
