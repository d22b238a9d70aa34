"""Memory admission: a request starts only with room for its KV cache under the ceiling.

The room a request may use is ``ceiling - weights - what running requests reserved -
the in-memory prompt caches``; each running request reserves ``(prompt + max_tokens) x
KV bytes per token`` from the moment it is admitted until it completes, so concurrent
requests count against the same budget. For a new request, in order:

1. its prompt + ``max_tokens`` fit: it runs as asked;
2. not yet, but least-recently-used prompt caches can be evicted to make the room:
   they are, and it runs as asked;
3. its prompt fits but not ``max_tokens`` on top: ``max_tokens`` is capped to the room
   left (finish_reason ``length`` when the cap is hit). Only a ``max_tokens`` the client
   sent counts as clamped and is reported (see docs/server.md "Memory"); a request that
   sent none just gets what fits;
4. not even its prompt fits, because other requests hold memory: it is deferred (it
   waits in the batch's backlog until one of them completes; never fails for it). Only
   while some request really runs: with nothing running it cannot wait for anything;
5. its prompt alone cannot fit even with nothing else running: a 400 giving the numbers.

mlx-bun clamps ``max_tokens`` the same way. The estimate is the one ``fit`` uses
(:func:`kit.models.memory.estimate`: K and V of every layer per token); mlx's KV cache
grows in steps of 256 tokens and a batch pads its rows to the longest, so the real use can
be somewhat higher: the ceiling should keep some headroom (Metal's working set does).
Nothing here imports mlx: the arithmetic is testable without a model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit.engine.types import InvalidRequest
from kit.models.memory import Ceiling, human

log = logging.getLogger("mlx_kit.engine")


class Deferred(Exception):
    """Raised by :meth:`Admission.admit` (and so ``Pipeline.prepare``) when a request's
    prompt does not fit only because other running requests hold memory: the batch keeps
    it at the head of its backlog and tries again once one of them completes. Internal:
    never reaches a client."""


@dataclass(frozen=True)
class Room:
    """What admission checks against, in bytes (``kv_per_token``: bytes of KV cache one
    token of context takes). ``cache_bytes()`` is what the in-memory prompt caches hold
    now; ``evict(n)`` drops least recently used ones until they hold at most ``n``."""

    ceiling: int
    source: str
    weights: int
    kv_per_token: int
    cache_bytes: Callable[[], int]
    evict: Callable[[int], None]


class Admission:
    """Reservations of the running requests and the admission rule (module docstring).

    Attributes:
        clamped, rejected, deferred: how many requests had ``max_tokens`` capped, were
            refused (the prompt alone cannot fit), waited for memory (each counted once).
        released: how many reservations were given back so far (a deferred request is
            tried again only once this moved).
    """

    def __init__(self) -> None:
        self.reserved: dict[int, int] = {}  # id(job) -> bytes
        self.clamped = self.rejected = self.deferred = 0
        self.released = 0
        self._waiting: set[int] = set()  # id(job) of deferred requests, counted once

    def admit(self, job: Any, request_id: str, prompt_tokens: int, max_tokens: int,
              room: Room | None, running: bool = False,
              sent: bool = True) -> tuple[int, int | None]:
        """Admit ``job`` (``prompt_tokens`` long, asking for ``max_tokens``) and reserve its
        KV cache. ``room`` None (no estimate, or a distributed rank): admitted as asked.

        The decision comes first, counting what evicting every prompt cache could free;
        caches are evicted only for a request that is then admitted, and only as many as
        it needs (a deferred or refused request evicts nothing).

        Args:
            running: some request is really decoding now (a batch with active rows). Only
                then may a request wait for memory; with nothing running, reservations
                left by other jobs are stale (a request that failed between its
                reservation and its start): they are dropped, and a prompt that still
                cannot fit is refused (the 400), never deferred.
            sent: the client sent ``max_tokens``. Only a sent value can be *clamped*
                (counted, reported as ``clamped_from``); without one the request gets
                what fits and nothing is reported (logged at debug).

        Returns:
            ``(max_tokens to use, the max_tokens asked for when capped else None)``.

        Raises:
            Deferred: the prompt fits only once running requests complete (``running``).
            InvalidRequest: ``insufficient_memory``, the prompt alone cannot fit.
        """
        if room is None or room.kv_per_token <= 0:
            return max_tokens, None
        if not running:
            self._drop_stale(job)
        per = room.kv_per_token
        held = sum(v for k, v in self.reserved.items() if k != id(job))
        free = room.ceiling - room.weights - held  # with every prompt cache evicted
        need = (prompt_tokens + max_tokens) * per
        granted, clamped_from = max_tokens, None
        if need > free:
            fits = free // per - prompt_tokens  # tokens it may still generate
            if fits < 1:
                if running and held:
                    if id(job) not in self._waiting:
                        self._waiting.add(id(job))
                        self.deferred += 1
                        log.info("%s: waits for memory: its prompt (%d tokens) needs "
                                 "%d bytes, %d are free while %d requests run", request_id,
                                 prompt_tokens, prompt_tokens * per, max(0, free),
                                 len(self.reserved))
                    raise Deferred
                self._waiting.discard(id(job))
                self.rejected += 1
                raise InvalidRequest(self._too_big(prompt_tokens, free, room),
                                     code="insufficient_memory", field="messages")
            granted = fits
            if sent:
                clamped_from = max_tokens
                self.clamped += 1
                log.info("%s: max_tokens %d -> %d: the room left under the %s ceiling",
                         request_id, max_tokens, fits, room.source)
            else:
                log.debug("%s: no max_tokens sent: %d tokens fit under the %s ceiling",
                          request_id, fits, room.source)
        keep = free - (prompt_tokens + granted) * per  # what the prompt caches may keep
        if room.cache_bytes() > keep:
            room.evict(max(0, keep))
        self._waiting.discard(id(job))
        self.reserved[id(job)] = (prompt_tokens + granted) * per
        return granted, clamped_from

    def _drop_stale(self, job: Any) -> None:
        """Nothing runs, so no other job may hold a reservation: drop any (a leak would
        otherwise make every later request wait for memory that never comes back)."""
        stale = [k for k in self.reserved if k != id(job)]
        if stale:
            log.warning("memory admission: dropped %d stale reservations (%d bytes) with "
                        "no request running", len(stale),
                        sum(self.reserved[k] for k in stale))
            for k in stale:
                del self.reserved[k]
            self.released += len(stale)

    def release(self, job: Any) -> None:
        """Give ``job``'s reservation back (it completed, failed or was cancelled); a job
        that holds none is ignored, so every exit path may call it."""
        self._waiting.discard(id(job))
        if self.reserved.pop(id(job), None) is not None:
            self.released += 1

    def snapshot(self) -> dict[str, int]:
        """The counters for ``/health``: ``clamped``, ``rejected``, ``deferred``, and the
        bytes reserved by running requests now (``reserved_bytes``)."""
        return {"clamped": self.clamped, "rejected": self.rejected,
                "deferred": self.deferred, "reserved_bytes": sum(self.reserved.values())}

    @staticmethod
    def _too_big(prompt_tokens: int, left: int, room: Room) -> str:
        per = room.kv_per_token
        fits = max(0, left) // per
        ceiling = Ceiling(room.ceiling, room.source).label
        return (f"the prompt does not fit in memory: {prompt_tokens} prompt tokens need "
                f"{human(prompt_tokens * per)} of KV cache ({per} bytes/token), but the room "
                f"is {fits} tokens ({human(max(0, left))}): the {ceiling} ceiling less "
                f"{human(room.weights)} of weights. Raise --memory-budget, quantize the KV "
                f"cache (--kv-bits 8 or 4), use a smaller model, or send a shorter prompt")
