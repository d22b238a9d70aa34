"""Benchmark: the HTTP server's overhead, prompt-cache reuse on a pi replay, concurrency.

Side by side in one run, on the starter (dense f32, greedy):
- decode tok/s of `mlx_lm.stream_generate` in-process vs streamed through mlx-kit's HTTP
  API vs streamed through `mlx_lm.server` (same prompt, same tokens);
- TTFT of a recorded pi request (tests/data) over 3 turns: cold, then warm;
- aggregate decode tok/s of 1 stream vs 4 concurrent streams.

Usage: python bench/api.py [--tokens N]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, free_port, openblas, starter, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


def stream(base: str, model: str, body_extra: dict, messages=PROMPT) -> dict:
    """Stream one chat completion; returns ttft, decode tok/s over the stream, tokens."""
    body = {"model": model, "messages": messages, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}, **body_extra}
    t0 = time.perf_counter()
    times, usage, text = [], {}, ""
    with httpx.stream("POST", base + "/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                piece = "".join(c["delta"].get("content") or "" for c in chunk.get("choices", []))
                if piece:
                    times.append(time.perf_counter())
                    text += piece
    n = usage.get("completion_tokens", len(times))
    decode = (n - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return {"ttft": times[0] - t0, "tps": decode, "tokens": n, "usage": usage,
            "wall": time.perf_counter() - t0, "text": text}


def in_process(model_path: str, tokens: int) -> dict:
    code = f"""
import json, time
from kit.engine.blas import preload_blas; preload_blas()
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
m, t = load({model_path!r})
p = t.apply_chat_template({PROMPT!r}, add_generation_prompt=True)
for _ in stream_generate(m, t, t.encode("Hi"), max_tokens=2): pass
times = []
for g in stream_generate(m, t, p, max_tokens={tokens}, sampler=make_sampler(temp=0.0)):
    times.append(time.perf_counter()); last = g
print(json.dumps({{"tokens": last.generation_tokens, "tps": (len(times) - 1) / (times[-1] - times[0]),
                  "mlx_tps": last.generation_tps}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-api-"))
    env = bench_env(work)
    model_path = starter(env)
    kp, rp = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(kp),
                               "--temperature", "0", "--log-file", str(work / "kit.log")],
                              env=env, stdout=open(work / "kit.log", "w"), stderr=subprocess.STDOUT)]
    blas = openblas()
    procs.append(subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", model_path,
                                   "--port", str(rp)], env={**env, **({"LD_PRELOAD": blas} if blas else {})},
                                  stdout=open(work / "ref.log", "w"), stderr=subprocess.STDOUT))
    kit, ref = f"http://127.0.0.1:{kp}/v1", f"http://127.0.0.1:{rp}/v1"
    try:
        wait_ready(f"http://127.0.0.1:{kp}/health", procs[0])
        wait_ready(ref + "/models", procs[1])
        n = {"max_tokens": args.tokens}
        stream(ref, model_path, {"max_tokens": 4})  # mlx_lm.server loads on first use
        ip = in_process(model_path, args.tokens)
        k = stream(kit, "local", n)
        r = stream(ref, model_path, n)
        print(f"| decode, {ip['tokens']} tokens | tok/s | ratio to in-process |")
        print("|---|---|---|")
        print(f"| mlx_lm.stream_generate in-process | {ip['tps']:.1f} | 1.00 |")
        print(f"| mlx-kit, HTTP stream | {k['tps']:.1f} | {k['tps'] / ip['tps']:.3f} |")
        print(f"| mlx_lm.server, HTTP stream | {r['tps']:.1f} | {r['tps'] / ip['tps']:.3f} |")
        print(f"(tokens: mlx-kit {k['tokens']}, mlx_lm.server {r['tokens']})\n")

        recorded = json.loads((ROOT / "tests" / "data" / "pi-0.73.1-request.json").read_text())
        body = copy.deepcopy(recorded)
        body["messages"][0]["content"] += f"\nrun {time.time()}"
        msgs = body["messages"]
        print("| pi replay turn | prompt tokens | cached tokens | TTFT s |")
        print("|---|---|---|---|")
        res: dict = {}
        for i, q in enumerate(["What is the capital of France?", "And of Spain?", "And of Italy?"]):
            if i:
                msgs += [{"role": "assistant", "content": res["text"]},
                         {"role": "user", "content": [{"type": "text", "text": q}]}]
            res = stream(kit, "local", {"max_completion_tokens": 24, "tools": body["tools"]}, msgs)
            u = res["usage"]
            print(f"| {i + 1} | {u['prompt_tokens']} | "
                  f"{u['prompt_tokens_details']['cached_tokens']} | {res['ttft']:.2f} |")

        print("\n| concurrent streams | aggregate decode tok/s | wall s |")
        print("|---|---|---|")
        for c in (1, 4):
            results: list = [None] * c
            t0 = time.perf_counter()
            threads = [threading.Thread(target=lambda i=i: results.__setitem__(
                i, stream(kit, "local", {"max_tokens": 64}, [{"role": "user", "content":
                                                             f"Story number {i} about a cat."}])))
                       for i in range(c)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            total = sum(x["tokens"] for x in results)
            print(f"| {c} | {total / wall:.1f} | {wall:.2f} |")
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


if __name__ == "__main__":
    main()
