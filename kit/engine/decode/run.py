"""The records the engine's parts pass to each other: queue items (:class:`Job`,
:class:`Swap`), a request in progress (:class:`Run`) and one that moves from decoding
alone into a batch (:class:`Joined`). Plain data; the behaviour lives in the parts that
make them (:mod:`kit.engine.decode.pipeline`, :mod:`kit.engine.decode.sequential`, :mod:`kit.engine.decode.batch`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kit.engine.types import ChatRequest, TextDelta, TokenLogprob, ToolCall


class Cancelled(Exception):
    """Raised from mlx-lm's prefill progress callback to stop a cancelled request."""


@dataclass
class Job:
    """A queued request. The worker ``post``s its events (then :data:`kit.engine.decode.bridge.END`)
    to ``sink``; ``cancelled``, set by the caller, stops it at the next token (or prefill
    chunk)."""

    request: ChatRequest
    sink: Callable[[Any], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    jid: int = 0  # the pipe's id of it (0 in-process); ranks name the job by it

    def post(self, item: Any) -> None:
        """Hand one event, exception or END to the caller (any thread)."""
        self.sink(item)


@dataclass
class Swap:
    """A queued swap to ``spec``; the worker calls ``reply(result, error)`` once."""

    spec: str
    reply: Callable[[Any, BaseException | None], None]

    def done(self, result: Any = None, error: BaseException | None = None) -> None:
        self.reply(result, error)


@dataclass
class Run:
    """A request being generated: what :meth:`kit.engine.decode.pipeline.Pipeline.prepare`
    computed, plus progress.

    Attributes:
        job: the queued request.
        key: the model id the prompt cache files it under (and ``Started``/``Finished`` name).
        prompt: every prompt token id (forced tokens of a constraint included).
        rest: the prompt tokens still to prefill (after the cached prefix).
        cache: the KV cache (mlx-lm's per-layer list) to generate into; None once a batch
            owns it.
        cached: prompt tokens the cache already held.
        max_tokens: tokens to generate at most.
        sampler, processors: mlx-lm's sampler and logits processors.
        parser: the :class:`kit.formats.output.OutputParser`.
        t0: ``time.perf_counter()`` when work on it began.
        logprob: ``(token, logprobs, top_n) -> TokenLogprob``, or None when not asked for.
        media: a vision model's processor arrays for the prompt (pixel values...;
            :mod:`kit.engine.decode.vision`), or None for a text model.
        cache_key: the key the prompt cache files ``cache`` under when not ``key`` (a
            request decoding with a draft model: :mod:`kit.engine.decode.draft`).
    """

    job: Job
    key: str
    prompt: list[int]
    rest: list[int]
    cache: Any
    cached: int
    max_tokens: int
    sampler: Any
    processors: Any
    parser: Any
    t0: float
    logprob: Callable[[int, Any, int], TokenLogprob] | None = None
    media: dict[str, Any] | None = None
    cache_key: str | None = None
    n: int = 0
    ttft: float = 0.0
    first_at: float = 0.0
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    pending: list[TokenLogprob] = field(default_factory=list)

    def token(self, token: int, logprobs: Any) -> None:
        """Count a generated token (and keep its logprob when asked for); ``logprobs``:
        mlx's log-probability vector over the vocabulary for this step."""
        if self.n == 0:
            self.first_at = time.perf_counter()
            self.ttft = self.first_at - self.t0
        self.n += 1
        if self.logprob is not None:
            self.pending.append(self.logprob(token, logprobs,
                                             self.job.request.params.top_logprobs))

    def emit(self, events: list[Any]) -> None:
        """Post parser events; the first text delta carries the pending logprobs."""
        for ev in events:
            if isinstance(ev, ToolCall):
                self.calls.append(ev)
            if isinstance(ev, TextDelta):
                self.texts.append(ev.text)
                if self.pending:
                    ev = TextDelta(ev.text, tuple(self.pending))
                    self.pending.clear()
            self.job.post(ev)


@dataclass
class Joined:
    """A request that ran alone and continues in a batch: its run, the tokens its KV
    cache (``run.cache``) holds, the tokens to feed next, its detokenizer (which has seen
    every generated token).

    ``feed`` is the last generated token (the batch computes the next one from it again),
    or, for a request that moves before its prefill (others arrived while it was
    prepared), the prompt's uncached rest, which the batch prefills with theirs."""

    run: Run
    held: list[int]
    feed: list[int]
    detok: Any
