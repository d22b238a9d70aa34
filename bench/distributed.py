"""Benchmark: one model over 1 rank vs N ranks (mx.distributed, ring backend on loopback),
mlx-kit next to mlx_lm.server launched the same way, side by side in one run.

Four servers, one after another (never two at once: they would share the CPUs):
- ``mlx-kit serve`` (one engine process) and ``mlx-kit serve --ranks N``;
- ``mlx_lm.server`` alone and ``mlx.launch --backend ring -n N ... mlx_lm.server``.
Each gets one warm-up request, then ``--requests`` greedy streamed requests (the same
prompts, ``--max-tokens`` each). Client-side TTFT (seconds to the first content chunk) and
decode tok/s (chunks after the first / seconds after the first), medians; resident memory
(RSS) of every rank process after the requests, and for mlx-kit the mlx allocator's active
bytes per rank from /health.

Usage: python bench/distributed.py [--ranks 3] [--requests 3] [--max-tokens 24] [--model DIR]
(default model: the starter, whose 9 heads and 3 KV heads split over 3 ranks)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, openblas, starter, wait_ready  # noqa: E402

PROMPTS = ["Write a short story about a cat.", "Explain what a CPU does.",
           "List three uses of a paperclip."]


def _stream(root: str, model: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    """(TTFT s, decode tok/s) of one greedy streamed chat request, measured here."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    with httpx.stream("POST", f"{root}/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    if first is None:
        return float("nan"), float("nan")
    tps = (chunks - 1) / (last - first) if chunks > 1 and last > first else float("nan")
    return first - t0, tps


def _rank_pids(proc: subprocess.Popen, health: dict | None) -> list[int]:
    """The processes that hold the model: /health's ranks, else the server itself, else
    (mlx.launch) its python children."""
    if health and health.get("distributed"):
        return [r["pid"] for r in health["distributed"]["ranks"]]
    if health and health.get("engine_pid"):
        return [health["engine_pid"]]
    kids = [c for c in psutil.Process(proc.pid).children(recursive=True)
            if "python" in c.name()]
    return [c.pid for c in kids] or [proc.pid]


def run(name: str, cmd: list[str], env: dict, health_url: str, root: str, model: str,
        requests: int, max_tokens: int, log: Path) -> dict:
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE, start_new_session=True)
    try:
        wait_ready(health_url, proc, timeout=600)
        if "mlx-kit" in name:  # /health answers before the engine finished loading
            while httpx.get(health_url, timeout=5).json()["model_state"] == "loading":
                time.sleep(0.2)
        _stream(root, model, "Hi", 4)  # warm-up
        ttfts, rates = [], []
        for i in range(requests):
            t, r = _stream(root, model, PROMPTS[i % len(PROMPTS)], max_tokens)
            ttfts.append(t)
            rates.append(r)
        health = httpx.get(health_url, timeout=5).json() if "mlx-kit" in name else None
        pids = _rank_pids(proc, health)
        rss = [psutil.Process(p).memory_info().rss for p in pids]
        active = ([r["memory"]["active_bytes"] for r in health["distributed"]["ranks"]]
                  if health and health.get("distributed") else
                  [health["memory"]["active_bytes"]] if health else None)
        return {"name": name, "ttft": statistics.median(ttfts),
                "tps": statistics.median(rates), "rss": rss, "active": active}
    finally:
        import os
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the session we started: ours
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    env = bench_env(home)
    model = str(args.model or starter(env))
    py = sys.executable
    launch = [py, "-c", "import sys; from mlx._distributed_utils.launch import main; "
              "sys.exit(main())", "--backend", "ring", "-n", str(args.ranks), "--python", py]
    blas = openblas()
    ref_env = {**env, **({"LD_PRELOAD": blas} if blas else {})}  # as our engine preloads it
    rows = []
    for name, cmd_for, e, served in [
        ("mlx-kit, 1 process", lambda p: [py, "-m", "kit", "serve", "--model", model,
                                          "--port", str(p)], env, "local"),
        (f"mlx-kit, {args.ranks} ranks", lambda p: [py, "-m", "kit", "serve", "--model", model,
                                                    "--port", str(p), "--ranks",
                                                    str(args.ranks)], env, "local"),
        ("mlx_lm.server, 1 process", lambda p: [py, "-m", "mlx_lm.server", "--model", model,
                                                "--port", str(p)], ref_env, model),
        (f"mlx_lm.server, {args.ranks} ranks", lambda p: [*launch, "-m", "mlx_lm.server",
                                                          "--model", model, "--port", str(p)],
         ref_env, model),
    ]:
        port = free_port()
        root = f"http://127.0.0.1:{port}"
        health = f"{root}/health" if "mlx-kit" in name else f"{root}/v1/models"
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows.append(run(name, cmd_for(port), e, health, root, served, args.requests,
                        args.max_tokens, home / f"{port}.log"))
    mib = 1 << 20
    print(f"\nmodel: {model}; {args.requests} greedy streamed requests of {args.max_tokens} "
          f"tokens each (medians); ring backend on loopback\n")
    print("| server | TTFT s | decode tok/s | RSS per rank MiB | mlx active per rank MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        active = ", ".join(f"{a / mib:.0f}" for a in r["active"]) if r["active"] else "-"
        print(f"| {r['name']} | {r['ttft']:.2f} | {r['tps']:.1f} | "
              f"{', '.join(f'{x / mib:.0f}' for x in r['rss'])} | {active} |")
    ours1, oursn, ref1, refn = rows
    print(f"\nratios: mlx-kit {args.ranks} ranks / 1 process decode "
          f"{oursn['tps'] / ours1['tps']:.2f}; mlx-kit / mlx_lm.server decode at 1 process "
          f"{ours1['tps'] / ref1['tps']:.2f}, at {args.ranks} ranks "
          f"{oursn['tps'] / refn['tps']:.2f}; largest rank's RSS {args.ranks} ranks / 1 "
          f"process {max(oursn['rss']) / max(ours1['rss']):.2f}")


if __name__ == "__main__":
    main()
