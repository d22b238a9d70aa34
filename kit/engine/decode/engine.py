"""The engine: one worker loop owns the model and runs work in order.

In-process, the loop runs on a thread (``Engine.start()``); the server runs it on the main
thread of a child process instead (:mod:`kit.engine.proc.process`), so that HTTP never takes
the GIL from decode.

Design (behind :class:`kit.engine.interface.EngineLike`; a distributed engine runs this same
worker on every rank over a :class:`kit.engine.distributed.rank_inbox.RankInbox`):
- ``Engine.start()`` loads the model on the worker thread; ``state`` tells ``loading``,
  ``ready``, ``unloaded`` (idle past the TTL; reloaded on the next request) or ``failed``.
- ``Engine.generate(request)`` is an async iterator of events. Requests wait in one FIFO
  queue; the worker prepares each (:class:`kit.engine.decode.pipeline.Pipeline`: chat template,
  the longest cached prefix), decodes it alone (:mod:`kit.engine.decode.sequential`) or with
  others (:mod:`kit.engine.decode.batch`), and posts events back to the caller's event loop
  (:mod:`kit.engine.decode.bridge`).
- ``Engine.swap(model)`` queues a swap in the same FIFO: requests queued before it finish on
  the old model, requests queued after it wait for the load and run on the new one, so a
  swap fails no request. The new model loads while the old one still serves its queue
  position; the old one is released only once the new one is loaded, so a failed load
  leaves the old model serving (:class:`kit.engine.decode.slot.ModelSlot`).
- Closing the iterator early (client disconnect) sets the request's cancel flag; the worker
  stops generating at the next token.

This module is the public API and the scheduler; the model's load, reload, unload and swap
are :mod:`kit.engine.decode.transitions`'; the parts it drives each have one job.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from kit.engine.cache import reclaim
from kit.engine.cache.disk_tier import DiskTier
from kit.engine.cache.kv import kv_snapshot
from kit.engine.decode.batch import run_batch
from kit.engine.decode.bridge import END, LoopSink, settle_from_thread
from kit.engine.decode.draft import Drafts, parse_pairings
from kit.engine.decode.inbox import Inbox, is_job
from kit.engine.cache.policy import PromptCachePolicy
from kit.engine.decode.pipeline import Pipeline
from kit.engine.decode.run import Job, Joined, Swap
from kit.engine.decode.sequential import resume, serve_alone
from kit.engine.decode.slot import ModelSlot
from kit.engine.decode.transitions import ModelTransitions
from kit.engine.decode.warmup import check_mode
from kit.engine.interface import SwapResult
from kit.engine.types import (
    ChatRequest,
    EngineError,
    EngineUnavailable,
    Event,
    ModelLoadError,
    ModelUnavailable,
)
from kit.errors import KitError, ModelError, error_kind
from kit.models.adapters import parse_adapters
from kit.models.resolve import ModelInfo
from kit.engine.status import status_of
from kit.config import EngineConfig

if TYPE_CHECKING:
    from kit.engine.status import EngineStatus

log = logging.getLogger("mlx_kit.engine")

_FLUSH_S = 3.0  # a graceful stop writes queued prompt caches for this long (of the 10 s
                # EngineProcess.stop waits)

class Engine(ModelTransitions):
    """Owns one loaded model and serves chat requests and swaps from one queue; satisfies
    :class:`kit.engine.interface.EngineLike`.

    Args:
        model: what to load first (see :func:`kit.models.resolve.resolve_model`).
        config: the knobs (:class:`kit.config.EngineConfig`; default: the defaults and
            the ``MLX_KIT_*`` environment). The engine reads ``prompt_cache_size``,
            ``prompt_cache_bytes`` (None: a quarter of the memory ceiling left after the
            weights, at each load), ``ttl`` (0: never unload), ``memory_budget`` (None:
            what is available plus what the replaced model frees), ``max_batch`` (via
            ``config.batch``), ``kv_bits``/``kv_group_size``, ``trust_remote_code``,
            ``prompt_cache_dir``/``prompt_cache_disk`` (bytes; 0: no disk tier),
            ``warmup`` and ``idle_write_s``; its validation (KV settings) ran once, when
            it was built.
        on_change: called on the worker right after the public state changed (first
            load, reload, unload, swap, a request served, before its ``Finished``); the
            engine process forwards :meth:`snapshot` from here.
        trust_remote_code: let checkpoints run their own code when they load (every
            model this engine loads, swaps included; see :class:`ModelSlot`).
        inbox: the worker's queue (default :class:`kit.engine.decode.inbox.Inbox`; a distributed
            engine's ranks share one through :class:`kit.engine.distributed.rank_inbox.RankInbox`).
        loader: ``(path, trust_remote_code) -> (model, tokenizer)`` (default
            ``mlx_lm.load``; a distributed engine's ranks pass ``mlx_lm``'s sharded load).
        agree: ``error -> error``: what every rank decided about a load's checks (the
            model found, fits, splits); default: this process's own ``error``. A load
            goes ahead only when it returns None, so all ranks load or none does.
        split: this rank's place in a distributed engine (see :class:`ModelSlot`).
        on_fatal: called with an unexpected generation failure before it is reported to
            the request (a distributed engine's rank exits there: its peers wait inside a
            collective it will not join); default: nothing, the engine goes on.

    Attributes:
        phase: what a load is doing now, ``"loading weights"`` or ``"warming up"``; None
            when no load runs (first load, reload, swap alike).
        slot: the model (:class:`kit.engine.decode.slot.ModelSlot`).
        pipeline: prepare/complete of requests (:class:`kit.engine.decode.pipeline.Pipeline`).
        reclaim_heap: set when ``count_tokens`` saw a large prompt; whoever runs it
            beside the worker clears it and gives memory back (see :mod:`kit.engine.cache.reclaim`).
    """

    def __init__(self, model: ModelInfo, config: EngineConfig | None = None, *,
                 on_change: Callable[[], None] | None = None, inbox: Inbox | None = None,
                 loader: Callable[..., Any] | None = None,
                 agree: Callable[[BaseException | None], BaseException | None] | None = None,
                 split: tuple[int, int, bool, int] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        """Raises ConfigError for a warm-up mode :func:`kit.engine.decode.warmup.check_mode`
        refuses (``on`` in a distributed engine)."""
        c = self.config = config if config is not None else EngineConfig()
        self.state = "loading"
        self.phase: str | None = None
        self.error: str | None = None
        #: the failed load's kind (kit.errors.error_kind: "model_does_not_fit", ...): what
        #: /health's ``error_type`` says, so the CLI picks the error's exit code
        self.error_type: str | None = None
        self.requests_served = 0
        self.swaps = 0
        self.reloads = 0
        self.unloads = 0
        self.restarts = 0  # in-process there is no engine process to replace
        self.load_seconds: float | None = None
        self.ttl = c.ttl or None
        self.max_batch = c.batch
        self.slot = ModelSlot(model, c.memory_budget, trust_remote_code=c.trust_remote_code,
                              loader=loader, split=split,
                              warmup=check_mode(c.warmup.value, distributed=split is not None),
                              max_batch=self.max_batch, kv_bits=c.kv_bits,
                              kv_group_size=c.kv_group_size,
                              adapters=parse_adapters(c.adapter),
                              max_image_tokens=c.max_image_tokens,
                              drafts=Drafts(parse_pairings(c.draft_model, model.id),
                                            c.num_draft_tokens) if c.draft_model else None,
                              compile_decode=c.compile_decode.value)
        self.pipeline = Pipeline(self.slot,
                                 PromptCachePolicy(c.prompt_cache_size, c.prompt_cache_bytes),
                                 servable=self._check_servable, served=self._served)
        self.pipeline.changed = lambda: self._on_change()
        if c.prompt_cache_disk > 0:
            self.pipeline.cache.attach_disk(DiskTier.for_slot(
                c.prompt_cache_dir, c.prompt_cache_disk, self.slot))
        self._agree = agree or (lambda error: error)
        self.reclaim_heap = False
        self._on_change = on_change or (lambda: None)
        self.inbox = inbox or Inbox()
        self.pipeline.sync = self.inbox.sync
        if on_fatal is not None:
            self.pipeline.fatal = on_fatal
        self._thread = threading.Thread(target=self.run_worker, name="mlx-kit-engine",
                                        daemon=True)
        self._ready = threading.Event()
        self._ids = itertools.count(1)

    @property
    def model_info(self) -> ModelInfo:
        """The model behind ``local`` (changes on a swap)."""
        return self.slot.info

    @property
    def pid(self) -> int:
        """This process: generation runs in it."""
        return os.getpid()

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
        self.inbox.put(None)

    def submit(self, item: Job | Swap | None) -> None:
        """Queue a request, a swap, or None (stop after the work queued before it); any
        thread. :meth:`generate` and :meth:`swap` use it; so does the engine process."""
        self.inbox.put(item)

    def cancel(self, job: Job) -> None:
        """Ask ``job`` to stop at its next token; any thread (see :meth:`Inbox.cancel`)."""
        self.inbox.cancel(job)

    def memory(self) -> dict[str, int | None]:
        """mlx's allocator: bytes in live arrays now and at peak, and the loaded weights'
        size (all None before mlx is imported)."""
        return self.slot.memory()

    async def current_memory(self) -> dict[str, int | None]:
        """:meth:`memory`, awaitable (the engine process answers through its pipe)."""
        return self.memory()

    def capabilities(self) -> dict[str, Any]:
        """See :meth:`kit.engine.decode.slot.ModelSlot.capabilities`."""
        return self.slot.capabilities()

    def snapshot(self) -> dict[str, Any]:
        """The public state as plain values: what ``/health`` and ``/v1/models`` read."""
        return {"model_info": self.model_info, "state": self.state, "error": self.error,
                "error_type": self.error_type,
                "requests_served": self.requests_served, "swaps": self.swaps,
                "reloads": self.reloads, "unloads": self.unloads,
                "load_seconds": self.load_seconds, "phase": self.phase,
                "memory": self.memory(),
                "capabilities": self.capabilities(), "admission": self.admission,
                "prompt_cache": self.prompt_cache,
                "kv_cache": kv_snapshot(self.slot, self.max_batch), "draft": self.draft}

    def status(self) -> EngineStatus:
        """See :meth:`kit.engine.interface.EngineLike.status`."""
        return status_of(self, prompt_cache=self.prompt_cache, admission=self.admission,
                         kv_cache=kv_snapshot(self.slot, self.max_batch), draft=self.draft)

    @property
    def draft(self) -> dict[str, Any] | None:
        """Speculative decoding's pairings and counters (:meth:`Drafts.status`), or None
        without ``--draft-model``."""
        return self.slot.drafts.status() if self.slot.drafts is not None else None

    @property
    def admission(self) -> dict[str, Any]:
        """Memory admission's counters (``clamped``, ``rejected``, ``deferred``), the
        ceiling and the in-memory prompt caches (:meth:`Pipeline.memory_snapshot`)."""
        return self.pipeline.memory_snapshot()

    @property
    def prompt_cache(self) -> dict[str, int]:
        """The prompt cache's counters (:meth:`PromptCachePolicy.stats`), for ``/health``."""
        return self.pipeline.cache.stats()

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
        self.submit(Job(request, sink, cancelled))
        try:
            async for event in sink.drain():
                yield event
        finally:
            cancelled.set()

    def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens ``request`` would take (chat template applied), without queueing.
        Thread-safe: the tokenizer is only read. Exact whenever it is the window or less;
        a prompt provably over the window is not tokenized (see
        :meth:`kit.engine.decode.prompt.Prompts.tokens`).

        Raises:
            InvalidRequest: the template rejects the messages, or ``context_length_exceeded``
                (the prompt alone fills the context window, by a lower bound).
            EngineError: no tokenizer is loaded (the model failed to load).
        """
        if self.slot.tokenizer is None:
            if self.state == "failed":
                raise ModelLoadError(f"the model failed to load: {self.error}")
            raise EngineUnavailable("model is loading")
        # the caller gives memory back once it dropped the request
        return len(self.pipeline.prompts.tokens(request, None, on_large=self._reclaim_heap))

    def _reclaim_heap(self) -> None:
        self.reclaim_heap = True

    async def count_tokens_async(self, request: ChatRequest) -> int:
        """:meth:`count_tokens` awaited from the event loop: tokenizing is CPU work, so it
        runs on a worker thread (the in-process engine answers at once)."""
        return await asyncio.to_thread(self.count_tokens, request)

    async def swap(self, spec: str) -> SwapResult:
        """Make ``spec`` (a cache id or folder) the model behind ``local``.

        Waits for the requests queued before it, then loads. Raises the load's error
        (:class:`kit.errors.ModelNotFoundError`, :class:`kit.errors.ModelError` for a model
        that does not fit or does not load) with the old model still serving.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.submit(Swap(spec, settle_from_thread(loop, future)))
        return await future

    # -- worker ----------------------------------------------------------------------------

    def run_worker(self) -> None:
        """The worker loop, on the calling thread: load the model, then serve the queue
        until :meth:`stop` (``start`` runs it on a thread; the engine process on its main
        thread)."""
        try:
            t0 = time.perf_counter()
            self._install(self._load(self.model_info, replacing=0))
            self.load_seconds = time.perf_counter() - t0
            self.state = "ready"
        except KitError as e:  # expected (does not fit, not a model...): one line, no trace
            log.error("model load failed: %s", e)
            self.state, self.error, self.error_type = "failed", str(e), error_kind(e)
        except Exception as e:  # reported through state/error and /health; requests get it
            log.exception("model load failed")
            self.state, self.error = "failed", str(e)
            self.error_type = error_kind(ModelError(""))  # "model": not of a kind of ours
        finally:
            self._on_change()
            self._ready.set()

        backlog: deque = deque()
        item: Any = None
        idle_s = self.config.idle_write_s
        while True:  # requests queued during the first load are served once it is done
            timeout = self.ttl if self.ttl and self.slot.loaded else None
            item = None  # a served request's prompt must not live on until the next one
            idle_write = self.pipeline.cache.pending() and not backlog
            if self.pipeline.reclaim and not backlog and self.inbox.empty():
                self.pipeline.reclaim = False

                reclaim.give_back()
            try:
                # with a write queued, wait idle_write_s for a request first (the TTL,
                # much longer, counts again after the write)
                wait = min(timeout, idle_s) if idle_write and timeout else (
                    idle_s if idle_write else timeout)
                item = backlog.popleft() if backlog else self.inbox.get(timeout=wait)
            except queue.Empty:
                if idle_write:  # idle for idle_s: a request now waits for one file
                    self.pipeline.cache.write_pending()
                    self._on_change()
                else:
                    self._unload()
                continue
            if item is None:
                self.pipeline.cache.flush(_FLUSH_S)
                return
            if isinstance(item, Swap):
                self._swap(item)
            elif self.max_batch <= 1 or self.slot.vision:  # mlx-vlm: one at a time
                serve_alone(self.pipeline, item)
            elif self._check_servable(item):
                # A request alone decodes with stream_generate (the in-process speed; one
                # stream on BatchGenerator measured 0.66 of it on an H200); it moves into a
                # batch when another request arrives.
                # A batch down to one request hands it back to decode alone (resume).
                joins = self._joins(item, backlog)
                if joins() or not self._can_start_alone(item):
                    backlog = run_batch(self.pipeline, item, self.inbox, self.max_batch,
                                        queued=backlog, alone=self._resume)
                elif (joined := serve_alone(self.pipeline, item, join=joins)) is not None:
                    backlog = run_batch(self.pipeline, None, self.inbox, self.max_batch,
                                        joined=joined, queued=backlog, alone=self._resume)

    def _resume(self, joined: Joined, join: Callable[[], bool]) -> Joined | None:
        return resume(self.pipeline, joined, join)

    def _served(self) -> None:
        self.requests_served += 1
        self._on_change()

    def _check_servable(self, job: Job) -> bool:
        """Get the model ready for ``job`` (reload after an idle unload); on failure post
        the error and end the job. Returns whether it can run."""
        try:
            if job.request.model and job.request.model != self.model_info.id:
                raise ModelUnavailable(f"model {job.request.model!r} is not loaded; "
                                       f"{self.model_info.id!r} is")
            if not self.slot.loaded:
                if self.state == "failed":  # a swap to a model that loads can fix this
                    raise ModelLoadError(f"the model failed to load: {self.error}")
                self._reload()
            # the batch admits only requests of its adapter (run_batch): a switch happens
            # only between batches
            self.slot.use_adapter(job.request.adapter)
        except EngineError as e:
            job.post(e)
            job.post(END)
            return False
        return True

    def _can_start_alone(self, job: Job) -> bool:
        """Whether ``job`` may decode alone first: only if it can move into a batch later
        (see :func:`kit.engine.decode.sequential.decode`): the model's KV cache can be trimmed
        (not recurrent or rotating) and no grammar constrains the output."""
        req = job.request
        if req.force_tool is not None or req.response_schema is not None:
            return False
        return self.slot.trimmable()

    def _joins(self, job: Job, backlog: deque) -> Callable[[], bool]:
        """Whether a request that could decode in one batch with ``job`` (the same
        adapter) is next in line, asked while ``job`` decodes alone: the head of
        ``backlog`` (items the worker took and has not served, ahead of the inbox) or else
        of the inbox. A request for another adapter at the head waits for ``job`` instead
        (:mod:`kit.engine.decode.adapters`), and what arrives after it waits behind it."""
        adapter = job.request.adapter
        return lambda: is_job(backlog[0], adapter) if backlog else \
            self.inbox.next_is_job(adapter)
