"""The HTTP edge under oversize and hostile input: how fast a body over --max-body-size is
refused (declared 20 MB; chunked, 17 MiB sent with no end), what the HTTP process's RSS
does over those requests, what the JSON-depth check costs on the worst bodies, and what
the guard adds to a small request. Prints a table.

    python bench/edge.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

from kit.server.guard import DEFAULT_MAX_BODY, MAX_JSON_DEPTH, json_depth_exceeds  # noqa: E402


def _refusal_seconds(port: int, head: bytes, chunks: list[bytes]) -> tuple[int, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        t0 = time.perf_counter()
        s.sendall(head)
        for c in chunks:
            try:
                s.sendall(c)
            except OSError:
                break
        status = int(s.recv(65536).split()[1])
        return status, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp())
    env = bench_env(home)
    starter(env)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                             "--log-file", str(home / "serve.log")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rows = []
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc)
        server = psutil.Process(proc.pid)
        rss0 = server.memory_info().rss
        declared = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 20000000\r\n\r\n"
                    ).encode()
        chunked = (b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                   b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        mib = b"x" * (1 << 20)
        chunk = f"{len(mib):x}\r\n".encode() + mib + b"\r\n"
        for name, head, chunks in [("declared 20 MB", declared, [b"{"]),
                                   ("chunked, 17 MiB sent", chunked, [chunk] * 17)]:
            times = []
            for _ in range(args.repeat):
                status, took = _refusal_seconds(port, head, chunks)
                assert status == 413, status
                times.append(took)
            rows.append((f"413 for {name}", f"{statistics.median(times) * 1000:.0f} ms median"))
        rows.append(("HTTP process RSS over those requests",
                     f"{rss0 / 2**20:.0f} -> {server.memory_info().rss / 2**20:.0f} MiB"))
        small = {"model": "nope", "messages": []}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            c.post("/v1/chat/completions", json=small)
            t0 = time.perf_counter()
            for _ in range(200):
                c.post("/v1/chat/completions", json=small)
        rows.append(("small invalid POST round trip (guard included)",
                     f"{(time.perf_counter() - t0) / 200 * 1000:.2f} ms"))
    finally:
        proc.terminate()
        proc.wait(20)
    for name, body in [("16 MiB of '[]'", b"[]" * (DEFAULT_MAX_BODY // 2)),
                       ("16 MiB of '['", b"[" * DEFAULT_MAX_BODY),
                       ("16 MiB string of brackets", b'"' + b"[" * (DEFAULT_MAX_BODY - 2) + b'"')]:
        t0 = time.perf_counter()
        json_depth_exceeds(body, MAX_JSON_DEPTH)
        rows.append((f"depth check, {name}", f"{(time.perf_counter() - t0) * 1000:.0f} ms"))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
