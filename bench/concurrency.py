"""Benchmark: where aggregate decode goes at 1/2/4/8 concurrent streams, layer by layer,
side by side in one run.

Every layer decodes the same prompts (fresh ones per round, so no prompt cache helps),
``--tokens`` tokens each with EOS biased away, greedy; aggregate = completion tokens over
wall time from the first request sent to the last token (TTFT included), best of 2 rounds
after one untimed round per level (kernels compile on first use on CUDA; every layer
shares one kernel cache). The layers:

1. **BatchGenerator, all at once**: mlx-lm's ``BatchGenerator`` built as
   kit/engine/decode/batch.py builds it, every prompt inserted before the first step (the
   kernel limit the issue measures against);
2. **BatchGenerator, one first**: the first prompt decodes one token alone, then the rest
   are inserted (what a server sees when the requests arrive a moment apart);
3. **kit Engine in-process**: :class:`kit.engine.decode.engine.Engine` on its worker
   thread, the requests submitted at once from one event loop (the scheduler, lone
   decode, the hand-off into a batch, detokenizing and parsing; no HTTP, no pipe);
4. **mlx-kit server**: ``python -m kit serve``, streamed chat completions from one
   thread per stream (adds the engine process's pipe, the HTTP process, JSON and SSE);
5. **mlx_lm.server** (``--mlx-lm-server``), the same requests.

Also per level: the slowest TTFT (the issue's TTFT p99 at 8 streams: at most 8 samples, so
the max) against a lone request's. ``--profile``: cProfile of the in-process engine's
worker at the top level, the functions with the most own time (where host time goes).

Usage: python bench/concurrency.py [--model PATH] [--tokens 128] [--levels 1,2,4,8]
       [--mlx-lm-server] [--profile] [--compile-decode on|off]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # kit, for _common.openblas
from _common import bench_env, eos_ids, free_port, serving, starter, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def prompt_text(tag: str, words: int) -> str:
    body = " ".join(f"w{(i * 7919) % 1000} fox{i % 13}" for i in range(words // 2))
    return f"Summarize these notes. {tag}: {body}"


def rounds_for(n: int, words: int) -> list[list[str]]:
    """One untimed round and two timed ones of ``n`` distinct user messages."""
    return [[prompt_text(f"s{n}-r{k}-{j}", words + 5 * j) for j in range(n)] for k in range(3)]


IN_PROCESS = r"""
import asyncio, cProfile, io, json, os, pstats, sys, threading, time
spec = json.load(open(sys.argv[1]))
sys.path.insert(0, spec["root"])
from kit.blas import preload_blas; preload_blas()
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_logits_processors
from kit.engine.decode.prefill import prefill_step_size
bias = {int(k): v for k, v in spec["bias"].items()}
out = {}
if spec["layer"] == "batch":
    model, tok = load(spec["model"])
    procs = make_logits_processors(logit_bias=bias)
    def ids(text):
        return tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True)
    def batched(texts, one_first):
        bg = BatchGenerator(model, completion_batch_size=spec["max_batch"],
                            prefill_batch_size=min(spec["max_batch"], 8),
                            prefill_step_size=prefill_step_size())
        try:
            prompts = [ids(t) for t in texts]
            t0 = time.perf_counter()
            first, ttft, n, left = {}, [], 0, set()
            todo = prompts[1:] if one_first else []
            left |= set(bg.insert(prompts[:1] if one_first else prompts,
                                  max_tokens=[spec["tokens"]] * (1 if one_first else len(prompts)),
                                  logits_processors=[procs] * (1 if one_first else len(prompts))))
            while left:
                _, gen = bg.next()
                for r in gen:
                    if r.uid not in first:
                        first[r.uid] = time.perf_counter() - t0
                n += len(gen)
                left -= {r.uid for r in gen if r.finish_reason is not None}
                if todo and gen:
                    left |= set(bg.insert(todo, max_tokens=[spec["tokens"]] * len(todo),
                                          logits_processors=[procs] * len(todo)))
                    todo = []
            return n / (time.perf_counter() - t0), max(first.values())
        finally:
            bg.close()
    for level, rounds in spec["rounds"].items():
        for name, one_first in (("all", False), ("one_first", True)):
            batched(rounds[0], one_first)
            best = max(batched(r, one_first) for r in rounds[1:])
            out.setdefault(level, {})[name] = best
