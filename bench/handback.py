"""Benchmark: a long stream that a short request joins for a while, with and without the
batch handing the long one back to decode alone once the short one is done.

In-process (:class:`kit.engine.decode.engine.Engine`, the starter or ``--model``), greedy,
EOS biased away: a long request (``--long`` tokens) starts alone; a short one
(``--short`` tokens) is sent after the long one's first token, so the long one moves into
a batch; the figure is the long one's decode speed after the short one's last token
(tokens over seconds, from then to its end), with the hand-back (what the engine does)
and without it (the engine's ``_resume`` removed: the long one stays in the batch), the
two alternating ``--rounds`` times. Also whether the long text is the same both ways.

Usage: python bench/handback.py [--model PATH] [--long 160] [--short 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, first_difference, starter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--long", type=int, default=160)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = bench_env(Path(tempfile.mkdtemp(prefix="bench-handback-")) / "home")
    model = args.model or starter(env)

    from kit.blas import preload_blas
    preload_blas()
    import mlx.core as mx

    from kit.config import EngineConfig
    from kit.engine.decode.engine import Engine
    from kit.engine.types import ChatRequest, SamplingParams, TextDelta
    from kit.models.resolve import resolve_model

    engine = Engine(resolve_model(model), EngineConfig(warmup="off", prompt_cache_disk=0))
    engine.start()
    assert engine.wait_ready(600)
    eos = engine.slot.tokenizer.eos_token_ids
    bias = tuple((int(i), -100.0) for i in eos)
    resume = engine._resume

    def req(text: str, n: int) -> ChatRequest:
        return ChatRequest(messages=[{"role": "user", "content": text}],
                           params=SamplingParams(max_tokens=n, temperature=0, logit_bias=bias))

    async def pair(k: int) -> tuple[float, str]:
        started, short_done = asyncio.Event(), asyncio.Event()
        marks: dict[str, float] = {}

        async def long() -> tuple[int, str]:
            text, times = "", []
            async for ev in engine.generate(req(f"({k}) Tell me a long story about a fox.",
                                                args.long)):
                if isinstance(ev, TextDelta):
                    text += ev.text
                    times.append(time.perf_counter())
                    started.set()
            after = [t for t in times if t > marks["short"]]
            return len(after) / (after[-1] - marks["short"]), text

        async def short() -> None:
            await started.wait()
            async for _ in engine.generate(req(f"({k}) Say hi.", args.short)):
                pass
            marks["short"] = time.perf_counter()

        (tps, text), _ = await asyncio.gather(long(), short())
        return tps, text

    got: dict[str, list] = {"hand-back": [], "stays in the batch": []}
    texts: dict[str, list] = {k: [] for k in got}
    for k in range(args.rounds + 1):  # round 0 warms up
        for name in got:
            engine._resume = resume if name == "hand-back" else None
            tps, text = asyncio.run(pair(k))
            if k:
                got[name].append(tps)
                texts[name].append(text)
    engine.stop()
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"bench/handback.py: {args.model or 'the float32 starter'} on {mx.default_device()}, "
          f"a {args.long}-token stream joined by a {args.short}-token request, "
          f"{args.rounds} rounds (medians)")
    print("| the long stream after the short one ended | decode tok/s |")
    print("|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} |")
    print(f"| ratio | {med['hand-back'] / med['stays in the batch']:.2f} |")
    a, b = texts["hand-back"], texts["stays in the batch"]
    print(f"same long text both ways: {a == b}")
    if a != b:
        # greedy on random weights sits on near-ties, which a batch's other kernels flip;
        # whether the rounds agree among themselves tells that apart from lost tokens
        for name, t in texts.items():
            print(f"  {name}: the same text every round: {len(set(t)) == 1}")
        x, y = a[0], b[0]
        at = first_difference(x, y)
        print(f"  round 1 differs at character {at} of {len(x)}: {x[at:at + 20]!r} "
              f"/ {y[at:at + 20]!r}")
    sys.stdout.flush()
    os._exit(0)  # see bench/concurrency.py: mlx's CUDA teardown can abort at exit


if __name__ == "__main__":
    main()
