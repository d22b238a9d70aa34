"""Write a tiny random-weight Gemma 4 model folder (text, image and audio towers) that
mlx-vlm loads and runs on CPU.

It is for testing a server's audio path end to end (WAV bytes -> mlx-vlm's Gemma 4 audio
feature extractor -> audio tokens -> model -> text) without real weights, as
bench/random_vlm.py does for images.

No omni weights can be had here (the Hugging Face hub is unreachable), so the model is
built from mlx-vlm's own ``gemma4`` classes with random init; the text it writes is noise.
Gemma 4 is the omni family mlx-vlm's processor serves without anything beyond its own
files: a numpy port of the image processor and of the audio feature extractor (128 mel
bins at 16 kHz, one audio token per 40 ms, as the real checkpoints), so the folder needs
only JSON files besides the weights.

Shapes: language model 2 layers (one sliding-window, one full-attention), hidden 64,
2 query / 1 KV heads (head_dim 32), MLP 128, per-layer inputs 16, tied embeddings; vision
tower 1 layer, hidden 32; audio tower (conformer) 1 layer, hidden 32, 2 heads, output 32.
The tokenizer is the starter's (SmolLM2, 49,152 tokens, ChatML) plus Gemma 4's six image
and audio tokens, declared as the processor reads them (``extra_special_tokens``). A 3 s
clip at any sample rate becomes 75 audio tokens (3,000 ms / 40 ms), as with the real model.

Usage: python bench/random_omni.py OUT [--seed 0] [--tokenizer DIR] [--check]
"""

from __future__ import annotations

import argparse
import io
import json
import time
import wave
from pathlib import Path

try:  # imported as bench.random_omni (the tests), or run as a script from bench/
    from bench.random_vlm import write_tokenizer
except ImportError:
    from random_vlm import write_tokenizer

MODEL_TYPE = "gemma4"
#: Gemma 4's media tokens by the tokenizer attribute the processor reads, appended to the
#: starter's vocabulary in this order (ids 49152..49157 there).
MEDIA_TOKENS = {"boi_token": "<|image>", "image_token": "<|image|>", "eoi_token": "<image|>",
                "boa_token": "<|audio>", "audio_token": "<|audio|>", "eoa_token": "<audio|>"}
#: One audio token per this many milliseconds of sound (Gemma 4's processor default).
AUDIO_MS_PER_TOKEN = 40

TEXT = dict(model_type="gemma4_text", hidden_size=64, num_hidden_layers=2,
            intermediate_size=128, num_attention_heads=2, head_dim=32, global_head_dim=32,
            num_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=16,
            sliding_window=512, sliding_window_pattern=2,
            layer_types=["sliding_attention", "full_attention"], use_double_wide_mlp=False,
            max_position_embeddings=32768)
VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
              global_head_dim=16, position_embedding_size=1024)
AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             subsampling_conv_channels=[16, 8], output_proj_dims=32)
# ChatML (the starter's format); an image part becomes <|image|> and an audio part
# <|audio|>, which the processor expands (boa + one token per 40 ms + eoa).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image|>"
    "{% elif part['type'] == 'audio' %}<|audio|>"
    "{% elif part['text'] is defined %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build(out: Path, seed: int = 0, tokenizer: Path | None = None) -> Path:
    """Write the model folder ``out`` (created if missing) and return it.

    Args:
        out: the folder to write: config.json, model.safetensors (bfloat16, ~10 MB, mostly
            the two 49,158-row embeddings), tokenizer files, processor_config.json and
            chat_template.jinja.
        seed: seeds mlx's random init; the same seed writes the same weights.
        tokenizer: a folder with tokenizer.json + tokenizer_config.json to extend; ``None``
            builds (or finds) the starter and uses its tokenizer.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import gemma4

    if tokenizer is None:
        from kit.models.starter import ensure_starter

        tokenizer = ensure_starter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the processor reads the tokens as tokenizer attributes (audio_token, audio_token_id...),
    # which transformers makes of extra_special_tokens
    by_token, vocab = write_tokenizer(
        Path(tokenizer), out, list(MEDIA_TOKENS.values()), CHAT_TEMPLATE,
        lambda cfg: cfg.update(extra_special_tokens=dict(MEDIA_TOKENS)))
    ids = {name: by_token[t] for name, t in MEDIA_TOKENS.items()}
    ids.update(bos=by_token["bos"], eos=by_token["eos"])

    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": MODEL_TYPE,
        "text_config": {**TEXT, "vocab_size": vocab, "vocab_size_per_layer_input": vocab},
        "vision_config": VISION,
        "audio_config": AUDIO,
        # exactly the tokenizer's size, so every id the model can emit decodes
        "vocab_size": vocab, "hidden_size": TEXT["hidden_size"],
        "image_token_id": ids["image_token"], "audio_token_id": ids["audio_token"],
        "boi_token_id": ids["boi_token"], "eoi_token_id": ids["eoi_token"],
        "boa_token_id": ids["boa_token"], "eoa_token_id": ids["eoa_token"],
        "bos_token_id": ids["bos"], "eos_token_id": [ids["eos"]], "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma4Processor",
        "image_processor": {"max_soft_tokens": 70, "patch_size": 16,
                            "pooling_kernel_size": 3},
        "audio_seq_length": 750, "audio_ms_per_token": AUDIO_MS_PER_TOKEN}, indent=2))

    # Build the config objects the way mlx_vlm.load does, so the parameter names match.
    cfg = gemma4.ModelConfig.from_dict(json.loads(json.dumps(config)))
    cfg.text_config = gemma4.TextConfig.from_dict(cfg.text_config)
    cfg.vision_config = gemma4.VisionConfig.from_dict(cfg.vision_config)
    cfg.audio_config = gemma4.AudioConfig.from_dict(cfg.audio_config)
    mx.random.seed(seed)
    model = gemma4.Model(cfg)
    model.set_dtype(mx.bfloat16)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def wav_bytes(seconds: float = 3.0, rate: int = 16000, channels: int = 1,
              pitch_hz: float = 440.0) -> bytes:
    """A 16-bit PCM WAV file of a sine tone, encoded in memory."""
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * pitch_hz * t) * 12000).astype("<i2")
    frames = np.repeat(samples[:, None], channels, axis=1).tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


def audio_tokens(seconds: float) -> int:
    """Audio tokens Gemma 4's processor gives a clip of ``seconds`` (one per 40 ms)."""
    import math

    return math.ceil(seconds * 1000 / AUDIO_MS_PER_TOKEN)


def check(folder: Path, max_tokens: int = 8) -> dict:
    """Load ``folder`` with mlx-vlm and generate from a prompt with one 3 s WAV clip, the
    way a server would: WAV bytes -> processor (input_ids with the audio tokens,
    input_features) -> ``stream_generate``.

    Returns:
        load_s, audio_tokens, prompt_tokens, ttft_s (seconds from the bytes to the first
        token) and text (noise).
    """
    import mlx.core as mx
    from mlx_vlm import load, prepare_inputs, stream_generate

    t0 = time.perf_counter()
    model, processor = load(str(folder))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    messages = [{"role": "user", "content": [{"type": "text", "text": "Transcribe this."},
                                             {"type": "audio"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=True)
    inputs = prepare_inputs(processor, audio=[io.BytesIO(wav_bytes())], prompts=prompt,
                            add_special_tokens=False)
    ids = inputs["input_ids"]
    n_audio = int((ids == model.config.audio_token_id).sum().item())
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    text, ttft_s = "", None
    for r in stream_generate(model, processor, prompt, input_ids=ids,
                             mask=inputs["attention_mask"], max_tokens=max_tokens,
                             temperature=0.0, **extra):
        if ttft_s is None:
            ttft_s = time.perf_counter() - t0
        text += r.text
    mx.clear_cache()
    return dict(load_s=load_s, audio_tokens=n_audio, prompt_tokens=int(ids.size),
                ttft_s=ttft_s, text=text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="folder whose tokenizer to extend (default: the starter's)")
    ap.add_argument("--check", action="store_true",
                    help="load it with mlx-vlm and generate 8 tokens for a 3 s WAV clip")
    args = ap.parse_args()

    t0 = time.perf_counter()
    out = build(args.out, args.seed, args.tokenizer)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"{out}: {MODEL_TYPE} (text + image + audio), random bf16, {size / 1e6:.1f} MB, "
          f"built in {time.perf_counter() - t0:.1f} s")
    if args.check:
        r = check(out)
        print(f"load {r['load_s']:.2f} s; 3 s clip -> {r['audio_tokens']} audio tokens; "
              f"prompt {r['prompt_tokens']} tokens; TTFT {r['ttft_s']:.2f} s")
        print(f"text (random weights, meaningless): {r['text']!r}")


if __name__ == "__main__":
    main()
