"""The engine seam: :class:`EngineLike`, what the server needs from whatever owns the
model, and :class:`SwapResult`. :class:`kit.engine.decode.engine.Engine` (in-process) and
:class:`kit.engine.proc.process.EngineProcess` (the same engine in a child process) satisfy
it; so does :class:`kit.engine.distributed.world_process.DistributedEngine` (see the Protocol's
docstring)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kit.engine.status import EngineStatus
from kit.engine.types import ChatRequest, Event
from kit.models.resolve import ModelInfo


@dataclass(frozen=True)
class SwapResult:
    """What a swap did: the model now behind ``local``, the one before, and how long the
    load took (seconds, resolve + fit check + load + warm-up; 0 when ``changed`` is
    False: it was loaded already)."""

    model: str
    previous: str
    load_seconds: float
    changed: bool


@runtime_checkable
class EngineLike(Protocol):
    """Whatever owns the model and serves generations, as the server sees it.

    State attributes (read by ``/health`` and ``/v1/models``; written only by the engine):

    - ``model_info``: the model behind ``local`` (:class:`kit.models.resolve.ModelInfo`).
    - ``state``: ``loading``, ``ready``, ``unloaded`` (idle past ``ttl``; reloaded on the
      next request), ``failed`` (``error`` says why), ``restarting`` (a dead engine process
      is being replaced) or ``stopped``.
    - ``error``: why it is ``failed``/``restarting``, else None.
    - ``requests_served``, ``swaps``, ``reloads``, ``unloads``, ``restarts``: counters
      since start (``restarts``: engine processes replaced; 0 in-process).
    - ``load_seconds``: the last load's duration in seconds, or None before one.
    - ``phase`` (optional; ``/health`` reads it with a default of None): what a load is
      doing, ``"loading weights"`` or ``"warming up"`` (:mod:`kit.engine.decode.warmup`), None
      when no load runs.
    - ``ttl``: idle seconds before an unload, or None for never.
    - ``pid``: the process that runs generation (None before it started).

    ``/health`` and ``/metrics`` read :meth:`status` (one typed record), not these.

    Every method is called from the server's event loop thread unless it says otherwise.

    :class:`kit.engine.distributed.world_process.DistributedEngine` (one model sharded over several
    ranks with ``mlx.distributed``) implements it on rank 0: ``start`` launches the ranks
    and returns once rank 0 connected (``state`` is ``ready`` when every shard loaded),
    ``generate`` queues on rank 0, ``memory``/``current_memory`` report rank 0 (each
    rank's in its ``distributed`` attribute), ``pid`` is ``mlx.launch``'s, and a rank lost
    is ``failed`` (not restarted). Every rank runs the same :class:`kit.engine.decode.engine.Engine`
    worker over a :class:`kit.engine.distributed.rank_inbox.RankInbox`, which gives the followers what
    rank 0's queue saw at the same sync points, so they mirror the pipeline
    (:class:`kit.engine.decode.pipeline.Pipeline`'s ``prepare``, each decode step, ``complete``)
    and the model-slot transitions (load, unload, swap), and their KV caches match.
    """

    model_info: ModelInfo
    state: str
    error: str | None
    requests_served: int
    swaps: int
    reloads: int
    unloads: int
    restarts: int
    load_seconds: float | None
    ttl: float | None

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None:
        """Start serving: the model loads in the background (``state`` ``loading``).
        Returns at once; call once."""

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block (not on the event loop) until the first load finished or failed, at most
        ``timeout`` seconds (None: no limit). Returns whether ``state`` is ``ready``."""

    def stop(self) -> None:
        """Stop: queued work finishes or is cancelled, then the engine exits. Idempotent."""

    def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Queue ``request`` (FIFO with swaps) and yield its events: one ``Started``,
        ``TextDelta``/``ReasoningDelta``/``ToolCall`` events, then one ``Finished``.
        Closing the iterator early cancels the request (its ``Finished`` then is not
        delivered). Sets ``request.request_id`` when it is empty.

        Raises (from the iterator, before ``Started`` unless generation itself fails):
            InvalidRequest: the request cannot run as given (``field`` names the part;
                ``code`` ``context_length_exceeded`` for a prompt over the window).
            ModelUnavailable: ``request.model`` is not the loaded model.
            ModelLoadError: the model failed to load.
            EngineUnavailable: the engine is stopping or its process died.
            EngineError: generation failed.
        """

    def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens ``request`` would take (chat template applied), without queueing
        it. May block for the engine's answer: call it from a worker thread.

        Raises:
            InvalidRequest: the template rejects the messages, or
                ``context_length_exceeded``.
            ModelLoadError: no tokenizer: the model failed to load.
            EngineUnavailable: the model is loading, or the engine did not answer.
        """

    async def count_tokens_async(self, request: ChatRequest) -> int:
        """:meth:`count_tokens` for the event loop: the same count, awaited without
        holding a worker thread while the engine answers (a stuck engine must not use up
        the loop's thread pool).

        Raises:
            The same as :meth:`count_tokens`; ``EngineUnavailable`` after 30 s without an
            answer.
        """

    async def swap(self, spec: str) -> SwapResult:
        """Make ``spec`` (a cache id or a folder) the model behind ``local``, after the
        requests queued before it; requests queued after it run on the new model. On
        failure the old model keeps serving.

        Raises:
            ModelNotFoundError, ModelError (ModelDoesNotFitError: not enough memory),
            EngineUnavailable: the engine is stopping or died.
        """

    def memory(self) -> dict[str, int | None]:
        """The last known allocator counters, bytes: ``active_bytes``, ``peak_bytes``,
        ``weights_bytes`` (None: unknown). Never blocks."""

    async def current_memory(self) -> dict[str, int | None]:
        """:meth:`memory` as of now (asks the engine; falls back to :meth:`memory`
        quickly, so ``/health`` always answers)."""

    def capabilities(self) -> dict[str, Any]:
        """What the loaded model's chat template supports: ``tools``, ``reasoning``
        (both False while unknown)."""

    def status(self) -> EngineStatus:
        """The engine's state as of its last report (:class:`kit.engine.status.EngineStatus`:
        state, counters, memory, prompt cache, KV settings, admission, ranks): what
        ``/health`` and ``/metrics`` show. Never blocks."""
