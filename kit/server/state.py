"""What the routers share: the engine, model naming policy (aliases, swap on request), the
model catalog for /v1/models (a snapshot rescanned off the event loop), the API key and the
admin token."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kit import STABLE_MODEL_ID, __version__
from kit.engine.interface import EngineLike
from kit.engine.types import SamplingParams
from kit.errors import KitError
from kit.health import HealthBody
from kit.models.adapters import SEPARATOR as ADAPTER_SEPARATOR, adapter_of
from kit.models.aliases import AliasTable
from kit.models.catalog import CatalogCache, CatalogEntry, served_entries
from kit.server.content.media import MediaLimits, MediaReader
from kit.server.errors import APIError, api_error
from kit.engine.status import MemoryStatus

if TYPE_CHECKING:
    from kit.embed.process import EmbedProcess
    from kit.engine.types import ChatRequest


#: The sampling fields the server has defaults for (/health's ``sampling_defaults``), and
#: that ``--force-sampling`` takes from the server instead of the request.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p")


@dataclass
class ServerState:
    """Attributes:
        engine: the engine that owns the model (the server runs an
            :class:`kit.engine.proc.process.EngineProcess`: the engine in its own process).
        api_key: required bearer / x-api-key on /v1 routes, or None for none.
        admin_token: required bearer on /admin routes (written to the pid file, 0600).
        aliases: model names served by ``local`` or another model.
        swap_on_request: a request naming another cached model swaps to it (else 404).
        default_temperature, default_top_p: sampling for requests that set none (None:
            the model's generation_config.json).
        force_sampling: :meth:`sampling_defaults` replaces a request's own temperature,
            top_p, top_k and min_p (``--force-sampling``).
        started: server start time (unix seconds).
        catalog_cache: the models on this machine, rescanned in a background thread.
        swaps_pending: swaps handed to the engine and not yet done (/health; a swap waits
            for the requests queued before it, and requests sent after it wait for it).
        embedder: the embedding model's process (``--embed-model``), listed as
            ``local-embed``; None when the server serves none.
        adapters: the LoRA adapters' names (``--adapter NAME=PATH``), each served as
            ``local:NAME`` while ``adapters_for``, the model they were trained on (the
            one the server started with), is the one loaded.
        media_limits: the bounds on a request's images (``--max-image-bytes``,
            ``--max-image-pixels``, ``--max-images``; :mod:`kit.server.content.media`).
    """

    engine: EngineLike
    api_key: str | None = None
    admin_token: str | None = None
    aliases: AliasTable = field(default_factory=AliasTable)
    swap_on_request: bool = False
    default_temperature: float | None = None
    default_top_p: float | None = None
    force_sampling: bool = False
    started: float = field(default_factory=time.time)
    catalog_cache: CatalogCache = field(default_factory=CatalogCache)
    swaps_pending: int = 0
    embedder: EmbedProcess | None = None
    adapters: tuple[str, ...] = ()
    adapters_for: str | None = None
    media_limits: MediaLimits = field(default_factory=MediaLimits)

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

    def media_reader(self) -> MediaReader:
        """A new request's :class:`~kit.server.content.media.MediaReader`: the server's
        image bounds, and whether the model loaded now takes images and audio (the engine's
        ``capabilities()["vision"]`` and ``["audio"]``; a text-only model refuses every
        media part unread)."""
        caps = self.engine.capabilities()
        return MediaReader(self.media_limits, vision=bool(caps.get("vision", False)),
                           audio=bool(caps.get("audio", False)))

    def catalog(self) -> list[CatalogEntry]:
        """The model catalog's last snapshot (:class:`~kit.models.catalog.CatalogCache`: a
        read older than 10 s starts a rescan in the background). Never scans on the
        caller's thread; blocks only before the first scan ended, which ``serve`` waits for
        before it listens. In a coroutine prefer :meth:`load_catalog`."""
        return self.catalog_cache.get()

    async def load_catalog(self) -> list[CatalogEntry]:
        """:meth:`catalog` for coroutines: before the first snapshot exists it is awaited,
        never waited for on the event loop."""
        return await asyncio.wrap_future(self.catalog_cache.when_ready())

    def available_ids(self) -> list[str]:
        return [STABLE_MODEL_ID, *self._adapter_ids(), self.model_id] + [
            e.id for e in self.catalog() if e.loadable and e.id != self.model_id]

    def _adapter_ids(self) -> list[str]:
        """``local:NAME`` of each adapter, while the model they run on is loaded."""
        if self.adapters_for != self.model_id:
            return []
        return [f"{STABLE_MODEL_ID}{ADAPTER_SEPARATOR}{n}" for n in self.adapters]

    def split_adapter(self, requested: str) -> tuple[str, str | None]:
        """``(model name, adapter)`` of a requested name: ``local:NAME`` (or
        ``<model id>:NAME``, ``<alias of local>:NAME``, an alias whose target is
        ``local:NAME``) -> ``("local", NAME)``; any other name -> ``(name, None)``.

        Raises:
            APIError: 404 ``model_not_found`` for ``local:NAME`` when no adapter NAME is
                mounted, or when the model the adapters run on is not the one loaded.
        """
        target = self.aliases.target(requested)
        if target is not None and adapter_of(target, self.adapters) is not None:
            requested = target  # --alias NAME=local:ADAPTER
        found = adapter_of(requested, self.adapters)
        if found is None:
            base = requested.rpartition(ADAPTER_SEPARATOR)[0]
            if base == STABLE_MODEL_ID or self.adapters and base and (
                    base == self.adapters_for or self.aliases.target(base) == STABLE_MODEL_ID):
                # local:TYPO, or claude-*:TYPO, which the claude-* alias would otherwise
                # serve with the base model as if no adapter had been asked for
                raise self._not_found(requested)
            return requested, None
        base, name = found
        if base not in (STABLE_MODEL_ID, self.adapters_for) and \
                self.aliases.target(base) != STABLE_MODEL_ID:  # claude-*:NAME is local:NAME
            raise self._not_found(requested)
        if self.adapters_for != self.model_id:
            raise APIError(404, f"adapter {name!r} runs on {self.adapters_for!r}, and "
                           f"{self.model_id!r} is loaded", type="not_found_error",
                           param="model", code="model_not_found")
        return STABLE_MODEL_ID, name

    def _not_found(self, requested: str) -> APIError:
        return APIError(404, f"model {requested!r} not found; available: "
                        + ", ".join(self.available_ids()), type="not_found_error",
                        param="model", code="model_not_found")

    async def resolve(self, requested: str) -> str | None:
        """Map a requested model name to the real id the request must run on (None: whatever
        is behind ``local``). Swaps first when ``swap_on_request`` allows it.

        A LoRA adapter's name (``local:NAME``, :meth:`split_adapter`) resolves as the
        model it runs on: routes that only count tokens or describe the model take it as
        they take ``local``.

        Raises:
            APIError: 404 ``model_not_found`` listing the ids that exist (an adapter not
                mounted too), or the swap's error.
        """
        requested = self.split_adapter(requested)[0]
        if requested == STABLE_MODEL_ID:
            return None
        if requested == self.model_id:
            return requested
        target = self.aliases.target(requested)
        if target is not None:
            return None if target == STABLE_MODEL_ID else await self.resolve(target)
        known = {e.id for e in await self.load_catalog() if e.loadable}
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
        except KitError as e:  # not found, not a model, does not fit, failed to load, died
            error = api_error(e)
            error.param = "model"
            raise error from None
        finally:
            self.swaps_pending -= 1
        # a starter may have been built: list it as it is now (a scan that ran during the
        # swap may have missed it), rescanned in the background thread, awaited here
        try:
            await asyncio.wrap_future(self.catalog_cache.refresh(force=True))
        except Exception:  # logged by the scan; the swap itself succeeded
            pass
        return {"model": result.model, "previous": result.previous,
                "load_seconds": round(result.load_seconds, 3), "changed": result.changed}

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt's token count (:meth:`Engine.count_tokens`) without holding a worker
        thread while the engine process answers: a stuck engine must not use up the event
        loop's thread pool (as it once did /health's). An in-process engine tokenizes on a
        worker thread.

        Raises:
            EngineError: the engine's (e.g. ``EngineUnavailable`` after 30 s).
        """
        return await self.engine.count_tokens_async(request)

    def model_entries(self, catalog: list[CatalogEntry] | None = None) -> list[dict]:
        """/v1/models entries (:func:`~kit.models.catalog.served_entries`): ``local`` first
        (naming the real model), the loaded model, then every other model on this machine
        that can be served. ``catalog``: a snapshot from :meth:`load_catalog` (default
        :meth:`catalog`)."""
        info = self.engine.model_info
        # what mlx-lm detected on the loaded model beats the catalog's guess
        detected = self.engine.capabilities() if self.engine.state in (
            "ready", "unloaded") else None
        entries = served_entries(self.catalog() if catalog is None else catalog, info.id,
                                 context_window=info.context_window,
                                 loaded=self.engine.state == "ready", detected=detected)
        entries[1:1] = [{**entries[0], "id": mid, "adapter": mid.partition(
            ADAPTER_SEPARATOR)[2]} for mid in self._adapter_ids()]
        if self.embedder is not None:
            entries.append(self.embedder.api_entry())
        extra = {"object": "model", "created": int(self.started), "owned_by": "mlx-kit"}
        return [{**e, **extra} for e in entries]

    def health(self, memory: dict | None = None) -> HealthBody:
        """The /health body (:class:`kit.health.HealthBody`) of the engine's
        :meth:`~kit.engine.interface.EngineLike.status`; ``memory``: fresher allocator
        counters (default: the status's, the engine's last report)."""
        d = self.sampling_defaults()
        return HealthBody.build(
            self.engine.status(), version=__version__, model=self.model_id, pid=os.getpid(),
            swaps_pending=self.swaps_pending,
            sampling={**{k: getattr(d, k) for k in SAMPLING_FIELDS},
                      "forced": self.force_sampling},
            memory=MemoryStatus.model_validate(memory) if memory is not None else None,
            embeddings=None if self.embedder is None else self.embedder.status(),
            adapters=self._adapter_ids() if self.adapters else None)
