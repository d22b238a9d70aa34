"""Benchmark: memory admission, a request with a huge max_tokens next to others.

One server on the f32 starter under a ``--memory-budget`` of its weights plus the KV
cache of ``--room`` tokens (both read from the starter's files, as the server computes
them). Side by side in one run, each scenario's requests sent at once:

- ``huge + 3 small``: one request asks for 3000 tokens (more than the room) beside three
  asking for 64;
- ``4 huge``: four requests ask for 3000 tokens each.

For each request: HTTP status, max_tokens asked and granted (the ``X-Mlx-Kit-Max-Tokens``
header, or as asked), finish_reason, tokens generated, seconds to the answer; then
/health's admission counters. Without admission the same requests would reserve the KV in
the "asked" column, past the ceiling (printed as "asked KV / room"). None may fail.

Usage: python bench/admission.py [--room TOKENS]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

from kit.models.memory import kv_bytes_per_token, weights_bytes  # noqa: E402

HEADER = "X-Mlx-Kit-Max-Tokens"
PROMPTS = ["Say hello.", "Name a colour.", "What is 2 + 2?", "Name a fruit."]


def ask(root: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    r = httpx.post(root + "/v1/chat/completions", timeout=600, json={
        "model": "local", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}]})
    out = {"status": r.status_code, "asked": max_tokens, "seconds": time.perf_counter() - t0}
    header = r.headers.get(HEADER)
    out["granted"] = int(header.split()[0]) if header else max_tokens
    if r.status_code == 200:
        body = r.json()
        out.update(finish=body["choices"][0]["finish_reason"],
                   tokens=body["usage"]["completion_tokens"],
                   prompt=body["usage"]["prompt_tokens"])
    else:
        out.update(finish=r.json()["error"].get("code"), tokens=0, prompt=0)
    return out


def scenario(root: str, asks: list[int]) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        return list(pool.map(lambda i: ask(root, PROMPTS[i], asks[i]), range(len(asks))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--room", type=int, default=2400, help="tokens of KV beside the "
                        "weights (at least 2048: the load needs that much)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = bench_env(home)
        folder = Path(starter(env))
        per = kv_bytes_per_token(json.loads((folder / "config.json").read_text()))
        budget = weights_bytes(folder) + args.room * per
        port = free_port()
        log = home / "serve.log"
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--temperature", "0", "--memory-budget", str(budget),
                                 "--log-file", str(log)], env=env, stdout=open(log, "w"),
                                stderr=subprocess.STDOUT)
        root = f"http://127.0.0.1:{port}"
        try:
            wait_ready(root + "/health", proc)
            print(f"starter f32: {per} KV bytes/token; budget {budget} bytes = weights + "
                  f"{args.room} tokens of KV\n")
            print(f"{'scenario':<16} {'req':>3} {'status':>6} {'asked':>6} {'granted':>7} "
                  f"{'finish':>8} {'tokens':>6} {'seconds':>7}")
            failed = 0
            for name, asks in (("huge + 3 small", [3000, 64, 64, 64]),
                               ("4 huge", [3000, 3000, 3000, 3000])):
                rows = scenario(root, asks)
                for i, r in enumerate(rows):
                    failed += r["status"] != 200
                    print(f"{name if i == 0 else '':<16} {i:>3} {r['status']:>6} "
                          f"{r['asked']:>6} {r['granted']:>7} {r['finish']:>8} "
                          f"{r['tokens']:>6} {r['seconds']:>7.1f}")
                wanted = sum(r["asked"] + r["prompt"] for r in rows)
                print(f"{'':<16} asked KV / room: {wanted} / {args.room} tokens "
                      f"({wanted / args.room:.2f}x)")
            adm = httpx.get(root + "/health", timeout=10).json()["admission"]
            print(f"\n/health admission: clamped {adm['clamped']}, deferred "
                  f"{adm['deferred']}, rejected {adm['rejected']}; failed requests: {failed}")
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    main()
