"""Benchmark: a mixed load on one server: errors, latency, and whether memory stays flat.

Starts `mlx-kit serve` on loopback (the starter, greedy), then runs CLIENTS concurrent
clients x REQUESTS requests each, mixed over the three protocols (chat completions,
Responses, Messages), streamed and not, with a share of the streams cancelled mid-stream
(the client closes the connection after the first text). Reports errors (non-2xx, an
exception, or a stream without its final event), p50/p99 latency per protocol, and the
RSS of both processes (the HTTP server and the engine, pids from /health) after the
warm-up round and at the end, once idle. Goal: 0 errors and < 10 % RSS growth.

Usage: python bench/load.py [--clients 8] [--requests 50] [--max-tokens 8] [--model PATH]
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

KINDS = [(proto, streamed) for proto in ("chat", "responses", "messages")
         for streamed in (False, True)]
TOPICS = ["the sea", "a red fox", "bread", "rain", "a lighthouse", "tea", "winter", "bees"]


def body(proto: str, streamed: bool, prompt: str, max_tokens: int) -> tuple[str, dict]:
    """The path and JSON body of one request in ``proto``'s shape."""
    if proto == "chat":
        return "/v1/chat/completions", {"model": "local", "max_tokens": max_tokens,
                                        "stream": streamed,
                                        "messages": [{"role": "user", "content": prompt}]}
    if proto == "responses":
        return "/v1/responses", {"model": "local", "max_output_tokens": max_tokens,
                                 "stream": streamed, "input": prompt}
    return "/v1/messages", {"model": "local", "max_tokens": max_tokens, "stream": streamed,
                            "messages": [{"role": "user", "content": prompt}]}


_FINAL = {"chat": "data: [DONE]", "responses": "response.completed",
          "messages": "message_stop"}
_TEXT = {"responses": "response.output_text.delta", "messages": "content_block_delta"}


def has_text(proto: str, line: str) -> bool:
    """Whether an SSE line carries generated text (chat's first chunk carries only the
    role)."""
    if proto != "chat":
        return _TEXT[proto] in line
    if not line.startswith("data: {"):
        return False
    return any(c.get("delta", {}).get("content") for c in json.loads(line[6:])["choices"])


def one(client: httpx.Client, root: str, proto: str, streamed: bool, cancel: bool,
        prompt: str, max_tokens: int) -> tuple[float, str | None]:
    """Send one request; returns (seconds, error or None). A cancelled stream stops
    reading at its first text and closes the connection."""
    path, payload = body(proto, streamed, prompt, max_tokens)
    t0 = time.perf_counter()
    try:
        if not streamed:
            r = client.post(root + path, json=payload)
            if r.status_code != 200:
                return time.perf_counter() - t0, f"{r.status_code}: {r.text[:200]}"
            return time.perf_counter() - t0, None
        with client.stream("POST", root + path, json=payload) as r:
            if r.status_code != 200:
                r.read()
                return time.perf_counter() - t0, f"{r.status_code}: {r.text[:200]}"
            for line in r.iter_lines():
                if cancel and has_text(proto, line):
                    return time.perf_counter() - t0, None  # closing the stream cancels it
                if _FINAL[proto] in line:
                    return time.perf_counter() - t0, None
        return time.perf_counter() - t0, "the stream ended without its final event"
    except httpx.HTTPError as e:
        return time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def run_round(root: str, clients: int, requests: int, max_tokens: int,
              cancel_every: int) -> list[dict]:
    """``clients`` threads x ``requests`` requests each; one record per request."""
    records: list[dict] = []
    lock = threading.Lock()

    def client_loop(c: int) -> None:
        with httpx.Client(timeout=300) as client:
            for i in range(requests):
                n = c * requests + i
                proto, streamed = KINDS[n % len(KINDS)]
                cancel = streamed and cancel_every > 0 and (n // len(KINDS)) % cancel_every == 0
                prompt = f"In one sentence, tell me about {TOPICS[n % len(TOPICS)]} (#{n})."
                seconds, error = one(client, root, proto, streamed, cancel, prompt,
                                     64 if cancel else max_tokens)
                with lock:
                    records.append({"proto": proto, "streamed": streamed, "cancel": cancel,
                                    "seconds": seconds, "error": error})

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def rss(pids: dict[str, int]) -> dict[str, int]:
    return {name: psutil.Process(pid).memory_info().rss for name, pid in pids.items()}


def idle_rss(root: str, pids: dict[str, int], seconds: float = 3.0) -> dict[str, int]:
    """RSS once the server is idle: /health answers and ``seconds`` have passed (the
    engine gives memory back when its queue is empty)."""
    httpx.get(root + "/health", timeout=30)
    time.sleep(seconds)
    return rss(pids)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50, help="per client")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--cancel-every", type=int, default=3,
                    help="cancel one streamed request in this many (0: none)")
    ap.add_argument("--warmup", type=int, default=6, help="requests per client first")
    ap.add_argument("--model", help="an MLX model folder (default: the starter)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-load-"))
    env = bench_env(work)
    model_path = str(Path(args.model).resolve()) if args.model else starter(env)
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    log = work / "kit.log"
    proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                             "--model", model_path, "--temperature", "0",
                             "--log-file", str(log)],
                            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(root + "/health", proc)
        health = httpx.get(root + "/health", timeout=10).json()
        pids = {"HTTP server": health["pid"], "engine": health["engine_pid"]}
        t0 = time.perf_counter()
        warm = run_round(root, args.clients, args.warmup, args.max_tokens, args.cancel_every)
        before = idle_rss(root, pids)
        t1 = time.perf_counter()
        records = run_round(root, args.clients, args.requests, args.max_tokens,
                            args.cancel_every)
        wall = time.perf_counter() - t1
        after = idle_rss(root, pids)
        alive = httpx.get(root + "/health", timeout=10).json()
    finally:
        proc.terminate()
        proc.wait(30)

    errors = [r for r in records + warm if r["error"]]
    print(f"\n{args.clients} clients x {args.requests} requests (+{args.warmup} warm-up "
          f"each), max_tokens {args.max_tokens}, {wall:.0f} s "
          f"(warm-up {t1 - t0:.0f} s); server after: {alive['status']}, "
          f"{alive.get('requests_served')} served, restarts {alive.get('restarts')}\n")
    print("| protocol | requests | cancelled | errors | p50 s | p99 s |")
    print("|---|---|---|---|---|---|")
    for proto in ("chat", "responses", "messages", "all"):
        rs = [r for r in records if proto in ("all", r["proto"])]
        done = [r["seconds"] for r in rs if not r["cancel"] and not r["error"]]
        print(f"| {proto} | {len(rs)} | {sum(r['cancel'] for r in rs)} | "
              f"{sum(bool(r['error']) for r in rs)} | {pct(done, 0.5):.2f} | "
              f"{pct(done, 0.99):.2f} |")
    print("\n| process | RSS after warm-up MB | RSS at end MB | growth |")
    print("|---|---|---|---|")
    for name in pids:
        growth = (after[name] - before[name]) / before[name]
        print(f"| {name} | {before[name] / 2**20:.0f} | {after[name] / 2**20:.0f} | "
              f"{growth:+.1%} |")
    for r in errors[:10]:
        print("error:", json.dumps(r))
    if errors:
        print(f"\n{len(errors)} errors; server log: {log}")
    print(f"\nlatency of cancelled streams (to their first text): p50 "
          f"{statistics.median([r['seconds'] for r in records if r['cancel']] or [0]):.2f} s")


if __name__ == "__main__":
    main()
