""":class:`HealthBody`: ``GET /health``'s body, the contract between the server and the CLI.

The server builds it from :meth:`kit.engine.interface.EngineLike.status`
(:meth:`kit.server.state.ServerState.health`); ``status``, ``launch``, ``stop``, the daemon
and the probe parse it (:func:`parse_health`) instead of reading keys. The OpenAPI schema
(``/openapi.json``) documents it. Imports pydantic, not fastapi: the CLI uses it.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.engine.status import (
    DistributedStatus,
    DraftStatus,
    EngineStatus,
    KvCacheStatus,
    MemoryStatus,
)

#: keys left out of the body when None (they appear once the engine reports them)
_OMITTED_WHEN_NONE = ("kv_cache", "admission", "distributed", "embeddings", "adapters",
                      "draft")


class SamplingDefaults(BaseModel):
    """Sampling for fields a request leaves out (the server's flags, else the model's);
    ``forced``: for every request, whatever it sets (``--force-sampling``)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    forced: bool = False


class EmbedStatus(BaseModel):
    """``/health``'s ``embeddings``: the embedding model served as ``local-embed``
    (:class:`kit.embed.process.EmbedProcess`)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    id: str = Field("local-embed", description="The id requests name.")
    model: str = Field(description="The model behind it.")
    state: str = Field(description="`loading`, `ready`, `failed` or `stopped`.")
    error: Optional[str] = None
    pid: Optional[int] = Field(None, description="The embedding process.")
    dims: Optional[int] = Field(None, description="The vectors' length.")
    window: Optional[int] = Field(None, description="Most tokens per input.")
    pooling: Optional[str] = Field(None, description="`mean`, `cls`, `lasttoken` or `model`.")
    weights_bytes: Optional[int] = None
    load_seconds: Optional[float] = None
    requests_served: int = 0
    inputs_served: int = 0
    restarts: int = Field(0, description="Embedding processes replaced after a crash.")


class HealthBody(BaseModel):
    """``GET /health``: 200 when ``status`` is ``ok``, else 503 with the same body.

    ``status`` is ``ok`` when the model is ready or unloaded (idle; the next request
    reloads it), else the engine's state (``loading``, ``failed``, ``restarting``,
    ``stopped``); ``model_state`` is always the engine's state.
    """

    model_config = ConfigDict(frozen=True, extra="allow")
    service: str = Field("mlx-kit", description="Always `mlx-kit`: how clients tell it is ours.")
    version: str = ""
    status: str
    # optional here so a minimal body ({"service", "status"}) still reads as ours; the
    # server always sets it
    model_state: Optional[str] = Field(None, description="The engine's state.")
    model: Optional[str] = Field(None, description="The model behind `local`.")
    context_window: Optional[int] = Field(None, description="Tokens.")
    pid: Optional[int] = Field(None, description="The server's process (HTTP).")
    requests_served: int = 0
    swaps: int = 0
    reloads: int = 0
    unloads: int = 0
    restarts: int = Field(0, description="Engine processes replaced.")
    engine_pid: Optional[int] = Field(None, description="The process that runs generation.")
    ttl: Optional[float] = Field(None, description="Idle seconds before an unload.")
    load_seconds: Optional[float] = None
    phase: Optional[str] = Field(None, description="`loading weights` or `warming up`.")
    swaps_pending: int = Field(0, description="Swaps queued or running.")
    memory: MemoryStatus = Field(default_factory=MemoryStatus)
    error: Optional[str] = Field(None, description="Why the engine is failed or restarting.")
    error_type: Optional[str] = Field(None, description="The error's kind (e.g. "
                                      "`model_does_not_fit`), which picks the CLI's exit code.")
    prompt_cache: Optional[dict[str, int]] = None
    kv_cache: Optional[KvCacheStatus] = Field(None, description="Absent until reported.")
    sampling_defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)
    admission: Optional[dict[str, Any]] = Field(None, description="Absent until reported.")
    distributed: Optional[DistributedStatus] = Field(None, description="Only for ranks.")
    embeddings: Optional[EmbedStatus] = Field(None, description="Only with --embed-model.")
    adapters: Optional[list[str]] = Field(None, description="Only with --adapter: the LoRA "
                                          "adapters' ids (local:NAME) served now.")
    draft: Optional[DraftStatus] = Field(None, description="Only with --draft-model: the "
                                         "draft loaded now and its acceptance.")

    @property
    def ok(self) -> bool:
        """Whether the server answers requests now (``status`` ``ok``)."""
        return self.status == "ok"

    @classmethod
    def build(cls, status: EngineStatus, *, version: str, model: str, pid: int,
              swaps_pending: int, sampling: dict[str, Any],
              memory: MemoryStatus | None = None,
              embeddings: dict[str, Any] | None = None,
              adapters: list[str] | None = None) -> "HealthBody":
        """The body of an engine's :class:`EngineStatus` and the server's own facts
        (``model``: the id behind ``local``; ``pid``: the HTTP process; ``memory``: fresher
        allocator counters than the status's; ``adapters``: the ids of the LoRA adapters
        served now, None without --adapter)."""
        s = status
        return cls(version=version, status="ok" if s.state in ("ready", "unloaded") else s.state,
                   model_state=s.state, model=model, context_window=s.context_window, pid=pid,
                   requests_served=s.requests_served, swaps=s.swaps, reloads=s.reloads,
                   unloads=s.unloads, restarts=s.restarts, engine_pid=s.pid, ttl=s.ttl,
                   load_seconds=s.load_seconds, phase=s.phase, swaps_pending=swaps_pending,
                   memory=memory or s.memory, error=s.error,
                   error_type=s.error_type if s.error else None, prompt_cache=s.prompt_cache,
                   kv_cache=s.kv_cache, sampling_defaults=SamplingDefaults(**sampling),
                   admission=s.admission or None, distributed=s.distributed,
                   embeddings=EmbedStatus(**embeddings) if embeddings else None,
                   adapters=adapters, draft=s.draft)

    def to_json(self) -> dict[str, Any]:
        """The body as sent: every field, ``kv_cache``/``admission``/``distributed`` only
        when set."""
        body = self.model_dump(mode="json")
        for key in _OMITTED_WHEN_NONE:
            if body.get(key) is None:
                body.pop(key, None)
        return body


def parse_health(body: Any) -> HealthBody | None:
    """``body`` (JSON) as a :class:`HealthBody`; None when it is not mlx-kit's /health
    (no ``service: mlx-kit``, or fields of the wrong type). Never raises."""
    if not isinstance(body, dict) or body.get("service") != "mlx-kit":
        return None
    try:
        return HealthBody.model_validate(body)
    except ValidationError:
        return None
