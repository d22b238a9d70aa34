""":class:`EngineStatus`: what an engine reports about itself (:meth:`EngineLike.status`).

One typed record instead of attributes read with ``getattr``: ``/health``
(:class:`kit.health.HealthBody`) and ``/metrics`` are built from it. Sizes are bytes, times
seconds; None means unknown or not yet reported.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Part(BaseModel):
    # extra allowed: a CLI parsing a newer server's /health keeps what it does not know
    model_config = ConfigDict(frozen=True, extra="allow")


class MemoryStatus(_Part):
    """mlx's allocator in the engine process, bytes (None: unknown, e.g. before mlx loaded)."""

    active_bytes: Optional[int] = Field(None, description="Bytes in live arrays now.")
    peak_bytes: Optional[int] = Field(None, description="Most bytes in live arrays so far.")
    weights_bytes: Optional[int] = Field(None, description="The loaded weights' size.")


class KvCacheStatus(_Part):
    """The KV cache's settings (``--kv-bits``) and how many layers quantize."""

    bits: Optional[int] = Field(None, description="4 or 8; None: full precision.")
    group_size: Optional[int] = Field(None, description="Values per scale (None: full precision).")
    quantized_start: Optional[int] = Field(None, description="0 when quantized from the first token.")
    quantized_layers: Optional[int] = Field(None, description="Layers whose cache quantizes "
                                            "(None before a load or at full precision).")
    layers: Optional[int] = Field(None, description="The loaded model's layers.")
    max_batch: Optional[int] = Field(None, description="Most requests decoded together.")


class DraftStatus(_Part):
    """Speculative decoding (``--draft-model``; :mod:`kit.engine.decode.draft`)."""

    model: Optional[str] = Field(None, description="The draft loaded beside the model now "
                                 "(None: the loaded model has no draft).")
    pairings: dict[str, str] = Field(default_factory=dict,
                                     description="Target model id -> its draft.")
    num_draft_tokens: int = Field(description="Tokens the draft proposes per step.")
    drafted: int = Field(0, description="Proposals the model checked, since start.")
    accepted: int = Field(0, description="Proposals the model kept.")
    acceptance: Optional[float] = Field(None, description="accepted / drafted (None: none "
                                        "drafted yet).")


class RankStatus(_Part):
    """One rank of a distributed engine."""

    rank: int
    host: Optional[str] = Field(None, description="As the flags named it (an address).")
    hostname: Optional[str] = Field(None, description="Its host name, as it reported.")
    pid: Optional[int] = None
    memory: Optional[MemoryStatus] = None


class DistributedStatus(_Part):
    """A model spread over ranks with mlx.distributed."""

    world_size: int
    backend: str = Field(description="ring, jaccl, mpi or nccl.")
    mode: str = Field(description="tensor or pipeline (parallelism).")
    ranks: list[RankStatus] = Field(default_factory=list)


class EngineStatus(_Part):
    """An engine's state as of now.

    ``state``: ``loading``, ``ready``, ``unloaded`` (idle past ``ttl``; the next request
    reloads), ``failed`` (``error`` says why; ``error_type`` its kind, e.g.
    ``model_does_not_fit``), ``restarting`` (a dead engine process is being replaced) or
    ``stopped``.
    """

    model: str = Field(description="The model behind `local` (its id).")
    context_window: Optional[int] = Field(None, description="Its context window, tokens.")
    state: str
    error: Optional[str] = None
    error_type: Optional[str] = None
    requests_served: int = 0
    swaps: int = 0
    reloads: int = 0
    unloads: int = 0
    restarts: int = Field(0, description="Engine processes replaced (0 in-process).")
    load_seconds: Optional[float] = Field(None, description="The last load's duration, s.")
    phase: Optional[str] = Field(None, description="What a load does now: `loading weights` "
                                 "or `warming up`; None when no load runs.")
    ttl: Optional[float] = Field(None, description="Idle seconds before an unload (None: never).")
    pid: Optional[int] = Field(None, description="The process that runs generation.")
    memory: MemoryStatus = Field(default_factory=MemoryStatus)
    prompt_cache: Optional[dict[str, int]] = Field(
        None, description="The prompt cache's counters (memory_hits, disk_hits, misses, "
        "memory_bytes, memory_entries, disk_bytes, disk_entries, disk_writes); None until "
        "the engine reported them.")
    kv_cache: Optional[KvCacheStatus] = None
    admission: Optional[dict[str, Any]] = Field(
        None, description="Memory admission: clamped, rejected, deferred, reserved_bytes, "
        "ceiling_bytes, ceiling_source, prompt_cache_bytes/entries/max_bytes.")
    distributed: Optional[DistributedStatus] = None
    draft: Optional[DraftStatus] = Field(None, description="Speculative decoding; absent "
                                         "without --draft-model.")


def status_of(engine: Any, **extra: Any) -> EngineStatus:
    """The :class:`EngineStatus` of an engine that keeps its state in attributes
    (:class:`kit.engine.decode.engine.Engine`, :class:`kit.engine.proc.process.EngineProcess`);
    ``extra``: fields that engine computes (``prompt_cache``, ``admission``, ...).

    Raises:
        pydantic.ValidationError: a value of the wrong type (a bug in the engine).
    """
    e = engine
    fields = {"model": e.model_info.id, "context_window": e.model_info.context_window,
              "state": e.state, "error": e.error, "error_type": e.error_type,
              "requests_served": e.requests_served, "swaps": e.swaps, "reloads": e.reloads,
              "unloads": e.unloads, "restarts": e.restarts, "load_seconds": e.load_seconds,
              "phase": e.phase, "ttl": e.ttl, "pid": e.pid, "memory": e.memory()}
    return EngineStatus.model_validate({**fields, **extra})
