"""The disk tier behind :class:`kit.engine.cache.policy.PromptCachePolicy`: which file a prompt
starts from when memory holds less of it, and the queue of caches waiting to be written
(the engine worker writes one once it has been idle for
the ``idle_write_s`` knob, :data:`kit.knobs.KNOBS`). The files themselves are
:class:`kit.engine.cache.disk_cache.DiskCache`'s.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import mlx_lm_api
from kit.engine.cache.disk_cache import DiskCache, MIN_TOKENS
from kit.paths import prompt_cache_dir

log = logging.getLogger("mlx_kit.engine")

PENDING_MAX = 2  #: caches queued for the disk (each holds its KV memory until written)


class DiskTier:
    """The prompt cache's disk tier for the model ``identity()`` names.

    Args:
        disk: the files.
        identity: the loaded model's identity (None: no disk for it, e.g. unloaded).
    """

    def __init__(self, disk: DiskCache, identity: Callable[[], str | None]) -> None:
        self.disk = disk
        self._identity = identity
        self._pending: deque[tuple[str, list[int], Any]] = deque()

    @classmethod
    def for_slot(cls, folder: str | Path | None, max_bytes: int, slot: Any) -> DiskTier:
        """A tier over ``folder`` (None: :func:`kit.paths.prompt_cache_dir`) bounded to
        ``max_bytes``, for whatever model ``slot`` (a ModelSlot) holds at the time."""

        disk = DiskCache(Path(folder) if folder else prompt_cache_dir(), max_bytes)
        return cls(disk, lambda: disk.identity(slot))

    def model_installed(self) -> None:
        """Take the just-loaded model's identity now, from its files as they were loaded
        (a folder re-converted in place afterwards must not label this model's caches)."""
        self._identity()

    # -- writes ----------------------------------------------------------------------------

    def queue(self, tokens: list[int], cache: Any) -> None:
        """Queue ``cache`` (holding ``tokens``) for the disk when it holds at least
        :data:`MIN_TOKENS`; a queued cache whose tokens this one extends is dropped (this
        one serves its prompts), and only the newest :data:`PENDING_MAX` are kept. The
        model's identity is taken now: a swap before the write does not mislabel it."""
        if self.disk.key is None:  # the tier is off (no key, a shared folder): hold nothing
            return
        ident = self._identity()
        if ident is None or len(tokens) < MIN_TOKENS:
            return
        self._pending = deque(
            p for p in self._pending
            if not (p[0] == ident and len(p[1]) <= len(tokens)
                    and tokens[:len(p[1])] == p[1]))
        self._pending.append((ident, list(tokens), cache))
        while len(self._pending) > PENDING_MAX:
            self._pending.popleft()

    def pending(self) -> bool:
        """Whether caches wait to be written."""
        return bool(self._pending)

    def write_one(self) -> None:
        """Write the newest queued cache (a failure is logged: the cache is just not kept)."""
        if self._pending:
            ident, tokens, cache = self._pending.pop()
            try:
                self.disk.save(ident, tokens, cache, mlx_lm_api.can_trim_prompt_cache(cache))
            except Exception:  # never the worker's end
                log.exception("cannot write a prompt cache to disk")

    def flush(self, seconds: float) -> None:
        """Write what is queued for at most about ``seconds``; drop the rest."""
        end = time.monotonic() + seconds
        while self._pending and time.monotonic() < end:
            self.write_one()
        self._pending.clear()

    def stats(self) -> dict[str, int]:
        """disk_bytes / disk_entries (every file in the folder) and disk_writes."""
        return {"disk_bytes": self.disk.bytes, "disk_entries": self.disk.entries,
                "disk_writes": self.disk.writes}

    # -- lookup ----------------------------------------------------------------------------

    def lookup(self, key: str, prompt: list[int], cache: Any, rest: list[int],
               new_cache: Callable[[], Any], memory: Any) -> tuple[Any, list[int]] | None:
        """A longer prefix of ``prompt`` than memory's answer (``cache``, ``rest``; cache
        None: a miss) from disk, or None when disk has nothing better. The file's cache
        is kept in ``memory`` (mlx-lm's ``LRUPromptCache``, under ``key``) too and
        trimmed to the prompt as a memory hit would be. A failure is logged and is None:
        the disk tier never fails a request."""
        try:
            return self._lookup(key, prompt, cache, rest, new_cache, memory)
        except Exception:
            log.exception("the prompt cache's disk tier failed; using memory's answer")
            return None

    def _lookup(self, key: str, prompt: list[int], cache: Any, rest: list[int],
                new_cache: Callable[[], Any], memory: Any) -> tuple[Any, list[int]] | None:
        have = len(prompt) - len(rest) if cache is not None else 0
        if have >= len(prompt) - 1 or len(prompt) < MIN_TOKENS:  # nothing to gain: no read
            return None
        ident = self._identity()
        if ident is None:
            return None
        fresh = new_cache()  # the model's own layer classes, to check files against
        classes = tuple(type(c).__name__ for c in fresh)
        found = self.disk.find(ident, prompt, classes, mlx_lm_api.can_trim_prompt_cache(fresh))
        if found is None or found.common <= have:
            return None
        loaded = self.disk.load(ident, found.entry, classes)
        if loaded is None:
            return None
        stored = found.entry.tokens.tolist()
        memory.insert_cache(key, stored, loaded)
        again, left = memory.fetch_nearest_cache(key, prompt)  # a copy of it
        if again is not None and len(prompt) - len(left) >= min(found.common,
                                                                len(prompt) - 1):
            return again, left
        # memory's bound did not keep it: it is ours alone, use it as it is
        if found.common == len(stored):
            return loaded, prompt[len(stored):]
        keep = min(len(prompt) - 1, found.common)
        mlx_lm_api.trim_prompt_cache(loaded, len(stored) - keep)
        return loaded, prompt[keep:]
