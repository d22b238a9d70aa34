"""Benchmark: compiled decode (``--compile-decode``) against the eager step, side by side
in one run.

For each prompt (greedy, ``--tokens`` new tokens, EOS biased away so both decode the same
count), alternating eager and compiled ``--rounds`` times: decode tok/s, time to first
token (the compiled one traces its step before its first token) and whether the two
texts are equal. Two ways:

- **in-process**: ``mlx_lm.stream_generate`` given the model, or
  :class:`kit.engine.decode.compiled.CompiledModel` in its place (what the engine does);
- **mlx-kit** (``--server``): ``python -m kit serve --compile-decode off`` and ``on``, one
  after the other, streamed chat completions.

Default model: the float32 starter. On the lent GPU: ``--model`` the random 8B of
bench/random_model.py (no kit dependencies are needed for the in-process part).

Usage: python bench/compiled.py [--model PATH] [--tokens 128] [--rounds 3] [--server]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, serving, starter, streamed_answer  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is in three sentences.",
           "List five uses of a lighthouse."]


def eos_bias(tok) -> dict[int, float]:
    return {int(i): -100.0 for i in tok.eos_token_ids}


def in_process(model_path: str, tokens: int, rounds: int) -> dict:
    """Medians over prompts and rounds: tok/s and TTFT eager and compiled, text equality."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_logits_processors

    from kit.engine.decode.compiled import CompiledModel

    model, tok = load(model_path)
    procs = make_logits_processors(logit_bias=eos_bias(tok))
    got: dict[str, list] = {"eager": [], "compiled": []}
    same = True
    for r in range(rounds + 1):  # round 0 warms both paths up (kernels, buffers)
        for text in PROMPTS:
            prompt = tok.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True)
            texts = {}
            for name in ("eager", "compiled"):
                cache = make_prompt_cache(model)
                step = CompiledModel(model, cache) if name == "compiled" else None
                t0, first, pieces, tps = time.perf_counter(), None, [], 0.0
                for g in stream_generate(step or model, tok, prompt, max_tokens=tokens,
                                         logits_processors=procs,
                                         prompt_cache=step.caches if step else cache):
                    first = first or time.perf_counter() - t0
                    pieces.append(g.text)
                    tps = g.generation_tps
                texts[name] = "".join(pieces)
                if r:
                    got[name].append((tps, first))
                mx.clear_cache()
            same = same and (r == 0 or texts["eager"] == texts["compiled"])
    med = statistics.median
    return {name: (med(t for t, _ in rows), med(f for _, f in rows))
            for name, rows in got.items()} | {"same": same}


def through_server(env: dict, model: str, tokens: int, rounds: int) -> dict:
    """tok/s medians of mlx-kit with --compile-decode off and on, and text equality."""
    out: dict = {}
    texts: dict[str, list] = {}
    for mode in ("off", "on"):
        with serving(env, "--model", model, "--temperature", "0", "--compile-decode", mode,
                     "--warmup", "off") as root:
            tps, got = [], []
            for r in range(rounds + 1):
                for i, text in enumerate(PROMPTS):
                    # a fresh prompt each round: no prompt cache shortcut on either side
                    answer, n, first = streamed_answer(root, {
                        "model": "local", "max_tokens": tokens, "temperature": 0,
                        "messages": [{"role": "user", "content": f"({r}) {text}"}]})
                    if r:
                        tps.append((n - 1) / (time.perf_counter() - first) if first else 0.0)
                        got.append(answer)
            out[mode], texts[mode] = statistics.median(tps), got
    return {"eager": out["off"], "compiled": out["on"], "same": texts["off"] == texts["on"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model folder (default: the f32 starter)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", action="store_true", help="also through mlx-kit")
    args = ap.parse_args()
    env = bench_env(Path(tempfile.mkdtemp(prefix="bench-compiled-")) / "home")
    model = args.model or starter(env)
    import mlx.core as mx

    print(f"bench/compiled.py: {args.model or 'the float32 starter'} on "
          f"{mx.default_device()}, {args.tokens} new tokens, greedy, {len(PROMPTS)} prompts x "
          f"{args.rounds} rounds (medians)")
    p = in_process(model, args.tokens, args.rounds)
    rows = [("in-process", p["eager"][0], p["compiled"][0], p["same"],
             f"TTFT {p['eager'][1]:.3f} / {p['compiled'][1]:.3f} s")]
    if args.server:
        s = through_server(env, model, args.tokens, args.rounds)
        rows.append(("mlx-kit", s["eager"], s["compiled"], s["same"], ""))
    print("| decode | eager tok/s | compiled tok/s | compiled / eager | same text | |")
    print("|---|---|---|---|---|---|")
    for name, e, c, same, note in rows:
        print(f"| {name} | {e:.1f} | {c:.1f} | {c / e:.2f} | {same} | {note} |")


if __name__ == "__main__":
    main()
