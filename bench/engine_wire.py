"""Benchmark: what the engine pipe's typed encoding (kit/engine/proc/wire.py) costs per event,
against the pickled tuples it replaced; and, with ``--trees``, a short streamed
generation's decode tokens/s through a real server of each source tree, side by side.

- ``codec``: µs per message, encoded and decoded (``wire.decode(wire.encode(m))`` vs
  ``pickle.loads(pickle.dumps(m))``, the protocol ``Connection.send`` uses), best of
  ``--repeat`` runs of ``--n`` each, for the events a generation streams (a text delta
  per token; with 5 top logprobs; Started; Finished) and a state report.
- ``pipe``: the same through a real ``multiprocessing.Pipe`` (send then recv, one thread),
  so the syscalls are in the figure too.
- ``server`` (``--trees A,B``): ``python -m kit serve`` on the starter with
  ``PYTHONPATH`` set to each tree in turn (e.g. main's checkout and this branch's), one
  streamed chat completion of ``--tokens`` tokens (EOS biased away, greedy) each after a
  warm-up one; decode tok/s measured at the client between the first and last chunk.

Usage: python bench/engine_wire.py [--n 20000] [--repeat 5] [--trees OLD,NEW --tokens 200]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402


def messages() -> dict[str, tuple]:
    from kit.engine.types import Finished, Started, TextDelta, TokenLogprob, Usage
    from kit.models.resolve import ModelInfo

    top = tuple((f"tok{i}", -0.5 * i) for i in range(5))
    snap = {"model_info": ModelInfo("org/model", Path("/models/m"), 32768), "state": "ready",
            "error": None, "error_type": None, "requests_served": 12, "swaps": 0,
            "reloads": 0, "unloads": 0, "load_seconds": 1.25, "phase": None,
            "memory": {"active_bytes": 1 << 30, "peak_bytes": 2 << 30,
                       "weights_bytes": 1 << 29},
            "capabilities": {"tools": True, "reasoning": True, "tool_format": "hermes",
                             "reasoning_format": "think"},
            "admission": {"clamped": 0, "rejected": 0, "deferred": 0, "ceiling": 1 << 33},
            "prompt_cache": {"hits": 3, "misses": 1, "entries": 2},
            "kv_cache": {"bits": None, "group_size": 64, "layers": 28, "max_batch": 8}}
    return {
        "text delta": ("ev", 17, TextDelta(" the")),
        "text + 5 logprobs": ("ev", 17, TextDelta(" the", (TokenLogprob(" the", -0.1, top),))),
        "Started": ("ev", 17, Started("org/model", 120, 64, 200, None)),
        "Finished": ("ev", 17, Finished("stop", Usage(120, 200, 64, 0), "org/model",
                                        0.05, 85.0, None)),
        "state report": ("state", snap),
    }


def best_us(fn, n: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return min(runs)


def codec_table(n: int, repeat: int) -> None:
    from kit.engine.proc import wire

    print("| message | pickle µs | wire µs | wire bytes | pickle bytes |")
    print("|---|---|---|---|---|")
    for name, m in messages().items():
        p = best_us(lambda: pickle.loads(pickle.dumps(m)), n, repeat)
        w = best_us(lambda: wire.decode(wire.encode(m)), n, repeat)
        print(f"| {name} | {p:.2f} | {w:.2f} | {len(wire.encode(m))} | "
              f"{len(pickle.dumps(m))} |", flush=True)


def pipe_table(n: int, repeat: int) -> None:
    from kit.engine.proc import wire

    a, b = multiprocessing.Pipe()
    print("\n| through a Pipe | pickle µs | wire µs |")
    print("|---|---|---|")
    for name in ("text delta", "Finished"):
        m = messages()[name]

        def old() -> None:
            a.send(m)
            b.recv()

        def new() -> None:
            a.send_bytes(wire.encode(m))
            wire.recv(b, wire.TO_SERVER_MAX)
        print(f"| {name} | {best_us(old, n, repeat):.2f} | {best_us(new, n, repeat):.2f} |",
              flush=True)


def server_table(trees: list[str], tokens: int) -> None:
    import httpx

    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-wire-"))
    env = bench_env(work)
    model = starter(env)
    eos = json.loads((Path(model) / "config.json").read_text()).get("eos_token_id", 2)
    bias = {str(e): -100 for e in (eos if isinstance(eos, list) else [eos])}
    body = {"model": "local", "stream": True, "temperature": 0, "logit_bias": bias,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}
    print(f"\n| server tree | decode tok/s ({tokens} tokens, client side) | chunks |")
    print("|---|---|---|")
    for tree in trees:
        port = free_port()
        log = open(work / f"serve-{port}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kit", "serve", "--port", str(port), "--model", model,
             "--log-file", str(work / f"kit-{port}.log")],
            env={**env, "PYTHONPATH": str(Path(tree).resolve())}, stdout=log,
            stderr=subprocess.STDOUT, cwd=tree)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for size in (8, tokens):  # a warm-up, then the measured one
                times = []
                with httpx.stream("POST", url, json={**body, "max_tokens": size},
                                  timeout=600) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {") and '"content"' in line:
                            times.append(time.perf_counter())
            tps = (tokens - 1) / (times[-1] - times[0])
            print(f"| {tree} | {tps:.1f} | {len(times)} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="messages per run")
    ap.add_argument("--repeat", type=int, default=5, help="runs (the best one counts)")
    ap.add_argument("--trees", help="comma-separated source trees to serve from, in turn")
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    codec_table(args.n, args.repeat)
    pipe_table(args.n, args.repeat)
    if args.trees:
        server_table(args.trees.split(","), args.tokens)


if __name__ == "__main__":
    main()
