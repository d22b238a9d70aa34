"""Benchmark: the prompt cache's disk tier; time to first token with a disk-warm cache vs cold.

Side by side in one run, on the starter (SmolLM2-135M-Instruct, dense f32), greedy:

1. Agent replay after a restart: pi 0.73.1's and Claude Code 2.1.197's recorded first
   requests (tests/data/*-request.json, streamed as the agents send them). A server with
   an empty cache folder answers both (cold), stops (its caches were written to disk once
   it was idle), a new server on the same folder answers them again (disk-warm).
2. Swap A -> B -> A: pi's request on A (f32), a swap to B (the 4-bit starter) and back,
   pi's request again: with the disk tier (disk-warm) and with ``--prompt-cache-disk 0``
   (cold: a swap drops the memory tier).

Ratios are disk-warm / cold TTFT (goal <= 0.25 on a CPU). Also printed: the disk cache's
size and hit rate over the replays, and whether each warm answer is the cold one.

Usage: python bench/prompt_cache.py [--rounds N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
PI = json.loads((DATA / "pi-0.73.1-request.json").read_text())
CLAUDE = json.loads((DATA / "claude-code-2.1.197-request.json").read_text())
Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"


class Server:
    def __init__(self, work: Path, env: dict, cache: Path, *args: str) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        log = work / f"serve-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kit", "serve", "--port", str(self.port), "--temperature",
             "0", "--prompt-cache-dir", str(cache), "--log-file", str(log), *args],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_ready(self.root + "/health", self.proc)

    def cache(self) -> dict:
        return httpx.get(self.root + "/health", timeout=5).json()["prompt_cache"]

    def wait_writes(self, n: int, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while self.cache()["disk_writes"] < n:
            if time.monotonic() > end:
                raise TimeoutError(f"{n} disk writes")
            time.sleep(0.1)

    def swap(self, model: str) -> None:
        state = Path(bench_home) / ".local" / "state" / "mlx-kit" / f"server-{self.port}.json"
        token = json.loads(state.read_text())["admin_token"]
        r = httpx.post(self.root + "/admin/swap", json={"model": model}, timeout=600,
                       headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


bench_home = ""


def pi_turn(server: Server, max_tokens: int) -> tuple[float, str, int, int]:
    """(TTFT s, text, prompt tokens, cached tokens) of pi's request, streamed."""
    body = copy.deepcopy(PI)
    body["max_completion_tokens"] = max_tokens
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with httpx.stream("POST", server.root + "/v1/chat/completions", json=body,
                      timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk["choices"]:
                if c["delta"].get("content") or c["delta"].get("reasoning_content"):
                    ttft = ttft or time.perf_counter() - t0
                    text += c["delta"].get("content") or ""
    return ttft or float("nan"), text, usage.get("prompt_tokens", 0), \
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def claude_turn(server: Server, max_tokens: int) -> tuple[float, str, int, int]:
    """(TTFT s, text, prompt tokens, cached tokens) of Claude Code's request, streamed."""
    body = copy.deepcopy(CLAUDE)
    body["max_tokens"] = max_tokens
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with httpx.stream("POST", server.root + "/v1/messages", json=body, timeout=900,
                      headers={"anthropic-version": "2023-06-01"}) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"claude request: {r.status_code} {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "message_start":
                usage = ev["message"]["usage"]
            elif ev["type"] == "content_block_delta":
                ttft = ttft or time.perf_counter() - t0
                text += ev["delta"].get("text", "")
    cached = usage.get("cache_read_input_tokens", 0) or 0
    return ttft or float("nan"), text, usage.get("input_tokens", 0) + cached, cached


TURNS = {"pi 0.73.1": pi_turn, "Claude Code 2.1.197": claude_turn}


def main() -> None:
    global bench_home
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="restart rounds (each: cold, warm)")
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-"))
    home, hf = work / "home", work / "hf"
    home.mkdir()
    bench_home = str(home)
    env = {k: v for k, v in bench_env(home).items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf))
    starter(env, "mlx-kit/SmolLM2-135M-Instruct", Q4)

    replay: dict[str, dict[str, list]] = {n: {"cold": [], "warm": [], "same": [], "tokens": []}
                                          for n in TURNS}
    hits = requests = 0
    disk_bytes = 0
    for i in range(args.rounds):
        cache = work / f"cache-{i}"
        s = Server(work, env, cache)
        try:
            cold = {n: f(s, args.max_tokens) for n, f in TURNS.items()}
            s.wait_writes(len(TURNS))
        finally:
            s.stop()
        s = Server(work, env, cache)
        try:
            warm = {n: f(s, args.max_tokens) for n, f in TURNS.items()}
            c = s.cache()
            hits += c["disk_hits"]
            requests += c["disk_hits"] + c["memory_hits"] + c["misses"]
            disk_bytes = max(disk_bytes, c["disk_bytes"])
        finally:
            s.stop()
        for n in TURNS:
            r = replay[n]
            r["cold"].append(cold[n][0])
            r["warm"].append(warm[n][0])
            r["same"].append(cold[n][1] == warm[n][1])
            r["tokens"].append((cold[n][2], cold[n][3], warm[n][3]))

    swap: dict[str, float] = {}
    for label, extra in (("disk-warm", ()), ("cold", ("--prompt-cache-disk", "0"))):
        s = Server(work, env, work / f"cache-swap-{label}", *extra)
        try:
            pi_turn(s, args.max_tokens)
            if not extra:
                s.wait_writes(1)
            s.swap(Q4)
            s.swap("mlx-kit/SmolLM2-135M-Instruct")
            swap[label] = pi_turn(s, args.max_tokens)[0]
        finally:
            s.stop()

    print("model: starter (SmolLM2-135M-Instruct, dense f32), greedy, "
          f"max_tokens {args.max_tokens}, {args.rounds} round(s)\n")
    print("| replay after restart | prompt tokens | cached cold / warm | TTFT cold s "
          "| TTFT disk-warm s | warm / cold | same text |")
    print("|---|---|---|---|---|---|---|")
    for n, r in replay.items():
        c, w = statistics.median(r["cold"]), statistics.median(r["warm"])
        toks = r["tokens"][0]
        print(f"| {n} | {toks[0]} | {toks[1]} / {toks[2]} | {c:.2f} | {w:.2f} | "
              f"{w / c:.3f} | {'yes' if all(r['same']) else 'NO'} |")
    print(f"\n| swap A -> B -> A, pi's request on A | TTFT s |\n|---|---|")
    for label, t in swap.items():
        print(f"| {label} | {t:.2f} |")
    print(f"\nratio swap disk-warm / cold: {swap['disk-warm'] / swap['cold']:.3f}")
    print(f"disk cache after a replay round: {disk_bytes / 1e6:.1f} MB; disk hit rate over "
          f"the warm replays: {hits}/{requests}")


if __name__ == "__main__":
    main()
