"""Warm before ready: run the shapes a first request and the first batches use, so mlx
compiles their kernels before ``/health`` says ready.

mlx's CUDA build compiles a kernel (NVRTC) the first time a shape class is used and keeps
it in ``MLX_PTX_CACHE_DIR`` (:mod:`kit.engine.proc.process` points that at
:func:`kit.paths.kernel_cache_dir` unless the variable is set). On an H200 with a
Llama-3-8B-shaped 4-bit model, a fresh machine's first request took 38 s after the engine
said ready, a second prompt length 29 s more, the first batch of 4 requests 3.4 s: the
user paid for compilation. :func:`warm_up` pays it while the engine is still loading
(``phase: "warming up"`` in ``/health``), once per machine: with the kernel cache warm it
takes seconds. What it runs (:func:`plan`), each through the path a request takes:

- ``mlx_lm.stream_generate`` (a request alone, :mod:`kit.engine.decode.sequential`) over one
  full prefill chunk (:func:`kit.engine.decode.prefill.prefill_step_size` tokens) and over a
  shorter chunk in each power-of-two range below it (:func:`prefill_chunks`), each
  followed by a few decode steps;
- mlx-lm's ``BatchGenerator`` as :mod:`kit.engine.decode.batch` drives it, at every batch size
  from 1 to ``max_batch`` (above 8, powers of two and ``max_batch``), a few-token prompt
  per row and a few decode steps. Without batching (``max_batch`` 1, or a quantized KV
  cache, which ``BatchGenerator`` cannot batch) only the single-stream shapes.

Bounded: no new shape starts after :data:`LIMIT_S` seconds (a shape already compiling
cannot be interrupted), and a failure is logged and ends the warm-up: the server still
becomes ready, and a request pays what was not warmed. Modes (``serve --warmup``):
``auto`` (the default) warms only where mlx runs on CUDA (elsewhere kernels are built in
or compile in milliseconds, and the load runs only :func:`first_use`), ``on`` always,
``off`` never (not even :func:`first_use`). A distributed engine's ranks never run it
(every rank would have to run the same shapes in lockstep, and a time limit or a failure
on one rank would leave the others waiting in a collective): ``on`` is refused there.

Nothing here imports mlx at module import time (the HTTP process imports
:func:`check_mode`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kit import mlx_lm_api
from kit.engine.decode.prefill import prefill_step_size
from kit.errors import ConfigError

log = logging.getLogger("mlx_kit.engine")

MODES = ("auto", "on", "off")
#: seconds after which no new shape starts (a cold H200 took ~70 s for a first request,
#: a second prompt length and a batch, one after the other)
LIMIT_S = 300.0
#: decode steps per shape: the first compiles, the rest make sure the steady state (the
#: cache grown past its first block, async eval overlapping) ran too
DECODE_STEPS = 3
#: the smallest prompt chunk warmed; below it the batched decode shapes cover the rows
SMALLEST_CHUNK = 16
#: tokens per row of a warm-up batch (rows differ by one token: padded, masked prefill)
BATCH_PROMPT = 5
_TEXT = "The quick brown fox jumps over the lazy dog. 0123456789 "


def check_mode(mode: str, distributed: bool = False) -> str:
    """``mode`` if it is one of :data:`MODES` and allowed here.

    Args:
        distributed: the engine spreads the model over several ranks.

    Raises:
        ConfigError: an unknown mode, or ``on`` for a distributed engine.
    """
    if mode not in MODES:
        raise ConfigError(f"--warmup {mode!r}: expected one of {', '.join(MODES)}")
    if distributed and mode == "on":
        raise ConfigError("--warmup on does not work with --ranks/--hosts/--hostfile: the "
                          "ranks would have to warm up in lockstep",
                          hint="leave --warmup at auto (a distributed engine does not warm "
                               "up) or pass --warmup off")
    return mode


def on_cuda() -> bool:
    """Whether mlx runs on CUDA here: its CUDA backend is available and the default
    device is the GPU (``mx.cuda.is_available()`` is False on Metal and CPU builds).
    Imports mlx."""
    import mlx.core as mx

    return bool(mx.cuda.is_available()) and mx.default_device().type == mx.DeviceType.gpu


def wanted(mode: str) -> bool:
    """Whether ``mode`` means a full warm-up on this machine (imports mlx for ``auto``)."""
    return mode == "on" or (mode == "auto" and on_cuda())


@dataclass(frozen=True)
class Shape:
    """One thing to run: ``kind`` ``"stream"`` (``stream_generate`` over ``tokens`` prompt
    tokens, then greedy decode), ``"sampled"`` (the same with a temperature, top-p/min-p/
    top-k filters and logits processors: the path a request with sampling takes) or
    ``"batch"`` (``BatchGenerator`` with ``rows`` prompts of about ``tokens`` tokens
    decoding together)."""

    kind: str
    rows: int
    tokens: int

    @property
    def label(self) -> str:
        """How the log names it, e.g. ``prefill 2048 + decode``, ``sampled decode`` or
        ``batch x4``."""
        if self.kind == "stream":
            return f"prefill {self.tokens - 1} + decode"
        if self.kind == "sampled":
            return "sampled decode"
        return f"batch x{self.rows}"


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes to warm: each of 1..min(8, max_batch), then powers of two up to
    ``max_batch``, and ``max_batch`` itself (mlx picks its matmul kernels by row-count
    ranges, so every size is not needed past a few)."""
    sizes = list(range(1, min(8, max_batch) + 1))
    n = 16
    while n < max_batch:
        sizes.append(n)
        n *= 2
    if max_batch not in sizes:
        sizes.append(max_batch)
    return sizes


