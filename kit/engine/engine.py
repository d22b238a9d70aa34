"""The engine: one worker loop owns the model and runs work in order.

In-process, the loop runs on a thread (``Engine.start()``); the server runs it on the main
thread of a child process instead (:mod:`kit.engine.process`), so that HTTP never takes
the GIL from decode.

Design (the seam a distributed engine will replace):
- ``Engine.start()`` loads the model on the worker thread; ``state`` tells ``loading``,
  ``ready``, ``unloaded`` (idle past the TTL; reloaded on the next request) or ``failed``.
- ``Engine.generate(request)`` is an async iterator of events. Requests wait in one FIFO
  queue; the worker applies the chat template, fetches the longest cached prefix from
  mlx-lm's ``LRUPromptCache``, runs ``mlx_lm.stream_generate`` on the rest, and posts
  events back to the caller's event loop.
- ``Engine.swap(model)`` queues a swap in the same FIFO: requests queued before it finish on
  the old model, requests queued after it wait for the load and run on the new one, so a
  swap fails no request. The new model loads while the old one still serves its queue
  position; the old one is released only once the new one is loaded, so a failed load
  leaves the old model serving.
- Closing the iterator early (client disconnect) sets the request's cancel flag; the worker
  stops generating at the next token.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import queue
from collections import deque
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from kit.engine.types import (
    ChatRequest,
    EngineError,
    EngineUnavailable,
    Event,
    Finished,
    InvalidRequest,
    ModelLoadError,
    ModelUnavailable,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCall,
    Usage,
)
from kit.errors import KitError, ModelDoesNotFitError, ModelError
from kit.models.resolve import ModelInfo

log = logging.getLogger("mlx_kit.engine")

_END = object()  # a job's last item
_PENALTY_CONTEXT = 20  # tokens mlx-lm's presence/frequency penalties look back (its default)


class _Cancelled(Exception):
    """Raised from mlx-lm's prefill progress callback to stop a cancelled request."""


