"""Benchmark: how fast a distributed server ends when a rank is lost, and how fast every
rank exits when the server is stopped or killed.

Each scenario starts `mlx-kit serve --ranks N` on the starter (ring ranks on 127.0.0.1) in
a throwaway HOME, waits until /health names every rank's pid, then:
- follower idle / rank 0 idle: `kill -9` that rank; seconds until serve exited (and its
  exit code, 1 expected) and until no rank process is left;
- follower mid-stream: the same, with a streamed chat request in flight (its first chunk
  received); also whether the stream's error named the rank;
- SIGTERM server (what `mlx-kit stop` sends) / SIGKILL server: seconds until every rank
  exited.

Usage: python bench/rank_failures.py [--ranks 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def start(env: dict, home: Path, ranks: int) -> tuple[subprocess.Popen, str, list, Path]:
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    log = home / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--ranks", str(ranks), "--temperature", "0"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_ready(root + "/health", proc)
    while True:  # every rank's pid is in /health once the ranks reported
        h = httpx.get(root + "/health", timeout=5).json()
        if all(r.get("pid") for r in h["distributed"]["ranks"]):
            break
        time.sleep(0.1)
    procs = [psutil.Process(p) for p in
             [h["engine_pid"], *(r["pid"] for r in h["distributed"]["ranks"])]]
    return proc, root, procs, log


def alive(procs: list) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            pass
    return False


def until_gone(procs: list, t0: float, limit: float = 60) -> float:
    while alive(procs) and time.perf_counter() - t0 < limit:
        time.sleep(0.02)
    return time.perf_counter() - t0


def scenario(name: str, env: dict, home: Path, ranks: int) -> dict:
    proc, root, procs, log = start(env, home, ranks)
    stream_error = ""
    reader = None
    if name == "follower mid-stream":
        got = threading.Event()

        def read() -> None:
            nonlocal stream_error
            body = {"model": "local", "stream": True, "max_tokens": 16,
                    "messages": [{"role": "user", "content": "Tell me about Paris."}]}
            with httpx.stream("POST", root + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    got.set()
                    if line.startswith("data: {\"error\""):
                        stream_error = json.loads(line[6:])["error"]["message"]
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        got.wait(60)
    target = {"follower idle": procs[-1], "follower mid-stream": procs[-1],
              "rank 0 idle": procs[1]}.get(name)
    t0 = time.perf_counter()
    if target is not None:
        os.kill(target.pid, signal.SIGKILL)
    elif name == "SIGTERM server":
        proc.terminate()
    else:
        proc.kill()
    code = proc.wait(60)
    exited = time.perf_counter() - t0
    gone = until_gone(procs, t0)
    if reader is not None:
        reader.join(30)
    for p in procs:  # a scenario that went wrong must not leave ranks behind
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    text = log.read_text(errors="replace")
    named = next((ln.split("error: ", 1)[1] for ln in text.splitlines()
                  if ln.startswith("error: ")), "")
    return {"exit": code, "exited_s": exited, "ranks_gone_s": gone,
            "error": (stream_error or named)[:90]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-ranks-"))
    env = bench_env(home)
    env["HF_HOME"] = str(home / "hf")
    env["TMPDIR"] = str(home)
    starter(env)
    names = ["follower idle", "follower mid-stream", "rank 0 idle", "SIGTERM server",
             "SIGKILL server"]
    print(f"{args.ranks} ring ranks on 127.0.0.1, the starter, {args.rounds} round(s); "
          "seconds from the signal (median)")
    print(f"| {'scenario':<20} | exit | server gone s | ranks gone s | error (stream, else serve's) |")
    print(f"|{'-' * 22}|------|---------------|--------------|{'-' * 30}|")
    for name in names:
        runs = [scenario(name, env, home, args.ranks) for _ in range(args.rounds)]
        med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
        print(f"| {name:<20} | {runs[-1]['exit']:>4} | {med('exited_s'):>13.2f} | "
              f"{med('ranks_gone_s'):>12.2f} | {runs[-1]['error']} |", flush=True)
    leftover = sorted(home.glob("mlx-kit-ranks-*"))
    print(f"control directories left: {len(leftover)}")


if __name__ == "__main__":
    main()
