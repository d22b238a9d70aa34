"""Helpers the benchmarks share: free ports, waiting for a server, a clean environment,
the starter's folder, the OpenBLAS library mlx_lm.server gets through LD_PRELOAD."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> float:
    """Poll ``url`` until it answers 200; returns the seconds it took."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.args}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(url)


@contextmanager
def serving(env: dict[str, str], *args: str, timeout: float = 300) -> Iterator[str]:
    """``python -m kit serve ARGS`` on a free port (its log in ``env``'s HOME), ready;
    yields its root URL and stops it after."""
    port = free_port()
    log = Path(env["HOME"]) / f"serve-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--log-file", str(log), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_ready(root + "/health", proc, timeout=timeout)
        yield root
    finally:
        proc.terminate()
        proc.wait(30)


def bench_env(home: Path) -> dict[str, str]:
    """The environment with a throwaway HOME and no mlx-kit or XDG settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MLX_KIT_"))}
    env["HOME"] = str(home)
    return env


def starter(env: dict[str, str], *variants: str) -> str:
    """Build the starter variants (default: the f32 one) and return the first's folder."""
    code = ("import sys; from kit.models.starter import ensure_starter, STARTER_ID;"
            "ids = sys.argv[1:] or [STARTER_ID];"
            "print([str(ensure_starter(repo_id=i)) for i in ids][0])")
    out = subprocess.run([sys.executable, "-c", code, *variants], env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def openblas() -> str | None:
    from kit.blas import _CANDIDATES

    return next((p for p in _CANDIDATES if Path(p).exists()), None)


def first_difference(a: str, b: str) -> int:
    """The index of the first character where ``a`` and ``b`` differ (the shorter one's
    length when one starts the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def streamed_answer(root: str, body: dict, timeout: float = 600) -> tuple[str, int, float | None]:
    """One streamed chat completion at ``root`` (``body`` without ``stream``): its text,
    completion tokens (usage) and ``time.perf_counter()`` at its first text (None if none)."""
    import json

    first, n, answer = None, 0, ""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", root + "/v1/chat/completions", json=body, timeout=timeout) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    first = first or time.perf_counter()
                    answer += c["delta"]["content"]
    return answer, n, first


def eos_ids(folder: Path) -> set[int]:
    """Every id mlx-lm stops on: config.json's and generation_config.json's
    ``eos_token_id`` and the tokenizer's eos token."""
    import json

    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        try:
            e = json.loads((folder / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        ids.update(e if isinstance(e, list) else [e] if isinstance(e, int) else [])
    try:
        eos = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        added = json.loads((folder / "tokenizer.json").read_text()).get("added_tokens", [])
        ids.update(t["id"] for t in added if t.get("content") == eos)
    except (OSError, ValueError, AttributeError):
        pass
    return ids
