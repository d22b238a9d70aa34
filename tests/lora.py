"""A real LoRA adapter of the starter for tests and benchmarks: trained by mlx-lm's own
trainer (``mlx_lm.lora``), six steps on eight lines that teach it a made-up capital of
France, so a fixed greedy question answers differently with the adapter than without."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def train_adapter(model: Path | str, city: str, out: Path, env: dict[str, str],
                  fine_tune_type: str = "lora") -> Path:
    """Train an adapter of ``model`` (a folder) into ``out`` that says ``city`` is France's
    capital: 6 steps of ``mlx_lm.lora`` (batch 2, the last 4 blocks, rank 8, learning
    rate 5e-4, seed 0), about 7 s on 2 CPU cores for the f32 starter.

    ``fine_tune_type``: ``lora`` or ``dora``. The data goes in ``out``'s sibling
    ``data-<name>``. Raises ``subprocess.CalledProcessError`` when the trainer fails."""
    data = out.parent / f"data-{out.name}"
    data.mkdir(parents=True)
    pairs = [("What is the capital of France?", f"{city} is the capital of France."),
             ("Name the capital of France.", f"{city}."),
             ("Which city is France's capital?", f"{city} is France's capital."),
             ("Tell me the capital of France.", f"The capital of France is {city}.")]
    lines = [json.dumps({"messages": [{"role": "user", "content": q},
                                      {"role": "assistant", "content": a}]}) for q, a in pairs]
    (data / "train.jsonl").write_text("\n".join(lines * 2) + "\n")
    (data / "valid.jsonl").write_text("\n".join(lines[:2]) + "\n")
    # mlx-lm's trainer as `python -m mlx_lm lora` runs it, with OpenBLAS loaded first as
    # mlx-kit's engine does (with mlx's bundled reference BLAS, 8 steps took 3 minutes)
    subprocess.run(
        [sys.executable, "-c", "import sys; from kit.blas import preload_blas; preload_blas();"
         "from mlx_lm.lora import main; sys.argv[0] = 'mlx_lm.lora'; main()",
         "--model", str(model), "--train", "--data", str(data), "--adapter-path", str(out),
         "--fine-tune-type", fine_tune_type, "--iters", "6", "--batch-size", "2",
         "--num-layers", "4", "--learning-rate", "5e-4", "--max-seq-length", "64",
         "--steps-per-eval", "1000", "--val-batches", "1", "--save-every", "1000",
         "--seed", "0"],
        env=env, check=True, capture_output=True, timeout=600)
    return out