else:
    from kit.config import EngineConfig
    from kit.engine.decode.engine import Engine
    from kit.engine.types import ChatRequest, Finished, SamplingParams
    from kit.models.resolve import resolve_model
    engine = Engine(resolve_model(spec["model"]), EngineConfig(
        max_batch=spec["max_batch"], warmup="off", prompt_cache_disk=0,
        compile_decode=spec["compile_decode"]))
    prof = cProfile.Profile() if spec["profile"] else None
    def worker():
        if prof:
            prof.runcall(engine.run_worker)
        else:
            engine.run_worker()
    t = threading.Thread(target=worker); t.start()
    engine.wait_ready()
    async def one(text, t0):
        req = ChatRequest(messages=[{"role": "user", "content": text}],
                          params=SamplingParams(max_tokens=spec["tokens"], temperature=0,
                                                logit_bias=tuple(bias.items())))
        first, n = None, 0
        async for ev in engine.generate(req):
            if first is None and getattr(ev, "text", None):
                first = time.perf_counter() - t0
            if isinstance(ev, Finished):
                n = ev.usage.completion_tokens
        return n, first
    async def level(texts):
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(x, t0) for x in texts))
        return sum(n for n, _ in got) / (time.perf_counter() - t0), max(f for _, f in got)
    for lv, rounds in spec["rounds"].items():
        asyncio.run(level(rounds[0]))
        best = max((asyncio.run(level(r)) for r in rounds[1:]), key=lambda x: x[0])
        out[lv] = {"engine": best}
    engine.stop(); t.join()
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
print(json.dumps(out), flush=True)
# mlx 0.32.4's CUDA build can abort while the interpreter tears down ("terminate called
# without an active exception"), after the work is done: leave without the teardown
os._exit(0)
"""


def in_process(env: dict, layer: str, spec: dict) -> dict:
    path = Path(env["HOME"]) / f"spec-{layer}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**spec, "layer": layer, "root": str(ROOT)}))
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"in-process {layer} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stream(client: httpx.Client, url: str, text: str, tokens: int, bias: dict,
           t0: float, model: str = "local") -> tuple[int, float, str]:
    """One streamed chat completion on ``client``: (completion tokens, s from t0 to its
    first text, the response's id)."""
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "stream": True, "temperature": 0, "max_tokens": tokens, "logit_bias": bias,
            "stream_options": {"include_usage": True}}
    first, n, rid = None, 0, ""
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            rid = chunk.get("id", rid)
            n = (chunk.get("usage") or {}).get("completion_tokens", n)
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
    return n, first if first is not None else time.perf_counter() - t0, rid


def over_http(url: str, rounds: dict, tokens: int, bias: dict, model: str = "local") -> dict:
    """Per level: (best aggregate tok/s, its slowest TTFT, its requests' ids); ``model``:
    the id the server takes (mlx_lm.server: the model's path).

    As an agent's client sends: one client whose connections stay open (the untimed round
    opens them), each stream's thread started before the clock and released together. A
    new ``httpx.Client`` per request (an SSL context and a connection each, under one GIL)
    sent the streams 20-78 ms apart on the 2-core CPU: the client's cost, not the
    server's."""
    def level(client: httpx.Client, texts: list[str]) -> tuple[float, float, list[str]]:
        got: list = [None] * len(texts)
        go = threading.Barrier(len(texts) + 1)
        t0 = 0.0

        def one(i: int) -> None:
            go.wait()
            got[i] = stream(client, url, texts[i], tokens, bias, t0, model)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        go.wait()
        for t in threads:
            t.join()
        return (sum(n for n, _, _ in got) / (time.perf_counter() - t0),
                max(f for _, f, _ in got), [rid for _, _, rid in got])

    out = {}
    with httpx.Client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
                      ) as client:
        for lv, rs in rounds.items():
            level(client, rs[0])
            out[lv] = max((level(client, r) for r in rs[1:]), key=lambda x: x[0])
    return out


def arrival_spread(log: str, ids: list[str]) -> float | None:
    """Seconds from the first to the last of ``ids`` reaching the engine: the timestamps of
    their "starts" lines in the server's debug log (ms resolution), or None without them."""
    wanted = set(ids)
    stamps = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
              for line in log.splitlines()
              if (m := re.search(r" (\S+): starts: ", line)) and m[1] in wanted]
    return max(stamps) - min(stamps) if len(stamps) == len(ids) else None


