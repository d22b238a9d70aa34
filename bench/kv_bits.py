"""Benchmark: the KV cache at full precision vs ``--kv-bits 8`` vs ``--kv-bits 4``.

One run, on one model (default: the starter, dense float32), in this process, with the
caches the server builds (``kit.engine.cache.kv.quantized_cache``: quantized from the first
token, every plain KVCache layer). For each setting:

- memory per 1,000 tokens of context: a prompt of ``--context`` tokens prefilled into a
  fresh cache; measured as mlx's active memory after minus before (the cache's arrays,
  as allocated: mlx-lm grows caches in steps of 256 tokens) and as the cache's ``nbytes``,
  both scaled to 1,000 tokens; and what ``kit.models.memory.kv_bytes_per_token`` (the fit
  check, ``mlx-kit fit``) estimates;
- decode tok/s: ``--tokens`` greedy tokens after that context (EOS masked, so every run
  decodes the same count), best of ``--repeat``;
- greedy agreement with full precision on a fixed prompt set (chat template, ``--agree``
  tokens each): tokens equal until the first divergence, mean and minimum; and the
  teacher-forced top-1 agreement: full precision's greedy answers fed through the setting's
  cache, the share of steps whose argmax is the same token. The first measure falls at the
  first near-tie (the starter has many) and depends on the machine's kernels; the second is
  the feature's accuracy, checked against ``FLOOR`` (the tests assert only what holds on
  every machine: see tests/greedy.py).

Usage: python bench/kv_bits.py [--model PATH] [--context 1000] [--tokens 64] [--agree 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_env, starter  # noqa: E402

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain what a compiler does in two sentences.", "List three prime numbers.",
           "Name a famous painter.", "How do I reverse a list in Python?",
           "What is 12 times 12?", "Describe a cat in one sentence.",
           "Say hello in Spanish.", "What color is the sky?"]
SETTINGS = (None, 8, 4)
# Teacher-forced top-1 agreement with full precision a setting must reach (measured on the
# starter: 8-bit 0.97-1.00 over six BLAS kernels; 4-bit is lossy and has no floor).
FLOOR = {8: 0.9}


def new_cache(model, bits: int | None, group: int):
    from mlx_lm.models.cache import make_prompt_cache

    from kit.engine.cache.kv import quantized_cache

    cache = make_prompt_cache(model)
    return cache if bits is None else quantized_cache(cache, bits, group)


def prefill(model, cache, tokens: list[int], step: int = 512) -> None:
    import mlx.core as mx

    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i:i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])


def memory_per_1k(model, tokens: list[int], bits: int | None, group: int) -> tuple[int, int]:
    """(active-memory delta, cache nbytes) of ``tokens`` prefilled, per 1,000 tokens."""
    import gc

    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    cache = new_cache(model, bits, group)
    prefill(model, cache, tokens)
    gc.collect()
    mx.clear_cache()
    delta = mx.get_active_memory() - before
    nbytes = sum(c.nbytes for c in cache)
    del cache
    scale = 1000 / len(tokens)
    return int(delta * scale), int(nbytes * scale)


def decode_tps(model, tok, context: list[int], n: int, bits: int | None, group: int,
               repeat: int) -> float:
    """Best greedy decode tok/s of ``n`` tokens after ``context`` (EOS masked)."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    eos = list(tok.eos_token_ids)

    def no_eos(_tokens, logits):
        logits[:, eos] = -float("inf")
        return logits

    best = 0.0
    for _ in range(repeat):
        cache = new_cache(model, bits, group)
        prefill(model, cache, context[:-1])
        t0, count = None, 0
        for g in stream_generate(model, tok, context[-1:], max_tokens=n, prompt_cache=cache,
                                 sampler=make_sampler(0.0), logits_processors=[no_eos]):
            if t0 is None:
                t0 = time.perf_counter()  # from the first token: decode, not prefill
            count += 1
        mx.eval([c.state for c in cache])
        if count > 1:
            best = max(best, (count - 1) / (time.perf_counter() - t0))
    return best


def greedy(model, tok, prompt: list[int], n: int, bits: int | None, group: int) -> list[int]:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    cache = new_cache(model, bits, group)
    return [g.token for g in stream_generate(model, tok, prompt, max_tokens=n,
                                             prompt_cache=cache, sampler=make_sampler(0.0))]


