"""Write a tiny random-weight Qwen2.5-VL model folder that mlx-vlm loads and runs on CPU.

It is for testing a server's image path end to end (bytes -> processor -> image tokens ->
model -> text) without real weights.

No vision-language weights can be had here (the Hugging Face hub is unreachable), so the
model is built from mlx-vlm's own ``qwen2_5_vl`` classes with random init; the text it writes
is noise. Qwen2.5-VL is what many MLX users run, and mlx-vlm ships a numpy port of its
processor, so the folder needs only JSON files besides the weights.

Shapes: language model 2 layers, hidden 128, 4 query / 2 KV heads (head_dim 32), MLP 256,
tied embeddings; vision tower 2 blocks, hidden 64, 4 heads, MLP 128, patch 14, merge 2
(one window-attention block, one full-attention block). The image processor keeps the real
model's sizing (patch 14 x merge 2 = 28-pixel grid, 3136..12845056 pixels), so a 512x512 image
becomes 504x504 = 36x36 patches = 324 image tokens, as with the real checkpoints. The
tokenizer is the starter's (SmolLM2, 49,152 tokens) plus Qwen's five vision tokens.

``--shape 3b`` builds the same thing at Qwen2.5-VL-3B-Instruct's shapes instead (its
config.json: language model 36 layers, hidden 2048, 16 query / 2 KV heads (head_dim 128), MLP
11008, tied embeddings, mRoPE sections [16, 24, 24]; vision tower 32 blocks, hidden 1280,
16 heads, MLP 3420, out 2048, 112-pixel windows, full attention in blocks 7/15/23/31), so
timings on a GPU are the real model's compute, not overhead. Only the vocabulary differs:
the starter's 49,157 tokens instead of 151,936 (a smaller embedding and output projection;
one output row per prompt, so it changes TTFT very little). About 3.5 B parameters, ~7 GB in
bf16: build it on the machine that runs it (random init), don't ship it.

Usage: python bench/random_vlm.py OUT [--shape tiny|3b] [--seed 0] [--tokenizer DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

MODEL_TYPE = "qwen2_5_vl"
# Appended to the starter's vocabulary, in this order (ids 49152..49156 there).
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>"]

# Language model, at the config's top level (mlx-vlm copies it into text_config itself).
TEXT = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=True,
            # mRoPE splits head_dim / 2 = 16 rotary pairs over (time, height, width)
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})
VISION = dict(model_type=MODEL_TYPE, depth=2, hidden_size=64, intermediate_size=128,
              num_heads=4, out_hidden_size=TEXT["hidden_size"], in_channels=3,
              patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
              temporal_patch_size=2, tokens_per_second=2,
              # 112-pixel windows = 4x4 merged tokens; block 1 attends over the whole image
              window_size=112, fullatt_block_indexes=[1])
# Qwen2.5-VL-3B-Instruct's shapes (its config.json; the vision fields it leaves out take the
# Qwen2.5-VL vision defaults: depth 32, MLP 3420, 16 heads, windows 112, full attention in
# blocks 7, 15, 23, 31).
TEXT_3B = dict(TEXT, hidden_size=2048, num_hidden_layers=36, intermediate_size=11008,
               num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=128000,
               rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
VISION_3B = dict(VISION, depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                 out_hidden_size=TEXT_3B["hidden_size"], window_size=112,
                 fullatt_block_indexes=[7, 15, 23, 31])
#: ``--shape`` -> (language model fields, vision config)
SHAPES = {"tiny": (TEXT, VISION), "3b": (TEXT_3B, VISION_3B)}
# Qwen2.5-VL's own image processor settings (CLIP normalisation, pixels as counts).
PREPROCESSOR = dict(image_processor_type="Qwen2VLImageProcessor",
                    processor_class="Qwen2_5_VLProcessor",
                    patch_size=14, temporal_patch_size=2, merge_size=2,
                    min_pixels=56 * 56, max_pixels=28 * 28 * 16384,
                    size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384},
                    do_resize=True, resample=3, do_rescale=True, rescale_factor=1 / 255,
                    do_normalize=True, do_convert_rgb=True,
                    image_mean=[0.48145466, 0.4578275, 0.40821073],
                    image_std=[0.26862954, 0.26130258, 0.27577711])
# Qwen-style ChatML; an image part becomes <|vision_start|><|image_pad|><|vision_end|>, and
# the processor then repeats <|image_pad|> once per merged 28x28 patch. One line, so no
# whitespace control is needed (it would also eat the newlines that belong to the format).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url', 'input_image') %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['text'] is defined %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(src: Path, out: Path, tokens: list[str], template: str,
                    edit: Callable[[dict], None] | None = None) -> tuple[dict[str, int], int]:
    """Copy the tokenizer in ``src`` to ``out`` with ``tokens`` added as special tokens,
    ``template`` as the chat template (in tokenizer_config.json and chat_template.jinja,
    where mlx-vlm's processors look first) and ``edit`` applied to tokenizer_config.json.

    Written with the ``tokenizers`` library and plain JSON rather than transformers'
    ``save_pretrained``, so the files keep the starter's (version-neutral) layout.

    Returns:
        ids by token (and "bos", "eos") and the vocabulary size.
    """
    from tokenizers import AddedToken, Tokenizer

    tk = Tokenizer.from_file(str(src / "tokenizer.json"))
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    tk.save(str(out / "tokenizer.json"))
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    if edit is not None:
        edit(tok_cfg)
    tok_cfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    if (src / "special_tokens_map.json").exists():
        shutil.copy(src / "special_tokens_map.json", out / "special_tokens_map.json")
    (out / "chat_template.jinja").write_text(template)
    ids = {t: tk.token_to_id(t) for t in tokens}
    ids.update(bos=tk.token_to_id(tok_cfg["bos_token"]),
               eos=tk.token_to_id(tok_cfg["eos_token"]))
    return ids, tk.get_vocab_size(with_added_tokens=True)


def _listed(cfg: dict) -> None:
    """Name :data:`VISION_TOKENS` in ``additional_special_tokens`` too (Qwen's layout)."""
    extra = cfg.get("additional_special_tokens", [])
    cfg["additional_special_tokens"] = extra + [t for t in VISION_TOKENS if t not in extra]


def build(out: Path, seed: int = 0, tokenizer: Path | None = None,
          shape: str = "tiny") -> Path:
    """Write the model folder ``out`` (created if missing) and return it.

    Args:
        out: the folder to write: config.json, model.safetensors (bfloat16, ~13 MB, mostly
            the 49,157 x 128 embedding), tokenizer files, preprocessor/processor configs and
            chat_template.jinja.
        seed: seeds mlx's random init; the same seed writes the same weights.
        tokenizer: a folder with tokenizer.json + tokenizer_config.json to extend; ``None``
            builds (or finds) the starter and uses its tokenizer.
        shape: a key of :data:`SHAPES` ("tiny", or "3b": Qwen2.5-VL-3B-Instruct's shapes,
            ~7 GB of weights).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import qwen2_5_vl

    if tokenizer is None:
        from kit.models.starter import ensure_starter

        tokenizer = ensure_starter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    ids, vocab = write_tokenizer(Path(tokenizer), out, VISION_TOKENS, CHAT_TEMPLATE, _listed)

    config = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": MODEL_TYPE,
        # exactly the tokenizer's size, so every id the model can emit decodes
        "vocab_size": vocab,
        "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "torch_dtype": "bfloat16",
        **SHAPES[shape][0],
        "vision_config": SHAPES[shape][1],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    # mlx-vlm's Qwen processor looks for these two and asks the hub when they are missing
    (out / "video_preprocessor_config.json").write_text(json.dumps(
        {**PREPROCESSOR, "video_processor_type": "Qwen2VLVideoProcessor"}, indent=2))
    (out / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Qwen2_5_VLProcessor"}, indent=2))

    # Build the config objects the way mlx_vlm.load does, so the parameter names match.
    cfg = qwen2_5_vl.ModelConfig.from_dict(json.loads(json.dumps(config)))
    cfg.text_config = qwen2_5_vl.TextConfig.from_dict(cfg.text_config)
    cfg.vision_config = qwen2_5_vl.VisionConfig.from_dict(cfg.vision_config)
    mx.random.seed(seed)
    model = qwen2_5_vl.Model(cfg)
    model.set_dtype(mx.bfloat16)
    weights = dict(tree_flatten(model.parameters()))
    # Names are mlx-vlm's own (vision_tower.*, language_model.model.*), which its sanitize
    # keeps; the Conv3d patch embedding is already channels-last, (64, 2, 14, 14, 3).
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def png_bytes(size: int = 512, seed: int | None = None) -> bytes:
    """A ``size`` x ``size`` RGB PNG (a colour gradient), encoded in memory; with ``seed``,
    noise drawn from it is added, so each seed gives a different image."""
    import io

    import numpy as np
    from PIL import Image

    ramp = np.linspace(0, 255, size, dtype=np.uint8)
    rgb = np.stack([np.tile(ramp, (size, 1)), np.tile(ramp[:, None], (1, size)),
                    np.full((size, size), 128, np.uint8)], axis=-1)
    if seed is not None:
        noise = np.random.default_rng(seed).integers(0, 64, rgb.shape, dtype=np.uint8)
        rgb = rgb // 2 + noise
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def check(folder: Path, max_tokens: int = 8) -> dict:
    """Load ``folder`` with mlx-vlm and generate from a prompt with one 512x512 PNG.

    Goes the way a server would: PNG bytes -> PIL -> chat template -> processor
    (input_ids, pixel_values, image_grid_thw) -> ``stream_generate`` with those tensors.

    Returns:
        load_s (seconds), image_tokens (count of <|image_pad|> ids in input_ids),
        prompt_tokens, preprocess_s and ttft_s (seconds from the bytes to the first token,
        preprocessing included), and text (noise).
    """
    import io

    import mlx.core as mx
    from mlx_vlm import apply_chat_template, load, prepare_inputs, stream_generate
    from mlx_vlm.utils import load_image

    t0 = time.perf_counter()
    model, processor = load(str(folder))
    load_s = time.perf_counter() - t0

    data = png_bytes(512)
    t0 = time.perf_counter()
    image = load_image(io.BytesIO(data))
    prompt = apply_chat_template(processor, model.config, "Describe this image.",
                                 num_images=1)
    inputs = prepare_inputs(processor, images=[image], prompts=prompt)
    preprocess_s = time.perf_counter() - t0
    input_ids = inputs["input_ids"]
    image_tokens = int((input_ids == model.config.image_token_id).sum().item())
    extra = {k: v for k, v in inputs.items()
             if k not in ("input_ids", "pixel_values", "attention_mask")}
    text, ttft_s = "", None
    for r in stream_generate(model, processor, prompt, input_ids=input_ids,
                             pixel_values=inputs["pixel_values"],
                             mask=inputs["attention_mask"], max_tokens=max_tokens,
                             temperature=0.0, **extra):
        if ttft_s is None:
            ttft_s = time.perf_counter() - t0
        text += r.text
    mx.clear_cache()
    return dict(load_s=load_s, image_tokens=image_tokens,
                prompt_tokens=int(input_ids.size), preprocess_s=preprocess_s,
                ttft_s=ttft_s, text=text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                    help="tiny (default; ~14 MB) or 3b (Qwen2.5-VL-3B-Instruct's shapes, "
                         "~7 GB in bf16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="folder whose tokenizer to extend (default: the starter's)")
    ap.add_argument("--check", action="store_true",
                    help="load it with mlx-vlm and generate 8 tokens for one 512x512 PNG")
    args = ap.parse_args()

    t0 = time.perf_counter()
    out = build(args.out, args.seed, args.tokenizer, args.shape)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"{out}: {MODEL_TYPE} ({args.shape}), random bf16, {size / 1e6:.1f} MB, "
          f"built in {time.perf_counter() - t0:.1f} s")
    if args.check:
        r = check(out)
        print(f"load {r['load_s']:.2f} s; 512x512 image -> {r['image_tokens']} image tokens; "
              f"prompt {r['prompt_tokens']} tokens; preprocess {r['preprocess_s']:.3f} s; "
              f"TTFT {r['ttft_s']:.2f} s")
        print(f"text (random weights, meaningless): {r['text']!r}")


if __name__ == "__main__":
    main()
