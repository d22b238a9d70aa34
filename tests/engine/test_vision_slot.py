"""What the engine says of a vision model before its weights are loaded: a request sent
while it loads or restarts after a crash must be read as one the model takes images for,
not refused as text-only (found by a new-user trial: 105 of 160 image requests sent during
an engine restart got "not supported by this text-only model")."""

from __future__ import annotations

import json

import pytest

from kit.engine.decode.slot import ModelSlot
from kit.models.resolve import ModelInfo

pytest.importorskip("mlx_vlm")


def folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelInfo(id="m", path=tmp_path, context_window=4096)


def test_a_vision_model_says_vision_before_it_loads(tmp_path):
    info = folder(tmp_path, model_type="qwen2_5_vl", vision_config={"depth": 2})
    assert ModelSlot(info).capabilities()["vision"] is True


@pytest.mark.parametrize("config", [
    {"model_type": "llama"},  # a text model
    {"model_type": "qwen2_5_vl", "vision_config": None},  # no vision tower
    {"model_type": "no_such_family", "vision_config": {"depth": 2}},  # mlx-vlm has no model
])
def test_other_models_do_not(tmp_path, config):
    assert ModelSlot(folder(tmp_path, **config)).capabilities()["vision"] is False
