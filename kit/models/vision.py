"""Which models take images: those that mlx-vlm loads as vision models, judged from
``config.json`` without importing mlx-vlm (importing it imports mlx, which a listing
command must not pay for).

A model is a vision model when its config has a non-null ``vision_config`` and its
``model_type`` (through mlx-vlm's ``MODEL_REMAPPING``) names one of mlx-vlm's model
packages, ``mlx_vlm/models/<model_type>/``. It takes audio too when its config also has a
non-null ``audio_config`` (Gemma 3n and 4, the omni models). An audio model without a
vision tower is not served (none of the families mlx-vlm serves audio for lacks one). The installed mlx-vlm is found with
``importlib.util.find_spec``, which runs no ``__init__`` for a top-level package.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["audio_model_type", "is_audio_model", "is_vision_model", "mlx_vlm_installed", "vision_model_type"]


def source_root() -> Path | None:
    """The folder of the installed mlx-vlm package, or None when it is not installed
    (found without importing it)."""
    try:
        spec = importlib.util.find_spec("mlx_vlm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def _mlx_vlm_models() -> tuple[Path | None, dict[str, str]]:
    """mlx-vlm's models folder and its ``MODEL_REMAPPING`` (read from ``utils.py`` as a
    literal), or ``(None, {})`` without mlx-vlm."""
    root = source_root()
    if root is None:
        return None, {}
    remap: dict[str, str] = {}
    try:
        for node in ast.parse((root / "utils.py").read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets):
                value = ast.literal_eval(node.value)
                remap = value if isinstance(value, dict) else {}
    except (OSError, SyntaxError, ValueError):
        pass
    return root / "models", remap


def mlx_vlm_installed() -> bool:
    """Whether mlx-vlm is installed (without importing it)."""
    return _mlx_vlm_models()[0] is not None


def vision_model_type(config: Mapping[str, Any]) -> bool:
    """Whether a model with this ``config.json`` content is a vision model mlx-vlm loads:
    a non-null ``vision_config`` and a ``model_type`` mlx-vlm has a model package for
    (after its ``MODEL_REMAPPING``). False without mlx-vlm installed."""
    kind = config.get("model_type")
    if config.get("vision_config") is None or not isinstance(kind, str) or not kind:
        return False
    models, remap = _mlx_vlm_models()
    if models is None:
        return False
    name = remap.get(kind, kind)
    if not isinstance(name, str) or not name.isidentifier():  # never a path out of models/
        return False
    return (models / name / "__init__.py").is_file()


def audio_model_type(config: Mapping[str, Any]) -> bool:
    """Whether a model with this ``config.json`` content takes audio: a vision model
    (:func:`vision_model_type`) whose config has a non-null ``audio_config``."""
    return config.get("audio_config") is not None and vision_model_type(config)


def is_vision_model(path: Path) -> bool:
    """Whether the model folder ``path`` holds a vision model mlx-vlm loads
    (:func:`vision_model_type` of its ``config.json``); False when that file is missing or
    not a JSON object."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and vision_model_type(config)


def is_audio_model(path: Path) -> bool:
    """Whether the model folder ``path`` holds a model mlx-vlm loads that takes audio
    (:func:`audio_model_type` of its ``config.json``)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and audio_model_type(config)
