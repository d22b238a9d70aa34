"""The warm-up module (kit/engine/decode/warmup.py) in-process: what it plans, its time limit, and
that a failure in it never keeps the engine from becoming ready.

On this CPU machine mlx compiles nothing worth warming; the shapes still run through the
same mlx-lm paths (stream_generate, BatchGenerator) that compile kernels on CUDA.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest


from kit.config import EngineConfig
from kit.engine.decode import warmup
from kit.errors import ConfigError


@pytest.fixture(scope="module")
def starter_folder(hf_home) -> str:
    from huggingface_hub import snapshot_download

    from kit.models.starter import STARTER_ID

    return snapshot_download(STARTER_ID, cache_dir=Path(hf_home) / "hub",
                             local_files_only=True)


@pytest.fixture(scope="module")
def starter(starter_folder):
    from kit.blas import preload_blas

    preload_blas()  # as the engine process does: mlx's CPU matmuls are slow without it
    from mlx_lm import load

    return load(starter_folder)


# --- the plan (no model) -------------------------------------------------------------------

def test_the_plan_warms_a_full_prefill_chunk_one_per_shorter_range_and_every_batch_size():
    labels = [s.label for s in warmup.plan(max_batch=4, step_size=2048, batching=True)]
    assert labels == ["prefill 2048 + decode", "prefill 769 + decode", "prefill 385 + decode",
                      "prefill 193 + decode", "prefill 97 + decode", "prefill 49 + decode",
                      "prefill 25 + decode", "prefill 13 + decode", "sampled decode",
                      "batch x1", "batch x2", "batch x3", "batch x4"]
    assert warmup.prefill_chunks(512) == [512, 193, 97, 49, 25, 13]  # CPU's chunk


def test_without_batching_only_the_single_stream_shapes_are_warmed():
    # max_batch 1 (requests one at a time), or a quantized KV cache (no batching)
    for plan in (warmup.plan(1, 512, batching=True), warmup.plan(8, 512, batching=False)):
        assert {s.kind for s in plan} == {"stream", "sampled"} and len(plan) == 7


def test_large_max_batch_warms_each_size_to_8_then_powers_of_two_and_the_maximum():
    assert warmup.batch_sizes(40) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 40]
    assert warmup.batch_sizes(3) == [1, 2, 3]


def test_warmup_on_is_refused_for_a_distributed_engine_and_unknown_modes_name_the_choices():
    assert warmup.check_mode("auto", distributed=True) == "auto"
    assert warmup.check_mode("off", distributed=True) == "off"
    with pytest.raises(ConfigError, match="--warmup on does not work with --ranks"):
        warmup.check_mode("on", distributed=True)
    with pytest.raises(ConfigError, match="auto, on, off"):
        warmup.check_mode("always")


def test_auto_means_no_warm_up_where_mlx_does_not_run_on_cuda():
    import mlx.core as mx

    assert not mx.cuda.is_available()  # this machine: CPU only
    assert not warmup.on_cuda() and not warmup.wanted("auto")
    assert warmup.wanted("on") and not warmup.wanted("off")


# --- on the real starter -------------------------------------------------------------------

@pytest.mark.model
def test_warm_up_stops_starting_shapes_past_its_time_limit(starter, caplog):
    model, tokenizer = starter
    # a clock that reads 0 at the start and at the first check, then 1000 s
    clock = itertools.chain([0.0, 0.0], itertools.repeat(1000.0)).__next__
    with caplog.at_level(logging.INFO, logger="mlx_kit.engine"):
        report = warmup.warm_up(model, tokenizer, max_batch=2, limit_s=60, clock=clock)
    assert report.warmed == ["prefill 512 + decode"]  # CPU: 512-token prefill chunks
    assert report.skipped[0] == "prefill 193 + decode" and report.skipped[-2:] == [
        "batch x1", "batch x2"]
    assert report.error is None
    assert "warm-up stopped at its 60 s limit; not warmed: prefill 193 + decode" in caplog.text


class FailsFirst:
    """The real model, whose first ``calls`` forward passes raise as a kernel that fails
    to compile would (a CUDA failure cannot happen on this CPU machine: a stand-in)."""

    def __init__(self, model, calls: int = 1) -> None:
        self._model, self._left = model, calls

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        if self._left > 0:
            self._left -= 1
            raise RuntimeError("nvrtc: kernel compilation failed")
        return self._model(*args, **kwargs)


@pytest.mark.model
def test_a_warm_up_failure_is_reported_not_raised(starter, caplog):
    model, tokenizer = starter
    with caplog.at_level(logging.INFO, logger="mlx_kit.engine"):
        report = warmup.warm_up(FailsFirst(model), tokenizer, max_batch=2)
    assert report.warmed == [] and report.error == "RuntimeError: nvrtc: kernel compilation failed"
    assert report.skipped[0] == "prefill 512 + decode"
    assert "warm-up failed at prefill 512 + decode" in caplog.text


@pytest.mark.model
def test_an_engine_whose_warm_up_fails_still_becomes_ready_and_answers(starter_folder, caplog):
    from mlx_lm import load

    from kit.engine.decode.engine import Engine
    from kit.engine.types import ChatRequest, Finished, SamplingParams
    from kit.models.resolve import resolve_model

    phases: list = []

    def loader(path, trust):
        model, tokenizer = load(path)
        return FailsFirst(model), tokenizer

    engine = Engine(resolve_model(starter_folder), EngineConfig(max_batch=2, warmup="on"), loader=loader,
                    on_change=lambda: phases.append((engine.state, engine.phase)))
    with caplog.at_level(logging.INFO, logger="mlx_kit.engine"):
        engine.start()
        assert engine.wait_ready(120)
    try:
        assert phases == [("loading", "loading weights"), ("loading", "warming up"),
                          ("ready", None)]
        assert "warm-up failed at prefill 512 + decode" in caplog.text

        async def ask() -> Finished:
            async for ev in engine.generate(ChatRequest(
                    messages=[{"role": "user", "content": "Hi"}],
                    params=SamplingParams(max_tokens=3, temperature=0.0))):
                if isinstance(ev, Finished):
                    return ev
            raise AssertionError("no Finished event")

        assert asyncio.run(ask()).usage.completion_tokens >= 1
        assert engine.snapshot()["phase"] is None
    finally:
        engine.stop()
