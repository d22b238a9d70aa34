"""TTFT for one 512x512 image with mlx-vlm in-process, and what a cached second turn saves.

For issue 28: one image's cost in tokens and time to first token, on whatever device mlx
runs on (a lent GPU or this machine's CPU). Models are bench/random_vlm.py's random-weight
Qwen2.5-VL folders, built here (random init) at the shapes asked for: ``tiny`` (hidden 128;
on a GPU its TTFT is all overhead) and ``3b`` (Qwen2.5-VL-3B-Instruct's shapes, bf16, with
the starter's 49,157-token vocabulary instead of 151,936).

For each shape: build the folder, ``mlx_vlm.load`` it (load_s), then 1 warm-up conversation
and RUNS measured ones. A conversation is the way mlx-kit's engine goes
(kit/engine/decode/vision_decode.py): a new 512x512 PNG (different pixels each time, so
nothing can be reused between conversations) -> PIL -> chat template -> ``prepare_inputs``
-> ``stream_generate`` with a fresh ``PromptCacheState`` (turn 1, 8 tokens); then turn 2,
the same image plus the turn-1 answer and a follow-up question, rendered again and sent with
the same state, which reuses the common prefix's KV (its ``cached_tokens``) and skips the
vision tower. TTFT counts from the PNG bytes to the first token (preprocessing included).

Measured 2026-12-06 (mlx 0.32.4, mlx-vlm 0.7.10; 512x512 -> 324 image tokens, 350 prompt
tokens; TTFT median of 5, preprocessing ~0.02 s included; turn 2 reuses 358 of 375 tokens):
| device | shape | load s | cold TTFT s | TTFT s | turn 2 TTFT s |
|---|---|---|---|---|---|
| NVIDIA H200 (lent) | tiny | 0.33 | 30.1 (kernel JIT) | 0.031 | 0.026 |
| NVIDIA H200 (lent) | 3b | 2.69 (7.1 GB) | 1.95 | 0.095 | 0.054 |
| CPU, 2 cores (dev machine) | tiny | 0.59 | 1.02 | 0.78 | 0.042 |
The 3b shape was not run on this CPU: mlx's CPU matmul runs at ~3 GFLOP/s in bf16 here and
one 3b TTFT is ~4 TFLOP (vision tower ~1.7, 350-token prefill ~2), i.e. ~20 min.
On the GPU: ``bash bench/vision_gpu_device.sh`` (how mlx travels there).

Usage: python bench/vision_gpu.py [--shapes tiny,3b] [--runs 5] [--dir /tmp/vision_gpu]
                                  [--tokenizer DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import random_vlm  # noqa: E402

QUESTION = "Describe this image."
FOLLOW_UP = "What colours does it use?"


def device_name() -> str:
    """mlx's default device, with the GPU's name where nvidia-smi gives it."""
    import mlx.core as mx

    dev = mx.default_device()
    name = ""
    if dev.type == mx.DeviceType.gpu:
        try:
            name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20
                                  ).stdout.strip().splitlines()[0]
        except Exception:  # noqa: BLE001 (a name is only a label)
            name = str(mx.device_info().get("device_name", ""))
    else:
        name = str(mx.device_info().get("device_name", ""))
    return f"{dev} ({name})" if name else str(dev)


def _turn(model, processor, messages: list, png: bytes, state, max_tokens: int) -> dict:
    """One request: bytes -> image -> template -> processor -> stream_generate, consumed to
    the end (the state records the turn only then)."""
    from mlx_vlm import prepare_inputs, stream_generate
    from mlx_vlm.utils import load_image

    t0 = time.perf_counter()
    image = load_image(io.BytesIO(png))
    prompt = processor.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=True)
    inputs = prepare_inputs(processor, images=[image], prompts=prompt,
                            add_special_tokens=False)
    preprocess_s = time.perf_counter() - t0
    input_ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items()
             if k not in ("input_ids", "pixel_values", "attention_mask")}
    ttft_s, text, cached, n = None, "", 0, 0
    for r in stream_generate(model, processor, "", input_ids=input_ids,
                             pixel_values=inputs["pixel_values"],
                             mask=inputs["attention_mask"], max_tokens=max_tokens,
                             temperature=0.0, prompt_cache_state=state, **extra):
        if ttft_s is None:
            ttft_s = time.perf_counter() - t0
            cached = r.cached_tokens
        text += r.text
        n = r.generation_tokens
    total_s = time.perf_counter() - t0
    return dict(preprocess_s=preprocess_s, ttft_s=ttft_s, total_s=total_s,
                prompt_tokens=int(input_ids.size), cached_tokens=int(cached or 0),
                image_tokens=int((input_ids == model.config.image_token_id).sum().item()),
                gen_tokens=n, text=text)


def conversation(model, processor, seed: int, max_tokens: int = 8) -> tuple[dict, dict]:
    """Turn 1 (a new image, seeded) and turn 2 (same image, the answer, a follow-up)."""
    from mlx_vlm.generate import PromptCacheState

    png = random_vlm.png_bytes(512, seed=seed)
    state = PromptCacheState()
    user = {"role": "user", "content": [{"type": "image"},
                                        {"type": "text", "text": QUESTION}]}
    t1 = _turn(model, processor, [user], png, state, max_tokens)
    messages = [user, {"role": "assistant", "content": t1["text"]},
                {"role": "user", "content": [{"type": "text", "text": FOLLOW_UP}]}]
    t2 = _turn(model, processor, messages, png, state, max_tokens)
    return t1, t2


def measure(shape: str, folder: Path, tokenizer: Path | None, runs: int) -> dict:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm import load

    t0 = time.perf_counter()
    random_vlm.build(folder, seed=0, tokenizer=tokenizer, shape=shape)
    build_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    mx.clear_cache()

    t0 = time.perf_counter()
    model, processor = load(str(folder))
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))

    warm1, warm2 = conversation(model, processor, seed=1000)
    t1s, t2s = [], []
    for i in range(runs):
        a, b = conversation(model, processor, seed=i)
        t1s.append(a)
        t2s.append(b)
        print(f"  [{shape}] run {i}: turn1 TTFT {a['ttft_s']:.3f} s "
              f"(pre {a['preprocess_s']:.3f}), turn2 TTFT {b['ttft_s']:.3f} s, "
              f"cached {b['cached_tokens']}/{b['prompt_tokens']}", flush=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    out = dict(
        shape=shape, params_b=n_params / 1e9, weights_gb=size / 1e9, build_s=build_s,
        load_s=load_s, image_tokens=t1s[0]["image_tokens"],
        prompt_tokens=t1s[0]["prompt_tokens"], preprocess_s=med(t1s, "preprocess_s"),
        cold_ttft_s=warm1["ttft_s"], ttft_s=med(t1s, "ttft_s"),
        ttft_min_s=min(r["ttft_s"] for r in t1s), ttft_max_s=max(r["ttft_s"] for r in t1s),
        turn2_cold_ttft_s=warm2["ttft_s"], turn2_ttft_s=med(t2s, "ttft_s"),
        turn2_preprocess_s=med(t2s, "preprocess_s"),
        turn2_prompt_tokens=t2s[0]["prompt_tokens"],
        turn2_cached_tokens=t2s[0]["cached_tokens"],
        turn2_cached_all=[r["cached_tokens"] for r in t2s],
        peak_mem_gb=mx.get_peak_memory() / 1e9, runs=runs,
        ttft_all=[r["ttft_s"] for r in t1s], turn2_ttft_all=[r["ttft_s"] for r in t2s])
    del model, processor
    mx.clear_cache()
    return out


def table(device: str, version: str, rows: list[dict]) -> str:
    lines = [f"device: {device}; mlx {version}; mlx-vlm {_version('mlx-vlm')}; "
             f"one 512x512 PNG, median of {rows[0]['runs'] if rows else 0} after 1 warm-up",
             "| shape | params | load s | image tok | prompt tok | preprocess s | "
             "cold TTFT s | TTFT s (min-max) | turn 2 TTFT s | turn 2 cached / prompt tok |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['params_b']:.2f} B | {r['load_s']:.2f} | "
            f"{r['image_tokens']} | {r['prompt_tokens']} | {r['preprocess_s']:.3f} | "
            f"{r['cold_ttft_s']:.3f} | {r['ttft_s']:.3f} ({r['ttft_min_s']:.3f}-"
            f"{r['ttft_max_s']:.3f}) | {r['turn2_ttft_s']:.3f} | "
            f"{r['turn2_cached_tokens']} / {r['turn2_prompt_tokens']} |")
    return "\n".join(lines)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny,3b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/vision_gpu"))
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="folder with the starter's tokenizer files (default: the starter)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the model folders")
    args = ap.parse_args()

    import mlx.core as mx

    device = device_name()
    print(f"device {device}; mlx {mx.__version__}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        folder = args.dir / shape
        try:
            rows.append(measure(shape, folder, args.tokenizer, args.runs))
            print(json.dumps(rows[-1]), flush=True)
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(dict(device=device, mlx=mx.__version__,
                                                 rows=rows), indent=2))
    print(table(device, mx.__version__, rows))


if __name__ == "__main__":
    main()
