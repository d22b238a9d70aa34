"""Benchmark: what one image costs on a vision model, through mlx-kit and in-process, side by
side in one run.

The model is the tiny random-weight Qwen2.5-VL of bench/random_vlm.py (no real vision
weights can be had offline): its vision tower and language model are small, so the figures
show the server's and the processor's share, not a real model's compute. For one 512x512
PNG and the words "Describe this image." (greedy, 8 new tokens):

- **image tokens**: the prompt's tokens with the image minus without it (usage);
- **TTFT** through ``python -m kit serve --model VLM`` (streamed chat completions, a data
  URL; time to the first content chunk), median of ``--rounds``: a new image (cold), the
  second turn of the same conversation (its KV comes from the prompt cache), and the same
  words without an image;
- **in-process**: ``mlx_vlm.stream_generate`` on the same model and prompt, from the PNG's
  bytes to the first token (decoding and preprocessing included); the ratio is in-process
  TTFT over server TTFT.

Each cold round uses a new image (a different colour), so no cache serves it.

Usage: python bench/vision.py [--model FOLDER] [--rounds 5]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, serving, starter  # noqa: E402

QUESTION = "Describe this image."


def png(i: int, size: int = 512) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), ((37 * i) % 256, (91 * i) % 256, (53 * i) % 256)).save(
        buf, format="PNG")
    return buf.getvalue()


def user(image: bytes | None, text: str = QUESTION) -> dict:
    parts = [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(image).decode()}}] if image else []
    return {"role": "user", "content": parts + [{"type": "text", "text": text}]}


def stream(client: httpx.Client, root: str, messages: list[dict]) -> tuple[float, str, dict]:
    """(TTFT s, text, usage) of one streamed chat completion."""
    t0, ttft, text, usage = time.perf_counter(), None, "", {}
    with client.stream("POST", root + "/v1/chat/completions", json={
            "model": "local", "messages": messages, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content") and ttft is None:
                    ttft = time.perf_counter() - t0
                text += choice["delta"].get("content") or ""
    return (ttft if ttft is not None else time.perf_counter() - t0), text, usage


def in_process(folder: Path, rounds: int) -> float:
    """Median seconds from PNG bytes to the first token with mlx-vlm alone."""
    import mlx.core as mx
    from mlx_vlm import load, prepare_inputs, stream_generate
    from PIL import Image

    model, processor = load(str(folder))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        add_generation_prompt=True, tokenize=False)
    times = []
    for i in range(rounds + 1):
        data = png(1000 + i)
        t0 = time.perf_counter()
        inputs = prepare_inputs(processor, images=[Image.open(io.BytesIO(data)).convert("RGB")],
                                prompts=prompt)
        extra = {k: v for k, v in inputs.items()
                 if k not in ("input_ids", "pixel_values", "attention_mask")}
        for _ in stream_generate(model, processor, prompt, input_ids=inputs["input_ids"],
                                 pixel_values=inputs["pixel_values"],
                                 mask=inputs["attention_mask"], max_tokens=1,
                                 temperature=0.0, **extra):
            break
        if i:  # the first round compiles
            times.append(time.perf_counter() - t0)
        mx.clear_cache()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a vision model folder "
                    "(default: build bench/random_vlm.py's)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-vision-"))
    env = bench_env(work / "home")
    folder = args.model
    if folder is None:
        from random_vlm import build
        folder = build(work / "tiny-qwen2.5-vl", tokenizer=starter(env))
    with serving(env, "--model", str(folder), "--temperature", "0", timeout=180) as root, \
            httpx.Client(timeout=120) as client:
        stream(client, root, [user(png(0))])  # first use of each shape
        cold, second, text_only, image_tokens, cached = [], [], [], 0, 0
        for i in range(1, args.rounds + 1):
            ttft, text, usage = stream(client, root, [user(png(i))])
            cold.append(ttft)
            ttft_t, _, usage_t = stream(client, root, [user(None, f"Round {i}.")])
            text_only.append(ttft_t)
            image_tokens = usage["prompt_tokens"] - usage_t["prompt_tokens"]
            ttft2, _, usage2 = stream(client, root, [
                user(png(i)), {"role": "assistant", "content": text},
                user(None, "And its colour?")])
            second.append(ttft2)
            cached = usage2.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        prompt_tokens = usage["prompt_tokens"]
    alone = in_process(folder, args.rounds)
    med = statistics.median
    rows = [("image tokens (512x512, 2 markers incl.)", f"{image_tokens}"),
            ("prompt tokens with the image", f"{prompt_tokens}"),
            ("TTFT, new image, mlx-kit", f"{med(cold) * 1000:.0f} ms"),
            ("TTFT, new image, in-process mlx-vlm", f"{alone * 1000:.0f} ms"),
            ("ratio in-process / mlx-kit", f"{alone / med(cold):.2f}"),
            ("TTFT, second turn (same image, cached)", f"{med(second) * 1000:.0f} ms"),
            ("  prompt tokens from the cache", f"{cached}"),
            ("ratio second turn / new image", f"{med(second) / med(cold):.2f}"),
            ("TTFT, no image", f"{med(text_only) * 1000:.0f} ms")]
    width = max(len(r[0]) for r in rows)
    print(f"bench/vision.py: {folder.name}, {args.rounds} rounds, medians")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
