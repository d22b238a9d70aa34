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


def test_a_request_decoding_alone_moves_into_a_batch_when_another_arrives(engine, caplog):
    """Alone, a request decodes with stream_generate (faster for one stream); a second
    request makes it continue inside a batch, KV cache carried over. Greedy: both texts
    are what each gets alone, and they decode at the same time."""
    import logging
    import time

    from kit.engine.types import TextDelta

    engine.max_batch = 8

    def req(topic: str, n: int) -> ChatRequest:
        return ChatRequest(messages=[{"role": "user", "content": f"Tell me about {topic}."}],
                           params=SamplingParams(max_tokens=n, temperature=0.0))

    async def collect(request: ChatRequest,
                      delay: float = 0.0) -> tuple[str, float, float, Finished]:
        await asyncio.sleep(delay)
        text, times, fin = "", [], None
        async for ev in engine.generate(request):
            if isinstance(ev, TextDelta):
                text += ev.text
                times.append(time.monotonic())
            elif isinstance(ev, Finished):
                fin = ev
        return text, times[0], times[-1], fin

    async def main():
        alone = [(await collect(req("cats", 60)))[0], (await collect(req("dogs", 30)))[0]]
        with caplog.at_level(logging.DEBUG, logger="mlx_kit.engine"):
            a, b = await asyncio.gather(collect(req("cats", 60)),
                                        collect(req("dogs", 30), delay=1.0))
        return alone, a, b

    alone, a, b = asyncio.run(main())
    assert "joins a batch after" in caplog.text  # it did start alone, then moved
    assert a[0] == alone[0] and b[0] == alone[1]
    assert b[1] < a[2]  # b's first token came before a's last: decoded together
    assert a[3].usage.completion_tokens == 60 and a[3].finish_reason == "length"
