"""The model slot: the one loaded model, its tokenizer and what is derived from them.

:class:`ModelSlot` checks that a model fits (memory policy), loads and warms it up,
installs it, releases it (all of it, or all but the small tokenizer, so token counts keep
working while unloaded) and answers what the loaded model is and can do. It keeps no
public state beyond the loaded objects: the engine (:mod:`kit.engine.decode.engine`) decides
when to load, unload, reload or swap, and reports it.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit import mlx_lm_api
from kit.blas import preload_blas
from kit.engine.cache.kv import layer_kinds, quantized_cache, refuse_unquantizable
from kit.engine.decode import vision, warmup
from kit.engine.decode.adapters import mount
from kit.engine.decode.fit import check_fit
from kit.engine.decode.grammar import ll_tokenizer
from kit.engine.decode.prompt_bound import TokenBound
from kit.engine.decode.warmup import first_use
from kit.errors import ConfigError, ModelError, ModelUnavailable
from kit.formats.select import for_tokenizer
from kit.models.adapters import read_adapter
from kit.models.model_config import remote_code
from kit.models.resolve import ModelInfo
from kit.models.vision import is_audio_model

log = logging.getLogger("mlx_kit.engine")


@dataclass(frozen=True)
class Loaded:
    """A model loaded and warmed up but not installed yet (a swap installs it only once
    the old model is released): ``weights_bytes`` is the estimate of its weights' size
    (0 when it could not be estimated)."""

    info: ModelInfo
    model: Any
    tokenizer: Any
    weights_bytes: int
    ceiling: Any = None  # the kit.models.memory.Ceiling its fit was checked against
    kv_per_token: int = 0  # KV cache bytes per token of context (0: no estimate)
    adapters: Any = None  # its kit.engine.decode.adapters.AdapterSet (None: none mounted)
    processor: Any = None  # a vision model's mlx-vlm processor (kit.engine.decode.vision)
    draft: Any = None  # its kit.engine.decode.draft.LoadedDraft (None: no draft paired)


class ModelSlot:
    """Holds at most one model.

    Attributes:
        info: the model behind ``local`` (loaded or not).
        model, tokenizer: mlx-lm's model and ``TokenizerWrapper``, or None (the tokenizer
            outlives an idle unload).
        weights_bytes: the installed model's weights, bytes (its estimate).
        ceiling: the installed model's :class:`kit.models.memory.Ceiling` (measured
            when it loaded; None: no estimate), which memory admission
            (:mod:`kit.engine.cache.admission`) holds its requests under.
        kv_per_token: the installed model's KV cache bytes per token (0: no estimate).
        memory_budget: bytes a model may need at most (None: on Metal the GPU working
            set, else the memory available now plus what the replaced model frees).
        split: ``(rank, world size, pipeline, ranks on this host)`` on a distributed
            engine's ranks: fit checks count this rank's share of the model (and the
            shares of the ranks beside it on this machine); None: the whole model here.
        loader: ``(path, trust_remote_code) -> (model, tokenizer)``; None: ``mlx_lm.load``
            (a distributed engine's ranks pass a sharded load, see :mod:`kit.engine.distributed.rank`).
        trust_remote_code: let a checkpoint's own Python code (a tokenizer named by
            ``auto_map`` in tokenizer_config.json, an architecture named by ``model_file``
            in config.json) run when it loads; off unless ``serve --trust-remote-code``.
        warmup: ``auto``, ``on`` or ``off``: what :meth:`load` runs before the model is
            installed (:mod:`kit.engine.decode.warmup`; a distributed rank never runs the full
            warm-up, only :func:`kit.engine.decode.warmup.first_use` unless ``off``).
        max_batch: the engine's most requests decoded together (the batch sizes warmed).
        kv_bits, kv_group_size: the quantized KV cache (``serve --kv-bits``, 4 or 8; None:
            full precision) and its group size (elements per scale and bias; 64 by
            default); :meth:`new_cache` builds caches with them (:mod:`kit.engine.cache.kv`).
        kv_layers: ``(quantized layers, all layers)`` of the loaded model's cache with
            ``kv_bits`` (None before a load or without ``kv_bits``).
        adapters: the LoRA adapters (name -> :class:`kit.models.adapters.Adapter`) mounted
            whenever the model the slot was made with loads (not on a model swapped to);
            ``mounted``: their :class:`kit.engine.decode.adapters.AdapterSet` on the
            installed model, or None.
        drafts: the speculative-decoding pairings and the draft loaded now
            (:class:`kit.engine.decode.draft.Drafts`), or None without ``--draft-model``.
        compile_decode: ``--compile-decode`` (``on``, ``off``; see
            :mod:`kit.engine.decode.compiled`).
    """

    def __init__(self, info: ModelInfo, memory_budget: int | None = None, *,
                 trust_remote_code: bool = False, loader: Any = None,
                 split: tuple[int, int, bool, int] | None = None, warmup: str = "auto",
                 max_batch: int = 8, kv_bits: int | None = None,
                 kv_group_size: int = 64, adapters: dict[str, Any] | None = None,
                 max_image_tokens: int | None = None, drafts: Any = None,
                 compile_decode: str = "off") -> None:
        # kv_bits/kv_group_size were checked once, by kit.config.EngineConfig
        self.kv_bits = kv_bits
        self.kv_group_size = kv_group_size
        self.kv_layers: tuple[int, int] | None = None
        self.info = info
        self.adapters = dict(adapters or {})
        self._adapters_for = info.id  # they were trained on this model
        self.mounted: Any = None
        self.warmup = warmup
        self.max_batch = max_batch
        self._loader = loader
        self.split = split
        self.memory_budget = memory_budget
        self.trust_remote_code = trust_remote_code
        self.model: Any = None
        self.tokenizer: Any = None
        self.processor: Any = None  # a vision model's (mlx-vlm); None for a text model
        self.max_image_tokens = max_image_tokens  # serve --max-image-tokens
        self.drafts = drafts
        self._compile_mode = compile_decode
        self._compile: bool | None = None  # the mode resolved for this device, once
        self._vision_for: tuple[Any, bool, bool] | None = None  # (path, images, audio)
        self.weights_bytes = 0
        self.ceiling: Any = None
        self.kv_per_token = 0
        self._checked: tuple[Any, int] = (None, 0)  # check_fit's (ceiling, kv per token)
        self._grammar_tokenizer: Any = None  # llguidance's view of the tokenizer, lazily
        self._trimmable: bool | None = None  # the loaded model's KV cache, lazily
        self._bound_for: tuple[Any, Any] | None = None  # (tokenizer, its TokenBound)
        self._format_for: tuple[Any, Any] | None = None  # (tokenizer, its OutputFormat)

    @property
    def loaded(self) -> bool:
        """Whether a model is installed (not released or unloaded)."""
        return self.model is not None

    # -- load / install / release ------------------------------------------------------------

    def load(self, info: ModelInfo, replacing: int, weights: int | None = None,
             on_phase: Callable[[str], None] | None = None) -> Loaded:
        """Check ``info`` fits, load it and warm it up (the slot is unchanged).

        Args:
            replacing: bytes of weights that will be freed once this load succeeds.
            weights: what :meth:`check_fit` returned when the caller ran it already
                (None: run it here).
            on_phase: called with ``"warming up"`` when the full warm-up starts (see
                :mod:`kit.engine.decode.warmup`), for ``/health``'s ``phase``.

        Raises:
            ModelDoesNotFitError: the estimate is over the budget.
            ModelError: mlx-lm cannot load it (naming ``--trust-remote-code`` when the
                checkpoint ships code of its own and that was not allowed).
        """
        blas = preload_blas()
        if weights is None:
            weights = self.check_fit(info, replacing)
        t0 = time.perf_counter()
        trust = self.trust_remote_code
        processor = None
        try:
            # False, not None: transformers would otherwise ask on stdin (and wait 15 s)
            if vision.is_vision_folder(info.path):
                self._refuse_for_vision(info)
                model, tokenizer, processor = vision.load(str(info.path), trust,
                                                          self.max_image_tokens)
            elif self._loader is not None:
                model, tokenizer = self._loader(str(info.path), trust)
            else:
                model, tokenizer = mlx_lm_api.load(str(info.path),
                                        tokenizer_config={"trust_remote_code": trust},
                                        trust_remote_code=trust)
        except ModelError:
            raise
        except Exception as e:
            code = None if trust else remote_code(info.path)
            if code is None:
                raise ModelError(f"cannot load {info.id}: {e}") from None
            raise ModelError(
                f"cannot load {info.id}: {e}\n{code} is Python code shipped with the model, "
                f"which mlx-kit runs only when told to: start the server with --trust-remote-code "
                f"(serve, or launch when no server runs: `mlx-kit stop` first) if you trust "
                f"that code; it runs with your user's rights",
                hint="--trust-remote-code runs the code of the model's repository") from None
        if processor is not None:  # mlx-lm's warm-up and KV checks drive a text model
            log.info("loaded %s through mlx-vlm in %.2f s (vision; one request at a time)",
                     info.id, time.perf_counter() - t0)
            self._bound_for = (tokenizer, TokenBound.from_tokenizer(tokenizer))
            ceiling, kv_per_token = self._checked
            return Loaded(info, model, tokenizer, weights, ceiling, kv_per_token, None,
                          processor)
        # With --kv-bits, one tiny generation on the quantized cache first: a model whose
        # attention cannot read one (or whose head size the group size does not divide)
        # is refused here, whatever the warm-up mode
        cache = self._kv_cache(info, model)
        if self.kv_bits is not None:
            try:
                first_use(model, tokenizer, cache)
            except Exception as e:
                raise ModelError(
                    f"--kv-bits {self.kv_bits} --kv-group-size {self.kv_group_size}: "
                    f"{info.id} cannot run with a quantized KV cache: {e}",
                    hint="try another --kv-group-size (a divisor of the model's head size), "
                         "or serve it without --kv-bits") from None
        del cache
        self._warm(model, tokenizer, on_phase)

        bound = TokenBound.from_tokenizer(tokenizer)  # now, not on the first request
        if bound is None:
            log.info("no prompt-length bound for this tokenizer: prompts over the context "
                     "window are tokenized in full before they are rejected")
        self._bound_for = (tokenizer, bound)
        log.info("loaded %s in %.2f s (BLAS: %s)", info.id, time.perf_counter() - t0,
                 blas or "bundled")
        ceiling, kv_per_token = self._checked
        mounted = None
        if self.adapters and info.id == self._adapters_for:
            # each config read again, so a reload after an idle unload sees the config
            # that belongs to the weights on disk now (an adapter retrained in place)
            try:
                current = {n: read_adapter(n, a.path) for n, a in self.adapters.items()}
            except ConfigError as e:
                raise ModelError(e.message, hint=e.hint) from None
            mounted = mount(model, current)
        draft = self.drafts.load(info, tokenizer) if self.drafts is not None else None
        return Loaded(info, model, tokenizer, weights, ceiling, kv_per_token, mounted,
                      draft=draft)

    def _refuse_for_vision(self, info: ModelInfo) -> None:
        """What a vision model cannot run with here (raises ModelError naming the flag)."""
        flag = ("--ranks/--hosts" if self.split is not None else
                "--kv-bits" if self.kv_bits is not None else
                "--adapter" if self.adapters and info.id == self._adapters_for else None)
        if flag is not None:
            raise ModelError(f"{info.id} is a vision model (served through mlx-vlm), which "
                             f"mlx-kit does not run with {flag}",
                             hint=f"serve it without {flag}")

    def _warm(self, model: Any, tokenizer: Any,
              on_phase: Callable[[str], None] | None) -> None:
        """What ``warmup`` asks for before the model is installed (see :mod:`kit.engine.decode.warmup`)."""
        if self.warmup == "off":
            return
        if self.split is None and warmup.wanted(self.warmup):
            if on_phase is not None:
                on_phase("warming up")
            # caches as requests get them (quantized with --kv-bits), so the same kernels
            warmup.warm_up(model, tokenizer, max_batch=self.max_batch,
                           new_cache=lambda: self.new_cache(model),
                           batching=self.kv_bits is None)
        elif self.kv_bits is None:  # with --kv-bits load() has run it on a quantized cache
            warmup.first_use(model, tokenizer)

    def check_fit(self, info: ModelInfo, replacing: int) -> int:
        """The estimated weights of ``info`` in bytes (0: no estimate, which is allowed;
        :func:`kit.engine.decode.fit.check_fit`); the ceiling and KV bytes per token it
        was checked with are kept for :meth:`load`.

        Raises:
            ModelDoesNotFitError: see :func:`kit.engine.decode.fit.check_fit`.
        """
        self._checked = (None, 0)
        weights, ceiling, kv_per_token = check_fit(self, info, replacing)
        self._checked = (ceiling, kv_per_token)
        return weights

    def _kv_cache(self, info: ModelInfo, model: Any) -> list[Any]:
        """:meth:`new_cache` for ``model`` (being loaded), after checking that ``kv_bits``
        can quantize some of its layers (logging which keep full precision).

        Raises:
            ModelError: ``kv_bits`` is set and no layer's cache can be quantized.
        """
        if self.kv_bits is not None:
            plain = mlx_lm_api.make_prompt_cache(model)
            n, total = refuse_unquantizable(info.id, plain, self.kv_bits)
            if n < total:
                log.info("--kv-bits %d: %d of %d layers quantized; the %s layers keep full "
                         "precision (mlx-lm has no quantized form of them)", self.kv_bits,
                         n, total, ", ".join(layer_kinds(plain)[1]))
        return self.new_cache(model)

    def new_cache(self, model: Any = None) -> list[Any]:
        """An empty prompt cache for ``model`` (default: the loaded one):
        ``make_prompt_cache``, with every layer mlx-lm can quantize as a
        ``QuantizedKVCache`` (``kv_bits``, ``kv_group_size``) when ``kv_bits`` is set
        (:mod:`kit.engine.cache.kv`)."""
        cache = mlx_lm_api.make_prompt_cache(self.model if model is None else model)
        if self.kv_bits is None:
            return cache

        return quantized_cache(cache, self.kv_bits, self.kv_group_size)

    def install(self, loaded: Loaded) -> None:
        """Make ``loaded`` the slot's model (release the old one first)."""
        self.model, self.tokenizer, self.info = loaded.model, loaded.tokenizer, loaded.info
        self.processor = loaded.processor
        self.weights_bytes = loaded.weights_bytes
        self.mounted = loaded.adapters
        if self.mounted is not None:
            self.weights_bytes += self.mounted.nbytes
        if self.drafts is not None:  # its weights are in weights_bytes (check_fit)
            self.drafts.loaded = loaded.draft
        self.ceiling, self.kv_per_token = loaded.ceiling, loaded.kv_per_token
        if self.kv_bits is not None:  # QuantizedKVCache layers have ``bits``
            cache = self.new_cache()
            self.kv_layers = (sum(1 for c in cache if hasattr(c, "bits")), len(cache))

    def use_adapter(self, name: str | None) -> None:
        """Run the installed model with adapter ``name`` (None: the base model).

        Raises:
            ModelUnavailable: ``name`` is not mounted on the installed model (it was
                trained on the model the server started with, and another is loaded).
        """
        if name is None and self.mounted is None:
            return
        if self.mounted is None or (name is not None and name not in self.mounted.names):
            raise ModelUnavailable(f"adapter {name!r} is not mounted on {self.info.id!r}: "
                                   "adapters run on the model the server started with")
        self.mounted.use(name)

    def release(self, keep_tokenizer: bool = False) -> None:
        """Drop the model (and, unless ``keep_tokenizer``, the tokenizer) and give mlx's
        cached buffers back. Callers drop their own references (prompt caches) first."""
        import mlx.core as mx

        self.model = self.mounted = None
        if self.drafts is not None:
            self.drafts.loaded = None
        self._trimmable = None
        if not keep_tokenizer:
            self.tokenizer = self.processor = None
            self._grammar_tokenizer = None
        gc.collect()
        mx.clear_cache()

    # -- what the loaded model is ------------------------------------------------------------

    def _media_folder(self) -> tuple[bool, bool]:
        """Whether the model behind ``local`` takes images
        (:func:`kit.engine.decode.vision.is_vision_folder`) and audio
        (:func:`kit.models.vision.is_audio_model`), read once per model."""
        if self._vision_for is None or self._vision_for[0] != self.info.path:
            takes = self.split is None and vision.is_vision_folder(self.info.path)
            self._vision_for = (self.info.path, takes,
                                takes and is_audio_model(self.info.path))
        return self._vision_for[1], self._vision_for[2]

    @property
    def compile_decode(self) -> bool:
        """Whether a request alone may decode with a compiled step (``on``; never in a
        distributed engine, whose collectives a trace would freeze)."""
        if self._compile is None:
            self._compile = self.split is None and self._compile_mode == "on"
        return self._compile

    @property
    def vision(self) -> bool:
        """Whether the model (loaded, or unloaded with its tokenizer kept) takes images:
        it loaded through mlx-vlm (:mod:`kit.engine.decode.vision`)."""
        return self.processor is not None

    def trimmable(self) -> bool:
        """Whether the loaded model's KV cache can be trimmed (not recurrent or rotating);
        computed once per load."""
        if self._trimmable is None:
            self._trimmable = mlx_lm_api.can_trim_prompt_cache(mlx_lm_api.make_prompt_cache(self.model))
        return self._trimmable

    def bound(self) -> Any:
        """The tokenizer's :class:`kit.engine.decode.prompt_bound.TokenBound` (None: its pipeline
        allows no proven bound), computed once per tokenizer (~0.1 s, at load).
        Thread-safe (``count_tokens`` calls it beside the worker)."""

        tok = self.tokenizer
        cached = self._bound_for  # set by load; one tuple assignment: thread-safe
        if cached is None or cached[0] is not tok:
            cached = self._bound_for = (tok, TokenBound.from_tokenizer(tok))
        return cached[1]

    def grammar_tokenizer(self) -> Any:
        """llguidance's view of the tokenizer (:func:`kit.engine.decode.grammar.ll_tokenizer`),
        built once per loaded tokenizer."""
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = ll_tokenizer(self.tokenizer)
        return self._grammar_tokenizer

    def vocab_size(self) -> int:
        """Token ids the tokenizer knows (ids are 0..vocab_size-1)."""
        return len(mlx_lm_api.hf_tokenizer(self.tokenizer))

    def memory(self) -> dict[str, int | None]:
        """mlx's allocator: bytes in live arrays now and at peak, and the loaded weights'
        size (all None before mlx is imported)."""
        if "mlx.core" not in sys.modules:
            return {"active_bytes": None, "peak_bytes": None, "weights_bytes": None}
        import mlx.core as mx

        return {"active_bytes": mx.get_active_memory(), "peak_bytes": mx.get_peak_memory(),
                "weights_bytes": self.weights_bytes if self.model is not None else 0}

    @property
    def output_format(self) -> Any:
        """The tokenizer's :class:`kit.formats.OutputFormat` (reasoning and tool-call
        markup and parser), built once per tokenizer; None while no tokenizer is loaded."""
        tok = self.tokenizer
        if tok is None:
            return None
        if self._format_for is None or self._format_for[0] is not tok:
            self._format_for = (tok, for_tokenizer(tok, self.info.path))
        return self._format_for[1]

    def capabilities(self) -> dict[str, Any]:
        """What the model's output format supports (:mod:`kit.formats`): ``tools`` (tool
        calls are parsed), ``reasoning`` (reasoning markup), and their format names
        ``tool_format`` / ``reasoning_format`` (None when unsupported), and whether it
        takes images (``vision``) and audio (``audio``). False/None while no tokenizer is
        loaded, except the media ones, read from the folder."""
        fmt = self.output_format
        takes_images, takes_audio = self._media_folder()
        if fmt is None:  # media from the folder: requests sent while it (re)loads are
            # read as the model will take them, not refused as text-only
            return {"tools": False, "reasoning": False, "tool_format": None,
                    "reasoning_format": None, "vision": takes_images, "audio": takes_audio}
        return {"tools": fmt.tools, "reasoning": fmt.reasoning_format is not None,
                "tool_format": fmt.tool_format if fmt.tools else None,
                "reasoning_format": fmt.reasoning_format, "vision": self.vision,
                "audio": self.vision and takes_audio}
