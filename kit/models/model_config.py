"""What a model folder's ``config.json`` says (read without loading the model)."""

from __future__ import annotations

import json
from pathlib import Path


def read_context_window(folder: Path, default: int = 4096) -> int:
    """The context length in tokens from ``config.json`` (``max_position_embeddings`` and
    the usual aliases, also inside ``text_config``), else ``default``."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return default
    for scope in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_sequence_length", "n_positions",
                    "seq_length", "model_max_length"):
            value = scope.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return default
