"""What the routers share: the engine, the served model's metadata, the API key."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kit import STABLE_MODEL_ID, __version__
from kit.engine.engine import Engine
from kit.engine.types import SamplingParams
from kit.server.errors import APIError


@dataclass
class ServerState:
    """Attributes:
        engine: the engine that owns the model.
        api_key: required bearer / x-api-key on /v1 routes, or None for none.
        default_temperature, default_top_p: sampling for requests that set none.
        started: server start time (unix seconds).
    """

    engine: Engine
    api_key: str | None = None
    default_temperature: float = 0.7
    default_top_p: float = 1.0
    started: float = field(default_factory=time.time)

    @property
    def model_id(self) -> str:
        return self.engine.model_info.id

    def sampling_defaults(self) -> SamplingParams:
        """Sampling for fields a request leaves out (max_tokens: the model's output cap)."""
        return SamplingParams(max_tokens=self.engine.model_info.max_output_tokens,
                              temperature=self.default_temperature, top_p=self.default_top_p)

    def resolve(self, requested: str) -> str:
        """Map a requested model name to the served model's real id.

        Raises:
            APIError: 404 ``model_not_found`` listing the ids that exist.
        """
        if requested in (STABLE_MODEL_ID, self.model_id):
            return self.model_id
        raise APIError(404, f"model {requested!r} not found; available: "
                       f"{STABLE_MODEL_ID}, {self.model_id}", type="not_found_error",
                       param="model", code="model_not_found")

    def model_entries(self) -> list[dict]:
        """The /v1/models entries: ``local`` first (naming the real model), then the real id."""
        info = self.engine.model_info
        meta = {"context_window": info.context_window, "max_tokens": info.max_output_tokens,
                "capabilities": {"tools": False, "reasoning": False, "vision": False}}
        created = int(self.started)
        return [
            {"id": STABLE_MODEL_ID, "object": "model", "created": created,
             "owned_by": "mlx-kit", "name": f"{info.id} (mlx-kit)", "model": info.id, **meta},
            {"id": info.id, "object": "model", "created": created, "owned_by": "mlx-kit",
             "name": info.id, "model": info.id, **meta},
        ]

    def health(self) -> dict:
        e = self.engine
        return {"service": "mlx-kit", "version": __version__, "status": "ok"
                if e.state == "ready" else e.state, "model": self.model_id,
                "context_window": e.model_info.context_window, "pid": os.getpid(),
                "requests_served": e.requests_served, "load_seconds": e.load_seconds,
                "error": e.error}
