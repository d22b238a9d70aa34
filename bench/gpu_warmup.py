"""Benchmark: warm before ready (`serve --warmup`) on a fresh GPU machine, and aggregate
decode at 1/2/4/8 streams against the in-process batched forward.

One command, side by side, on one model (default: a random-weight Llama-3-8B-shaped 4-bit
model made by bench/random_model.py, tokenizer from the starter; `--quick`: the starter):

1. Three mlx-kit servers, one after the other, each with its own MLX_PTX_CACHE_DIR (mlx's
   CUDA kernel cache; an explicit variable wins over mlx-kit's default): `--warmup off`
   with an empty cache, `--warmup on` with an empty cache, `--warmup on` again with the
   cache the second one filled. For each: seconds to ready (/health "ok"), the first
   request's TTFT, a second request of another prompt length, and the first batch of 4
   concurrent requests (the slowest TTFT of the 4 and their wall time); the warm-up's own
   seconds (from the log) and the kernel files in the cache after the run.
2. On the last server: aggregate decode tok/s at 1/2/4/8 concurrent streams (fresh prompts
   each round, EOS biased away so every stream decodes the same count), against mlx-lm's
   BatchGenerator in-process (the construction kit/engine/decode/batch.py uses) over the same
   prompt tokens and the same token count, as ratios; at 1 stream also stream_generate
   (what mlx-kit runs for a request alone).

TTFT is measured by the client: from sending a streamed request to its first chunk with
text. Random weights write noise; speed depends on the shapes, not the values.

Usage: python bench/gpu_warmup.py [--quick] [--model PATH] [--tokens N] [--keep]
(--model: an MLX folder to use instead of building one; --keep: leave the work folder.)
On the GPU machine, set PYTHONPATH so `import mlx` finds the CUDA build; mlx-kit itself
runs from this checkout (`python -m kit`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, eos_ids, free_port, starter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NO_EOS: dict = {}  # {"logit_bias": {id: -100}}, filled in main


def text_of(n_words: int, tag: str) -> str:
    """A user message of about ``3.3 * n_words`` tokens that starts with ``tag`` (distinct
    tags share no prompt-cache prefix past the chat template's)."""
    words = [f"{tag}:"] + [f"w{(i * 7919) % 1000} fox{i % 13}" for i in range(n_words // 2)]
    return "Summarize these notes. " + " ".join(words)


def chat(tag: str, n_words: int) -> list[dict]:
    return [{"role": "user", "content": text_of(n_words, tag)}]


def stream(v1: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat completion: ttft (s to the first chunk with text), wall (s),
    prompt and completion tokens (usage)."""
    body = {"model": "local", "messages": messages, "stream": True, "temperature": 0,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True}, **NO_EOS}
    t0 = time.perf_counter()
    ttft, usage = None, {}
    with httpx.stream("POST", v1 + "/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if ttft is None and (delta.get("content") or delta.get("reasoning_content")):
                ttft = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"ttft": wall if ttft is None else ttft, "wall": wall,
            "prompt": usage.get("prompt_tokens"), "tokens": usage.get("completion_tokens", 0)}


def concurrent(v1: str, prompts: list[list[dict]], max_tokens: int) -> tuple[list[dict], float]:
    """``prompts`` sent at once; (each one's :func:`stream` result, wall s of all)."""
    out: list = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, stream(v1, prompts[i], max_tokens))) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


class Kit:
    """One `mlx-kit serve` on ``model`` with its own kernel cache ``ptx``."""

    def __init__(self, work: Path, env: dict, model: str, warmup: str, ptx: Path,
                 name: str, max_batch: int) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.v1 = self.root + "/v1"
        self.log = work / f"{name}.log"
        ptx.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "kit", "serve", "--port", str(self.port), "--model",
               model, "--temperature", "0", "--warmup", warmup, "--max-batch",
               str(max_batch), "--log-file", str(self.log)]
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env={**env, "MLX_PTX_CACHE_DIR": str(ptx)},
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     cwd=ROOT)

    def wait_ready(self, timeout: float = 900) -> tuple[float, list[str]]:
        """Seconds from the start to /health "ok", and the phases /health showed."""
        phases: list[str] = []
        while time.perf_counter() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited; see {self.log}:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                h = httpx.get(self.root + "/health", timeout=2).json()
                if h.get("phase") and h["phase"] not in phases:
                    phases.append(h["phase"])
                if h["status"] == "ok":
                    return time.perf_counter() - self.t0, phases
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.root} not ready after {timeout} s; see {self.log}")

    def warmup_seconds(self) -> float | None:
        m = re.search(r"warmed up \d+ shapes in ([0-9.]+) s", self.log.read_text(errors="replace"))
        return float(m.group(1)) if m else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def files_in(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


def first_requests(kit: Kit, sizes: dict, tokens: int) -> dict:
    """The first request, a second of another prompt length, the first batch of 4."""
    first = stream(kit.v1, chat("first", sizes["first"]), tokens)
    second = stream(kit.v1, chat("second", sizes["second"]), tokens)
    batch, wall = concurrent(kit.v1, [chat(f"batch{i}", sizes["batch"] + 9 * i)
                                      for i in range(4)], tokens)
    return {"first": first, "second": second, "batch_ttft": max(b["ttft"] for b in batch),
            "batch_wall": wall}


IN_PROCESS = r"""
import json, sys, time
from kit.blas import preload_blas; preload_blas()
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_logits_processors
from kit.engine.decode.prefill import prefill_step_size
spec = json.load(open(sys.argv[1]))
model, tok = load(spec["model"])
procs = make_logits_processors(logit_bias={int(k): v for k, v in spec["bias"].items()} or None)
def ids(messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True)
def batched(rounds):
    # kit/engine/decode/batch.py's construction; no stop sequences: every row
    # decodes spec["tokens"] tokens
    bg = BatchGenerator(model, completion_batch_size=spec["max_batch"],
                        prefill_batch_size=min(spec["max_batch"], 8),
                        prefill_step_size=prefill_step_size())
    try:
        prompts = [ids(m) for m in rounds]
        t0 = time.perf_counter()
        left = set(bg.insert(prompts, max_tokens=[spec["tokens"]] * len(prompts),
                             logits_processors=[procs] * len(prompts)))
        n = 0
        while left:
            _, gen = bg.next()
            n += len(gen)
            left -= {r.uid for r in gen if r.finish_reason is not None}
        return n / (time.perf_counter() - t0)
    finally:
        bg.close()
def alone(messages):
    t0 = time.perf_counter()
    n = 0
    for r in stream_generate(model, tok, ids(messages), max_tokens=spec["tokens"],
                             logits_processors=procs):
        n = r.generation_tokens
    return n / (time.perf_counter() - t0)
out = {}
for n, warm, timed in spec["rounds"]:
    batched(warm)  # untimed: this batch size's kernels, compiled or read from the cache
    out[str(n)] = {"tps": max(batched(r) for r in timed)}
alone(spec["rounds"][0][1][0])  # untimed
out["alone"] = max(alone(r[0]) for r in spec["rounds"][0][2])
print(json.dumps(out))
"""


def in_process(work: Path, env: dict, model: str, ptx: Path, rounds: list, tokens: int,
               max_batch: int) -> dict:
    """mlx-lm in a process of its own on the same kernel cache: BatchGenerator tok/s per
    batch size (best of the timed rounds), and stream_generate's for one stream."""
    spec = work / "in-process.json"
    spec.write_text(json.dumps({"model": model, "tokens": tokens, "rounds": rounds,
                                "max_batch": max_batch,
                                "bias": {int(k): v for k, v in
                                         NO_EOS.get("logit_bias", {}).items()}}))
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(spec)], cwd=ROOT,
                         env={**env, "MLX_PTX_CACHE_DIR": str(ptx)}, capture_output=True,
                         text=True)
    if out.returncode:
        raise RuntimeError(f"in-process run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="the starter, tiny sizes, 1-2 streams, --max-batch 2 (CPU: proves "
                         "the script end to end)")
    ap.add_argument("--model", help="an MLX model folder (default: build the random 8B)")
    ap.add_argument("--tokens", type=int, help="tokens per stream in the throughput table "
                    "(default 128; --quick 16)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-warmup-"))
    env = bench_env(work)
    # words (~3 tokens each through the starter's tokenizer)
    sizes = ({"first": 40, "second": 110, "batch": 8} if args.quick else
             {"first": 170, "second": 450, "batch": 30})
    tokens = args.tokens or (8 if args.quick else 128)
    levels = (1, 2) if args.quick else (1, 2, 4, 8)  # concurrent streams
    max_batch = levels[-1]
    try:
        if args.model:
            model = str(Path(args.model).resolve())
        elif args.quick:
            model = starter(env)
        else:
            model = str(work / "llama3-8b-4bit")
            subprocess.run([sys.executable, str(ROOT / "bench" / "random_model.py"), model,
                            "--tokenizer", starter(env)], env=env, check=True, cwd=ROOT)
        NO_EOS["logit_bias"] = {str(e): -100 for e in sorted(eos_ids(Path(model)))}
        print(f"model: {model}\n", flush=True)

        runs = [("--warmup off, empty kernel cache", "off", work / "ptx-off"),
                ("--warmup on, empty kernel cache", "on", work / "ptx-on"),
                ("--warmup on, kernel cache warm", "on", work / "ptx-on")]
        print("| server | ready s | warm-up s | phases seen | first request TTFT s "
              "(prompt tokens) | second request TTFT s (prompt tokens) | first batch of 4: "
              "slowest TTFT s / wall s | kernel files after |")
        print("|---|---|---|---|---|---|---|---|", flush=True)
        kit = None
        for i, (name, mode, ptx) in enumerate(runs):  # each row as soon as it is measured
            kit = Kit(work, env, model, mode, ptx, f"kit-{i}", max_batch)
            ready, phases = kit.wait_ready()
            r = first_requests(kit, sizes, 8)
            warm = kit.warmup_seconds()
            print(f"| {name} | {ready:.1f} | {'-' if warm is None else f'{warm:.1f}'} | "
                  f"{', '.join(phases) or '-'} | {r['first']['ttft']:.2f} "
                  f"({r['first']['prompt']}) | {r['second']['ttft']:.2f} "
                  f"({r['second']['prompt']}) | {r['batch_ttft']:.2f} / "
                  f"{r['batch_wall']:.2f} | {files_in(ptx)} |", flush=True)
            if i < len(runs) - 1:
                kit.stop()
        print(flush=True)

        # throughput on the last (warm) server, then in-process over the same prompts
        rounds, served = [], {}
        for n in levels:
            timed = [[chat(f"r{k}-s{n}-{j}", sizes["batch"] + 5 * j) for j in range(n)]
                     for k in range(2)]
            warm = [chat(f"warm-s{n}-{j}", sizes["batch"] + 5 * j) for j in range(n)]
            rounds.append((n, warm, timed))
            best = 0.0
            for prompts in timed:
                results, wall = concurrent(kit.v1, prompts, tokens)
                done = sum(x["tokens"] for x in results)
                assert done == n * tokens, f"{done} tokens, expected {n * tokens} (EOS?)"
                best = max(best, done / wall)
            served[n] = best
            print(f"(mlx-kit, {n} streams: {best:.1f} tok/s)", file=sys.stderr, flush=True)
        kit.stop()
        ref = in_process(work, env, model, runs[-1][2], rounds, tokens, max_batch)
        print(f"| streams ({tokens} tokens each, best of 2) | mlx-kit aggregate tok/s | "
              "in-process BatchGenerator tok/s | ratio |")
        print("|---|---|---|---|")
        for n in levels:
            b = ref[str(n)]["tps"]
            print(f"| {n} | {served[n]:.1f} | {b:.1f} | {served[n] / b:.3f} |")
        print(f"| 1 (in-process stream_generate) | {served[1]:.1f} | {ref['alone']:.1f} | "
              f"{served[1] / ref['alone']:.3f} |")
        print(f"\n(aggregate = completion tokens / wall time, TTFT included, on both sides; "
              f"total bench wall {time.perf_counter() - t_start:.0f} s)")
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
