"""What /metrics and the status page cost the request path: a small non-streamed chat
through the app with the counting hooks on and off, a /metrics scrape, and /ui/data with
the live list and the samples full (its size is what bounds a page poll). In-process (one
event loop, httpx's ASGI transport) on the tests' stand-in engine, so that only the
server's own work is timed, not a model's. Prints a table.

    python bench/metrics.py [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kit.server.live import MAX_LIVE_LISTED, MAX_SAMPLES  # noqa: E402
from tests.server.test_metrics import CHAT, LOOPBACK, StandInEngine, make_app  # noqa: E402


async def _per_request_ms(app, n: int) -> float:
    transport = httpx.ASGITransport(app=app, client=LOOPBACK)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        for _ in range(20):  # warm-up
            await c.post("/v1/chat/completions", json=CHAT)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                await c.post("/v1/chat/completions", json=CHAT)
            runs.append((time.perf_counter() - t0) / (n // 5) * 1000)
        return statistics.median(runs)


async def _get_ms(app, path: str, n: int = 50) -> tuple[float, int]:
    transport = httpx.ASGITransport(app=app, client=LOOPBACK)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        size = len((await c.get(path)).content)
        t0 = time.perf_counter()
        for _ in range(n):
            await c.get(path)
        return (time.perf_counter() - t0) / n * 1000, size


async def main(n: int) -> None:
    on = make_app(StandInEngine(words=16))
    off = make_app(StandInEngine(words=16))
    off.state.activity = None  # adapter.begin then skips the hook (the middleware stays)
    with_hooks = await _per_request_ms(on, n)
    without = await _per_request_ms(off, n)
    scrape_ms, scrape_bytes = await _get_ms(on, "/metrics")

    # the page's worst poll: the live list over its bound and the samples full
    full = make_app(StandInEngine(words=1))
    engine = full.state.kit.engine
    transport = httpx.ASGITransport(app=full, client=LOOPBACK)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        for _ in range(MAX_SAMPLES):
            await c.post("/v1/chat/completions", json=CHAT)
        engine.gate = asyncio.Event()
        held = [asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
                for _ in range(MAX_LIVE_LISTED * 4)]
        while len(full.state.activity.live) < len(held):
            await asyncio.sleep(0.01)
        data_ms, data_bytes = await _get_ms(full, "/ui/data", 20)
        engine.gate.set()
        await asyncio.gather(*held)

    rows = [("chat request, hooks on (ms)", f"{with_hooks:.2f}"),
            ("chat request, hooks off (ms)", f"{without:.2f}"),
            ("hook cost per request (ms)", f"{with_hooks - without:+.2f}"),
            ("/metrics scrape (ms)", f"{scrape_ms:.2f}"),
            ("/metrics size (bytes)", str(scrape_bytes)),
            (f"/ui/data, {len(held)} live + {MAX_SAMPLES} samples (ms)", f"{data_ms:.2f}"),
            ("/ui/data size at its bound (bytes)", str(data_bytes))]
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  value")
    for name, v in rows:
        print(f"{name:<{width}}  {v}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    asyncio.run(main(parser.parse_args().requests))
