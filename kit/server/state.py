"""What the routers share: the engine, model naming policy (aliases, swap on request), the
model catalog for /v1/models, the API key and the admin token."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kit import STABLE_MODEL_ID, __version__
from kit.engine.engine import Engine
from kit.engine.process import EngineProcess
from kit.engine.types import EngineError, SamplingParams
from kit.errors import KitError, ModelError, ModelNotFoundError
from kit.models.aliases import AliasTable
from kit.models.resolve import InvalidModelSpec
from kit.server.errors import APIError

_CATALOG_TTL_S = 10.0


@dataclass
class ServerState:
    """Attributes:
        engine: the engine that owns the model (the server runs it in its own process).
        api_key: required bearer / x-api-key on /v1 routes, or None for none.
        admin_token: required bearer on /admin routes (written to the pid file, 0600).
        aliases: model names served by ``local`` or another model.
        swap_on_request: a request naming another cached model swaps to it (else 404).
        default_temperature, default_top_p: sampling for requests that set none (None:
            the model's generation_config.json).
        started: server start time (unix seconds).
        swaps_pending: swaps handed to the engine and not yet done (/health; a swap waits
            for the requests queued before it, and requests sent after it wait for it).
    """

    engine: Engine | EngineProcess
    api_key: str | None = None
    admin_token: str | None = None
    aliases: AliasTable = field(default_factory=AliasTable)
    swap_on_request: bool = False
    default_temperature: float | None = None
    default_top_p: float | None = None
    started: float = field(default_factory=time.time)
    swaps_pending: int = 0
    _catalog: tuple[float, list] = (0.0, [])

    @property
    def model_id(self) -> str:
        return self.engine.model_info.id

    def sampling_defaults(self) -> SamplingParams:
        """Sampling for fields a request leaves out: the server's flags, else the loaded
        model's generation_config.json, else temperature 0.7 and top_p 1."""
        model = self.engine.model_info.sampling_defaults()
        return SamplingParams(
            temperature=self.default_temperature if self.default_temperature is not None
            else model.get("temperature", 0.7),
            top_p=self.default_top_p if self.default_top_p is not None
            else model.get("top_p", 1.0),
            top_k=int(model.get("top_k", 0)), min_p=model.get("min_p", 0.0))

    def catalog(self) -> list:
        """The model catalog (:func:`kit.models.catalog.scan`), re-read every 10 s."""
        at, entries = self._catalog
        if time.monotonic() - at > _CATALOG_TTL_S:
            from kit.models.catalog import scan

            entries = scan()
            self._catalog = (time.monotonic(), entries)
        return entries

    def available_ids(self) -> list[str]:
        return [STABLE_MODEL_ID, self.model_id] + [
            e.id for e in self.catalog() if e.loadable and e.id != self.model_id]

    def _not_found(self, requested: str) -> APIError:
        return APIError(404, f"model {requested!r} not found; available: "
                        + ", ".join(self.available_ids()), type="not_found_error",
                        param="model", code="model_not_found")

    async def resolve(self, requested: str) -> str | None:
        """Map a requested model name to the real id the request must run on (None: whatever
        is behind ``local``). Swaps first when ``swap_on_request`` allows it.

        Raises:
            APIError: 404 ``model_not_found`` listing the ids that exist, or the swap's error.
        """
        if requested == STABLE_MODEL_ID:
            return None
        if requested == self.model_id:
            return requested
        target = self.aliases.target(requested)
        if target is not None:
            return None if target == STABLE_MODEL_ID else await self.resolve(target)
        known = {e.id for e in self.catalog() if e.loadable}
        if requested not in known:  # never a download: only what is on this machine
            raise self._not_found(requested)
        if not self.swap_on_request:
            raise APIError(404, f"model {requested!r} is not loaded ({self.model_id!r} is); "
                           "swap with `mlx-kit swap` or start the server with "
                           "--swap-on-request", type="not_found_error", param="model",
                           code="model_not_found")
        await self.swap(requested)
        return requested

    async def swap(self, spec: str) -> dict:
        """Swap the model behind ``local``; errors become API errors (400 a name or folder
        that cannot be a model, 404 none by that name, 507 does not fit, 500 load failed)."""
        self.swaps_pending += 1  # engine.swap queues it before its first await
        try:
            result = await self.engine.swap(spec)
        except ModelNotFoundError as e:
            raise APIError(404, e.message + (f"; {e.hint}" if e.hint else ""),
                           type="not_found_error", param="model", code="model_not_found") from None
        except InvalidModelSpec as e:  # /etc, ../.., a megabyte of name: the client's mistake
            raise APIError(400, e.message + (f" ({e.hint})" if e.hint else ""),
                           param="model", code="invalid_model") from None
        except ModelError as e:
            fits = "does not fit" in e.message
            raise APIError(507 if fits else 500, e.message + (f" ({e.hint})" if e.hint else ""),
                           type="server_error", param="model",
                           code="insufficient_memory" if fits else "model_load_failed") from None
        except KitError as e:
            raise APIError(500, e.message, type="server_error") from None
        except EngineError as e:  # e.g. the engine process died during the load
            raise APIError(503, str(e), type="server_error", param="model") from None
        finally:
            self.swaps_pending -= 1
        self._catalog = (0.0, [])  # a starter may have been built
        return {"model": result.model, "previous": result.previous,
                "load_seconds": round(result.load_seconds, 3), "changed": result.changed}

    def model_entries(self) -> list[dict]:
        """/v1/models entries: ``local`` first (naming the real model), the loaded model,
        then every other model on this machine that can be served."""
        from kit.models.catalog import api_entry

        info = self.engine.model_info
        by_id = {e.id: e for e in self.catalog()}
        loaded = self.engine.state == "ready"
        entries = [api_entry(mid, by_id.get(info.id), real_id=info.id,
                             context_window=info.context_window, loaded=loaded)
                   for mid in (STABLE_MODEL_ID, info.id)]
        if self.engine.state in ("ready", "unloaded"):  # what mlx-lm detected beats a guess
            for e in entries:
                e["capabilities"] = {**e["capabilities"], **self.engine.capabilities()}
        entries += [api_entry(e.id, e, real_id=e.id) for e in self.catalog()
                    if e.loadable and e.id != info.id]
        extra = {"object": "model", "created": int(self.started), "owned_by": "mlx-kit"}
        return [{**e, **extra} for e in entries]

    def health(self, memory: dict | None = None) -> dict:
        """The /health body; ``memory``: the engine's (default: :meth:`Engine.memory`)."""
        e = self.engine
        return {"service": "mlx-kit", "version": __version__,
                "status": "ok" if e.state in ("ready", "unloaded") else e.state,
                "model_state": e.state, "model": self.model_id,
                "context_window": e.model_info.context_window, "pid": os.getpid(),
                "requests_served": e.requests_served, "swaps": e.swaps, "reloads": e.reloads,
                "unloads": e.unloads, "restarts": getattr(e, "restarts", 0),
                "engine_pid": getattr(e, "pid", os.getpid()), "ttl": e.ttl,
                "load_seconds": e.load_seconds, "swaps_pending": self.swaps_pending,
                "memory": e.memory() if memory is None else memory, "error": e.error,
                "sampling_defaults": {k: getattr(d, k) for d in [self.sampling_defaults()]
                                      for k in ("temperature", "top_p", "top_k", "min_p")}}
