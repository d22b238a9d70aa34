"""Benchmark: what one audio clip costs on an omni model, through mlx-kit and in-process,
side by side in one run.

The model is the tiny random-weight Gemma 4 of bench/random_omni.py (no real omni weights
can be had offline): its towers are small, so the figures show the server's, the audio
loader's and the feature extractor's share, not a real model's compute. For one 3 s
16 kHz mono WAV clip and the words "What do you hear?" (greedy, 8 new tokens):

- **audio tokens**: the prompt's tokens with the clip minus without it (usage);
- **TTFT** through ``python -m kit serve --model OMNI`` (streamed chat completions,
  ``input_audio``; time to the first content chunk), median of ``--rounds``: a new clip
  (cold), the second turn of the same conversation (its KV from the prompt cache), and the
  same words without a clip;
- **in-process**: ``mlx_vlm.stream_generate`` on the same model and prompt, from the WAV
  bytes to the first token (loading, resampling and features included); the ratio is
  in-process TTFT over server TTFT.

Each cold round uses a new clip (another pitch), so no cache serves it.

Usage: python bench/audio.py [--model FOLDER] [--rounds 5]
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_env, serving, starter  # noqa: E402
from random_omni import wav_bytes  # noqa: E402
from vision import stream  # noqa: E402

QUESTION = "What do you hear?"


def clip(i: int) -> bytes:
    return wav_bytes(3.0, 16000, pitch_hz=200.0 + 37.0 * i)


def user(audio: bytes | None, text: str = QUESTION) -> dict:
    parts = [{"type": "input_audio", "input_audio": {
        "data": base64.b64encode(audio).decode(), "format": "wav"}}] if audio else []
    return {"role": "user", "content": [{"type": "text", "text": text}] + parts}


def in_process(folder: Path, rounds: int) -> float:
    """Median seconds from WAV bytes to the first token with mlx-vlm alone."""
    import mlx.core as mx
    from mlx_vlm import load, prepare_inputs, stream_generate

    model, processor = load(str(folder))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "audio"}]}],
        add_generation_prompt=True, tokenize=False)
    times = []
    for i in range(rounds + 1):
        data = clip(1000 + i)
        t0 = time.perf_counter()
        inputs = prepare_inputs(processor, audio=[io.BytesIO(data)], prompts=prompt)
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        for _ in stream_generate(model, processor, prompt, input_ids=inputs["input_ids"],
                                 mask=inputs["attention_mask"], max_tokens=1,
                                 temperature=0.0, **extra):
            break
        if i:  # the first round compiles
            times.append(time.perf_counter() - t0)
        mx.clear_cache()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="an omni model folder "
                    "(default: build bench/random_omni.py's)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-audio-"))
    env = bench_env(work / "home")
    folder = args.model
    if folder is None:
        from random_omni import build
        folder = build(work / "tiny-gemma4", tokenizer=starter(env))
    with serving(env, "--model", str(folder), "--temperature", "0", timeout=180) as root, \
            httpx.Client(timeout=120) as client:
        stream(client, root, [user(clip(0))])  # first use of each shape
        words = stream(client, root, [user(None)])[2]["prompt_tokens"]
        cold, second, text_only, cached = [], [], [], 0
        for i in range(1, args.rounds + 1):
            ttft, text, usage = stream(client, root, [user(clip(i))])
            cold.append(ttft)
            text_only.append(stream(client, root, [user(None, f"Round {i}.")])[0])
            ttft2, _, usage2 = stream(client, root, [
                user(clip(i)), {"role": "assistant", "content": text},
                user(None, "And how loud?")])
            second.append(ttft2)
            cached = usage2.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        prompt_tokens = usage["prompt_tokens"]
        audio_tokens = prompt_tokens - words
    alone = in_process(folder, args.rounds)
    med = statistics.median
    rows = [("audio tokens (3 s, 2 markers incl.)", f"{audio_tokens}"),
            ("prompt tokens with the clip", f"{prompt_tokens}"),
            ("TTFT, new clip, mlx-kit", f"{med(cold) * 1000:.0f} ms"),
            ("TTFT, new clip, in-process mlx-vlm", f"{alone * 1000:.0f} ms"),
            ("ratio in-process / mlx-kit", f"{alone / med(cold):.2f}"),
            ("TTFT, second turn (same clip, cached)", f"{med(second) * 1000:.0f} ms"),
            ("  prompt tokens from the cache", f"{cached}"),
            ("ratio second turn / new clip", f"{med(second) / med(cold):.2f}"),
            ("TTFT, no clip", f"{med(text_only) * 1000:.0f} ms")]
    width = max(len(r[0]) for r in rows)
    print(f"bench/audio.py: {folder.name}, {args.rounds} rounds, medians")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
