"""Benchmark: the HTTP server's overhead, prompt-cache reuse on a pi replay, concurrency.

Side by side in one run, on the starter (dense f32, greedy):
- decode tok/s of `mlx_lm.stream_generate` in-process vs streamed through mlx-kit's HTTP
  API vs streamed through `mlx_lm.server` (same prompt, same tokens);
- TTFT of a recorded pi request (tests/data) over 3 turns: cold, then warm;
- aggregate decode tok/s of 1 stream vs 4 concurrent streams.

Usage: python bench/api.py [--tokens N] [--model PATH] [--no-eos]
(--model: any MLX model folder instead of the starter, e.g. one from bench/random_model.py
on a GPU machine; --no-eos: bias EOS away in every path, so random weights do not stop
early and every path decodes the same number of tokens.)
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


NO_EOS: dict = {}  # {"logit_bias": {...}} with --no-eos


def stream(base: str, model: str, body_extra: dict, messages=PROMPT) -> dict:
    """Stream one chat completion; returns ttft, decode tok/s over the stream, tokens."""
    body = {"model": model, "messages": messages, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}, **NO_EOS, **body_extra}
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


def in_process(model_path: str, tokens: int, repeat: int) -> dict:
    bias = {int(k): v for k, v in NO_EOS.get("logit_bias", {}).items()} or None
    code = f"""
import json, time
from pathlib import Path
from kit.blas import preload_blas; preload_blas()
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler
m, t = load(Path({model_path!r}) if Path({model_path!r}).is_dir() else {model_path!r})
p = t.apply_chat_template({PROMPT!r}, add_generation_prompt=True)
for _ in stream_generate(m, t, t.encode("Hi"), max_tokens=2): pass
procs = make_logits_processors(logit_bias={bias!r})
runs = []
for _ in range({repeat}):
  times = []
  for g in stream_generate(m, t, p, max_tokens={tokens}, sampler=make_sampler(temp=0.0),
                           logits_processors=procs):
    times.append(time.perf_counter()); last = g
  runs.append((len(times) - 1) / (times[-1] - times[0]))
print(json.dumps({{"tokens": last.generation_tokens, "tps": sorted(runs)[len(runs) // 2],
                  "runs": runs}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_table(kit: str, ref: str, model_path: str, args: argparse.Namespace) -> None:
    """Decode tok/s: in-process vs mlx-kit vs mlx_lm.server (medians, interleaved)."""
    n = {"max_tokens": args.tokens}
    before = in_process(model_path, args.tokens, args.repeat)
    ks, rs = [], []
    for _ in range(args.repeat):  # interleaved, so drift hits both servers alike
        ks.append(stream(kit, "local", n))
        rs.append(stream(ref, model_path, n))
    after = in_process(model_path, args.tokens, args.repeat)  # in-process brackets them
    runs = before["runs"] + after["runs"]
    ip = {"tokens": before["tokens"], "runs": runs, "tps": sorted(runs)[len(runs) // 2]}
    k = sorted(ks, key=lambda x: x["tps"])[len(ks) // 2]
    r = sorted(rs, key=lambda x: x["tps"])[len(rs) // 2]
    print(f"| decode, {ip['tokens']} tokens, median of {args.repeat} (in-process: "
          f"{2 * args.repeat}, before and after) | tok/s | "
          "ratio to in-process | runs |")
    print("|---|---|---|---|")
    fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    print(f"| mlx_lm.stream_generate in-process | {ip['tps']:.1f} | 1.00 | {fmt(ip['runs'])} |")
    print(f"| mlx-kit, HTTP stream | {k['tps']:.1f} | {k['tps'] / ip['tps']:.3f} | "
          f"{fmt(x['tps'] for x in ks)} |")
    print(f"| mlx_lm.server, HTTP stream | {r['tps']:.1f} | {r['tps'] / ip['tps']:.3f} | "
          f"{fmt(x['tps'] for x in rs)} |")
    print(f"(tokens: mlx-kit {k['tokens']}, mlx_lm.server {r['tokens']})\n", flush=True)


def pi_table(kit: str) -> None:
    """TTFT and cached tokens over a 3-turn replay of pi's recorded request."""
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
              f"{u['prompt_tokens_details']['cached_tokens']} | {res['ttft']:.2f} |", flush=True)
    print()


def concurrency_table(kit: str) -> None:
    """Aggregate decode tok/s of 1 stream vs 4 concurrent streams."""
    print("| concurrent streams | aggregate decode tok/s | wall s |")
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
        print(f"| {c} | {total / wall:.1f} | {wall:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--model", help="an MLX model folder (default: the starter)")
    ap.add_argument("--no-eos", action="store_true", help="bias EOS away everywhere")
    ap.add_argument("--repeat", type=int, default=3, help="decode runs per path (median)")
    ap.add_argument("--sections", default="decode,pi,concurrency",
                    help="which tables to measure (comma-separated)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-api-"))
    env = bench_env(work)
    model_path = str(Path(args.model).resolve()) if args.model else starter(env)
    if args.no_eos:
        eos = json.loads((Path(model_path) / "config.json").read_text()).get("eos_token_id", 2)
        NO_EOS["logit_bias"] = {str(e): -100 for e in (eos if isinstance(eos, list) else [eos])}
    sections = set(args.sections.split(","))
    kp, rp = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(kp),
                               "--model", model_path,
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
        stream(ref, model_path, {"max_tokens": 4})  # mlx_lm.server loads on first use
        if "decode" in sections:
            decode_table(kit, ref, model_path, args)
        if "pi" in sections:
            pi_table(kit)
        if "concurrency" in sections:
            concurrency_table(kit)
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


if __name__ == "__main__":
    main()