def prefill_chunks(step_size: int) -> list[int]:
    """Prompt chunk lengths to warm: one full chunk (``step_size``), then one length in
    each power-of-two range below it down to :data:`SMALLEST_CHUNK` (three quarters of
    the way up, odd: 769, 385, ... 13 for 2048). mlx's CUDA quantized matmuls are
    compiled per row-count range (an H200 run compiled ``qmm_..._m16_...`` for 1-16 rows
    and ``..._m32_...`` for 17-32, ~30 s each), and a prompt's last chunk can be any
    length."""
    chunks, top = [step_size], step_size // 2
    while top >= SMALLEST_CHUNK:
        chunks.append(top * 3 // 4 + 1)
        top //= 2
    return chunks


def plan(max_batch: int, step_size: int, batching: bool) -> list[Shape]:
    """The shapes :func:`warm_up` runs, in order (the first request's first).

    Args:
        max_batch: the engine's most requests decoded together.
        step_size: prompt tokens per prefill chunk (:func:`kit.engine.decode.prefill.prefill_step_size`).
        batching: whether requests are ever batched (False: single-stream shapes only).
    """
    # n + 1 prompt tokens: one chunk of exactly n, then the last token's step
    shapes = [Shape("stream", 1, n + 1) for n in prefill_chunks(step_size)]
    # the sampling path most requests take (agents send a temperature; the greedy shapes
    # above only compile argmax): sampler filters and logits processors
    shapes.append(Shape("sampled", 1, SMALLEST_CHUNK + 1))
    if batching and max_batch > 1:
        shapes += [Shape("batch", n, BATCH_PROMPT) for n in batch_sizes(max_batch)]
    return shapes


@dataclass
class Report:
    """What :func:`warm_up` did: ``warmed`` (the labels of the shapes run), ``skipped``
    (not run: the time limit, or after a failure), ``seconds`` (wall time), ``error``
    (the failure that ended it, as text; None if none)."""

    warmed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def _tokens(tokenizer: Any, n: int, shift: int = 0) -> list[int]:
    """``n`` token ids of ordinary text (any vocabulary), rotated by ``shift``."""
    base = [t for t in tokenizer.encode(_TEXT) if t not in tokenizer.eos_token_ids] or [0]
    return [base[(i + shift) % len(base)] for i in range(n)]


def _run_stream(model: Any, tokenizer: Any, shape: Shape, step_size: int,
                new_cache: Callable[[], Any] | None) -> None:
    extra: dict[str, Any] = {} if new_cache is None else {"prompt_cache": new_cache()}
    if shape.kind == "sampled":
        # every filter and processor kit.engine.decode.sampling.Sampling.build can make
        extra["sampler"] = mlx_lm_api.make_sampler(temp=0.7, top_p=0.95, min_p=0.05, top_k=40)
        extra["logits_processors"] = mlx_lm_api.make_logits_processors(
            logit_bias={0: -1.0}, presence_penalty=0.1, frequency_penalty=0.1)
    for _ in mlx_lm_api.stream_generate(model, tokenizer, _tokens(tokenizer, shape.tokens),
                             max_tokens=DECODE_STEPS, prefill_step_size=step_size, **extra):
        pass


def _run_batch(model: Any, tokenizer: Any, shape: Shape, step_size: int,
               max_batch: int) -> None:
    # the same construction as kit.engine.decode.batch.run_batch, so the same kernels compile
    bg = mlx_lm_api.BatchGenerator(model, completion_batch_size=max_batch,
                        prefill_batch_size=min(max_batch, 8), prefill_step_size=step_size)
    try:
        # no stop sequences: every row decodes DECODE_STEPS tokens, all rows together
        prompts = [_tokens(tokenizer, shape.tokens + i, shift=i) for i in range(shape.rows)]
        left = set(bg.insert(prompts, max_tokens=[DECODE_STEPS] * shape.rows))
        while left:
            _, generated = bg.next()
            left -= {r.uid for r in generated if r.finish_reason is not None}
    finally:
        bg.close()


def warm_up(model: Any, tokenizer: Any, *, max_batch: int,
            new_cache: Callable[[], Any] | None = None, batching: bool = True,
            limit_s: float = LIMIT_S,
            on_shape: Callable[[Shape, int, int], None] | None = None,
            clock: Callable[[], float] = time.monotonic) -> Report:
    """Run the shapes of :func:`plan` on ``model``; never raises (a failure is logged and
    reported).

    Args:
        model, tokenizer: mlx-lm's, as loaded.
        max_batch: the engine's most requests decoded together.
        new_cache: ``() -> cache``: the prompt cache a request starts from
            (:meth:`kit.engine.decode.slot.ModelSlot.new_cache`: quantized with ``--kv-bits``,
            so those kernels are warmed too); None: mlx-lm's default cache.
        batching: whether requests can be batched (False with ``--kv-bits``: mlx-lm's
            ``BatchGenerator`` cannot merge quantized caches): only single-stream shapes.
        limit_s: seconds after which no new shape starts.
        on_shape: called before each shape with ``(shape, its 1-based number, count)``.
        clock: seconds, monotonic (tests pass their own).

    Returns:
        A :class:`Report`; it is also logged: shapes warmed, seconds, the kernel cache.
    """
    import mlx.core as mx

    step = prefill_step_size()
    shapes = plan(max_batch, step, batching=batching)
    report = Report()
    t0 = clock()
    for i, shape in enumerate(shapes, 1):
        if clock() - t0 > limit_s:
            report.skipped = [s.label for s in shapes[i - 1:]]
            log.warning("warm-up stopped at its %.0f s limit; not warmed: %s", limit_s,
                        ", ".join(report.skipped))
            break
        log.info("warming up: %s (%d of %d)", shape.label, i, len(shapes))
        if on_shape is not None:
            on_shape(shape, i, len(shapes))
        try:
            if shape.kind in ("stream", "sampled"):
                _run_stream(model, tokenizer, shape, step, new_cache)
            else:
                _run_batch(model, tokenizer, shape, step, max_batch)
        except Exception as e:  # the server becomes ready anyway; a request pays the rest
            report.error = f"{type(e).__name__}: {e}"
            report.skipped = [s.label for s in shapes[i - 1:]]
            log.warning("warm-up failed at %s (%s); the server starts without the rest "
                        "warmed: %s", shape.label, report.error, ", ".join(report.skipped))
            break
        report.warmed.append(shape.label)
    mx.clear_cache()  # the warm-up's KV caches are garbage now
    report.seconds = clock() - t0
    log.info("warmed up %d shapes in %.1f s (%s); kernel cache: %s", len(report.warmed),
             report.seconds, ", ".join(report.warmed) or "none",
             os.environ.get("MLX_PTX_CACHE_DIR") or "mlx's default")
    return report


def first_use(model: Any, tokenizer: Any, cache: Any = None) -> None:
    """One tiny generation, so the first request does not pay first-use costs where no
    full warm-up runs (allocator growth, lazy imports inside mlx-lm; on Metal and CPU the
    kernels need no compilation worth a warm-up). ``cache``: the prompt cache to run it
    in (None: mlx-lm's default); raises whatever generation raises."""
    extra = {} if cache is None else {"prompt_cache": cache}
    for _ in mlx_lm_api.stream_generate(model, tokenizer, tokenizer.encode("Hi"), max_tokens=2, **extra):
        pass