def mlx_lm_server(env: dict, model: str, rounds: dict, tokens: int, bias: dict) -> dict:
    from _common import openblas

    port = free_port()
    e = dict(env)
    if openblas():
        e["LD_PRELOAD"] = openblas()
    proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", model,
                             "--port", str(port)], env=e, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/v1/models", proc, timeout=600)
        return over_http(url, rounds, tokens, bias, model)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="an MLX model folder (default: the f32 starter)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--words", type=int, default=30, help="prompt size (~3 tokens a word)")
    ap.add_argument("--mlx-lm-server", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compile-decode", default="off")
    ap.add_argument("--skip", default="", help="layers to skip: batch,engine,server")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    env = bench_env(work / "home")
    # one kernel cache for every layer (mlx's CUDA build; ignored elsewhere)
    env["MLX_PTX_CACHE_DIR"] = os.environ.get("MLX_PTX_CACHE_DIR", str(work / "ptx"))
    model = str(Path(args.model).resolve()) if args.model else starter(env)
    levels = [int(x) for x in args.levels.split(",")]
    rounds = {str(n): rounds_for(n, args.words) for n in levels}
    bias = {str(i): -100 for i in sorted(eos_ids(Path(model)))}
    spec = {"model": model, "tokens": args.tokens, "rounds": rounds, "bias": bias,
            "max_batch": max(levels), "profile": args.profile,
            "compile_decode": args.compile_decode}
    skip = set(args.skip.split(","))
    t0 = time.perf_counter()
    res: dict[str, dict] = {lv: {} for lv in rounds}
    if "batch" not in skip:
        for lv, v in in_process(env, "batch", spec).items():
            res[lv].update(v)
        print(f"(BatchGenerator done, {time.perf_counter() - t0:.0f} s) {json.dumps(res)}",
              file=sys.stderr, flush=True)
    profile = None
    if "engine" not in skip:
        got = in_process(env, "engine", spec)
        profile = got.pop("profile", None)
        for lv, v in got.items():
            res[lv].update(v)
        print(f"(engine done, {time.perf_counter() - t0:.0f} s) {json.dumps(res)}",
              file=sys.stderr, flush=True)
    if "server" not in skip:
        debug = {**env, "MLX_KIT_LOG_LEVEL": "debug"}  # the "starts" lines: arrivals
        with serving(debug, "--model", model, "--max-batch", str(max(levels)), "--warmup",
                     "off", "--prompt-cache-disk", "0", "--compile-decode",
                     args.compile_decode, timeout=900) as url:
            for lv, v in over_http(url, rounds, args.tokens, bias).items():
                res[lv]["server"] = v[:2]
                log = (Path(env["HOME"]) / f"serve-{url.rsplit(':', 1)[1]}.log").read_text()
                res[lv]["spread"] = arrival_spread(log, v[2])
        print(f"(server done, {time.perf_counter() - t0:.0f} s) {json.dumps(res)}",
              file=sys.stderr, flush=True)
    if args.mlx_lm_server:
        for lv, v in mlx_lm_server(env, model, rounds, args.tokens, bias).items():
            res[lv]["mlx_lm"] = v[:2]
    import mlx.core as mx

    print(f"bench/concurrency.py: {args.model or 'the float32 starter'} on "
          f"{mx.default_device()}, {args.tokens} tokens per stream, ~{args.words * 3}-token "
          f"prompts, best of 2 rounds, --compile-decode {args.compile_decode}; aggregate "
          f"tok/s (ratio to BatchGenerator all at once), slowest TTFT s")
    cols = [("all", "BatchGenerator all at once"), ("one_first", "BatchGenerator one first"),
            ("engine", "kit Engine in-process"), ("server", "mlx-kit server"),
            ("mlx_lm", "mlx_lm.server")]
    cols = [(k, name) for k, name in cols if any(k in res[lv] for lv in res)]
    print("| streams | " + " | ".join(name for _, name in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for lv in rounds:
        ref = res[lv].get("all")
        cells = []
        for k, _ in cols:
            v = res[lv].get(k)
            if v is None:
                cells.append("-")
                continue
            tps, ttft = v if isinstance(v, (list, tuple)) else (v, None)
            ratio = f" ({tps / ref[0]:.2f})" if ref and k != "all" else ""
            cells.append(f"{tps:.1f}{ratio}, {ttft:.2f} s")
        print(f"| {lv} | " + " | ".join(cells) + " |")
    spreads = {lv: res[lv].get("spread") for lv in rounds if res[lv].get("spread") is not None}
    if spreads:
        print("mlx-kit server: the timed round's requests reached the engine within "
              + ", ".join(f"{1000 * s:.0f} ms ({lv} streams)" for lv, s in spreads.items()))
    print(f"(total {time.perf_counter() - t0:.0f} s)")
    if profile:
        print("\nkit Engine worker, cProfile by own time (all levels):")
        print(profile)


if __name__ == "__main__":
    main()
