"""Write a random-weight Llama-shaped MLX model, for speed measurements where no real
checkpoint can be downloaded (the lent GPU machine has no internet).

Decode speed depends on the shapes and the quantization, not on the weights' values, so
a Llama-3-8B-shaped model with random 4-bit weights measures what an 8B model would; the
text it writes is noise. The tokenizer files are copied from ``--tokenizer`` (e.g. the
starter's folder).

``--pair N`` writes a speculative-decoding pair that agrees, for measuring drafting's best
case on such a machine: OUT, whose layers after the first N have their output projections
(``o_proj``, ``down_proj``) scaled by 1e-4 before quantization (it still computes every
layer, so it costs what the full model costs, but writes almost what its first N layers
write), and ``OUT-draft``, those first N layers alone with the same embeddings, norm and
head. Greedy acceptance is then near 1; it predicts a real pair's speed-up only at the
acceptance a real pair reaches.

Usage: python bench/random_model.py OUT --tokenizer DIR [--preset llama3-8b|tiny] [--bits 4]
       [--pair N]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

PRESETS = {
    # Llama-3-8B's shapes with the starter's 49,152-token vocabulary
    "llama3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, rope_theta=10000.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--bits", type=int, default=4, help="0: keep bfloat16")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--pair", type=int, default=None, metavar="N",
                    help="also write OUT-draft: the first N layers (see above)")
    args = ap.parse_args()
    layers = PRESETS[args.preset]["num_hidden_layers"]
    if args.pair is not None and not 0 < args.pair < layers:
        ap.error(f"--pair takes 1 to {layers - 1} (the {args.preset} preset has {layers} layers)")

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.llama import Model, ModelArgs

    vocab = json.loads((args.tokenizer / "config.json").read_text())["vocab_size"]
    config = {"model_type": "llama", "vocab_size": vocab, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 8192, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, **PRESETS[args.preset]}
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    if args.pair:
        for layer in model.model.layers[args.pair:]:
            layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 1e-4
            layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 1e-4
    if args.bits:
        nn.quantize(model, group_size=args.group_size, bits=args.bits)
        config["quantization"] = {"group_size": args.group_size, "bits": args.bits}
    mx.eval(model.parameters())
    write(args.out, model, config, args.tokenizer)
    if args.pair:
        model.model.layers = model.model.layers[:args.pair]
        write(args.out.with_name(args.out.name + "-draft"), model,
              {**config, "num_hidden_layers": args.pair}, args.tokenizer)


def write(out: Path, model, config: dict, tokenizer: Path) -> None:
    """Save ``model`` with ``config`` and the tokenizer files into ``out``; print its size."""
    from mlx_lm.utils import save_model

    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, out / name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    bits = config.get("quantization", {}).get("bits", 16)
    print(f"{out}: {config['num_hidden_layers']} layers, {bits}-bit, {size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
