"""Turn what the user typed (``--model``) into a model folder and its metadata.

A model is named by a Hugging Face repo id found in the local hub cache (never downloaded
here), by a local folder, or not at all (the embedded starter).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kit.errors import ModelError, ModelNotFoundError
from kit.models.catalog import cached_model_ids
from kit.models.model_config import read_context_window
from kit.models.starter import STARTER_ID, STARTER_VARIANTS, Progress, ensure_starter, no_progress

MAX_SPEC = 1024  # characters: hub ids are under 100, folder paths rarely over a few hundred


class InvalidModelSpec(ModelError):
    """``--model`` / a swap target that cannot name a model: too long, control
    characters, or a folder that is not a model (the server answers 400)."""


def _short(spec: str, limit: int = 80) -> str:
    """``spec`` cut for messages (errors never echo more than a short excerpt)."""
    return spec if len(spec) <= limit else spec[:limit] + "..."


def check_spec(spec: str) -> None:
    """Refuse a spec no model can have, before touching the file system or the hub cache.

    Raises:
        InvalidModelSpec: longer than :data:`MAX_SPEC` characters, or holding control
            characters (a NUL makes every path call raise).
    """
    if len(spec) > MAX_SPEC:
        raise InvalidModelSpec(f"model name too long ({len(spec)} characters; at most "
                               f"{MAX_SPEC}): {_short(spec, 40)!r}")
    if not spec.strip() or any(ord(c) < 32 or ord(c) == 127 for c in spec):
        raise InvalidModelSpec(f"model name {_short(spec)!r} is empty or holds control "
                               "characters")


@dataclass(frozen=True)
class ModelInfo:
    """A model we can serve.

    Attributes:
        id: the real model id (a hub repo id, or a local folder's path).
        path: the folder holding config.json, weights and tokenizer.
        context_window: the model's context length in tokens (from config.json).
    """

    id: str
    path: Path
    context_window: int

    @cached_property
    def _sampling_defaults(self) -> dict[str, float]:
        # read once per ModelInfo: requests ask for it every time (a swap makes a new one)
        try:
            cfg = json.loads((self.path / "generation_config.json").read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(cfg, dict):
            return {}
        return {k: float(cfg[k]) for k in ("temperature", "top_p", "top_k", "min_p")
                if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool)}

    def sampling_defaults(self) -> dict[str, float]:
        """The model's own recommended sampling (``generation_config.json``: temperature,
        top_p, top_k, min_p), for requests and servers that set none; read once."""
        return dict(self._sampling_defaults)

    @property
    def max_output_tokens(self) -> int:
        """A sane default cap on generated tokens: a quarter of the context, at most 8192."""
        return max(256, min(8192, self.context_window // 4))


def resolve_model(spec: str | None, progress: Progress = no_progress) -> ModelInfo:
    """Find the model named by ``spec``.

    Args:
        spec: None or ``STARTER_ID`` for the starter (built on first use), a folder path,
            or a hub repo id present in the local cache.
        progress: called with a short line before slow steps.

    Raises:
        ModelNotFoundError: nothing by that name is on this machine.
        InvalidModelSpec: a name no model can have, or a folder (or hub snapshot) without
            config.json.
    """
    if spec is None or spec in STARTER_VARIANTS:
        repo_id = spec or STARTER_ID
        path = ensure_starter(progress, repo_id)
        return ModelInfo(repo_id, path, read_context_window(path))
    check_spec(spec)
    folder = Path(spec).expanduser()
    try:
        is_dir = folder.is_dir()
    except (OSError, ValueError):  # e.g. a path component over NAME_MAX
        is_dir = False
    if is_dir:
        if not (folder / "config.json").is_file():
            raise InvalidModelSpec(f"{_short(str(folder))} is not a model folder (no "
                                   "config.json)", hint="name a folder with config.json "
                                   "and weights, or a hub id in the local cache")
        folder = folder.resolve()
        return ModelInfo(str(folder), folder, read_context_window(folder))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(spec, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        known = dict.fromkeys([*STARTER_VARIANTS, *cached_model_ids()])  # ordered, unique
        raise ModelNotFoundError(_short(spec), list(known)) from None
    if not (path / "config.json").is_file():
        raise InvalidModelSpec(f"{_short(spec)} in the hub cache has no config.json: not an "
                               "MLX model")
    return ModelInfo(spec, path, read_context_window(path))
