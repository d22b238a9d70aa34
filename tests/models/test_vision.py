"""Which models the catalog calls vision models: a ``vision_config`` and a ``model_type``
mlx-vlm has a model package for, read from files (mlx-vlm found, never imported). Most
tests point the lookup at a fake mlx-vlm folder, so they hold without mlx-vlm installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.models import catalog, vision
from kit.models.catalog import describe, served_entries


@pytest.fixture
def fake_vlm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An mlx-vlm package folder with model packages ``tinyvlm`` and ``lfm2_vl`` and the
    remapping ``lfm2-vl`` -> ``lfm2_vl``; the lookup's cache is cleared around the test."""
    root = tmp_path / "site" / "mlx_vlm"
    for kind in ("tinyvlm", "lfm2_vl"):
        (root / "models" / kind).mkdir(parents=True)
        (root / "models" / kind / "__init__.py").write_text("")
    (root / "models" / "base.py").write_text("")  # a module, not a model package
    (root / "utils.py").write_text('import os\nMODEL_REMAPPING = {"lfm2-vl": "lfm2_vl"}\n')
    monkeypatch.setattr(vision, "source_root", lambda: root)
    vision._mlx_vlm_models.cache_clear()
    yield root
    vision._mlx_vlm_models.cache_clear()


@pytest.fixture
def no_vlm(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-vlm not installed."""
    monkeypatch.setattr(vision, "source_root", lambda: None)
    vision._mlx_vlm_models.cache_clear()
    yield
    vision._mlx_vlm_models.cache_clear()


def model_folder(path: Path, config: dict) -> Path:
    """A servable-looking folder: config.json, a (dummy) safetensors file, a tokenizer."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer_config.json").write_text("{}")
    return path


@pytest.mark.parametrize("config, expected", [
    ({"model_type": "tinyvlm", "vision_config": {"depth": 2}}, True),
    ({"model_type": "lfm2-vl", "vision_config": {}}, True),  # through MODEL_REMAPPING
    ({"model_type": "tinyvlm", "vision_config": None}, False),
    ({"model_type": "tinyvlm"}, False),
    ({"model_type": "llava_next_unknown", "vision_config": {}}, False),
    ({"model_type": "base", "vision_config": {}}, False),  # base.py is no model package
    ({"model_type": "../tinyvlm", "vision_config": {}}, False),
    ({"vision_config": {}}, False),
    ({"model_type": 7, "vision_config": {}}, False),
], ids=["known", "remapped", "null-vision-config", "no-vision-config", "unknown-type",
        "module-not-package", "path-out", "no-model-type", "model-type-not-a-string"])
def test_vision_model_type_needs_a_vision_config_and_a_model_mlx_vlm_has(fake_vlm, config,
                                                                         expected):
    assert vision.vision_model_type(config) is expected


def test_a_vision_model_mlx_lm_cannot_load_is_listed_as_vision_and_loadable(fake_vlm,
                                                                            tmp_path):
    entry = describe("org/tiny-vlm", model_folder(
        tmp_path / "m", {"model_type": "tinyvlm", "vision_config": {"depth": 2}}))
    assert not catalog._supported("tinyvlm")  # mlx-lm has no module for it
    assert entry.capabilities.vision is True
    assert (entry.loadable, entry.reason) == (True, None)


def test_an_unknown_model_type_with_a_vision_config_is_not_vision_nor_loadable(fake_vlm,
                                                                              tmp_path):
    entry = describe("org/odd", model_folder(
        tmp_path / "m", {"model_type": "oddvlm", "vision_config": {}}))
    assert entry.capabilities.vision is False
    assert entry.loadable is False
    assert entry.reason == "model_type 'oddvlm' not supported by mlx-lm or mlx-vlm"


def test_a_text_model_is_not_vision_even_with_a_preprocessor_config(fake_vlm, tmp_path):
    folder = model_folder(tmp_path / "m", {"model_type": "llama"})
    (folder / "preprocessor_config.json").write_text("{}")  # once enough to say vision
    entry = describe("org/text", folder)
    assert entry.capabilities.vision is False
    assert entry.loadable is catalog._supported("llama")


def test_without_mlx_vlm_no_model_is_vision_and_the_reason_says_how_to_get_it(no_vlm,
                                                                             tmp_path):
    config = {"model_type": "tinyvlm", "vision_config": {}}
    assert vision.mlx_vlm_installed() is False
    assert vision.vision_model_type(config) is False
    entry = describe("org/tiny-vlm", model_folder(tmp_path / "m", config))
    assert entry.loadable is False
    assert "pip install 'mlx-kit[vision]'" in entry.reason


def test_is_vision_model_reads_the_folders_config_json(fake_vlm, tmp_path):
    assert vision.is_vision_model(model_folder(
        tmp_path / "v", {"model_type": "tinyvlm", "vision_config": {}})) is True
    assert vision.is_vision_model(model_folder(tmp_path / "t", {"model_type": "tinyvlm"})) \
        is False
    assert vision.is_vision_model(tmp_path / "missing") is False
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    assert vision.is_vision_model(tmp_path / "list") is False


@pytest.mark.skipif(importlib.util.find_spec("mlx_vlm") is None, reason="mlx-vlm not installed")
def test_the_installed_mlx_vlm_is_read_without_importing_it(tmp_path):
    """Against the real package: Qwen2.5-VL is a vision model, and judging it imports
    neither mlx-vlm nor mlx (a listing command must stay fast)."""
    folder = model_folder(tmp_path / "qwen", {"model_type": "qwen2_5_vl",
                                              "vision_config": {"depth": 2}})
    code = ("import sys; from pathlib import Path; from kit.models.vision import "
            f"is_vision_model; print(is_vision_model(Path({str(folder)!r})), "
            "'mlx_vlm' in sys.modules, 'mlx' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "False"]


@pytest.mark.parametrize("catalog_says, engine_says", [(False, True), (True, False)])
def test_the_engines_vision_wins_for_the_loaded_model(fake_vlm, tmp_path, catalog_says,
                                                      engine_says):
    """/v1/models: what the engine detected on the loaded model beats the catalog's guess
    for ``local`` and the model itself; another model keeps the catalog's."""
    config = ({"model_type": "tinyvlm", "vision_config": {}} if catalog_says
              else {"model_type": "llama"})  # mlx-lm's
    loaded = describe("org/a", model_folder(tmp_path / "a", config))
    other = describe("org/b", model_folder(tmp_path / "b", config))
    listed = served_entries([loaded, other], "org/a", loaded=True,
                            detected={"tools": False, "vision": engine_says})
    assert [e["capabilities"]["vision"] for e in listed] == [engine_says, engine_says,
                                                            catalog_says]


def test_a_model_that_takes_audio_says_so_in_the_listing_loaded_or_not(fake_vlm, tmp_path):
    """Regression: /v1/models named ``audio`` only for the loaded model (the engine's
    detection); another model on the machine that takes audio listed no such key."""
    omni = {"model_type": "tinyvlm", "vision_config": {}, "audio_config": {}}
    loaded = describe("org/text", model_folder(tmp_path / "t", {"model_type": "llama"}))
    other = describe("org/omni", model_folder(tmp_path / "o", omni))
    listed = served_entries([loaded, other], "org/text", loaded=True,
                            detected={"tools": False, "vision": False, "audio": False})
    assert [e["capabilities"]["audio"] for e in listed] == [False, False, True]
