"""The single-process engine: one worker thread owns the model and runs requests in order.

Design (the seam a batched or distributed engine will replace):
- ``Engine.start()`` loads the model on the worker thread; ``state`` tells ``loading``,
  ``ready`` or ``failed``.
- ``Engine.generate(request)`` is an async iterator of events. Requests wait in a FIFO
  queue; the worker applies the chat template, fetches the longest cached prefix from
  mlx-lm's ``LRUPromptCache``, runs ``mlx_lm.stream_generate`` on the rest, and posts
  events back to the caller's event loop.
- Closing the iterator early (client disconnect) sets the request's cancel flag; the worker
  stops generating at the next token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kit.engine.types import ChatRequest, EngineError, Event, Finished, InvalidRequest, TextDelta, Usage
from kit.models.resolve import ModelInfo

log = logging.getLogger("mlx_kit.engine")

_END = object()


@dataclass
class _Job:
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)

    def post(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            self.cancelled.set()


class Engine:
    """Owns one loaded model and serves chat requests from a queue.

    Args:
        model: what to load (see :func:`kit.models.resolve.resolve_model`).
        prompt_cache_size: how many prompt caches (KV of earlier requests) to keep.
    """

    def __init__(self, model: ModelInfo, *, prompt_cache_size: int = 4) -> None:
        self.model_info = model
        self.state = "loading"
        self.error: str | None = None
        self.requests_served = 0
        self.load_seconds: float | None = None
        self._prompt_cache_size = prompt_cache_size
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlx-kit-engine", daemon=True)
        self._ready = threading.Event()
        self._ids = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread, which loads the model, then serves the queue."""
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (or failed). Returns True when ready."""
        self._ready.wait(timeout)
        return self.state == "ready"

    def stop(self) -> None:
        """Ask the worker to finish after the current request."""
        self._jobs.put(None)

    # -- API -------------------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Queue ``request`` and yield its events: ``TextDelta``s then one ``Finished``.

        Raises:
            InvalidRequest: the chat template rejects the messages (before any event).
            EngineError: the model is not loaded, or generation failed.
        """
        if self.state != "ready":
            raise EngineError(f"model is {self.state}" + (f": {self.error}" if self.error else ""))
        if not request.request_id:
            request.request_id = f"req-{next(self._ids)}"
        job = _Job(request, asyncio.get_running_loop(), asyncio.Queue())
        self._jobs.put(job)
        try:
            while True:
                item = await job.events.get()
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            job.cancelled.set()

    # -- worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except Exception as e:  # reported through state/error and /health
            log.exception("model load failed")
            self.state, self.error = "failed", str(e)
            self._ready.set()
            return
        self.state = "ready"
        self._ready.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                job.post(_END)
                continue
            try:
                self._generate(job)
            except InvalidRequest as e:
                job.post(e)
            except Exception as e:
                log.exception("generation failed for %s", job.request.request_id)
                job.post(EngineError(f"generation failed: {e}"))
            else:
                self.requests_served += 1
            job.post(_END)

    def _load(self) -> None:
        from kit.engine.blas import preload_blas

        blas = preload_blas()
        t0 = time.perf_counter()
        from mlx_lm import load
        from mlx_lm.models.cache import LRUPromptCache

        self._model, self._tokenizer = load(str(self.model_info.path))
        self._prompt_cache = LRUPromptCache(max_size=self._prompt_cache_size)
        self._warm_up()
        self.load_seconds = time.perf_counter() - t0
        log.info("loaded %s in %.2f s (BLAS: %s)", self.model_info.id, self.load_seconds,
                 blas or "bundled")

    def _warm_up(self) -> None:
        """One tiny generation so the first real request does not pay for first-use setup
        (kernel compilation, allocator growth, lazy imports inside mlx-lm)."""
        from mlx_lm import stream_generate

        for _ in stream_generate(self._model, self._tokenizer, self._tokenizer.encode("Hi"),
                                 max_tokens=2):
            pass

    def _prompt_tokens(self, request: ChatRequest) -> list[int]:
        from jinja2 import TemplateError

        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        if request.tools:
            kwargs["tools"] = request.tools
        try:
            tokens = self._tokenizer.apply_chat_template(request.messages, **kwargs)
        except (TemplateError, ValueError, TypeError, KeyError) as e:
            raise InvalidRequest(f"the model's chat template rejected the messages: {e}") from None
        if isinstance(tokens, dict):  # some tokenizers return a BatchEncoding
            tokens = tokens["input_ids"]
        return list(tokens)

    def _generate(self, job: _Job) -> None:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.generate import TextStateMachine
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        req, params = job.request, job.request.params
        t0 = time.perf_counter()
        prompt = self._prompt_tokens(req)
        if params.seed is not None:
            mx.random.seed(params.seed)
        sampler = make_sampler(temp=params.temperature, top_p=params.top_p)

        key = self.model_info.id
        cache, rest = self._prompt_cache.fetch_nearest_cache(key, prompt)
        if cache is None:
            cache, rest = make_prompt_cache(self._model), prompt
        elif not rest:  # exact hit: re-feed the last prompt token to get fresh logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        cached = len(prompt) - len(rest)

        # Stop strings end generation (destination state None); the text before a possible
        # partial match is held back until it is known not to be a stop string.
        stops = TextStateMachine({"normal": [(s, None) for s in params.stop if s]})
        sm_state = stops.make_state()
        cache_key = list(prompt)
        texts: list[str] = []
        finish_reason, n_generated, ttft, tps = "stop", 0, 0.0, 0.0
        for gen in stream_generate(self._model, self._tokenizer, rest,
                                   max_tokens=params.max_tokens, sampler=sampler,
                                   prompt_cache=cache):
            if n_generated == 0:
                ttft = time.perf_counter() - t0
            n_generated = gen.generation_tokens
            tps = gen.generation_tps
            cache_key.append(gen.token)
            sm_state, text, where = TextStateMachine.step(sm_state, gen.text)
            if text:
                texts.append(text)
                job.post(TextDelta(text))
            if where is None:
                finish_reason = "stop"
                break
            if job.cancelled.is_set():
                finish_reason = "cancelled"
                break
            if gen.finish_reason is not None:
                finish_reason = gen.finish_reason
                sm_state, tail, _ = TextStateMachine.flush(sm_state)
                if tail:
                    texts.append(tail)
                    job.post(TextDelta(tail))
                break
        self._prompt_cache.insert_cache(key, cache_key, cache)
        usage = Usage(len(prompt), n_generated, cached)
        log.info("%s: prompt %d tokens (%d cached), generated %d, ttft %.3f s, %.1f tok/s, %s",
                 req.request_id, usage.prompt_tokens, cached, n_generated, ttft, tps,
                 finish_reason)
        log.debug("%s: text %r", req.request_id, "".join(texts))
        job.post(Finished(finish_reason, usage, ttft, tps))