@dataclass
class _Job:
    """A queued request. The worker ``post``s its events (then ``_END``) to ``sink``;
    ``cancelled`` set by the caller stops it at the next token."""

    request: ChatRequest
    sink: Callable[[Any], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def post(self, item: Any) -> None:
        self.sink(item)


@dataclass
class _Swap:
    """A queued swap; the worker calls ``reply(result, error)`` once."""

    spec: str
    reply: Callable[[Any, BaseException | None], None]

    def done(self, result: Any = None, error: BaseException | None = None) -> None:
        self.reply(result, error)


class LoopSink:
    """Events from another thread to an asyncio consumer, in batches: a wake-up of the
    event loop is scheduled only when none is pending, so when the HTTP side lags behind
    decode, the events that piled up arrive together (and are merged into fewer deltas,
    see :func:`_merge`) instead of costing one wake-up, one GIL hand-over and one SSE
    chunk each. Calling the sink after the loop closed sets ``cancelled`` (nobody listens).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancelled: threading.Event) -> None:
        self.loop, self.cancelled = loop, cancelled
        self.events: asyncio.Queue[list[Any]] = asyncio.Queue()
        self._pending: list[Any] = []
        self._scheduled = False
        self._lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        with self._lock:
            self._pending.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the caller's loop is closed
            self.cancelled.set()

    def _deliver(self) -> None:  # on the event loop
        with self._lock:
            items, self._pending = self._pending, []
            self._scheduled = False
        self.events.put_nowait(items)

    async def drain(self) -> AsyncIterator[Event]:
        """Yield the events until ``_END``; an exception item is raised."""
        while True:
            for item in _merge(await self.events.get()):
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item


def settle_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future
                       ) -> Callable[[Any, BaseException | None], None]:
    """A ``reply(result, error)`` callable that settles ``future`` on ``loop`` from any
    thread (a no-op once the loop is closed)."""
    def reply(result: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass
    return reply


def _excerpt(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, for error messages that may quote input."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _reserved_template_keys(tokenizer: Any) -> frozenset[str]:
    """The names a request's template variables may not take: the named parameters of
    ``tokenizer.apply_chat_template`` (read from the installed transformers, so a new one
    is covered) and the variables its renderer sets itself."""
    import inspect

    try:
        params = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    except (AttributeError, TypeError, ValueError):
        params = ()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(named | {"messages", "conversation", "tools", "documents",
                              "chat_template", "add_generation_prompt", "tokenize"})


def _merge(items: list[Any]) -> list[Any]:
    """Consecutive text (or reasoning) deltas joined into one, logprobs concatenated."""
    out: list[Any] = []
    for item in items:
        last = out[-1] if out else None
        if type(item) is TextDelta and type(last) is TextDelta:
            out[-1] = TextDelta(last.text + item.text, last.logprobs + item.logprobs)
        elif type(item) is ReasoningDelta and type(last) is ReasoningDelta:
            out[-1] = ReasoningDelta(last.text + item.text)
        else:
            out.append(item)
    return out


@dataclass
class _Run:
    """A request being generated: what _prepare computed, plus progress."""

    job: _Job
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
    n: int = 0
    ttft: float = 0.0
    first_at: float = 0.0
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    pending: list[TokenLogprob] = field(default_factory=list)

    def token(self, token: int, logprobs: Any, engine: Engine) -> None:
        """Count a generated token (and keep its logprob when asked for)."""
        if self.n == 0:
            self.first_at = time.perf_counter()
            self.ttft = self.first_at - self.t0
        self.n += 1
        if self.job.request.params.logprobs:
            self.pending.append(engine._logprob(token, logprobs,
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
class _Joined:
    """A request that ran alone and continues in a batch: its run, the tokens its KV
    cache (``run.cache``) holds, the token to feed next, its detokenizer."""

    run: _Run
    held: list[int]
    last: int
    detok: Any


@dataclass(frozen=True)
class SwapResult:
    """What a swap did: the model now behind ``local``, the one before, and how long the
    load took (seconds, resolve + fit check + load + warm-up)."""

    model: str
    previous: str
    load_seconds: float
    changed: bool


class Engine:
    """Owns one loaded model and serves chat requests and swaps from one queue.

    Args:
        model: what to load first (see :func:`kit.models.resolve.resolve_model`).
        prompt_cache_size: how many prompt caches (KV of earlier requests) to keep.
        ttl: unload the model after this many idle seconds (None: never).
        memory_budget: bytes a model may need at most (None: the memory available now
            plus what the replaced model frees).
        max_batch: most requests decoded together (continuous batching, mlx-lm's
            ``BatchGenerator``); 1 runs requests one at a time with ``stream_generate``.
    """

    def __init__(self, model: ModelInfo, *, prompt_cache_size: int = 4,
                 ttl: float | None = None, memory_budget: int | None = None,
                 max_batch: int = 8) -> None:
        self.model_info = model
        self.state = "loading"
        self.error: str | None = None
        self.requests_served = 0
        self.swaps = 0
        self.reloads = 0
        self.unloads = 0
        self.load_seconds: float | None = None
        self.ttl = ttl
        self.memory_budget = memory_budget
        self.max_batch = max_batch
        self._prompt_cache_size = prompt_cache_size
        self._model: Any = None
        self._tokenizer: Any = None
        self._weights_bytes = 0
        self._pending_weights = 0
        self._prompt_cache: Any = None
        self._grammar_tokenizer: Any = None  # llguidance's view of the tokenizer, lazily
        self._trimmable: bool | None = None  # the loaded model's KV cache, lazily
        self._bound_for: tuple[Any, Any] | None = None  # (tokenizer, its TokenBound)
        self._reclaim = False  # a large prompt was generated: give memory back when idle
        self.reclaim_heap = False  # count_tokens saw a large prompt (see kit.engine.reclaim)
        self._jobs: queue.Queue[_Job | _Swap | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlx-kit-engine", daemon=True)
        self._ready = threading.Event()
        self._ids = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread, which loads the model, then serves the queue."""
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the first load finished (or failed). Returns True when ready."""
        self._ready.wait(timeout)
        return self.state == "ready"

    def stop(self) -> None:
        """Ask the worker to finish after the queued work."""
        self._jobs.put(None)

    def memory(self) -> dict[str, int | None]:
        """mlx's allocator: bytes in live arrays now and at peak, and the loaded weights'
        size (all None before mlx is imported)."""
        if "mlx.core" not in sys.modules:
            return {"active_bytes": None, "peak_bytes": None, "weights_bytes": None}
        import mlx.core as mx

        return {"active_bytes": mx.get_active_memory(), "peak_bytes": mx.get_peak_memory(),
                "weights_bytes": self._weights_bytes if self._model is not None else 0}

    async def current_memory(self) -> dict[str, int | None]:
        """:meth:`memory`, awaitable (the engine process answers through its pipe)."""
        return self.memory()

    def capabilities(self) -> dict[str, bool]:
        """What the loaded model's chat template supports, as mlx-lm detected it:
        ``tools`` (it renders tools and has a tool-call parser), ``reasoning`` (think
        markers). All False while no model is loaded."""
        tok = self._tokenizer
        return {"tools": bool(tok is not None and getattr(tok, "has_tool_calling", False)),
                "reasoning": bool(tok is not None and getattr(tok, "has_thinking", False))}

    # -- API -------------------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Queue ``request`` and yield its events: one ``Started``, ``TextDelta``s, then one
        ``Finished``.

        Requests sent while the model loads wait for it.

        Raises:
            InvalidRequest: the request cannot run as given (before any event).
            ModelUnavailable: ``request.model`` is not the loaded model.
            EngineError: the model failed to load, or generation failed.
        """
        if not request.request_id:
            request.request_id = f"req-{next(self._ids)}"
        cancelled = threading.Event()
        sink = LoopSink(asyncio.get_running_loop(), cancelled)
        self._jobs.put(_Job(request, sink, cancelled))
        try:
            async for event in sink.drain():
                yield event
        finally:
            cancelled.set()

    def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens ``request`` would take (chat template applied), without queueing.
        Thread-safe: the tokenizer is only read. Exact whenever it is the window or less;
        a prompt provably over the window is not tokenized (see :meth:`_prompt_tokens`).

        Raises:
            InvalidRequest: the template rejects the messages, or ``context_length_exceeded``
                (the prompt alone fills the context window, by a lower bound).
            EngineError: no tokenizer is loaded (the model failed to load).
        """
        if self._tokenizer is None:
            if self.state == "failed":
                raise ModelLoadError(f"the model failed to load: {self.error}")
            raise EngineUnavailable("model is loading")
        large: list[bool] = []
        try:
            return len(self._prompt_tokens(request, None, large=large))
        finally:
            if large:  # the caller gives memory back once it dropped the request
                self.reclaim_heap = True

    async def swap(self, spec: str) -> SwapResult:
        """Make ``spec`` (a cache id or folder) the model behind ``local``.

        Waits for the requests queued before it, then loads. Raises the load's error
        (:class:`kit.errors.ModelNotFoundError`, :class:`kit.errors.ModelError` for a model
        that does not fit or does not load) with the old model still serving.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put(_Swap(spec, settle_from_thread(loop, future)))
        return await future

    # -- worker ----------------------------------------------------------------------------

    def _changed(self) -> None:
        """Called on the worker right after the public state changed (first load, reload,
        unload, swap, a request served); :class:`kit.engine.process.EngineProcess`'s
        child forwards a snapshot from here. Nothing to do in-process."""

    def snapshot(self) -> dict[str, Any]:
        """The public state as plain values: what ``/health`` and ``/v1/models`` read."""
        return {"model_info": self.model_info, "state": self.state, "error": self.error,
                "requests_served": self.requests_served, "swaps": self.swaps,
                "reloads": self.reloads, "unloads": self.unloads,
                "load_seconds": self.load_seconds, "memory": self.memory(),
                "capabilities": self.capabilities()}

    def _run(self) -> None:
        try:
            t0 = time.perf_counter()
            self._model, self._tokenizer = self._load(self.model_info, replacing=0)
            self._weights_bytes = self._pending_weights
            self.load_seconds = time.perf_counter() - t0
            self.state = "ready"
        except Exception as e:  # reported through state/error and /health; requests get it
            log.exception("model load failed")
            self.state, self.error = "failed", str(e)
        finally:
            self._changed()
            self._ready.set()
        from kit.engine.batch import run_batch

        backlog: deque = deque()
        item: Any = None
        while True:  # requests queued during the first load are served once it is done
            timeout = self.ttl if self.ttl and self._model is not None else None
            item = None  # a served request's prompt must not live on until the next one
            if self._reclaim and not backlog and self._jobs.empty():
                self._reclaim = False
                from kit.engine import reclaim

                reclaim.give_back()
            try:
                item = backlog.popleft() if backlog else self._jobs.get(timeout=timeout)
            except queue.Empty:
                self._unload()
                continue
            if item is None:
                return
            if isinstance(item, _Swap):
                self._swap(item)
            elif self.max_batch <= 1:
                self._serve(item)
            elif self._check_servable(item):
                # A request alone decodes with stream_generate (the in-process speed; one
                # stream on BatchGenerator measured 0.66 of it on an H200); it moves into a
                # batch when another request arrives.
                if self._next_is_job() or not self._can_start_alone(item):
                    backlog.extend(run_batch(self, item, self._jobs))
                elif (joined := self._serve(item, join=True)) is not None:
                    backlog.extend(run_batch(self, None, self._jobs, joined=joined))

    def _check_servable(self, job: _Job) -> bool:
        """Get the model ready for ``job`` (reload after an idle unload); on failure post
        the error and end the job. Returns whether it can run."""
        try:
            if job.request.model and job.request.model != self.model_info.id:
                raise ModelUnavailable(f"model {job.request.model!r} is not loaded; "
                                       f"{self.model_info.id!r} is")
            if self._model is None:
                if self.state == "failed":  # a swap to a model that loads can fix this
                    raise ModelLoadError(f"the model failed to load: {self.error}")
                self._reload()
        except EngineError as e:
            job.post(e)
            job.post(_END)
            return False
        return True

    def _can_start_alone(self, job: _Job) -> bool:
        """Whether ``job`` may decode alone first: only if it can move into a batch later
        (see :meth:`_generate`): the model's KV cache can be trimmed (not recurrent or
        rotating) and no grammar constrains the output."""
        req = job.request
        if req.force_tool is not None or req.response_schema is not None:
            return False
        if self._trimmable is None:
            from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

            self._trimmable = can_trim_prompt_cache(make_prompt_cache(self._model))
        return self._trimmable

    def _next_is_job(self) -> bool:
        """Whether a request (not a swap or the shutdown) waits at the queue's head."""
        with self._jobs.mutex:
            return bool(self._jobs.queue) and isinstance(self._jobs.queue[0], _Job)

    def _serve(self, job: _Job, join: bool = False) -> _Joined | None:
        """Run ``job`` alone. With ``join``, it may stop early and return its state for
        :func:`kit.engine.batch.run_batch` to continue (a request arrived meanwhile)."""
        if job.cancelled.is_set():
            job.post(_END)
            return None
        if not self._check_servable(job):
            return None
        try:
            joined = self._generate(job, join)
            if joined is not None:
                return joined
        except EngineError as e:
            job.post(e)
        except Exception as e:
            log.exception("generation failed for %s", job.request.request_id)
            job.post(EngineError(f"generation failed: {e}"))
        job.post(_END)
        return None

    def _load(self, info: ModelInfo, replacing: int) -> tuple[Any, Any]:
        """Check the model fits, load it and warm it up. ``replacing``: bytes of weights
        that will be freed once this load succeeds."""
        from kit.engine.blas import preload_blas

        blas = preload_blas()
        self._check_fit(info, replacing)
        t0 = time.perf_counter()
        from mlx_lm import load, stream_generate

        try:
            model, tokenizer = load(str(info.path))
        except Exception as e:
            raise ModelError(f"cannot load {info.id}: {e}") from None
        # One tiny generation so the first real request does not pay first-use costs
        # (kernel compilation, allocator growth, lazy imports inside mlx-lm).
        for _ in stream_generate(model, tokenizer, tokenizer.encode("Hi"), max_tokens=2):
            pass
        from kit.engine.prompt_bound import TokenBound

        bound = TokenBound.from_tokenizer(tokenizer)  # now, not on the first request
        if bound is None:
            log.info("no prompt-length bound for this tokenizer: prompts over the context "
                     "window are tokenized in full before they are rejected")
        self._bound_for = (tokenizer, bound)
        log.info("loaded %s in %.2f s (BLAS: %s)", info.id, time.perf_counter() - t0,
                 blas or "bundled")
        return model, tokenizer

    def _check_fit(self, info: ModelInfo, replacing: int) -> None:
        from kit.models.memory import available_bytes, estimate, human

        self._pending_weights = 0
        try:
            est = estimate(info.path, info.context_window)
        except (OSError, ValueError, KeyError) as e:
            log.warning("cannot estimate the memory of %s: %s", info.id, e)
            return
        budget = self.memory_budget or (available_bytes() + replacing)
        if est.total > budget:
            raise ModelDoesNotFitError(
                f"{info.id} does not fit: it needs ~{human(est.total)} ({human(est.weights)} "
                f"weights + {human(est.kv)} KV cache for {est.context} tokens) but the budget "
                f"is {human(budget)}",
                hint="free memory, pick a smaller or more quantized model, or raise "
                     "--memory-budget", needed=est.total, budget=budget)
        self._pending_weights = est.weights

    def _release(self, keep_tokenizer: bool = False) -> None:
        import mlx.core as mx

        self._model = None
        self._trimmable = None
        if not keep_tokenizer:
            self._tokenizer = None
            self._grammar_tokenizer = None
        self._prompt_cache = None
        gc.collect()
        mx.clear_cache()

    def _unload(self) -> None:
        self._release(keep_tokenizer=True)  # small; count_tokens keeps working
        self.state = "unloaded"
        self.unloads += 1
        self._changed()
        log.info("unloaded %s after %.0f s idle", self.model_info.id, self.ttl or 0)

    def _reload(self) -> None:
        t0 = time.perf_counter()
        self.state = "loading"
        self._changed()
        try:
            self._model, self._tokenizer = self._load(self.model_info, replacing=0)
            self._weights_bytes = self._pending_weights
        except KitError as e:
            self.state = "unloaded"
            self._changed()
            raise ModelLoadError(f"reloading {self.model_info.id} failed: {e.message}") from None
        self.state = "ready"
        self.reloads += 1
        self._changed()
        log.info("reloaded %s in %.2f s", self.model_info.id, time.perf_counter() - t0)

    def _swap(self, item: _Swap) -> None:
        from kit.models.resolve import resolve_model

        t0 = time.perf_counter()
        previous = self.model_info.id
        try:
            info = resolve_model(item.spec, progress=log.info)
            if info.id == previous and self._model is not None:
                item.done(SwapResult(info.id, previous, 0.0, False))
                return
            log.info("swapping %s -> %s", previous, info.id)
            model, tokenizer = self._load(info, replacing=self._weights_bytes
                                          if self._model is not None else 0)
        except Exception as e:
            log.warning("swap to %s failed, %s keeps serving: %s", item.spec, previous, e)
            item.done(error=e if isinstance(e, KitError) else ModelError(f"swap failed: {e}"))
            return
        weights = self._pending_weights
        self._release()  # drop every reference to the old model before taking the new one
        self._model, self._tokenizer, self.model_info = model, tokenizer, info
        self._weights_bytes = weights
        self.state, self.error = "ready", None
        self.swaps += 1
        self._changed()
        took = time.perf_counter() - t0
        log.info("swapped %s -> %s in %.2f s", previous, info.id, took)
        item.done(SwapResult(info.id, previous, took, True))

    def _prompt_tokens(self, request: ChatRequest, max_tokens: int | None,
                       large: list[bool] | None = None) -> list[int]:
        """The prompt's token ids: the raw prompt, or the messages through the chat
        template. Before tokenizing, a prompt that provably cannot fit the window with
        ``max_tokens`` more (None: with at least one more) is rejected on the lower bound
        of :mod:`kit.engine.prompt_bound` (a 20 MB prompt costs milliseconds, not a
        minute of tokenizing); what the bound does not decide is tokenized exactly and
        checked by :meth:`_max_tokens`. ``large`` gets True appended for a prompt text of
        :data:`kit.engine.reclaim.LARGE_BYTES` or more (the caller gives memory back).

        Raises:
            InvalidRequest: the template rejects the messages; ``context_length_exceeded``.
        """
        if request.prompt_ids is not None:  # token ids (legacy completions)
            vocab = len(self._tokenizer._tokenizer)
            bad = next((t for t in request.prompt_ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequest(f"prompt: token id {bad} is not in this model's "
                                     f"vocabulary (0..{vocab - 1})", code="invalid_value",
                                     field="prompt")
            return list(request.prompt_ids)
        from kit.engine.reclaim import LARGE_BYTES

        if request.prompt is not None:
            text = request.prompt
        else:
            try:
                text = self._render_text(request, request.messages, generation_prompt=True)
            except InvalidRequest:
                raise
            except Exception as e:
                # Anything the template raises on a request is about the request
                # (OverflowError from the sandbox's range limit, RecursionError, a
                # SecurityError...): a 400 with a short excerpt, never a 500.
                raise InvalidRequest("the model's chat template rejected the messages: "
                                     f"{_excerpt(str(e) or type(e).__name__, 200)}") from None
        if large is not None and len(text) >= LARGE_BYTES:
            large.append(True)
        bound = self._bound()
        if bound is not None:
            room = self.model_info.context_window - (max_tokens or 1)
            at_least = bound.at_least(text, above=room)
            if at_least > room:
                self._max_tokens(at_least, max_tokens, at_least=True)  # raises
        try:
            if request.prompt is not None:
                tokens = list(self._tokenizer.encode(text))
                if not tokens:  # mlx-lm cannot start from nothing
                    raise InvalidRequest("the prompt has no tokens", field="prompt")
                return tokens
            return self._encode_rendered(text)
        except (TypeError, ValueError) as e:  # the tokenizer takes valid Unicode only
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequest("the prompt is not valid Unicode (it contains a lone "
                                     "UTF-16 surrogate)", field="prompt" if request.prompt
                                     is not None else "messages") from None
            raise InvalidRequest(f"the prompt cannot be tokenized: {_excerpt(str(e))}",
                                 field="prompt" if request.prompt is not None
                                 else "messages") from None

    def _bound(self) -> Any:
        """The loaded tokenizer's :class:`kit.engine.prompt_bound.TokenBound` (None: its
        pipeline allows no proven bound), computed once per tokenizer (~0.1 s, at load)."""
        from kit.engine.prompt_bound import TokenBound

        tok = self._tokenizer
        cached = self._bound_for  # set by _load; one tuple assignment: thread-safe
        if cached is None or cached[0] is not tok:
            cached = self._bound_for = (tok, TokenBound.from_tokenizer(tok))
        return cached[1]

    def _render_text(self, request: ChatRequest, messages: list[dict[str, Any]], *,
                     generation_prompt: bool) -> str:
        """``messages`` through the chat template with ``request``'s tools and template
        variables, as text (raises whatever the template raises).

        Raises:
            InvalidRequest: a template variable names an argument of the renderer itself
                (``chat_template``, ``messages``, ``tokenize``...; the HTTP schemas refuse
                them first, this guards every caller of the engine).
        """
        reserved = _reserved_template_keys(self._tokenizer)
        bad = next((k for k in request.template_kwargs if k in reserved), None)
        if bad is not None:
            raise InvalidRequest(f"chat_template_kwargs.{_excerpt(str(bad), 60)} is set by the "
                                 "server, not by a request", code="invalid_value",
                                 field=f"template_kwargs.{_excerpt(str(bad), 60)}")
        kwargs: dict[str, Any] = {**request.template_kwargs,
                                  "add_generation_prompt": generation_prompt,
                                  "tokenize": False, "return_dict": False}
        if request.tools:
            kwargs["tools"] = request.tools
        text = self._tokenizer.apply_chat_template(messages, **kwargs)
        if not isinstance(text, str):  # a template variable changed it
            raise ValueError("the chat template did not return text")
        return text

    def _encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt, as ``apply_chat_template(tokenize=True)``
        makes them (the template writes the special tokens itself)."""
        return list(self._tokenizer._tokenizer.encode(text, add_special_tokens=False))

    def _render(self, request: ChatRequest, messages: list[dict[str, Any]], *,
                generation_prompt: bool) -> list[int]:
        """:meth:`_render_text`, as token ids."""
        return self._encode_rendered(self._render_text(request, messages,
                                                       generation_prompt=generation_prompt))

    def _constraint(self, request: ChatRequest,
                    prompt: list[int]) -> tuple[str | None, list[int], str]:
        """The grammar a request's output must follow (None: free), the tokens to append to
        its prompt, and the request field the grammar comes from (for errors); see
        :mod:`kit.engine.grammar`. A constrained answer skips the model's reasoning: a
        think block the prompt left open is closed first, so what the grammar makes is the
        answer (or the call), not reasoning.

        Raises:
            InvalidRequest: a tool's parameters or the response schema are not JSON
                schema objects.
        """
        from kit.engine.grammar import json_grammar, tool_call_grammar

        tok = self._tokenizer
        close: list[int] = []
        if getattr(tok, "has_thinking", False) and \
                tok.rfind_think_start(prompt) > tok.rfind_think_end(prompt):
            close = list(tok.encode(tok.think_end, add_special_tokens=False))
        try:
            if request.force_tool is not None and request.tools and tok.has_tool_calling:
                tools = request.tools if not request.force_tool else [
                    t for t in request.tools
                    if (t.get("function") or {}).get("name") == request.force_tool]
                family = tok._tokenizer.init_kwargs.get("tool_parser_type")
                start = list(tok.tool_call_start_tokens or ())
                return tool_call_grammar(family, tools), close + start, "tools"
            if request.response_schema is not None and not request.raw:
                return json_grammar(request.response_schema), close, "schema"
        except ValueError as e:
            raise InvalidRequest(str(e), field="tools" if request.force_tool is not None
                                 else "schema") from None
        return None, [], ""

    def _grammar_processor(self, grammar: str, param: str) -> Any:
        """A logits processor for ``grammar``; the llguidance tokenizer is built once per
        loaded model.

        Raises:
            InvalidRequest: the grammar does not compile (e.g. an unsupported schema).
        """
        from kit.engine.grammar import GrammarProcessor, ll_tokenizer

        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = ll_tokenizer(self._tokenizer)
        try:
            return GrammarProcessor(self._grammar_tokenizer, grammar)
        except ValueError as e:
            reason = str(e).splitlines()[0][:300] if str(e) else "invalid schema"
            raise InvalidRequest(f"cannot constrain the output to this schema: {reason}",
                                 field=param) from None

    def _check_sampling(self, params: Any) -> None:
        """Reject what would crash or break mlx-lm's samplers for everyone: token ids
        outside the vocabulary in ``logit_bias`` (mlx indexes out of bounds), non-finite
        biases, ``top_k`` not below the vocabulary size (its error left the sampler broken
        for later requests).

        Raises:
            InvalidRequest: with the parameter at fault.
        """
        import math

        vocab = len(self._tokenizer._tokenizer)
        for token, bias in params.logit_bias:
            if not 0 <= token < vocab:
                raise InvalidRequest(f"logit_bias: token id {token} is not in this model's "
                                     f"vocabulary (0..{vocab - 1})", field="logit_bias")
            if not math.isfinite(bias):
                raise InvalidRequest("logit_bias values must be finite numbers",
                                     field="logit_bias")
        if params.top_k and params.top_k >= vocab:
            raise InvalidRequest(f"top_k must be below this model's vocabulary size ({vocab})",
                                 field="top_k")

    def _max_tokens(self, n_prompt: int, requested: int | None, at_least: bool = False) -> int:
        """Tokens to generate within the context window. ``at_least``: ``n_prompt`` is a
        lower bound, not the count (the prompt was not tokenized).

        Raises:
            InvalidRequest: ``context_length_exceeded`` (OpenAI's wording, which agents
                such as pi recognise and answer by compacting); it never quotes the prompt.
        """
        window = self.model_info.context_window
        more = "at least " if at_least else ""
        if requested is not None and n_prompt + requested > window:
            raise InvalidRequest(
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {more}{n_prompt + requested} tokens ({more}{n_prompt} in the "
                f"messages, {requested} in the completion). Please reduce the length of the "
                "messages or completion.", code="context_length_exceeded")
        if requested is None and n_prompt >= window:
            raise InvalidRequest(
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {more}{n_prompt} tokens. Please reduce the length of "
                "the messages.", code="context_length_exceeded")
        return requested if requested is not None else min(
            self.model_info.max_output_tokens, window - n_prompt)

    @staticmethod
    def _prefill_step_size() -> int:
        """Prompt tokens per prefill chunk. On CPU, 512 prefills a 2000-token prompt ~30%
        faster than mlx-lm's default 2048 (14.0 s vs 20.4 s here) and bounds how long a
        cancelled request keeps the worker; GPUs keep the default."""
        import mlx.core as mx

        return 512 if mx.default_device().type == mx.DeviceType.cpu else 2048

    def _logprob(self, token: int, lp: Any, top_n: int) -> TokenLogprob:
        import mlx.core as mx

        top: tuple[tuple[str, float], ...] = ()
        if top_n:
            ids = mx.argpartition(-lp, kth=top_n - 1)[:top_n]
            vals = lp[ids]
            order = mx.argsort(-vals)
            top = tuple((self._tokenizer.decode([int(i)]), float(v))
                        for i, v in zip(ids[order].tolist(), vals[order].tolist()))
        return TokenLogprob(self._tokenizer.decode([token]), float(lp[token].item()), top)

    def _prepare(self, job: _Job) -> _Run:
        """Everything before the first token, shared by the sequential and batched paths:
        chat template, context check, sampler, prompt-cache lookup; posts ``Started``.

        Raises:
            InvalidRequest: the template rejects the messages, or the context is exceeded.
        """
        import mlx.core as mx
        from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache, trim_prompt_cache
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        from kit.engine.output import OutputParser

        req, params = job.request, job.request.params
        t0 = time.perf_counter()
        self._check_sampling(params)
        large: list[bool] = []
        try:
            prompt = self._prompt_tokens(req, params.max_tokens, large=large)
        finally:
            if large:
                self._reclaim = True  # given back once the worker is idle
        grammar, forced, source = self._constraint(req, prompt)
        prompt += forced
        max_tokens = self._max_tokens(len(prompt), params.max_tokens)
        if params.seed is not None:
            mx.random.seed(params.seed)
        sampler = make_sampler(temp=params.temperature, top_p=params.top_p,
                               min_p=params.min_p, top_k=params.top_k)
        processors = make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            presence_penalty=params.presence_penalty or None,
            frequency_penalty=params.frequency_penalty or None)
        if grammar is not None:
            processors.append(self._grammar_processor(grammar, source))
        if self._prompt_cache is None:
            self._prompt_cache = LRUPromptCache(max_size=self._prompt_cache_size)
        key = self.model_info.id
        cache, rest = self._prompt_cache.fetch_nearest_cache(key, prompt)
        if cache is None:
            cache, rest = make_prompt_cache(self._model), prompt
        elif not rest:  # exact hit: re-feed the last prompt token to get fresh logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        cached = len(prompt) - len(rest)
        job.post(Started(key, len(prompt), cached))
        parser = OutputParser(stops=params.stop) if req.raw else \
            OutputParser.for_model(self._tokenizer, prompt, stops=params.stop, tools=req.tools,
                                   in_tool_call=req.force_tool is not None and bool(forced))
        return _Run(job, key, prompt, rest, cache, cached, max_tokens, sampler, processors,
                    parser, t0)

    def _complete(self, run: _Run, finish_reason: str, tokens: list[int], cache: Any) -> None:
        """After the last token: flush the parser, post ``Finished``, then store the prompt
        cache (``tokens`` is what ``cache`` holds; None: nothing worth keeping) — as the
        next turn will resend it, see :meth:`_cache_for_next_turn`."""
        run.emit(run.parser.finish(finish_reason))
        if finish_reason == "stop" and run.parser.tool_calls:
            finish_reason = "tool_calls"
        usage = Usage(len(run.prompt), run.n, run.cached)
        tps = (run.n - 1) / (time.perf_counter() - run.first_at) if run.n > 1 else 0.0
        log.info("%s: %s, prompt %d tokens (%d cached), generated %d, ttft %.3f s, "
                 "%.1f tok/s, %s", run.job.request.request_id, run.key, usage.prompt_tokens,
                 run.cached, run.n, run.ttft, tps, finish_reason)
        log.debug("%s: text %r", run.job.request.request_id, "".join(run.texts))
        self.requests_served += 1  # before the client can see the end (and ask /health)
        self._changed()
        run.job.post(Finished(finish_reason, usage, run.key, run.ttft, tps,
                              run.parser.stop_string))
        if cache is None:
            return
        if finish_reason != "cancelled" and not run.job.request.raw:
            tokens = self._cache_for_next_turn(run, tokens, cache)
        self._prompt_cache.insert_cache(run.key, tokens, cache)

    def _cache_for_next_turn(self, run: _Run, tokens: list[int], cache: Any) -> list[int]:
        """Make ``cache`` hold what the client's next turn will start with, and return
        those tokens.

        The next request resends this turn as an assistant message rendered by the chat
        template, which is often not the generated text: thinking templates drop the
        reasoning of earlier turns, tool calls are re-serialized, the end-of-turn marker
        differs from the EOS token the model stopped on. The KV of the generated tokens
        after the first difference is useless to the next turn; so the cache is trimmed
        to the common prefix and the rest of the rendered message is prefilled now (a
        few tokens, after the client has its answer) — the next turn then only prefills
        its new messages. Non-trimmable caches (recurrent / rotated-out layers) keep the
        generated tokens as they are. Returns ``tokens`` unchanged when nothing applies.
        """
        import mlx.core as mx
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        req = run.job.request
        message: dict[str, Any] = {"role": "assistant",
                                   "content": "".join(run.texts) or (None if run.calls else "")}
        if run.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments}} for c in run.calls]
        try:
            resend = self._render(req, req.messages + [message], generation_prompt=False)
        except Exception as e:  # any template failure: keep the cache as generated
            log.debug("%s: no next-turn cache (%s)", req.request_id, e)
            return tokens
        common = 0
        for a, b in zip(resend, tokens):
            if a != b:
                break
            common += 1
        if common == len(resend) or common < len(run.prompt) // 2 \
                or not can_trim_prompt_cache(cache):
            return tokens  # already a prefix, the template rewrote the prompt, or no trim
        from mlx_lm.generate import generation_stream

        trim_prompt_cache(cache, len(tokens) - common)
        rest = resend[common:]
        step = self._prefill_step_size()
        with mx.stream(generation_stream):  # the stream mlx-lm generates on (GPU: no hops)
            for i in range(0, len(rest), step):
                self._model(mx.array(rest[i:i + step])[None], cache=cache)
                mx.eval([c.state for c in cache])
        log.debug("%s: cached the next turn's prefix: %d tokens (%d re-rendered)",
                  req.request_id, len(resend), len(rest))
        return resend

    def _generate(self, job: _Job, join: bool = False) -> _Joined | None:
        """Run one request alone: ``mlx_lm.stream_generate``.

        With ``join`` (only for requests :meth:`_can_start_alone` admits: a trimmable KV
        cache, no grammar, whose llguidance matcher would have consumed the last token
        already), when another request waits, stop after the current token and return the
        state a batch continues from: the KV cache trimmed by that token, which the batch
        feeds again (stream_generate has already fed it to compute the next one), and a
        detokenizer that has seen the tokens so far.
        """
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.models.cache import trim_prompt_cache

        run = self._prepare(job)

        def check_cancelled(_done: int, _total: int) -> None:
            if job.cancelled.is_set():  # the client left during prefill: stop it there
                raise _Cancelled

        processors = run.processors
        params = job.request.params
        if run.cached and (params.presence_penalty or params.frequency_penalty):
            # stream_generate shows processors only the uncached prompt (+ generated);
            # penalties look at the last 20 tokens, so lend them the cached ones, as a
            # batch does (same text whatever was cached or batched)
            before = mx.array(run.prompt[:run.cached][-_PENALTY_CONTEXT:])
            processors = [lambda tokens, logits, p=p: p(mx.concatenate([before, tokens]),
                                                         logits) for p in processors]
        stream = stream_generate(self._model, self._tokenizer, run.rest,
                                 max_tokens=run.max_tokens, sampler=run.sampler,
                                 logits_processors=processors, prompt_cache=run.cache,
                                 prompt_progress_callback=check_cancelled,
                                 prefill_step_size=self._prefill_step_size())
        try:
            first = next(stream, None)
        except _Cancelled:  # the KV cache is half-filled: do not keep it
            log.info("%s: cancelled during prefill", job.request.request_id)
            self._complete(run, "cancelled", [], None)
            return None
        tokens = list(run.prompt)
        finish_reason = "stop"
        for gen in itertools.chain([first] if first is not None else [], stream):
            run.token(gen.token, gen.logprobs, self)
            tokens.append(gen.token)
            run.emit(run.parser.feed(gen.text))
            if run.parser.stopped:
                break
            if job.cancelled.is_set():
                finish_reason = "cancelled"
                break
            if gen.finish_reason is not None:
                finish_reason = gen.finish_reason
                break
            if join and run.n < run.max_tokens and self._next_is_job():
                stream.close()
                mx.eval([c.state for c in run.cache])
                trim_prompt_cache(run.cache, 1)
                detok = self._tokenizer.detokenizer
                for token in tokens[len(run.prompt):]:
                    detok.add_token(token)
                detok.last_segment  # noqa: B018 (sent already, through stream_generate's)
                log.debug("%s: joins a batch after %d tokens", job.request.request_id, run.n)
                return _Joined(run, tokens[:-1], tokens[-1], detok)
        self._complete(run, finish_reason, tokens, run.cache)
        return None
