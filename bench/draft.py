"""Benchmark: speculative decoding, with and without a draft model, side by side in one run.

For each prompt (greedy, ``--tokens`` new tokens): decode tok/s of the model alone and with
the draft, the draft's acceptance (proposals kept / proposals checked), and whether the two
texts are equal (they must be, under greedy decoding). Two ways:

- **in-process**: ``mlx_lm.stream_generate`` with and without ``draft_model`` (what mlx-lm
  itself gets);
- **mlx-kit** (``--server``): ``python -m kit serve --model M`` and ``... --draft-model D``,
  one after the other, streamed chat completions; acceptance from ``/health``'s ``draft``.

Defaults: the float32 starter with its 4-bit variant as the draft (the same tokenizer;
what can be had offline here). ``--layers N`` drafts with the model's own first N layers
instead (an in-process cut of MODEL: a stand-in for a small model of the same family on
machines with no real pair, e.g. the random 8B model of bench/random_model.py on the lent
GPU; random weights make its acceptance meaningless for real pairs).

Usage: python bench/draft.py [--model ID] [--draft ID | --layers N] [--tokens 128]
       [--num-draft-tokens 3] [--server]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, first_difference, serving, starter, streamed_answer  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is in three sentences.",
           "List five uses of a lighthouse."]


def in_process(model_path: str, draft_path: str | None, layers: int | None, tokens: int,
               num_draft: int) -> list[dict]:
    """Per prompt: tok/s alone and with the draft, acceptance, and text equality."""
    import copy

    import mlx.core as mx
    from mlx_lm import load, stream_generate

    model, tok = load(model_path)
    if layers is not None:
        draft = copy.copy(model)
        draft.model = copy.copy(model.model)
        draft.model.layers = model.model.layers[:layers]
    else:
        draft, _ = load(draft_path)
    rows = []
    for text in ["Warm up."] + PROMPTS:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)
        out = {}
        for name, kw in (("alone", {}), ("draft", {"draft_model": draft,
                                                   "num_draft_tokens": num_draft})):
            pieces, flags, tps = [], [], 0.0
            for r in stream_generate(model, tok, prompt, max_tokens=tokens, **kw):
                pieces.append(r.text)
                flags.append(r.from_draft)
                tps = r.generation_tps
            out[name] = ("".join(pieces), flags, tps)
            mx.clear_cache()
        if text == "Warm up.":
            continue
        flags = out["draft"][1]
        steps = sum(1 for f in flags if not f)
        accepted = len(flags) - steps
        rows.append({"alone_tps": out["alone"][2], "draft_tps": out["draft"][2],
                     "acceptance": accepted / max(1, steps * num_draft),
                     "same": out["alone"][0] == out["draft"][0]})
    return rows


def through_server(env: dict, model: str, draft: str, tokens: int, num_draft: int) -> dict:
    """tok/s medians of mlx-kit without and with ``--draft-model``, the acceptance the
    server reports, and whether every text was equal."""
    texts, speeds, acceptance = {}, {}, None
    for name, extra in (("alone", []), ("draft", ["--draft-model", draft,
                                                   "--num-draft-tokens", str(num_draft)])):
        with serving(env, "--model", model, "--temperature", "0", *extra) as root:
            got, tps = [], []
            for text in ["Warm up."] + PROMPTS:
                answer, n, first = streamed_answer(root, {
                    "model": "local", "max_tokens": tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": text}]})
                if text != "Warm up.":
                    got.append(answer)
                    tps.append((n - 1) / (time.perf_counter() - first) if first else 0.0)
            texts[name], speeds[name] = got, statistics.median(tps)
            if extra:
                acceptance = httpx.get(root + "/health").json()["draft"]["acceptance"]
    for prompt, a, b in zip(PROMPTS, texts["alone"], texts["draft"]):
        if a != b:
            at = first_difference(a, b)
            print(f"  texts differ for {prompt!r} at character {at}: {a[at:at + 30]!r} "
                  f"alone, {b[at:at + 30]!r} with the draft")
    return {"alone_tps": speeds["alone"], "draft_tps": speeds["draft"],
            "acceptance": acceptance, "same": texts["alone"] == texts["draft"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the float32 starter")
    ap.add_argument("--draft", default=None, help="default: the 4-bit starter")
    ap.add_argument("--layers", type=int, default=None,
                    help="draft with the model's first N layers (in-process only)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--server", action="store_true", help="also through mlx-kit")
    args = ap.parse_args()
    env = bench_env(Path(tempfile.mkdtemp(prefix="bench-draft-")) / "home")

    def folder(spec: str) -> str:
        """A folder as it is (no kit import: the lent GPU machine has none of its
        dependencies); an id found in your Hugging Face cache."""
        if Path(spec).is_dir():
            return spec
        from kit.models.resolve import resolve_model
        return str(resolve_model(spec).path)

    # the defaults are built in a throwaway cache
    model = folder(args.model) if args.model else starter(env)
    if args.draft or args.layers:
        draft = folder(args.draft) if args.draft else None
    else:
        from kit.models.starter import STARTER_4BIT_ID
        draft = starter(env, STARTER_4BIT_ID)
    rows = in_process(model, draft, args.layers, args.tokens, args.num_draft_tokens)
    what = f"its first {args.layers} layers" if args.layers else args.draft or "the 4-bit starter"
    print(f"bench/draft.py: {args.model or 'the float32 starter'} drafted by {what}, "
          f"{args.num_draft_tokens} draft tokens, "
          f"{args.tokens} new tokens, greedy, {len(rows)} prompts")
    med = statistics.median
    lines = [("in-process tok/s, alone", f"{med(r['alone_tps'] for r in rows):.1f}"),
             ("in-process tok/s, with the draft", f"{med(r['draft_tps'] for r in rows):.1f}"),
             ("  speed-up (with / alone)",
              f"{med(r['draft_tps'] for r in rows) / med(r['alone_tps'] for r in rows):.2f}"),
             ("  acceptance", f"{med(r['acceptance'] for r in rows):.2f}"),
             ("  same text every prompt", str(all(r["same"] for r in rows)))]
    if args.server and draft:
        s = through_server(env, model, draft, args.tokens, args.num_draft_tokens)
        lines += [("mlx-kit tok/s, alone", f"{s['alone_tps']:.1f}"),
                  ("mlx-kit tok/s, --draft-model", f"{s['draft_tps']:.1f}"),
                  ("  speed-up (with / alone)", f"{s['draft_tps'] / s['alone_tps']:.2f}"),
                  ("  acceptance (/health)", f"{s['acceptance']}"),
                  ("  same text every prompt", str(s["same"]))]
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
