"""Benchmark: what a LoRA adapter costs (``serve --adapter NAME=PATH``), side by side in one run.

A LoRA adapter of the f32 starter is trained here by mlx-lm's own trainer (6 steps of
``mlx_lm.lora`` on eight lines, the last 4 blocks, rank 8: tests/lora.py, as the tests
train theirs), then one server (``python -m kit serve --adapter a=...``,
throwaway HOME, offline) is asked, one request at a time on one keep-alive connection:

- **switch cost**: ``--requests`` short requests (``max_tokens`` 1: the prompt-cache hit
  and one decode step) all for ``local:a`` (no switch) vs alternating ``local`` /
  ``local:a`` (every request switches the model's modules); median latency of each and the
  difference;
- **in-process**, on the same model loaded here with the adapter mounted: ``AdapterSet.use``
  (kit/engine/decode/adapters.py) timed alone, switching there and back, and decode tok/s
  of 64 greedy tokens without and with the adapter (its low-rank matmuls on top of the
  base's), best of ``--rounds``;
- **memory**: the adapter's weights (``adapters.safetensors``) and the ``weights_bytes``
  /health reports, with and without the adapter mounted (a second server).

CPU numbers on this machine (mlx's CPU backend, Linux), not Apple silicon.

Usage: python bench/adapters.py [--requests 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, free_port, starter, wait_ready  # noqa: E402

from tests.lora import train_adapter  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# the decode prompt (64 tokens are decoded whatever the model answers)
COUNT = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]


def serve(model: str, env: dict[str, str], work: Path, *args: str):
    port = free_port()
    log = work / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port),
                                 "--log-file", str(log), "--model", model, "--temperature",
                                 "0", *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    wait_ready(root + "/health", proc, timeout=180)
    return proc, root


def ask(client: httpx.Client, root: str, model: str, max_tokens: int,
        messages: list[dict] = QUESTION) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.post(root + "/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40, help="requests per switch pattern")
    ap.add_argument("--rounds", type=int, default=3, help="decode runs per model (best)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-adapters-"))
    env = bench_env(work)
    model = starter(env)
    t0 = time.perf_counter()
    adapter = train_adapter(model, "Zorblax", work / "a", env)
    trained = time.perf_counter() - t0
    env.update(PI_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")

    plain, plain_root = serve(model, env, work)
    try:
        base_weights = httpx.get(plain_root + "/health").json()["memory"]["weights_bytes"]
    finally:
        plain.terminate()
        plain.wait(30)
    proc, root = serve(model, env, work, "--adapter", f"a={adapter}")
    try:
        health = httpx.get(root + "/health").json()
        with httpx.Client(timeout=120) as client:
            for m in ("local", "local:a"):  # warm both, and the prompt cache of both
                ask(client, root, m, 1)
            same = [ask(client, root, "local:a", 1)[0] for _ in range(args.requests)]
            switch = [ask(client, root, m, 1)[0]
                      for _ in range(args.requests // 2) for m in ("local", "local:a")]
    finally:
        proc.terminate()
        proc.wait(30)
    use_s, decode = in_process(model, adapter, args.rounds)

    ms = 1000
    s_med, w_med = statistics.median(same), statistics.median(switch)
    print(f"trained the adapter in {trained:.1f} s (6 steps)\n")
    print("| requests (max_tokens 1, prompt-cache hit) | median ms | p90 ms |")
    print("|---|---|---|")
    for name, xs in (("all local:a (no switch)", same),
                     ("local / local:a alternating (each switches)", switch)):
        print(f"| {name} | {statistics.median(xs) * ms:.1f} | "
              f"{sorted(xs)[int(len(xs) * 0.9)] * ms:.1f} |")
    print(f"\nswitch cost through the server: {(w_med - s_med) * ms:+.2f} ms a request "
          f"(ratio {w_med / s_med:.3f}); AdapterSet.use in-process: {use_s * 1e6:.0f} µs\n")
    print("| decode in-process, 64 tokens | tok/s |")
    print("|---|---|")
    for m, tps in decode.items():
        print(f"| {m} | {tps:.1f} |")
    print(f"\nadapter / base decode: {decode['local:a'] / decode['local']:.3f}")
    size = (adapter / "adapters.safetensors").stat().st_size
    print(f"memory: adapters.safetensors {size / 2**20:.2f} MiB; /health weights_bytes "
          f"{base_weights:,} without, {health['memory']['weights_bytes']:,} with "
          f"(+{health['memory']['weights_bytes'] - base_weights:,})")


def in_process(model: str, adapter: Path, rounds: int) -> tuple[float, dict[str, float]]:
    """On the model loaded here with the adapter mounted (kit/engine/decode/adapters.py):
    seconds one ``AdapterSet.use`` takes (mean over 200 switches there and back), and the
    decode tok/s of 64 greedy tokens without and with the adapter (mlx-lm's
    ``generate_step``, which does not stop at EOS, so both decode 64; best of ``rounds``)."""
    from kit.blas import preload_blas

    preload_blas()
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from kit.engine.decode.adapters import mount
    from kit.models.adapters import parse_adapters

    m, tok = load(model)
    mounted = mount(m, parse_adapters([f"a={adapter}"]))
    t0 = time.perf_counter()
    for _ in range(100):
        mounted.use("a")
        mounted.use(None)
    use_s = (time.perf_counter() - t0) / 200
    prompt = mx.array(tok.apply_chat_template(COUNT, add_generation_prompt=True))
    decode = {}
    for name, adapter_name in (("local", None), ("local:a", "a")):
        mounted.use(adapter_name)
        best = 0.0
        for _ in range(rounds):
            steps = generate_step(prompt, m, max_tokens=65)
            next(steps)  # the prefill and first token: not decode
            t0 = time.perf_counter()
            n = sum(1 for _ in steps)
            best = max(best, n / (time.perf_counter() - t0))
        decode[name] = best
    return use_s, decode


if __name__ == "__main__":
    main()
