"""Benchmark: hot-swap latency vs plain load time, and resident memory around a swap.

Side by side in one run, on the two starter variants (dense f32 ~538 MB, 4-bit ~115 MB):
- plain load: a fresh `mlx-kit serve --model M` (engine load + warm-up, from /health), and
  `mlx_lm.load(M)` alone in a fresh process;
- swap latency: POST /admin/swap to M, and a streamed request sent right behind it: seconds
  from the swap request to that request's first token on M;
- memory: mlx's active bytes (/health) and the server's RSS, before and after each swap.

Usage: python bench/swap.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

F32 = "mlx-kit/SmolLM2-135M-Instruct"
Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"


class Server:
    def __init__(self, env: dict, home: Path, model: str):
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        log = home / f"serve-{self.port}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port",
                                      str(self.port), "--model", model, "--temperature", "0",
                                      "--log-file", str(log)], env=env,
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_ready(self.root + "/health", self.proc)
        pid_file = home / ".local" / "state" / "mlx-kit" / f"server-{self.port}.json"
        self.token = json.loads(pid_file.read_text())["admin_token"]

    def health(self) -> dict:
        return httpx.get(self.root + "/health", timeout=5).json()

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def first_token_after_swap(server: Server, model: str) -> tuple[float, float]:
    """(seconds to the swap's reply, seconds to the first token of a request sent right
    behind the swap), both from the moment the swap was sent."""
    t0 = time.perf_counter()
    swap_done: list[float] = []

    def do_swap():
        r = httpx.post(server.root + "/admin/swap", json={"model": model}, timeout=300,
                       headers={"Authorization": f"Bearer {server.token}"})
        r.raise_for_status()
        swap_done.append(time.perf_counter() - t0)

    t = threading.Thread(target=do_swap)
    t.start()
    time.sleep(0.2)  # let the swap reach the queue first (the load takes longer than this)
    first = None
    with httpx.stream("POST", server.root + "/v1/chat/completions", timeout=300, json={
            "model": "local", "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and first is None:
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    assert chunk["model"] == model, chunk["model"]
                    first = time.perf_counter() - t0
    t.join()
    return swap_done[0], first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-swap-"))
    env = bench_env(work)
    starter(env, F32, Q4)

    plain: dict[str, list[float]] = {F32: [], Q4: []}
    bare: dict[str, list[float]] = {F32: [], Q4: []}
    for _ in range(args.rounds):
        for m in (F32, Q4):
            s = Server(env, work, m)
            plain[m].append(s.health()["load_seconds"])
            s.stop()
            code = (f"import time; from kit.blas import preload_blas; preload_blas();"
                    f"from mlx_lm import load; t=time.perf_counter(); load({m!r});"
                    f"print(time.perf_counter()-t)")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True)
            bare[m].append(float(out.stdout.strip().splitlines()[-1]))

    s = Server(env, work, F32)
    rows = []
    try:
        current = F32
        for _ in range(args.rounds):
            for target in (Q4, F32):
                before = s.health()["memory"]["active_bytes"], s.rss()
                reply, first = first_token_after_swap(s, target)
                after = s.health()["memory"]["active_bytes"], s.rss()
                rows.append((current, target, reply, first, before, after))
                current = target
    finally:
        s.stop()

    mb = 1e6
    print("| model | mlx_lm.load alone s | mlx-kit plain load (+warm-up) s |")
    print("|---|---|---|")
    for m in (F32, Q4):
        print(f"| {m} | {statistics.median(bare[m]):.2f} | {statistics.median(plain[m]):.2f} |")
    print("\n| swap | swap reply s | first token on new model s | mlx active MB before -> after "
          "| RSS MB before -> after |")
    print("|---|---|---|---|---|")
    for cur, tgt, reply, first, before, after in rows:
        print(f"| {cur.split('/')[1]} -> {tgt.split('/')[1]} | {reply:.2f} | {first:.2f} | "
              f"{before[0] / mb:.0f} -> {after[0] / mb:.0f} | {before[1] / mb:.0f} -> "
              f"{after[1] / mb:.0f} |")
    for tgt in (Q4, F32):
        firsts = [r[3] for r in rows if r[1] == tgt]
        print(f"\nto {tgt}: median first token after swap {statistics.median(firsts):.2f} s vs "
              f"plain load {statistics.median(plain[tgt]):.2f} s "
              f"(ratio {statistics.median(firsts) / statistics.median(plain[tgt]):.2f})")


if __name__ == "__main__":
    main()
