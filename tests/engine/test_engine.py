"""The engine in-process on the real starter: what a consumer of its events can rely on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from kit.engine.engine import Engine
from kit.engine.types import ChatRequest, Finished, SamplingParams
from kit.models.resolve import resolve_model
from kit.models.starter import STARTER_ID


@pytest.fixture(scope="module")
def engine(hf_home):
    folder = snapshot_download(STARTER_ID, cache_dir=Path(hf_home) / "hub",
                               local_files_only=True)
    e = Engine(resolve_model(folder), max_batch=1)
    e.start()
    assert e.wait_ready(120)
    yield e
    e.stop()


@pytest.mark.parametrize("max_batch", [1, 8])
def test_requests_served_counts_a_request_before_its_finished_event(engine, max_batch):
    # Regression: the count went up only after the next-turn cache prefill, which runs
    # after Finished is posted, so a client asking /health right after its answer saw
    # the old count (the Continue and Codex end-to-end tests caught it).
    engine.max_batch = max_batch

    async def one(i: int) -> tuple[int, int]:
        before = engine.requests_served
        async for ev in engine.generate(ChatRequest(
                messages=[{"role": "user", "content": f"Say {i}."}],
                params=SamplingParams(max_tokens=3, temperature=0.0))):
            if isinstance(ev, Finished):
                return before, engine.requests_served
        raise AssertionError("no Finished event")

    for i in range(3):
        before, at_finish = asyncio.run(one(i))
        assert at_finish == before + 1
