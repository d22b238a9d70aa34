"""The model slot's transitions, run on :class:`kit.engine.decode.engine.Engine`'s worker: the
first load and a reload after an idle unload (the TTL), the unload itself, and a swap to
another model. Each updates the engine's public state (``state``, ``error``, ``phase``,
the counters) and reports it through ``_on_change``, as the scheduler does.

Kept apart from the scheduler (:mod:`kit.engine.decode.engine`): the worker loop decides
*when* (queue order, the TTL's timeout); this module decides *how* a model comes and goes
(checks agreed on every rank, the old model kept until the new one loaded).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kit.engine.decode.run import Swap
from kit.engine.interface import SwapResult
from kit.engine.types import ModelLoadError
from kit.errors import KitError, ModelError
from kit.models.resolve import ModelInfo, resolve_model

if TYPE_CHECKING:
    from collections.abc import Callable

    from kit.engine.decode.pipeline import Pipeline
    from kit.engine.decode.slot import ModelSlot

log = logging.getLogger("mlx_kit.engine")


class ModelTransitions:
    """The transitions of :class:`kit.engine.decode.engine.Engine`'s model (a mixin: the
    engine holds the state they change; only its worker calls them)."""

    # the engine's, set in its __init__
    slot: ModelSlot
    pipeline: Pipeline
    state: str
    error: str | None
    error_type: str | None
    phase: str | None
    ttl: float | None
    swaps: int
    reloads: int
    unloads: int
    _on_change: Callable[[], None]
    _agree: Callable[[BaseException | None], BaseException | None]
    model_info: ModelInfo

    def _install(self, loaded: Any) -> None:
        """Make ``loaded`` the slot's model and let the prompt cache take its identity
        now (the disk tier's: a folder re-converted in place later is not this model)."""
        self.slot.install(loaded)
        self.pipeline.cache.model_installed()

    def _release(self, keep_tokenizer: bool = False) -> None:
        self.pipeline.cache.clear()  # the prompt caches belong to the model
        self.pipeline.vision_caches.clear()
        self.slot.release(keep_tokenizer)

    def _unload(self) -> None:
        self._release(keep_tokenizer=True)  # small; count_tokens keeps working
        self.state = "unloaded"
        self.unloads += 1
        self._on_change()
        log.info("unloaded %s after %.0f s idle", self.model_info.id, self.ttl or 0)

    def _reload(self) -> None:
        t0 = time.perf_counter()
        self.state = "loading"
        self._on_change()
        try:
            self._install(self._load(self.model_info, replacing=0))
        except KitError as e:
            self.state = "unloaded"
            self._on_change()
            raise ModelLoadError(f"reloading {self.model_info.id} failed: {e.message}") from None
        self.state = "ready"
        self.reloads += 1
        self._on_change()
        log.info("reloaded %s in %.2f s", self.model_info.id, time.perf_counter() - t0)

    def _load(self, info: ModelInfo, replacing: int) -> Any:
        """:meth:`ModelSlot.load` after its checks (fit, split) passed on every rank
        (``agree``). Raises the checks' error, or the load's."""
        self._set_phase("loading weights")
        try:
            error, weights = None, 0
            try:
                weights = self.slot.check_fit(info, replacing)
            except Exception as e:
                error = e
            error = self._agree(error)
            if error is not None:
                raise error
            return self.slot.load(info, replacing, weights=weights, on_phase=self._set_phase)
        finally:
            self.phase = None  # reported with the state the caller sets next

    def _set_phase(self, phase: str | None) -> None:
        """Say what the load is doing (``/health``'s ``phase``). A distributed rank reports
        it with its next state change only: there every report is a collective, which
        all ranks must reach at the same points."""
        self.phase = phase
        if self.slot.split is None:
            self._on_change()

    def _swap(self, item: Swap) -> None:
        t0 = time.perf_counter()
        previous = self.model_info.id
        try:
            error = None
            try:
                info = resolve_model(item.spec, progress=log.info)
            except Exception as e:
                error = e
            error = self._agree(error)  # every rank found it, or none loads
            if error is not None:
                raise error
            if info.id == previous and self.slot.loaded:
                item.done(SwapResult(info.id, previous, 0.0, False))
                return
            log.info("swapping %s -> %s", previous, info.id)
            loaded = self._load(info, replacing=self.slot.weights_bytes
                                if self.slot.loaded else 0)
        except Exception as e:
            log.warning("swap to %s failed, %s keeps serving: %s", item.spec, previous, e)
            if self.slot.split is None:
                self._on_change()  # the phase is over
            item.done(error=e if isinstance(e, KitError) else ModelError(f"swap failed: {e}"))
            return
        self._release()  # drop every reference to the old model before taking the new one
        self._install(loaded)
        self.state, self.error, self.error_type = "ready", None, None
        self.swaps += 1
        self._on_change()
        took = time.perf_counter() - t0
        log.info("swapped %s -> %s in %.2f s", previous, info.id, took)
        item.done(SwapResult(info.id, previous, took, True))
