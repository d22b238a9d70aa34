"""What a model folder's ``config.json`` says (read without loading the model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def remote_code(folder: Any) -> str | None:
    """What in a model folder is code of its own that loading it would run: its tokenizer
    (``auto_map`` names an ``AutoTokenizer`` class in tokenizer_config.json or config.json)
    or its architecture (``model_file`` in config.json, mlx-lm's custom models), as words
    for an error message; None when it ships none (or the files cannot be read)."""
    def read(name: str) -> dict:
        try:
            data = json.loads((Path(str(folder)) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    tok, cfg = read("tokenizer_config.json"), read("config.json")
    for name, data in (("tokenizer_config.json", tok), ("config.json", cfg)):
        auto = data.get("auto_map")
        entry = auto.get("AutoTokenizer") if isinstance(auto, dict) else None
        names = [n for n in (entry if isinstance(entry, list) else [entry])
                 if isinstance(n, str)]
        if names:
            return f"its tokenizer ({' / '.join(names)}, auto_map in {name})"
    if isinstance(cfg.get("model_file"), str):
        return f"its architecture ({cfg['model_file']}, model_file in config.json)"
    return None