def forced_agreement(model, prompt: list[int], answer: list[int], bits: int | None,
                     group: int) -> tuple[int, int]:
    """(steps whose argmax is ``answer``'s token, steps) with ``answer`` fed after
    ``prompt`` through a fresh cache of the setting (one forward, teacher forcing)."""
    import mlx.core as mx

    cache = new_cache(model, bits, group)
    prefill(model, cache, prompt[:-1])
    logits = model(mx.array([prompt[-1], *answer[:-1]])[None], cache=cache)[0]
    picked = mx.argmax(logits, axis=-1).tolist()
    return sum(int(a == b) for a, b in zip(picked, answer)), len(answer)


def agreement(base: list[int], other: list[int]) -> int:
    """Tokens equal until the first divergence (the shorter length if none)."""
    for i, (a, b) in enumerate(zip(base, other)):
        if a != b:
            return i
    return min(len(base), len(other))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (default: the starter, f32)")
    ap.add_argument("--context", type=int, default=1000, help="context tokens")
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per tok/s run")
    ap.add_argument("--repeat", type=int, default=2, help="tok/s runs per setting (best)")
    ap.add_argument("--agree", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--group-size", type=int, default=64)
    args = ap.parse_args()

    import json
    import os

    from kit.blas import preload_blas

    preload_blas()  # before mlx is imported (as the engine does): OpenBLAS's sgemm

    if args.model:
        folder = args.model
    else:  # a throwaway HOME: the starter is built there, never in the user's cache
        home = Path(tempfile.mkdtemp(prefix="mlx-kit-bench-kv-"))
        env = bench_env(home)
        folder = starter(env)
        os.environ.update(HOME=env["HOME"])
    from mlx_lm import load

    from kit.models.memory import kv_bytes_per_token

    model, tok = load(folder)
    config = json.loads((Path(folder) / "config.json").read_text())
    text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in
                    range(args.context))
    context = tok.encode(text)[:args.context]
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True) for p in PROMPTS]
    base = [greedy(model, tok, p, args.agree, None, args.group_size) for p in prompts]
    rows = []
    for bits in SETTINGS:
        delta, nbytes = memory_per_1k(model, context, bits, args.group_size)
        est = kv_bytes_per_token(config, bits, args.group_size) * 1000
        tps = decode_tps(model, tok, context, args.tokens, bits, args.group_size, args.repeat)
        agree = [agreement(b, greedy(model, tok, p, args.agree, bits, args.group_size))
                 for b, p in zip(base, prompts)]
        forced = [forced_agreement(model, p, b, bits, args.group_size)
                  for b, p in zip(base, prompts)]
        rate = sum(f[0] for f in forced) / max(1, sum(f[1] for f in forced))
        rows.append((bits, delta, nbytes, est, tps, agree, rate))
        print(f"  measured {'full' if bits is None else f'{bits}-bit'}", file=sys.stderr)
    full = rows[0]
    name = next((part[len("models--"):].replace("--", "/") for part in Path(folder).parts
                 if part.startswith("models--")), Path(folder).name)
    print(f"model {name} ({config.get('torch_dtype')}), context {len(context)} "
          f"tokens, group size {args.group_size}, {args.tokens} decoded tokens (best of "
          f"{args.repeat}), agreement over {len(PROMPTS)} prompts x {args.agree} tokens "
          f"(full precision's row: its own answers' lengths, the most any row can reach)\n")
    print("| KV cache | memory / 1k tokens (active delta) | cache nbytes / 1k | estimate / 1k "
          "| vs full | decode tok/s | vs full | greedy agreement (mean / min tokens) "
          "| top-1 agreement, teacher-forced (floor) |")
    print("|---|---|---|---|---|---|---|---|---|")
    below = []
    for bits, delta, nbytes, est, tps, agree, rate in rows:
        floor = FLOOR.get(bits)
        if floor is not None and rate < floor:
            below.append(f"--kv-bits {bits}: {rate:.3f} < {floor}")
        name = "full precision" if bits is None else f"--kv-bits {bits}"
        print(f"| {name} | {delta / 1e6:.2f} MB | {nbytes / 1e6:.2f} MB | {est / 1e6:.2f} MB "
              f"| {nbytes / full[2]:.2f} | {tps:.1f} | {tps / full[4]:.2f} | "
              f"{statistics.mean(agree):.1f} / {min(agree)} of {args.agree} | {rate:.3f}"
              + (f" (>= {floor})" if floor is not None else "") + " |")
    if below:
        sys.exit("below the agreement floor: " + "; ".join(below))


if __name__ == "__main__":
    main()
